// The raw baseline of the rpc figures: a TCP_NODELAY 1-byte ping-pong between two rank
// processes of a benchmark, meeting through the benchmark's store.
//   rank 1: int listener = listen_for_echo(store); ... serve_echo(listener);
//   rank 0: std::vector<double> rtts = ping_pong(store, 2000, 200);
// Errors: std::runtime_error naming the system call that failed.
#pragma once

#include <string>
#include <vector>

namespace gradwire::c10d {
class Store;
}  // namespace gradwire::c10d

namespace gradwire::bench {

// Listens on 127.0.0.1 and publishes the port under `key`; returns the socket.
int listen_for_echo(c10d::Store& store, const std::string& key = "echo_port");
// Accepts one connection, echoes every byte until it closes, then closes both sockets.
void serve_echo(int listener);
// serve_echo with one hand-off between threads per byte, the shape of a server that runs
// its handler on another thread than the one that read the request (rpc's pool path): a
// reading thread polls the socket (non-blocking reads with sched_yield between them, as
// rpc's transport threads poll) and hands each byte to a writing thread that waits on a
// condition variable (as a pool thread waits for work) and writes it back. Its round trip
// is the raw ping-pong plus one wake-up of a sleeping thread: the floor of the pool path
// on this host.
void serve_echo_handoff(int listener);
// Connects to the port published under `key`; returns the seconds of `count` round trips,
// after `warmup` untimed ones. Closing the connection ends the peer's serve_echo.
std::vector<double> ping_pong(c10d::Store& store, int count, int warmup,
                              const std::string& key = "echo_port");

}  // namespace gradwire::bench
