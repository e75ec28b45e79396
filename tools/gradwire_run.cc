// gradwire-run: starts the local workers of a gradwire (or any) program with the
// environment that rendezvous reads, meets the launchers of the job's other nodes on a
// TCPStore, watches the workers, and stops or restarts every node's workers together.
//
//   gradwire-run --nproc-per-node 3 ./ps_train --epochs 2
//   gradwire-run --nnodes 1:4 --nproc-per-node 2 --rdzv-endpoint 10.0.0.1:29400
//                --rdzv-id job7 ./train                                   (one line)
//
// The launchers form generations (run_rendezvous.h): each generation numbers the nodes,
// sums their --nproc-per-node into global ranks, and picks a fresh port for the workers'
// store on node 0. A worker that fails on any node ends the generation on every node
// (counted against --max-restarts); a node that arrives (below MAX) or whose launcher dies
// ends it too (not counted), and the launchers that remain form the next one.
// docs/launcher.md describes the flags, the environment, the protocol and the failure rules.
//
// With roles (--role server:1:critical --role trainer:2) the job is an elastic role job:
// one generation, whose workers' store a launcher hosts; a node arriving later joins it with
// fresh ranks while fewer than MAX nodes are in it (else it waits for one to leave), a node
// leaving stops nobody and frees its place, a worker is only ever restarted alone, and a
// failure ends the job only when the worker's role is critical.
//
// Secrets (run_secret.h): a job uses GRADWIRE_SECRET / GRADWIRE_SECRET_FILE when the user
// set one; else a single-node job makes up its own (its store and its workers require it),
// and a job of several nodes runs unauthenticated, with a warning at start.
//
// Errors: a bad command line prints what was wrong and exits with 2, and so does a
// --node-rank another node holds. A rendezvous that fails (timeout, store gone) exits 1.
// Workers that fail past --max-restarts end every node with that worker's status.
//
// Thread-safety: one thread (the store client and an in-process store server run their
// own); workers are watched with poll() over their pipes, pidfds and a signal self-pipe.
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "gradwire/core/auth.h"
#include "gradwire/core/error.h"
#include "run_options.h"
#include "run_rendezvous.h"
#include "run_secret.h"
#include "run_workers.h"

namespace gradwire::run {
namespace {

constexpr int kTickMs = 100;

// The exit status recorded in a stop value "failed <status> ...", or in the value of
// `abandoned` ("<status> ...").
int status_of(const std::string& text) {
  const size_t start = text.rfind("failed ", 0) == 0 ? 7 : 0;
  const int status = std::atoi(text.c_str() + start);
  return status > 0 ? status : 1;
}

std::string why_of(const std::string& stop) {
  if (stop.rfind("failed ", 0) == 0) {
    const size_t space = stop.find(' ', 7);
    return space == std::string::npos ? stop : stop.substr(space + 1);
  }
  if (stop.rfind("changed ", 0) == 0) return stop.substr(8);
  return stop;
}

// Said at the start of a job of several nodes that has no secret: its store and its
// workers let anyone in.
void warn_unauthenticated(const Options& o) {
  const bool v6 = o.rdzv_host.find(':') != std::string::npos;
  const std::string endpoint =
      (v6 ? "[" + o.rdzv_host + "]" : o.rdzv_host) + ":" + std::to_string(o.rdzv_port);
  std::fprintf(stderr,
               "gradwire-run: WARNING: this job of several nodes has no shared secret "
               "(GRADWIRE_SECRET or GRADWIRE_SECRET_FILE): anyone on the network who can reach "
               "the rendezvous store at %s can join the job, change its membership and send "
               "every worker to an address of their choosing, and the workers' stores and rpc "
               "agents accept anyone too. Give every node the same secret, e.g. "
               "GRADWIRE_SECRET_FILE naming a file that holds the output of "
               "`openssl rand -hex 32` (docs/launcher.md, Secrets).\n",
               endpoint.c_str());
}

// A node's launcher over the job: the rendezvous's lifecycle (run_lifecycle.h) drives it,
// and each state the launcher itself waits in has a step here.
class Launcher {
 public:
  Launcher(const Options& o, const std::string& own_secret) : o_(o), rdzv_(o, own_secret) {}

  // The launcher's exit status. `secret_file`: the file named to the workers, if any.
  int run(const std::string& secret_file) {
    secret_file_ = secret_file;
    if (!o_.standalone()) {
      std::fprintf(stderr, "gradwire-run: rendezvous '%s' on the store at %s%s\n",
                   o_.run_id.c_str(), rdzv_.endpoint().c_str(),
                   rdzv_.hosts_store() ? " (hosted by this launcher)" : "");
    }
    for (;;) {
      const std::optional<GroupPlan> plan = rdzv_.join();
      if (!plan) {
        std::fprintf(stderr, "gradwire-run: the job completed before this node could join it\n");
        return 0;
      }
      const GroupResult result = run_group(*plan);
      if (result.outcome == Outcome::kInterrupted) {
        guarded([&]() -> std::optional<std::string> {
          rdzv_.leave("its launcher got signal " + std::to_string(result.signal));
          return std::nullopt;
        });
        return 128 + result.signal;
      }
      if (result.outcome == Outcome::kSucceeded) {
        if (std::optional<int> status = wait_for_others()) return *status;
      }
      rdzv_.ended();
      if (std::optional<int> status = end_generation(result)) return *status;
    }
  }

 private:
  // Runs a store call from inside the workers' watch: a failure is kept (the launcher
  // throws it once the workers are stopped) and turned into a reason to stop them.
  template <class Call>
  std::optional<std::string> guarded(Call&& call) {
    try {
      return call();
    } catch (const std::exception& e) {
      store_error_ = e.what();
      return std::string("the rendezvous store failed: ") + e.what();
    }
  }

  // kRunning: this node's workers of the generation, until they have all ended.
  GroupResult run_group(const GroupPlan& plan) {
    store_error_.reset();
    GroupResult result;
    {
      LocalGroup group(o_, plan, secret_file_);
      result = group.run(
          kTickMs, [&] { return guarded([&] { return rdzv_.watch(); }); },
          [&](int rank, int status) {
            guarded([&]() -> std::optional<std::string> {
              rdzv_.fail(rank, status);
              return std::nullopt;
            });
          },
          worker_restarts_);
    }
    if (store_error_) throw NetworkError(*store_error_);
    return result;
  }

  // kFinished: this node's workers all exited 0; waits until every node's have (the exit
  // status: 0), a signal (128 + N), or the generation's stop (nullopt).
  std::optional<int> wait_for_others() {
    rdzv_.mark_done();
    for (;;) {
      if (rdzv_.all_done()) {
        rdzv_.complete();
        rdzv_.finish();
        return 0;
      }
      if (rdzv_.watch()) return std::nullopt;
      pollfd pfd{signal_fd(), POLLIN, 0};
      if (::poll(&pfd, 1, kTickMs) > 0) {
        if (const int sig = take_signal(); sig != 0) {
          rdzv_.leave("its launcher got signal " + std::to_string(sig));
          return 128 + sig;
        }
      }
    }
  }

  // kEnding: moves the job to the next generation and says why; the exit status when the
  // job is abandoned instead.
  std::optional<int> end_generation(const GroupResult& result) {
    const std::string stop = rdzv_.stop_reason();
    if (!rdzv_.advance()) {
      if (o_.elastic_roles()) {
        std::fprintf(stderr, "gradwire-run: the job failed: %s\n", why_of(stop).c_str());
      } else {
        std::fprintf(stderr, "gradwire-run: giving up after %d restart%s: %s\n", o_.max_restarts,
                     o_.max_restarts == 1 ? "" : "s", why_of(stop).c_str());
      }
      rdzv_.finish();
      return result.outcome == Outcome::kFailed ? result.status : status_of(stop);
    }
    if (stop.rfind("failed ", 0) == 0) {
      std::fprintf(stderr,
                   "gradwire-run: %s; restarting every node's workers (restart %lld of %d)\n",
                   why_of(stop).c_str(), static_cast<long long>(rdzv_.failures()), o_.max_restarts);
    } else {
      std::fprintf(stderr,
                   "gradwire-run: %s; forming the next generation (not counted as a restart)\n",
                   why_of(stop).c_str());
    }
    return std::nullopt;
  }

  const Options& o_;
  Rendezvous rdzv_;
  std::string secret_file_;
  int worker_restarts_ = 0;
  std::optional<std::string> store_error_;
};

int run(const Options& o) {
  // The user's secret, if any, is used as it is (the workers inherit it); else a single
  // node makes up its own.
  std::string own_secret;
  if (gradwire::resolve_secret("").empty()) {
    if (o.max_nodes == 1) {
      own_secret = generate_secret();
    } else {
      warn_unauthenticated(o);
    }
  }
  Launcher launcher(o, own_secret);
  // Until here a signal ends the launcher at once (no worker runs yet); from now on it
  // reaches the workers, or ends a rendezvous wait.
  install_signal_handlers();
  // Written only now, so that the launcher always removes it: a signal ends the launcher
  // through its return from here on.
  std::optional<SecretFile> secret_file;
  if (!own_secret.empty()) secret_file.emplace(own_secret);
  return launcher.run(secret_file ? secret_file->path() : std::string());
}

}  // namespace
}  // namespace gradwire::run

int main(int argc, char** argv) {
  using namespace gradwire::run;
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gradwire-run: %s\n%s", e.what(), kUsage);
    return 2;
  }
  if (o.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    std::fprintf(stderr,
                 "gradwire-run: setting OMP_NUM_THREADS=1 for each worker so that %d workers do "
                 "not overload the machine; set it yourself to tune it\n",
                 o.nproc_per_node);
  }
  try {
    return run(o);
  } catch (const Interrupted& e) {
    std::fprintf(stderr, "gradwire-run: interrupted by signal %d during the rendezvous\n",
                 e.signal);
    return 128 + e.signal;
  } catch (const gradwire::InvalidArgument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "%s%s\n",
                 what.rfind("gradwire-run: ", 0) == 0 ? "" : "gradwire-run: ", what.c_str());
    return 1;
  }
}
