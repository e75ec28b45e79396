// The worker of the elastic role job tests (tests/tools/elastic_test.cc and the multinode
// case elastic_roles.sh): it prints what gradwire-run told it, meets the job on the workers'
// store through rendezvous("env://"), and sets and waits for store keys that the test or
// the job's other workers use as gates.
//
//   elastic_worker [--rendezvous] [--set KEY]... [--wait KEY] [--fail-first-life N]
//                  [--exit N] [--timeout-ms T]
//
// Its lines, in order (a step missing when its flag is):
//   worker pid=P rank=R local=L world=W role=NAME role_rank=RR role_world=RW group=G
//          groups=GW elastic=0|1 join=0|1 rejoin=0|1 hosted=0|1 restart=C master=A:P
//          secret_file=F
//   met rank=R world=W          rendezvous("env://") returned
//   failing N                   --fail-first-life N in the first life (RESTART_COUNT 0):
//                               exits with N
//   set KEY                     KEY=<pid> written to the store
//   released by KEY             KEY appeared in the store (--wait, at most --timeout-ms)
//   done                        then exits with --exit N (0 by default)
//
// Errors: a bad command line exits 2 naming the flag; a failed rendezvous or store call
// (a timeout included) prints the error and exits 1.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/rendezvous.h"

namespace {

struct Args {
  bool rendezvous = false;
  std::vector<std::string> set;
  std::string wait;
  int fail_first_life = 0;
  int exit_status = 0;
  std::chrono::milliseconds timeout{60000};
};

std::string env(const char* name, const char* fallback = "0") {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

int number(const std::string& flag, const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 0 || v > 1'000'000) {
    std::fprintf(stderr, "elastic_worker: %s takes a number in [0, 1000000], got '%s'\n",
                 flag.c_str(), text);
    std::exit(2);
  }
  return static_cast<int>(v);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool valued = flag != "--rendezvous";
    if (valued && i + 1 >= argc) {
      std::fprintf(stderr, "elastic_worker: %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    if (flag == "--rendezvous") {
      a.rendezvous = true;
    } else if (flag == "--set") {
      a.set.emplace_back(argv[++i]);
    } else if (flag == "--wait") {
      a.wait = argv[++i];
    } else if (flag == "--fail-first-life") {
      a.fail_first_life = number(flag, argv[++i]);
    } else if (flag == "--exit") {
      a.exit_status = number(flag, argv[++i]);
    } else if (flag == "--timeout-ms") {
      a.timeout = std::chrono::milliseconds(number(flag, argv[++i]));
    } else {
      std::fprintf(stderr, "elastic_worker: unknown flag '%s'\n", flag.c_str());
      std::exit(2);
    }
  }
  if (!a.rendezvous && (!a.set.empty() || !a.wait.empty())) {
    std::fprintf(stderr, "elastic_worker: --set and --wait need --rendezvous (the store)\n");
    std::exit(2);
  }
  return a;
}

void report() {
  std::printf(
      "worker pid=%d rank=%s local=%s world=%s role=%s role_rank=%s role_world=%s group=%s "
      "groups=%s elastic=%s join=%s rejoin=%s hosted=%s restart=%s master=%s:%s secret_file=%s\n",
      static_cast<int>(::getpid()), env("RANK", "none").c_str(), env("LOCAL_RANK", "none").c_str(),
      env("WORLD_SIZE", "none").c_str(), env("ROLE_NAME", "none").c_str(),
      env("ROLE_RANK", "none").c_str(), env("ROLE_WORLD_SIZE", "none").c_str(),
      env("GROUP_RANK", "none").c_str(), env("GROUP_WORLD_SIZE", "none").c_str(),
      env("GRADWIRE_RPC_ELASTIC").c_str(), env("GRADWIRE_RPC_JOIN").c_str(),
      env("GRADWIRE_RPC_REJOIN").c_str(), env("GRADWIRE_STORE_HOSTED").c_str(),
      env("RESTART_COUNT").c_str(), env("MASTER_ADDR", "none").c_str(),
      env("MASTER_PORT", "none").c_str(), env("GRADWIRE_SECRET_FILE", "none").c_str());
  std::fflush(stdout);
}

int run(const Args& a) {
  report();
  std::shared_ptr<gradwire::c10d::Store> store;
  if (a.rendezvous) {
    const auto met = gradwire::c10d::rendezvous("env://", a.timeout);
    store = met.store;
    std::printf("met rank=%d world=%d\n", met.rank, met.world_size);
    std::fflush(stdout);
  }
  if (a.fail_first_life != 0 && env("RESTART_COUNT") == "0") {
    std::printf("failing %d\n", a.fail_first_life);
    std::fflush(stdout);
    return a.fail_first_life;
  }
  for (const std::string& key : a.set) {
    store->set(key, std::to_string(::getpid()));
    // A reply from the store: the one-way set has been applied before the line is printed.
    store->check({key});
    std::printf("set %s\n", key.c_str());
    std::fflush(stdout);
  }
  if (!a.wait.empty()) {
    store->wait({a.wait}, a.timeout);
    std::printf("released by %s\n", a.wait.c_str());
  }
  std::printf("done\n");
  std::fflush(stdout);
  return a.exit_status;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_worker: %s\n", e.what());
    return 1;
  }
}
