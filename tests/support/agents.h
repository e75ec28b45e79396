// Helpers for tests that run several rpc agents in one process (ranks as threads): start
// them on one store concurrently (each waits for all) and shut them down together.
// Header-only: the support library links core alone, and only tests linking rpc/ use it.
//
// Thread-safety: call from the test's thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <utility>

#include <filesystem>
#include <functional>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/harness.h"

namespace gradwire::test {

using Agents = std::vector<std::shared_ptr<rpc::RpcAgent>>;

inline std::string worker_name(int rank) {
  return "w" + std::to_string(rank);
}

// The transports a suite runs over: GRADWIRE_TEST_TRANSPORTS (comma-separated, e.g. "tcp")
// when set, else `defaults`. CTest runs the agent suites once per transport this way.
inline std::vector<std::string> transports_under_test(std::vector<std::string> defaults) {
  const char* env = std::getenv("GRADWIRE_TEST_TRANSPORTS");
  if (env == nullptr || *env == '\0') return defaults;
  std::vector<std::string> out;
  std::string item;
  for (const char* p = env;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) out.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else {
      item.push_back(*p);
    }
  }
  return out;
}

// Options for test agents on `reg`: short timeouts, few threads.
inline rpc::AgentOptions agent_options(rpc::Registry& reg) {
  using namespace std::chrono_literals;
  rpc::AgentOptions o;
  o.registry = &reg;
  o.rpc_timeout = 20s;
  o.join_timeout = 20s;
  o.num_worker_threads = 4;
  o.mpt_lanes = 1;
  o.transports = transports_under_test(o.transports);
  return o;
}

// Starts agents "w0" ... "w<n-1>" on one store (a fresh HashStore when none is given),
// concurrently.
inline Agents start_agents(int n, const rpc::AgentOptions& options,
                           std::shared_ptr<c10d::Store> store = nullptr) {
  using namespace std::chrono_literals;
  if (store == nullptr) store = std::make_shared<c10d::HashStore>(20s);
  Agents agents(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        agents[static_cast<size_t>(r)] =
            rpc::make_tensorpipe_agent(worker_name(r), r, n, store, options);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) {
      throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[static_cast<size_t>(r)]);
    }
  }
  return agents;
}

// The tcp address worker `rank` published in the store ({host, port}; {"", 0} if none).
inline std::pair<std::string, int> published_address(c10d::Store& store, int rank) {
  std::istringstream in(c10d::to_string(store.get("rpc/1/worker/" + std::to_string(rank))));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("url tcp://", 0) == 0) {
      const std::string hp = line.substr(10);
      const size_t colon = hp.rfind(':');
      return {hp.substr(0, colon), std::stoi(hp.substr(colon + 1))};
    }
  }
  return {"", 0};
}

// A plain TCP socket connected to `to`, for tests that speak to a listener byte by byte,
// with a 10 s receive timeout so that no read waits forever.
inline int raw_connect(const std::pair<std::string, int>& to) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(to.second));
  ::inet_pton(AF_INET, to.first.c_str(), &addr.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << to.first;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Writes all of `bytes`, or stops when the peer closed the connection (what the caller
// checks next).
inline void send_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Graceful shutdown of every agent at once; returns each agent's error, "" for success.
inline std::vector<std::string> shutdown_all(const Agents& agents) {
  std::vector<std::string> errors(agents.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < agents.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        agents[r]->shutdown();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return errors;
}

// Graceful shutdown of every agent at once; each error is a test failure.
// Every worker of `agents` calls every other one's `concat` (which the test registered:
// concat(a, b) -> a + b) and gets its answer: the group still serves.
inline void expect_every_pair_answers(const Agents& agents) {
  for (size_t from = 0; from < agents.size(); ++from) {
    for (size_t to = 0; to < agents.size(); ++to) {
      if (from == to) continue;
      EXPECT_EQ(agents[from]->rpc_sync<std::string>(worker_name(static_cast<int>(to)), "concat",
                                                    std::string("still "), std::string("here")),
                "still here")
          << from << " -> " << to;
    }
  }
}

// Sends `payload`, as a forger would, to handler `handler` on `to`: the text of the
// InvalidArgument it is refused with, or "(accepted)".
inline std::string send_forged(rpc::RpcAgent& from, const std::string& to, uint32_t handler,
                               const std::string& payload) {
  rpc::Request request;
  request.handler = handler;
  request.function = "forged";
  request.payload.assign(payload.begin(), payload.end());
  try {
    from.send(to, std::move(request)).get(std::chrono::seconds(10));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

inline void shutdown_agents(const Agents& agents) {
  for (const std::string& e : shutdown_all(agents))
    EXPECT_EQ(e, "");
}

// Runs `body` in `n` worker processes ("w0" ...) that meet through a FileStore in a fresh
// directory, each with an agent made with `options` (call before the test starts any
// thread: see run_ranks_as_processes).
inline RankResults run_agent_processes(
    const std::string& tag, int n, const rpc::AgentOptions& options,
    const std::function<void(int rank, c10d::Store& store, rpc::RpcAgent& agent)>& body) {
  using namespace std::chrono_literals;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradwire-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "store").string();
  RankResults results = run_ranks_as_processes(
      n,
      [&](int rank) {
        auto store = std::make_shared<c10d::FileStore>(
            c10d::FileStoreOptions{.path = path, .num_workers = n, .timeout = 30s});
        auto agent = rpc::make_tensorpipe_agent(worker_name(rank), rank, n, store, options);
        body(rank, *store, *agent);
      },
      60s);
  std::filesystem::remove_all(dir);
  return results;
}

}  // namespace gradwire::test
