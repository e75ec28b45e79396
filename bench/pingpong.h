// The raw baseline of the rpc figures: a TCP_NODELAY 1-byte ping-pong between two rank
// processes of a benchmark, meeting through the benchmark's store.
//   rank 1: int listener = listen_for_echo(store); ... serve_echo(listener);
//   rank 0: std::vector<double> rtts = ping_pong(store, 2000, 200);
// Errors: std::runtime_error naming the system call that failed.
#pragma once

#include <vector>

namespace gradwire::c10d {
class Store;
}  // namespace gradwire::c10d

namespace gradwire::bench {

// Listens on 127.0.0.1 and publishes the port under "echo_port"; returns the socket.
int listen_for_echo(c10d::Store& store);
// Accepts one connection, echoes every byte until it closes, then closes both sockets.
void serve_echo(int listener);
// Connects to the published port; returns the seconds of `count` round trips, after
// `warmup` untimed ones. Closing the connection ends the peer's serve_echo.
std::vector<double> ping_pong(c10d::Store& store, int count, int warmup);

}  // namespace gradwire::bench
