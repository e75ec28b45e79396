// c10d/ store figures, each against PyTorch 1.13's torch.distributed.TCPStore running the
// same workload in the same run (bench/pytorch/store_peer.py, under /usr/bin/python3 or
// $GRADWIRE_BENCH_PYTHON). Without torch the figure is still emitted, with
// params.pytorch = "unavailable" and null PyTorch values.
//
// store.add_contended_s also measures echo_floor_s, the cost of the same round trips to a
// bare epoll echo server: what no request/reply store can beat on this host.
//
// Multi-process workloads fork their client processes; the clock runs from the moment
// the last client has connected and a start barrier opens, until the last one is done.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/c10d/tcp_store_server.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
using c10d::TCPStore;
using c10d::TCPStoreOptions;
using c10d::TCPStoreServer;
using c10d::TCPStoreServerOptions;

constexpr int kRounds = 3;

TCPStoreOptions client_options(uint16_t port) {
  TCPStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = 120s;
  options.connect_timeout = 60s;
  return options;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Waits for every child; true when all exited with status 0.
bool reap(const std::vector<pid_t>& children) {
  bool ok = true;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// Runs the PyTorch peer for one workload; returns the median seconds per round, or
// nullopt (with the reason in `why`) when torch or the script is unavailable.
std::optional<double> pytorch_seconds(const std::string& args, std::string& why,
                                      std::string& version) {
  auto timings = run_pytorch_peer("store_peer.py", args, "", why);
  if (!timings) return std::nullopt;
  version = timings->torch_version;
  return median(timings->seconds);
}

// Adds the PyTorch side to a figure: its value, the ratio ours/theirs (higher is better
// when `higher_is_better`), and the target.
void add_baseline(Figure& f, const std::optional<double>& theirs_value, const std::string& why,
                  const std::string& version, bool higher_is_better, double target) {
  if (!theirs_value) {
    f.params.push_back({"pytorch", "unavailable"});
    f.params.push_back({"pytorch_reason", why});
    // NaN is written as JSON null.
    f.params.push_back({"pytorch_value", std::numeric_limits<double>::quiet_NaN()});
    f.params.push_back({"ratio", std::numeric_limits<double>::quiet_NaN()});
    return;
  }
  f.params.push_back({"pytorch", "torch.distributed.TCPStore " + version});
  f.params.push_back({"pytorch_value", *theirs_value});
  const double speedup = higher_is_better ? f.value / *theirs_value : *theirs_value / f.value;
  f.params.push_back({"ratio", speedup});
  f.params.push_back({"target_ratio_min", target});
}

const Register set_get_bench({"store.set_get_per_s"}, [](const auto& emit) {
  constexpr int kIters = 2000;
  // The same workload without and with a shared secret, rounds alternating: authentication
  // happens once per connection, so the figure must not drop.
  const std::string kSecret = "a shared secret for the benchmark";
  TCPStoreServer plain_server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = ""});
  TCPStoreServer auth_server(TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = kSecret});
  TCPStore plain(client_options(plain_server.port()));
  TCPStoreOptions auth_options = client_options(auth_server.port());
  auth_options.secret = kSecret;
  TCPStore authenticated(auth_options);
  const std::string value(16, 'x');
  auto round = [&](TCPStore& client) {
    return time_once([&] {
      for (int i = 0; i < kIters; ++i) {
        const std::string key = "k" + std::to_string(i % 64);
        client.set(key, value);
        client.get(key);
      }
    });
  };
  std::vector<double> seconds;
  std::vector<double> seconds_auth;
  for (int r = 0; r <= kRounds; ++r) {
    const double t = round(plain);
    const double ta = round(authenticated);
    if (r > 0) {  // round 0 warms up
      seconds.push_back(t);
      seconds_auth.push_back(ta);
    }
  }
  // The whole connection set-up, handshake included, without and with the secret.
  auto connect_us = [&](const TCPStoreOptions& options) {
    std::vector<double> times;
    for (int i = 0; i < 50; ++i)
      times.push_back(time_once([&] { TCPStore c(options); }) * 1e6);
    return median(times);
  };
  const double connect_plain = connect_us(client_options(plain_server.port()));
  const double connect_auth = connect_us(auth_options);
  Figure f{"store.set_get_per_s",
           kIters / median(seconds),
           "round trips/s",
           {{"iterations", double(kIters)},
            {"value_bytes", 16.0},
            {"clients", 1.0},
            {"secret", "none"},
            {"connect_us", connect_plain}}};
  std::string why, version;
  const auto theirs = pytorch_seconds(
      "set_get " + std::to_string(kIters) + " " + std::to_string(kRounds), why, version);
  add_baseline(f, theirs ? std::optional<double>(kIters / *theirs) : std::nullopt, why, version,
               true, 2.0);
  emit(f);
  const double with_secret = kIters / median(seconds_auth);
  emit(Figure{"store.set_get_per_s",
              with_secret,
              "round trips/s",
              {{"iterations", double(kIters)},
               {"value_bytes", 16.0},
               {"clients", 1.0},
               {"secret", "set"},
               {"no_secret_per_s", f.value},
               {"ratio_to_no_secret", with_secret / f.value},
               {"target_ratio_to_no_secret_min", 0.95},
               {"connect_us", connect_auth},
               {"no_secret_connect_us", connect_plain},
               {"statistic", "median of " + std::to_string(kRounds) +
                                 " rounds, alternating with the run without a secret"}}});
});

// One round of a multi-process workload: forks `procs` clients that meet at a start
// barrier, run `work`, and report in; returns the seconds from the barrier to the last.
template <typename Work>
double run_processes(uint16_t port, int procs, int round, Work work) {
  const std::string tag = "round" + std::to_string(round);
  TCPStore coordinator(client_options(port));
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < procs; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        TCPStore store(client_options(port));
        c10d::barrier(store, tag + "/start", procs + 1, 120s);
        work(store, rank, tag);
        if (store.add(tag + "/finished", 1) == procs) {
          store.set(tag + "/all_finished", std::string_view("1"));
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "store bench client %d: %s\n", rank, e.what());
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  c10d::barrier(coordinator, tag + "/start", procs + 1, 120s);
  const auto start = std::chrono::steady_clock::now();
  coordinator.wait({tag + "/all_finished"}, 120s);
  const double elapsed = seconds_since(start);
  if (!reap(children)) throw std::runtime_error("a store bench client process failed");
  return elapsed;
}

const Register clients_bench({"store.ops_per_s_8_clients"}, [](const auto& emit) {
  constexpr int kProcs = 8;
  constexpr int kIters = 500;
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  std::vector<double> seconds;
  for (int r = 0; r <= kRounds; ++r) {
    const double t =
        run_processes(server.port(), kProcs, r, [](TCPStore& store, int rank, const std::string&) {
          const std::string value(16, 'x');
          for (int i = 0; i < kIters; ++i) {
            const std::string key = "r" + std::to_string(rank) + "/k" + std::to_string(i % 64);
            store.set(key, value);
            store.get(key);
          }
        });
    if (r > 0) seconds.push_back(t);
  }
  const double total = double(kProcs) * kIters;
  Figure f{"store.ops_per_s_8_clients",
           total / median(seconds),
           "set+get pairs/s",
           {{"client_processes", double(kProcs)},
            {"iterations_per_client", double(kIters)},
            {"value_bytes", 16.0}}};
  std::string why, version;
  const auto theirs = pytorch_seconds("clients " + std::to_string(kProcs) + " " +
                                          std::to_string(kIters) + " " + std::to_string(kRounds),
                                      why, version);
  add_baseline(f, theirs ? std::optional<double>(total / *theirs) : std::nullopt, why, version,
               true, 2.0);
  emit(f);
});

// The floor under any request/reply store on this host: `procs` client processes each make
// `round_trips` blocking round trips of an add-sized request (32 bytes) to a one-thread
// epoll echo server that does nothing else, timed from a start signal until every client
// has hung up. What is left is the kernel: loopback TCP and the context switches of many
// processes sharing few cores.
double echo_floor_seconds(int procs, int round_trips) {
  constexpr size_t kFrame = 32;
  auto fail = [](const char* what) {
    throw std::runtime_error(std::string("store echo floor: ") + what + ": " +
                             std::strerror(errno));
  };
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, procs) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    fail("listen");
  }
  int go[2];
  if (::pipe(go) != 0) fail("pipe");
  std::vector<pid_t> children;
  for (int i = 0; i < procs; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
      // Only async-signal-safe calls from here: the parent has threads.
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      const int one = 1;
      char frame[kFrame] = {};
      char signal = 0;
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
          ::read(go[0], &signal, 1) != 1) {
        ::_exit(1);
      }
      for (int k = 0; k < round_trips; ++k) {
        if (::write(fd, frame, kFrame) != static_cast<ssize_t>(kFrame)) ::_exit(1);
        for (size_t got = 0; got < kFrame;) {
          const ssize_t n = ::read(fd, frame + got, kFrame - got);
          if (n <= 0) ::_exit(1);
          got += static_cast<size_t>(n);
        }
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) fail("epoll_create1");
  std::vector<int> fds;
  for (int i = 0; i < procs; ++i) {
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) fail("a client did not connect");
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) fail("accept");
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
    fds.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<char> signals(static_cast<size_t>(procs), 1);
  if (::write(go[1], signals.data(), signals.size()) != static_cast<ssize_t>(procs)) fail("write");
  int open = procs;
  std::vector<epoll_event> events(static_cast<size_t>(procs));
  char buffer[4096];
  while (open > 0) {
    const int n = ::epoll_wait(ep, events.data(), procs, 20000);
    if (n <= 0) fail("the clients stalled");
    for (int i = 0; i < n; ++i) {
      const int fd = events[static_cast<size_t>(i)].data.fd;
      const ssize_t got = ::read(fd, buffer, sizeof buffer);
      if (got <= 0) {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        --open;
        continue;
      }
      if (::write(fd, buffer, static_cast<size_t>(got)) != got) fail("echo");
    }
  }
  const double elapsed = seconds_since(start);
  const bool ok = reap(children);
  for (int fd : fds)
    ::close(fd);
  ::close(ep);
  ::close(go[0]);
  ::close(go[1]);
  ::close(listener);
  if (!ok) throw std::runtime_error("store echo floor: a client process failed");
  return elapsed;
}

const Register add_bench({"store.add_contended_s"}, [](const auto& emit) {
  constexpr int kProcs = 16;
  constexpr int kAdds = 1000;
  TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  std::vector<double> seconds;
  for (int r = 0; r <= kRounds; ++r) {
    const double t =
        run_processes(server.port(), kProcs, r, [](TCPStore& store, int, const std::string& tag) {
          for (int i = 0; i < kAdds; ++i)
            store.add(tag + "/counter", 1);
        });
    TCPStore check(client_options(server.port()));
    if (check.add("round" + std::to_string(r) + "/counter", 0) != int64_t{kProcs} * kAdds) {
      throw std::runtime_error("store.add_contended_s: adds were lost");
    }
    if (r > 0) seconds.push_back(t);
  }
  std::vector<double> floor_seconds;
  for (int r = 0; r <= kRounds; ++r) {
    const double t = echo_floor_seconds(kProcs, kAdds);
    if (r > 0) floor_seconds.push_back(t);
  }
  const double floor_s = median(floor_seconds);
  Figure f{"store.add_contended_s",
           median(seconds),
           "s",
           {{"processes", double(kProcs)},
            {"adds_per_process", double(kAdds)},
            {"echo_floor_s", floor_s},
            {"ratio_to_echo_floor", median(seconds) / floor_s}}};
  std::string why, version;
  const auto theirs = pytorch_seconds(
      "add " + std::to_string(kProcs) + " " + std::to_string(kAdds) + " " + std::to_string(kRounds),
      why, version);
  add_baseline(f, theirs, why, version, false, 2.0);
  if (theirs) f.params.push_back({"pytorch_ratio_to_echo_floor", *theirs / floor_s});
  emit(f);
});

const Register barrier_bench({"store.barrier_1024_s"}, [](const auto& emit) {
  constexpr int kClients = 1024;
  constexpr int kBarrierRounds = 1;
  // Two descriptors per client (both ends live in this process).
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < rlim_t{2 * kClients + 64}) {
    throw std::runtime_error("store.barrier_1024_s: the descriptor limit (" +
                             std::to_string(lim.rlim_cur) + ") is below " +
                             std::to_string(2 * kClients + 64));
  }
  std::vector<double> seconds;
  for (int r = 0; r <= kBarrierRounds; ++r) {
    TCPStoreServer server(TCPStoreServerOptions{.bind_host = "127.0.0.1"});
    const uint16_t port = server.port();
    std::vector<std::thread> threads;
    threads.reserve(kClients);
    std::atomic<int> failures{0};
    const double t = time_once([&] {
      for (int i = 0; i < kClients; ++i) {
        threads.emplace_back([&] {
          try {
            TCPStore store(client_options(port));
            c10d::barrier(store, "b", kClients, 120s);
          } catch (const std::exception&) {
            failures.fetch_add(1);
          }
        });
      }
      for (auto& th : threads)
        th.join();
    });
    if (failures.load() > 0) throw std::runtime_error("store.barrier_1024_s: clients failed");
    if (r > 0) seconds.push_back(t);
  }
  Figure f{"store.barrier_1024_s",
           median(seconds),
           "s",
           {{"clients", double(kClients)},
            {"note", "threads of one process, each its own connection; includes connecting"},
            {"target_max_s", 3.0}}};
  std::string why, version;
  const auto theirs = pytorch_seconds(
      "barrier " + std::to_string(kClients) + " " + std::to_string(kBarrierRounds), why, version);
  add_baseline(f, theirs, why, version, false, 1.0);
  emit(f);
});

}  // namespace
}  // namespace gradwire::bench
