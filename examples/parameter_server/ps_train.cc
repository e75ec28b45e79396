// ps_train: parameter-server training. One server holds the model as a RemoteModule
// (dist_nn/); T trainers run their forward passes through it inside dist_autograd
// contexts, call backward once, and step a DistributedOptimizer whose optimizer lives on
// the server, shared by all of them (a dist_optim::TrainerGroup).
//
// How the trainers combine (docs/parameter-server.md, "Trainer groups", has the measured
// trade-off): by default each update averages every trainer's gradient and no trainer starts
// a step before the others have finished the last (--aggregate T, --max-staleness 0), and each
// trainer's batch is 64 / T (1 to 32), so any trainer count converges as two do.
// --max-staleness S lets a trainer run S steps ahead of the slowest (-1: unbounded, the
// classic asynchronous parameter server), --aggregate K averages K gradients per update,
// --lr-scaling linear|inverse scales the rate by K or by 1/T, and --private-optimizers gives
// every trainer an optimizer of its own (PyTorch's DistributedOptimizer).
// --lr-schedule SPEC changes the rate once per epoch (optim::parse_lr_schedule:
// "step:30:0.1", "multistep:5,8:0.1", "exp:0.9", "cosine:12", "warmup:2:0.1,cosine:10", ...).
//
// The click-through task (--embedding-rows N [--sparse] [--embedding-dim D] [--hot-rows H]):
// the canonical parameter-server workload, examples/common/clicks.h. A table of N rows
// (nn::EmbeddingBag summing each sample's three rows) lives on ps0 and a linear head on the
// last server; the optimizer is Adagrad (lr 0.1 unless --lr). With --sparse the table's
// gradient holds only the rows a batch touched, so a step costs the batch, not the table:
//   gradwire-run --nproc-per-node 3 gradwire-ps-train --embedding-rows 10000000 --sparse
// trains a 10^7-row table; ps0 prints its peak RSS against the table and Adagrad's state.
//
// Started by the launcher, which gives every process its rank and the rendezvous address:
//   gradwire-run --nproc-per-node 3 gradwire-ps-train [--epochs N] [--batch B] [--lr LR]
//                                                     [--min-accuracy A]
// Ranks 0..P-1 are the servers "ps0".. (--servers P, default 1: the model's layers split
// over them, each shard a RemoteModule); the others are "trainer1"... The task is the
// built-in three-arm spiral (examples/common/spiral.h), or --data FILE.csv (numeric
// features, the label last; a header line allowed; --test-fraction held out), or
// --mnist DIR (the IDX files). Each trainer trains on its own share and prints one line per
// epoch. The run fails (exit 1) when a trainer's final held-out accuracy is below
// --min-accuracy, or on bad data (the error names the file and line). --checkpoint DIR
// saves the model, each trainer's optimizer state and progress after every epoch;
// --resume continues from there (with one trainer, to the very parameters an uninterrupted
// run reaches; with several, the trainers are asynchronous and the run continues from the
// saved state).
//
// Looking at a step: with --trace DIR every process records trace spans (docs/observability.md)
// and writes DIR/<worker>.trace.json at exit, as GRADWIRE_TRACE=DIR does; each trainer's
// batch is one span "step" (category train, argument step: 1, 2, ... over the whole run) with
// spans train.forward, train.backward and train.optimizer inside it.
//
// Surviving a trainer's death: with --kill-trainer-after B, trainer1 kills itself (SIGKILL)
// after B batches, as a crash would. Run under `gradwire-run --restart-workers 1`, the
// launcher starts it again alone; it rejoins the running job under its old name
// (AgentOptions::rejoin) and trains again, while the server, which has released the dead
// trainer's references and autograd contexts, serves on and the other trainers never stop:
//   gradwire-run --nproc-per-node 3 --restart-workers 1 gradwire-ps-train --kill-trainer-after 20
//
// Surviving a server's death (docs/parameter-server.md, section 10): with --checkpoint DIR
// --checkpoint-every S every server snapshots its shard (its parameters, the group's
// optimizer state, its update count) into DIR every S seconds in the background, keeping
// --keep-checkpoints K (3); a server restarted under --restart-workers restores the newest
// before it serves, and the trainers, whose calls failed with the server's loss, fetch its
// references again and go on (dist_optim::ServerFailover). The updates after the last
// snapshot are lost. --kill-server-after B kills the last server in its B-th forward:
//   gradwire-run --role server:1:critical --role trainer:2 --restart-workers 1
//       gradwire-ps-train --checkpoint /tmp/ps --checkpoint-every 0.1 --kill-server-after 150
// (a role job: the launcher hosts the workers' store, so even rank 0 can be restarted).
#include <gradwire/gradwire.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gradwire/core/mutex.h>
#include <gradwire/core/trace.h>
#include <gradwire/dist_optim/failover.h>
#include <gradwire/dist_optim/shard_checkpoint.h>
#include <gradwire/tensor/parallel.h>

#include "../common/args.h"
#include "../common/clicks.h"
#include "../common/data.h"
#include "../common/spiral.h"
#include "ps_membership.h"

using namespace gradwire;
using examples::Role;
using examples::TrainerWatch;
using rref::RRef;

namespace {

struct Options {
  int epochs = 12;
  int64_t batch = 0;  // --batch B; 0: 64 / trainers, between 1 and 32 (see run_trainer)
  double lr = 0.01;
  double min_accuracy = 0.85;
  std::string csv;    // --data FILE.csv
  std::string mnist;  // --mnist DIR
  double test_fraction = 0.2;
  int servers = 1;         // --servers P: the model's layers split over P servers
  std::string checkpoint;  // --checkpoint DIR: saved after every epoch
  bool resume = false;     // --resume: continue from --checkpoint DIR
  int64_t kill_after = 0;  // --kill-trainer-after B: trainer1's first life ends after B batches
  // Server failover: every server snapshots its shard into --checkpoint DIR every S seconds
  // (--checkpoint-every S), keeping K (--keep-checkpoints K); a restarted server restores
  // the newest. --kill-server-after B: the last server's first life ends in its B-th forward.
  double checkpoint_every = 0;
  int keep_checkpoints = 3;
  int64_t kill_server_after = 0;
  // --leave-after B: in an elastic job, the last of the trainers that formed it leaves the
  // job gracefully after B batches (its group and the rpc group), as a scaled-down node's would.
  int64_t leave_after = 0;
  std::string trace;  // --trace DIR: trace files written there at exit
  // The click-through task (--embedding-rows N): a table of N rows on ps0, a linear head on
  // the last server.
  int64_t embedding_rows = 0;
  int64_t embedding_dim = 16;
  int64_t hot_rows = 1000;  // distinct rows the traffic uses (examples/common/clicks.h)
  bool sparse = false;      // the table's gradient: sparse rows (only the batch's rows)
  std::string lr_schedule;  // --lr-schedule SPEC (optim::parse_lr_schedule), stepped per epoch
  // The trainers' group (dist_optim::TrainerGroup): one optimizer on each server shared by
  // every trainer, at most max_staleness steps between the fastest and the slowest trainer,
  // `aggregate` gradients averaged per update, the rate scaled by --lr-scaling.
  bool private_optimizers = false;  // --private-optimizers: one optimizer per trainer instead
  int max_staleness = 0;  // synchronous by default: converges the same at any trainer count
  int aggregate = 0;      // 0: every trainer's gradient in each update
  dist_optim::LrScaling lr_scaling = dist_optim::LrScaling::kNone;
  bool lr_given = false;
};

// The flags of the click-through task and of the trainers' group; false for any other.
bool parse_scale_flag(examples::Args& args, Options& o) {
  if (args.is("--embedding-rows")) {
    o.embedding_rows = args.integer(2, int64_t{1} << 34);
  } else if (args.is("--embedding-dim")) {
    o.embedding_dim = args.integer(1, 4096);
  } else if (args.is("--hot-rows")) {
    o.hot_rows = args.integer(1, int64_t{1} << 30);
  } else if (args.is("--sparse")) {
    o.sparse = true;
  } else if (args.is("--lr-schedule")) {
    o.lr_schedule = args.non_empty("a schedule (e.g. warmup:2:0.1,cosine:10)");
  } else if (args.is("--max-staleness")) {
    o.max_staleness = static_cast<int>(args.integer(-1, 1 << 20));
  } else if (args.is("--aggregate")) {
    o.aggregate = static_cast<int>(args.integer(1, 1 << 20));
  } else if (args.is("--lr-scaling")) {
    const std::string v = args.non_empty("none, linear or inverse");
    if (v == "none") {
      o.lr_scaling = dist_optim::LrScaling::kNone;
    } else if (v == "linear") {
      o.lr_scaling = dist_optim::LrScaling::kLinear;
    } else if (v == "inverse") {
      o.lr_scaling = dist_optim::LrScaling::kInverseTrainers;
    } else {
      throw InvalidArgument("--lr-scaling: expected none, linear or inverse, got '" + v + "'");
    }
  } else if (args.is("--private-optimizers")) {
    o.private_optimizers = true;
  } else {
    return false;
  }
  return true;
}

// The flags of server failover; false for any other.
bool parse_failover_flag(examples::Args& args, Options& o) {
  if (args.is("--checkpoint-every")) {
    o.checkpoint_every = args.number(1e-3, 1e6);
  } else if (args.is("--keep-checkpoints")) {
    o.keep_checkpoints = static_cast<int>(args.integer(1, 1000));
  } else if (args.is("--kill-server-after")) {
    o.kill_server_after = args.integer(1, int64_t{1} << 40);
  } else {
    return false;
  }
  return true;
}

Options parse_args(int argc, char** argv) {
  Options o;
  examples::Args args(argc, argv,
                      "--epochs N, --batch B, --lr LR, --min-accuracy A, --data FILE.csv, "
                      "--test-fraction F, --mnist DIR, --servers P, --checkpoint DIR, --resume, "
                      "--kill-trainer-after B, --trace DIR, --embedding-rows N, "
                      "--embedding-dim D, --hot-rows H, --sparse, --lr-schedule SPEC, "
                      "--max-staleness S, --aggregate K, --lr-scaling none|linear|inverse, "
                      "--private-optimizers, --checkpoint-every S, --keep-checkpoints K, "
                      "--kill-server-after B");
  while (args.next()) {
    if (args.is("--epochs")) {
      o.epochs = static_cast<int>(args.integer(1, 100000));
    } else if (args.is("--batch")) {
      o.batch = args.integer(1, 1 << 20);
    } else if (args.is("--lr")) {
      o.lr = args.number(0.0, 1e6);
      o.lr_given = true;
    } else if (args.is("--min-accuracy")) {
      o.min_accuracy = args.number(0.0, 1.0);
    } else if (args.is("--data")) {
      o.csv = args.value();
    } else if (args.is("--mnist")) {
      o.mnist = args.value();
    } else if (args.is("--test-fraction")) {
      o.test_fraction = args.number(0.0, 1.0);
    } else if (args.is("--servers")) {
      o.servers = static_cast<int>(args.integer(1, 3));
    } else if (args.is("--checkpoint")) {
      o.checkpoint = args.value();
    } else if (args.is("--resume")) {
      o.resume = true;
    } else if (args.is("--kill-trainer-after")) {
      o.kill_after = args.integer(1, int64_t{1} << 40);
    } else if (args.is("--leave-after")) {
      o.leave_after = args.integer(1, int64_t{1} << 40);
    } else if (args.is("--trace")) {
      o.trace = args.non_empty("a directory");
    } else if (parse_scale_flag(args, o) || parse_failover_flag(args, o)) {
    } else {
      args.unknown();
    }
  }
  if (!o.csv.empty() && !o.mnist.empty()) throw InvalidArgument("give --data or --mnist, not both");
  if (o.resume && o.checkpoint.empty()) throw InvalidArgument("--resume needs --checkpoint DIR");
  if (o.checkpoint_every > 0 && o.checkpoint.empty()) {
    throw InvalidArgument("--checkpoint-every needs --checkpoint DIR (where the snapshots go)");
  }
  if (o.kill_server_after > 0 && o.checkpoint_every == 0) {
    throw InvalidArgument(
        "--kill-server-after needs --checkpoint-every S: the restarted server restores a "
        "snapshot");
  }
  if (o.kill_server_after > 0 && o.embedding_rows > 0) {
    throw InvalidArgument("--kill-server-after applies to the MLP's servers, not the click task");
  }
  if (o.embedding_rows > 0 && (!o.csv.empty() || !o.mnist.empty())) {
    throw InvalidArgument(
        "--embedding-rows trains the click-through task: not with --data or --mnist");
  }
  if (o.sparse && o.embedding_rows == 0) {
    throw InvalidArgument("--sparse applies to the embedding table: give --embedding-rows N too");
  }
  if (o.embedding_rows > 0 && o.embedding_rows < o.hot_rows) o.hot_rows = o.embedding_rows;
  // Adagrad (which takes the table's sparse rows) for the click task: its own default rate.
  if (o.embedding_rows > 0 && !o.lr_given) o.lr = 0.1;
  return o;
}

examples::ClickTask click_task(const Options& o) {
  return examples::ClickTask{.rows = o.embedding_rows, .hot = o.hot_rows, .fields = 3, .seed = 7};
}

// The training and held-out sets: the built-in spiral, a CSV file split by
// --test-fraction, MNIST's own two sets, or the click-through task (ids [N, 3], int64).
std::pair<examples::Dataset, examples::Dataset> load_data(const Options& o) {
  if (o.embedding_rows > 0) {
    auto [x, y] = examples::clicks(click_task(o), 4000, 0);
    auto [tx, ty] = examples::clicks(click_task(o), 1000, 1);
    return {examples::Dataset{x, y, 2}, examples::Dataset{tx, ty, 2}};
  }
  if (!o.csv.empty()) return examples::split(examples::load_csv(o.csv), o.test_fraction, 7);
  if (!o.mnist.empty()) {
    return {examples::load_mnist(o.mnist, true), examples::load_mnist(o.mnist, false)};
  }
  Generator gen(7);
  auto [x, y] = examples::spiral(300, gen);
  auto [tx, ty] = examples::spiral(100, gen);
  return {examples::Dataset{x, y, 3}, examples::Dataset{tx, ty, 3}};
}

// This process's peak resident memory (VmHWM), in bytes; 0 where /proc has no such line.
int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    throw InvalidArgument(std::string(name) +
                          " is not set: start ps_train with gradwire-run "
                          "(gradwire-run --nproc-per-node 3 gradwire-ps-train)");
  }
  return static_cast<int>(parse_int(name, v, 0, 1 << 20));
}

// --kill-server-after B: the last server's first life ends (SIGKILL, as a crash would) in
// its B-th forward, once a snapshot of its shard exists to be restored. Set before serving.
struct ServerCrash {
  int64_t at = 0;  // 0: never
  std::atomic<int64_t> forwards{0};
  std::atomic<bool> snapshot_written{false};
  void on_forward() {
    if (at == 0 || ++forwards < at || !snapshot_written.load()) return;
    std::printf("killing this server in forward %lld (--kill-server-after)\n",
                static_cast<long long>(forwards.load()));
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
  }
};
ServerCrash server_crash;

// The model is an F-64-64-C ReLU MLP; with --servers P its three layers are split over P
// servers, each shard a RemoteModule on its server. Forward passes from many trainers run
// concurrently while the DistributedOptimizer updates the parameters in place; a
// RemoteModule's forward computes with a copy of the parameters taken at its start
// (dist_nn::ForwardParameters::kSnapshot, the default), so an update between a trainer's
// forward and its backward cannot invalidate what the backward needs.
class Shard : public nn::UnaryModule {
 public:
  // Layers of sizes[0] -> sizes[1] -> ...; a ReLU after each but the last, and after the
  // last too when `relu_last` (the shard is not the model's end).
  Shard(std::vector<int64_t> sizes, bool relu_last, int64_t seed)
      : UnaryModule("Shard"), gen_(static_cast<uint64_t>(seed)), relu_last_(relu_last) {
    net_ = register_module("net", std::make_shared<nn::MLP>(nn::MLPOptions{
                                      .sizes = std::move(sizes), .generator = &gen_}));
  }
  Tensor forward(const Tensor& x) override {
    server_crash.on_forward();
    const Tensor h = net_->forward(x);
    return relu_last_ ? relu(h) : h;
  }

 private:
  Generator gen_;
  bool relu_last_;
  std::shared_ptr<nn::MLP> net_;
};

// Server `s` of `servers`: its layers of the F-64-64-C model, made on "ps<s>".
dist_nn::RemoteModule<Shard> make_shard(rpc::RpcAgent& agent, int s, int servers, int64_t features,
                                        int64_t classes) {
  const std::vector<int64_t> all{features, 64, 64, classes};
  const int layers = static_cast<int>(all.size()) - 1;
  const int first = s * layers / servers, last = (s + 1) * layers / servers;
  std::vector<int64_t> sizes(all.begin() + first, all.begin() + last + 1);
  return dist_nn::RemoteModule<Shard>(agent, "ps" + std::to_string(s), "Shard", std::move(sizes),
                                      last < layers, int64_t{1 + s});
}

// The server's one shard, handed to every trainer that asks. Set once the server has made
// it; a request that comes before waits for it.
struct ServerSlot {
  Future<RRef<dist_nn::ModuleHost<Shard>>> shard;
  // The click task's modules: the table on ps0, the head on the last server.
  Future<RRef<dist_nn::ModuleHost<nn::EmbeddingBag>>> table;
  Future<RRef<dist_nn::ModuleHost<nn::Linear>>> head;
};

// The click task's table: each sample's rows summed ([B, 3] ids -> [B, dim]). Its forward
// runs on the table itself (a lookup copies only the rows it uses), never on a copy: with
// 10^7 rows a copy per forward would cost more than the whole step.
std::shared_ptr<nn::EmbeddingBag> make_table(int64_t rows, int64_t dim, bool sparse) {
  Generator gen(11);
  return std::make_shared<nn::EmbeddingBag>(
      nn::EmbeddingBagOptions{.num_embeddings = rows,
                              .embedding_dim = dim,
                              .mode = nn::EmbeddingBagMode::kSum,
                              .generator = &gen,
                              .sparse = sparse});
}

std::shared_ptr<nn::Linear> make_head(int64_t dim) {
  Generator gen(12);
  return std::make_shared<nn::Linear>(
      nn::LinearOptions{.in_features = dim, .out_features = 2, .generator = &gen});
}

void register_all(rpc::Registry& reg, const std::shared_ptr<ServerSlot>& slot) {
  dist_nn::register_remote_module<Shard>(reg, "Shard").ctor<std::vector<int64_t>, bool, int64_t>();
  dist_nn::register_remote_module<nn::EmbeddingBag>(reg, "ClickTable")
      .ctor<int64_t, int64_t, bool>(&make_table);
  dist_nn::register_remote_module<nn::Linear>(reg, "ClickHead").ctor<int64_t>(&make_head);
  reg.def("shard", [slot] { return slot->shard; });
  reg.def("click_table", [slot] { return slot->table; });
  reg.def("click_head", [slot] { return slot->head; });
  // In blocks of rows: a float64 copy of a whole table would double the server's memory.
  reg.def("parameter_sum", [](const RRef<Tensor>& p) {
    const Tensor t = p.local_value()->detach();
    if (t.dim() == 0) return t.item<double>();
    double total = 0;
    for (int64_t r = 0; r < t.size(0); r += 65536)
      total +=
          sum(t.narrow(0, r, std::min<int64_t>(65536, t.size(0) - r)), kFloat64).item<double>();
    return total;
  });
}

// What a trainer sees of the model: its forward through the servers, its parameters, and
// how to save it.
struct Model {
  std::function<Tensor(const Tensor&)> forward;
  std::vector<RRef<Tensor>> params;
  std::function<void(const std::string& dir)> save;
};

Model spiral_model(rpc::RpcAgent& agent, const Options& opt) {
  auto shards = std::make_shared<std::vector<dist_nn::RemoteModule<Shard>>>();
  Model m;
  for (int s = 0; s < opt.servers; ++s) {
    shards->emplace_back(
        agent.rpc_sync<RRef<dist_nn::ModuleHost<Shard>>>("ps" + std::to_string(s), "shard"));
    for (auto& p : shards->back().remote_parameters())
      m.params.push_back(std::move(p));
  }
  m.forward = [shards](const Tensor& input) {
    Tensor h = input;
    for (auto& shard : *shards)
      h = shard.forward(h);
    return h;
  };
  m.save = [shards](const std::string& dir) {
    for (size_t sh = 0; sh < shards->size(); ++sh)
      (*shards)[sh].save(dir + "/model-" + std::to_string(sh) + ".gw");
  };
  return m;
}

Model click_model(rpc::RpcAgent& agent, const Options& opt) {
  auto table = std::make_shared<dist_nn::RemoteModule<nn::EmbeddingBag>>(
      agent.rpc_sync<RRef<dist_nn::ModuleHost<nn::EmbeddingBag>>>("ps0", "click_table"));
  auto head = std::make_shared<dist_nn::RemoteModule<nn::Linear>>(
      agent.rpc_sync<RRef<dist_nn::ModuleHost<nn::Linear>>>("ps" + std::to_string(opt.servers - 1),
                                                            "click_head"));
  Model m;
  m.params = table->remote_parameters();
  for (auto& p : head->remote_parameters())
    m.params.push_back(std::move(p));
  m.forward = [table, head](const Tensor& ids) { return head->forward(table->forward(ids)); };
  m.save = [table, head](const std::string& dir) {
    table->save(dir + "/table.gw");
    head->save(dir + "/head.gw");
  };
  return m;
}

// The trainers' optimizer: Adam for the spiral's MLP, Adagrad (which takes the table's
// sparse rows) for the click task; shared by every trainer (a TrainerGroup) unless
// --private-optimizers.
std::unique_ptr<dist_optim::DistributedOptimizer> make_optimizer(rpc::RpcAgent& agent,
                                                                 const Options& opt, int trainers,
                                                                 std::vector<RRef<Tensor>> params) {
  const StateDict spec =
      opt.embedding_rows > 0
          ? optim::make_functional_optimizer(optim::AdagradOptions{.lr = opt.lr})->state_dict()
          : optim::make_functional_optimizer(optim::AdamOptions{.lr = opt.lr})->state_dict();
  if (opt.private_optimizers) {
    return std::make_unique<dist_optim::DistributedOptimizer>(agent, spec, std::move(params));
  }
  const dist_optim::TrainerGroup group{
      .name = "ps_train",
      .trainers = trainers,
      .max_staleness = opt.max_staleness,
      // By default every member of the moment: trainers that join a running elastic job
      // count from their first step, and those that leave stop counting.
      .aggregate = opt.aggregate > 0 ? std::min(opt.aggregate, trainers) : 0,
      .lr_scaling = opt.lr_scaling};
  return std::make_unique<dist_optim::DistributedOptimizer>(agent, spec, std::move(params), group);
}

// Continues from --checkpoint: the trainer's optimizer state, and the epoch it finished;
// skips the batch orders (and schedule steps) of the epochs done, so that the run goes on as
// an uninterrupted one would. Returns the first epoch to train.
int resume(const Options& opt, int trainer, const std::string& me, int64_t samples,
           dist_optim::DistributedOptimizer& optimizer, optim::LrScheduler* schedule,
           Generator& order_gen) {
  optimizer.load_state_dict(
      nn::load(opt.checkpoint + "/optimizer-" + std::to_string(trainer) + ".gw"));
  StateDict progress = nn::load(opt.checkpoint + "/progress-" + std::to_string(trainer) + ".gw");
  const int first_epoch = static_cast<int>(progress.at(0).second.item<int64_t>()) + 1;
  for (int e = 1; e < first_epoch; ++e) {
    (void)randperm(samples, &order_gen);
    if (schedule != nullptr) schedule->step();
  }
  std::printf("%s resumed after epoch %d from %s\n", me.c_str(), first_epoch - 1,
              opt.checkpoint.c_str());
  return first_epoch;
}

// The trainer's last line: its held-out accuracy and a fingerprint of the final parameters
// (a resumed run prints the same as an uninterrupted one when a single trainer runs), each
// summed where it lives (a table of 10^7 rows never travels). 1 when the accuracy is below
// --min-accuracy.
int report_done(rpc::RpcAgent& agent, const std::vector<RRef<Tensor>>& params, double test_accuracy,
                const Options& opt) {
  const std::string me = agent.worker_info().name;
  double checksum = 0;
  for (const auto& p : params)
    checksum += agent.rpc_sync<double>(p.owner().name, "parameter_sum", p);
  std::printf("%s done: held-out accuracy %.3f after %d epochs; parameter checksum %.17g\n",
              me.c_str(), test_accuracy, opt.epochs, checksum);
  if (test_accuracy < opt.min_accuracy) {
    std::fprintf(stderr, "%s: held-out accuracy %.3f is below %.3f\n", me.c_str(), test_accuracy,
                 opt.min_accuracy);
    return 1;
  }
  return 0;
}

// --leave-after: whether this trainer (the last of those that formed an elastic job) leaves
// after its batch `done`.
bool leaves_now(const rpc::RpcAgent& agent, const Options& opt, int trainer, int trainers,
                int64_t done) {
  return opt.leave_after > 0 && done == opt.leave_after && trainer == trainers &&
         agent.options().elastic && agent.incarnation() == 0;
}

// What a trainer's batches add up to over one epoch.
struct EpochStats {
  double loss_sum = 0;
  double train_correct = 0;
  int64_t seen = 0;
};

// One batch, in one dist_autograd context: the forward through the servers, backward, the
// optimizer's step. Run again after a server's failover (ServerFailover::run): the step that
// failed is computed again against the restored server.
void train_batch(rpc::RpcAgent& agent, const Model& model, dist_optim::ServerFailover& failover,
                 const Tensor& xb, const Tensor& yb, EpochStats& stats) {
  Tensor logits, loss;
  const size_t recovered = failover.recoveries().size();
  failover.run([&] {
    dist_autograd::Context ctx(agent);
    {
      const trace::Span phase("train.forward", "train");
      logits = model.forward(xb);
      loss = nn::cross_entropy(logits, yb);
    }
    {
      const trace::Span phase("train.backward", "train");
      dist_autograd::backward(agent, ctx.id(), {loss});
    }
    {
      const trace::Span phase("train.optimizer", "train");
      failover.optimizer().step(ctx.id());
    }
  });
  for (size_t k = recovered; k < failover.recoveries().size(); ++k) {
    const dist_optim::Recovery& r = failover.recoveries()[k];
    for (size_t i = 0; i < r.replaced.size(); ++i) {
      std::printf("%s recovered from the loss of %s (now incarnation %d) in %.3f s; training on\n",
                  agent.worker_info().name.c_str(), r.replaced[i].name.c_str(), r.incarnations[i],
                  r.took.count());
    }
    std::fflush(stdout);
  }
  stats.loss_sum += loss.item<double>() * static_cast<double>(xb.size(0));
  stats.train_correct +=
      examples::accuracy_of(logits.detach(), yb) * static_cast<double>(xb.size(0));
  stats.seen += xb.size(0);
}

int run_trainer(rpc::RpcAgent& agent, int trainer, int trainers, const Options& opt,
                const examples::Dataset& train, const examples::Dataset& test) {
  const std::string me = agent.worker_info().name;
  // The same data on every trainer; each takes every trainers-th sample (a trainer that
  // joined a running elastic job, numbered past the trainers that formed it, every
  // trainer-th).
  const Tensor &all_x = train.x, &all_y = train.y, &test_x = test.x, &test_y = test.y;
  std::vector<int64_t> mine;
  for (int64_t i = trainer - 1; i < all_x.size(0); i += std::max(trainers, trainer))
    mine.push_back(i);
  const Tensor index = tensor<int64_t>(mine);
  const Tensor x = index_select(all_x, 0, index), y = index_select(all_y, 0, index);

  // The default batch keeps the samples of one round of all trainers' steps at 64 (32 each
  // for two trainers): as trainers are added each steps on fewer samples, so the updates per
  // epoch, and how stale a gradient can get, stay what two trainers see.
  const int64_t batch = opt.batch > 0 ? opt.batch : std::clamp<int64_t>(64 / trainers, 1, 32);
  // The model's references and the optimizer over them, made again when a server is lost
  // and its replacement has restored its snapshot.
  Model model;
  dist_optim::ServerFailover failover(
      agent,
      [&] {
        model = opt.embedding_rows > 0 ? click_model(agent, opt) : spiral_model(agent, opt);
        return model.params;
      },
      [&](std::vector<RRef<Tensor>> params) {
        return make_optimizer(agent, opt, trainers, std::move(params));
      });
  // --lr-schedule: stepped once per epoch; with a shared optimizer trainer1 drives it.
  std::unique_ptr<optim::LrScheduler> schedule;
  const bool drives_schedule = opt.private_optimizers || trainer == 1;
  if (!opt.lr_schedule.empty() && drives_schedule)
    schedule = optim::parse_lr_schedule(opt.lr_schedule, failover);

  Generator order_gen(static_cast<uint64_t>(100 + trainer));
  // A checkpoint: the server's model (saved by trainer1, loaded by the server at start),
  // each trainer's optimizer state and the epoch it finished.
  const std::string optimizer_file =
      opt.checkpoint + "/optimizer-" + std::to_string(trainer) + ".gw";
  const int first_epoch = opt.resume ? resume(opt, trainer, me, x.size(0), failover.optimizer(),
                                              schedule.get(), order_gen)
                                     : 1;
  if (agent.incarnation() > 0) {
    std::printf("%s rejoined the running job (incarnation %d); training again\n", me.c_str(),
                agent.incarnation());
    std::fflush(stdout);
  }
  int64_t batches = 0;
  int64_t steps = 0;  // over the whole run: the trace's step numbers
  const auto start = std::chrono::steady_clock::now();
  double test_accuracy = 0;
  for (int epoch = first_epoch; epoch <= opt.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    const Tensor order = randperm(x.size(0), &order_gen);
    EpochStats stats;
    for (int64_t b = 0; b < x.size(0); b += batch) {
      // The whole batch, the context's release at the end of the scope included.
      const trace::Span step("step", "train", trace::Arg("step", ++steps));
      const Tensor rows = order.slice(0, b, b + batch);
      train_batch(agent, model, failover, index_select(x, 0, rows), index_select(y, 0, rows),
                  stats);
      if (leaves_now(agent, opt, trainer, trainers, steps)) {
        failover.run([&] { failover.optimizer().leave(); });
        std::printf("%s leaves the job after %lld batches (--leave-after); the others go on\n",
                    me.c_str(), static_cast<long long>(steps));
        std::fflush(stdout);
        agent.leave();
        return 0;
      }
      if (opt.kill_after > 0 && trainer == 1 && agent.incarnation() == 0 &&
          ++batches == opt.kill_after) {
        std::printf("%s: killing itself after %lld batches (--kill-trainer-after)\n", me.c_str(),
                    static_cast<long long>(batches));
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
    }
    failover.run([&] { test_accuracy = examples::accuracy_of(model.forward(test_x), test_y); });
    const double epoch_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double seen = static_cast<double>(stats.seen);
    std::printf(
        "%s epoch %2d/%d  loss %.4f  train accuracy %.3f  test accuracy %.3f  "
        "%.0f samples/s  %.2f s\n",
        me.c_str(), epoch, opt.epochs, stats.loss_sum / seen, stats.train_correct / seen,
        test_accuracy, seen / epoch_s, elapsed);
    std::fflush(stdout);
    if (schedule) {
      try {
        schedule->step();
      } catch (...) {
        // The rate was kept: set on the optimizer the recovery makes (a rerun would step twice).
        failover.recover(std::current_exception());
      }
    }
    if (!opt.checkpoint.empty()) {
      failover.run([&] {
        if (trainer == 1) model.save(opt.checkpoint);
        nn::save(failover.optimizer().state_dict(), optimizer_file);
      });
      nn::save(StateDict{{"epoch", tensor<int64_t>({epoch})}},
               opt.checkpoint + "/progress-" + std::to_string(trainer) + ".gw");
    }
  }
  // Done stepping: the other trainers no longer wait for this one.
  failover.run([&] { failover.optimizer().leave(); });
  if (opt.kill_server_after > 0 && failover.recoveries().empty()) {
    std::fprintf(stderr,
                 "%s: --kill-server-after %lld: no server was lost while this trainer trained "
                 "(the last server runs fewer forwards than that)\n",
                 me.c_str(), static_cast<long long>(opt.kill_server_after));
    return 1;
  }
  return report_done(agent, failover.params(), test_accuracy, opt);
}

// --checkpoint-every: this server's snapshots of `params` (its modules' parameters) into
// --checkpoint DIR, restored first when the server is a restarted one (or with --resume).
std::unique_ptr<dist_optim::ShardCheckpointer> start_snapshots(rpc::RpcAgent& agent,
                                                               const Options& opt,
                                                               StateDict params) {
  if (opt.checkpoint_every <= 0) return nullptr;
  std::vector<std::string> shards;
  for (int s = 0; s < opt.servers; ++s)
    shards.push_back("ps" + std::to_string(s));
  auto ckpt = std::make_unique<dist_optim::ShardCheckpointer>(
      agent, std::move(params),
      dist_optim::ShardCheckpointOptions{
          .dir = opt.checkpoint,
          .job_shards = shards,
          .every = std::chrono::duration<double>(opt.checkpoint_every),
          .keep_last = opt.keep_checkpoints,
          .group = opt.private_optimizers ? "" : "ps_train",
          .on_written = [](const dist_optim::SnapshotInfo&) {
            server_crash.snapshot_written = true;
          }});
  const std::string me = agent.worker_info().name;
  if (agent.incarnation() > 0 || opt.resume) {
    const auto start = std::chrono::steady_clock::now();
    const std::optional<dist_optim::SnapshotInfo> restored = ckpt->restore();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (restored) {
      std::printf(
          "%s restored snapshot %lld (after %lld updates) from %s in %.3f s; the updates "
          "applied after it are lost\n",
          me.c_str(), static_cast<long long>(restored->seq),
          static_cast<long long>(restored->updates), restored->path.c_str(), took);
    } else {
      std::printf("%s found no snapshot in %s: starting fresh\n", me.c_str(),
                  opt.checkpoint.c_str());
    }
  }
  ckpt->start();
  return ckpt;
}

// The parameters of a module this server holds, by name, each name after `prefix`.
template <typename M>
void add_named(StateDict& out, const dist_nn::RemoteModule<M>& module, const std::string& prefix) {
  for (const auto& [name, p] : module.module_rref().local_value()->module()->named_parameters())
    out.emplace_back(prefix + name, p);
}

// A server's life: its modules made (loaded with --resume, then restored from its newest
// snapshot when it was restarted), handed to every trainer that asks, and served until
// every trainer has finished.
int run_server(rpc::RpcAgent& agent, const Options& opt, int rank, int world,
               const examples::Dataset& train, ServerSlot& slot) {
  const std::string name = agent.worker_info().name;
  auto watch = std::make_shared<TrainerWatch>(agent);
  agent.add_listener(watch);
  if (agent.incarnation() > 0) {
    std::printf("%s rejoined the running job (incarnation %d)\n", name.c_str(),
                agent.incarnation());
  }
  StateDict params;
  std::vector<std::function<void()>> publish;  // once restored
  if (opt.embedding_rows > 0) {
    // The click task: the table on ps0, the head on the last server.
    if (rank == 0) {
      dist_nn::RemoteModule<nn::EmbeddingBag> table(agent, name, "ClickTable", opt.embedding_rows,
                                                    opt.embedding_dim, opt.sparse);
      if (opt.resume) table.load(opt.checkpoint + "/table.gw");
      add_named(params, table, "table.");
      publish.push_back([&slot, ref = table.module_rref()] { slot.table.set_value(ref); });
      std::printf("%s holds the %lld x %lld table (%s gradients); RSS %.2f GB\n", name.c_str(),
                  static_cast<long long>(opt.embedding_rows),
                  static_cast<long long>(opt.embedding_dim), opt.sparse ? "sparse" : "dense",
                  static_cast<double>(peak_rss_bytes()) / 1e9);
    }
    if (rank == opt.servers - 1) {
      dist_nn::RemoteModule<nn::Linear> head(agent, name, "ClickHead", opt.embedding_dim);
      if (opt.resume) head.load(opt.checkpoint + "/head.gw");
      add_named(params, head, "head.");
      publish.push_back([&slot, ref = head.module_rref()] { slot.head.set_value(ref); });
    }
  } else {
    auto shard = make_shard(agent, rank, opt.servers, train.features(), train.classes);
    if (opt.resume) shard.load(opt.checkpoint + "/model-" + std::to_string(rank) + ".gw");
    add_named(params, shard, "");
    publish.push_back([&slot, ref = shard.module_rref()] { slot.shard.set_value(ref); });
  }
  if (opt.kill_server_after > 0 && rank == opt.servers - 1 && agent.incarnation() == 0)
    server_crash.at = opt.kill_server_after;
  std::unique_ptr<dist_optim::ShardCheckpointer> snapshots =
      start_snapshots(agent, opt, std::move(params));
  for (const auto& p : publish)
    p();
  std::printf("%s serving shard %d of %d to %d trainers\n", name.c_str(), rank + 1, opt.servers,
              world - opt.servers);
  std::fflush(stdout);
  // In an elastic job trainers come and go: the server serves as long as one is there (and
  // the graceful shutdown meets the other servers alone, however long training took).
  // Otherwise the graceful shutdown waits until every trainer has finished and shut down.
  if (agent.options().elastic) watch->serve_until_trainers_are_gone();
  rpc::shutdown();
  if (snapshots) snapshots->stop();
  if (opt.embedding_rows > 0 && rank == 0) {
    // The table's server: its peak memory against what it must hold (the table and
    // Adagrad's sums, one float per element each); a dense gradient of the table's size
    // per step would show here.
    const double table_gb = static_cast<double>(opt.embedding_rows * opt.embedding_dim) * 4 / 1e9;
    std::printf("%s peak RSS %.2f GB; table %.2f GB + optimizer state %.2f GB\n", name.c_str(),
                static_cast<double>(peak_rss_bytes()) / 1e9, table_gb, table_gb);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse_args(argc, argv);
    // Files named after the worker (init_rpc names the process), written at exit.
    if (!opt.trace.empty()) trace::start(opt.trace);
    // The launcher's rank and world size as env:// reads them (gradwire-run, torchrun,
    // srun, mpirun).
    const c10d::LaunchEnv launch = c10d::launch_env();
    const int rank = launch.rank >= 0 ? launch.rank : env_int("RANK");
    const int world = launch.world_size >= 0 ? launch.world_size : env_int("WORLD_SIZE");
    if (world <= opt.servers) {
      throw InvalidArgument("ps_train needs " + std::to_string(opt.servers) +
                            " server(s) and at least one trainer: start it with "
                            "gradwire-run --nproc-per-node " +
                            std::to_string(opt.servers + 1) + " or more");
    }
    // Made here when missing: the epoch files and the servers' snapshots go there.
    if (!opt.checkpoint.empty()) std::filesystem::create_directories(opt.checkpoint);
    const auto [train, test] = load_data(opt);
    auto slot = std::make_shared<ServerSlot>();
    register_all(rpc::registry(), slot);
    set_num_threads(1);  // several processes share this machine's cores
    const Role role = examples::role_of(rank, opt.servers);
    const bool server = role.server;
    const std::string name =
        server ? "ps" + std::to_string(role.index) : "trainer" + std::to_string(role.index);
    rpc::AgentOptions options;
    options.rpc_timeout = std::chrono::seconds(60);
    auto agent = rpc::init_rpc(name, rank, world, options);
    if (server) return run_server(*agent, opt, role.index, world, train, *slot);
    if (options.join_running || examples::launch_joins()) {
      std::printf("%s joined the running job as rank %d\n", name.c_str(), rank);
      std::fflush(stdout);
    }
    const int status = run_trainer(*agent, role.index, world - opt.servers, opt, train, test);
    // In an elastic job (gradwire-run --role) a trainer that is done leaves: nobody waits for
    // it, and the servers go on serving the others. Otherwise every worker meets at the end.
    if (agent->options().elastic) {
      if (!agent->is_shut_down()) rpc::leave();
    } else {
      rpc::shutdown();
    }
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_train: %s\n", e.what());
    return 1;
  }
}
