// rendezvous(url): how a worker finds its store, its rank and the size of its job.
//
//   env://                                   MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
//   tcp://host:port?rank=R&world_size=N      a TCPStore at host:port
//   file:///path?rank=R&world_size=N         a FileStore at /path
//
// For env:// and tcp://, rank 0 hosts the TCPStore server (listening on every interface
// at the given port) and every worker waits until all world_size workers have connected.
// Query parameters override the environment for env:// ("env://?rank=1"). The file://
// store is removed when all world_size workers have destroyed theirs.
//
// Thread-safety: safe to call concurrently (it reads the environment, see env.h).
// Errors: InvalidArgument naming the variable or parameter that is missing or malformed
// (a rank outside [0, world_size), a port outside [1, 65535], an unknown scheme);
// NetworkError / TimeoutError from connecting and waiting for the other workers.
//
// Example:
//   auto [store, rank, world_size] = rendezvous("env://");
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "gradwire/c10d/store.h"

namespace gradwire::c10d {

struct RendezvousResult {
  std::shared_ptr<Store> store;
  int rank{0};
  int world_size{0};
};

RendezvousResult rendezvous(const std::string& url,
                            std::chrono::milliseconds timeout = kDefaultStoreTimeout);

}  // namespace gradwire::c10d
