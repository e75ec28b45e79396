// gradwire-run's command line: the flags, their defaults and their checks.
//
// parse() turns argv into Options or throws UsageError naming what was wrong (an unknown
// flag, a missing or out-of-range value, flags that contradict each other); main prints it
// with the usage text and exits with 2. docs/launcher.md lists every flag.
//
// Thread-safety: plain functions over values; parse() and resolve_program() read the
// environment and the file system.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradwire::run {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

extern const char* const kUsage;

// One role of an elastic role job (--role NAME:N[:critical]): this node runs `count`
// workers of it. A worker of a critical role that fails without a --restart-workers budget
// left ends the job on every node; one of another role is logged and the job goes on.
struct RoleSpec {
  std::string name;
  int count = 0;
  bool critical = false;
};

struct Options {
  // Workers on this node (--nproc-per-node; "auto" is resolved by parse()).
  int nproc_per_node = 1;
  // --nnodes N (min == max) or MIN:MAX.
  int min_nodes = 1;
  int max_nodes = 1;
  // --node-rank: this node's rank, fixed; nullopt: assigned in arrival order.
  std::optional<int> node_rank;
  // Where the launchers meet (--rdzv-endpoint, or --master-addr:--master-port with several
  // nodes); empty host: standalone (a store of this launcher on a free localhost port).
  std::string rdzv_host;
  int rdzv_port = 0;
  std::string run_id = "default";
  // The workers' MASTER_ADDR when given (--master-addr), else node 0's advertised address.
  std::optional<std::string> master_addr;
  // The workers' MASTER_PORT on a single standalone node (--master-port), else a fresh
  // free port every generation.
  std::optional<int> worker_port;
  std::chrono::milliseconds last_call{std::chrono::seconds(3)};
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(600)};
  int max_restarts = 0;
  int restart_workers = 0;
  int grace_ms = 5000;
  bool prefix = true;
  std::string log_dir;  // empty: none
  int tee = 0;          // with log_dir: 1 stdout, 2 stderr, 3 both also go to the console
  std::string role = "default";
  // --role NAME:N[:critical], in the order given: an elastic role job (docs/launcher.md,
  // "Elastic parameter-server jobs"); nproc_per_node is then the sum of the counts. Empty:
  // one role (`role`), nproc_per_node workers, the job restarted by generations.
  std::vector<RoleSpec> roles;
  std::vector<std::string> program;  // the program (resolved path first) and its arguments

  bool standalone() const { return rdzv_host.empty(); }
  bool elastic_roles() const { return !roles.empty(); }
};

// Parses argv; resolves the program on PATH and --nproc-per-node auto.
Options parse(int argc, char** argv);

// The number of workers `--nproc-per-node auto` starts: the GPUs visible (the entries of
// CUDA_VISIBLE_DEVICES when set, else /proc/driver/nvidia/gpus), else the CPUs this process
// may run on (sched_getaffinity).
int auto_nproc();

}  // namespace gradwire::run
