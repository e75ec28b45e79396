// ps.sparse_* figures: a parameter server holding a large embedding table whose gradients
// are sparse rows (docs/sparse.md), stepped by two trainers at once with Adagrad; the same
// table with dense gradients; PyTorch 1.13 doing the same (bench/pytorch/ps_sparse_peer.py),
// all in the same run.
//
// The model, on "ps" (rank 0), one per table size: a SparseModel (below) made as a
// dist_nn::RemoteModule on the server itself, forward on the module's own tensors
// (ForwardParameters::kShared, no copy of the table):
//   table = nn::EmbeddingBag(rows, 64, sum, .sparse = true)     N(0, 1), seeded
//   head  = nn::Linear(64, 2)
//   forward(ids [256, 4]) = table(ids) @ head.weight'.T + head.bias'
// where weight' and bias' are copies of the head's parameters taken at the forward's start
// (the gradient reaches the parameters through them): with two trainers a step may
// otherwise change the head between another trainer's forward and its backward. The table
// needs no copy: its backward does not keep it.
//
// Trainers "trainer1", "trainer2" (ranks 1, 2) each hold, per table, a RemoteModule handle
// (its RRef, from the server) and a DistributedOptimizer(Adagrad lr 0.1) over its
// parameters, both members of one asynchronous dist_optim::TrainerGroup per table (no
// staleness bound, every gradient applied as it arrives): the server keeps one Adagrad sum
// per table, the parameter server's optimizer state. (PyTorch's DistributedOptimizer keeps
// one optimizer per trainer on each owner; the peer below does as it does.) One step:
//   dist_autograd::Context ctx; logits = model.forward(ids);
//   loss = nn::cross_entropy(logits, labels); optimizer.backward_and_step(ctx.id(), {loss});
//   loss.item()
// Ids: each sample has a label y in {0, 1} and 4 ids of rows whose parity is y (a row's
// class is its parity, so the model can learn). "Hot" ids are drawn uniformly from a fixed
// hot set of 8192 rows spread over the table (one at a pseudo-random place in each of 8192
// equal stretches): a batch touches about 970 distinct rows at every table size. "Uniform"
// ids (a diagnostic) are drawn uniformly from the whole table: about 1020 distinct rows,
// each a cache and TLB miss on a large table. Each trainer cycles through kBatches batches
// of each kind per table, its own.
//
// Runs (each its own 3 processes; one intra-op thread and kPoolThreads pool threads each):
// - sparse: tables of 10^4, 10^5, 10^6 and 10^7 rows on one server. Each trainer makes one
//   step on each table in turn (the server reads its RSS after both trainers' first step
//   on a table), `warmup` more, then `blocks` rounds in which, for each table and kind of
//   ids, the trainers meet at a barrier and time `block_steps` steps each, one by one:
//   blocks alternate over the tables, so drift on a shared host favours no size.
// - dense: tables of 10^4 and 10^6 rows with .sparse = false (a gradient, and an Adagrad
//   step, the table's size every step), hot ids, fewer steps.
// - PyTorch: torch.nn.EmbeddingBag(sparse=True) and Linear on "ps" behind rpc.remote,
//   rpc_sync forward, dist_autograd, DistributedOptimizer(torch.optim.Adagrad), 2 trainers,
//   10^4, 10^6 and 10^7 rows, the same blocks and hot ids.
// Figures:
//   ps.sparse_step_ms        per table size: the median step (the median over the trainers
//                            of each one's median), hot ids; baseline: the step at 10^4
//                            rows (ratio; target at 10^7 rows: <= 1.25)
//   ps.sparse_rss_growth_mb  the server's peak RSS (VmHWM) over the warm-up and timed steps
//                            less its RSS before the tables were made, against the tables
//                            and their Adagrad sums (target: at most kSlackMiB more), and
//                            the same peak less the RSS after every table's first steps
//                            (no step allocates anything the table's size: at most
//                            kSlackMiB). The peak is reset (/proc/self/clear_refs) before
//                            each table is made and after the first steps: making a table
//                            has a transient peak of its own (its initialisation's
//                            temporaries, reported), and those temporaries, which the host
//                            block cache (tensor/storage.h) would keep for reuse, are given
//                            back (empty_host_cache) before the table's RSS is read.
//   ps.sparse_vs_dense       dense step / sparse step at 10^6 rows (target >= 5)
//   ps.sparse_vs_pytorch     PyTorch's step / ours at 10^6 rows (target >= 3)
// Each trainer checks that its loss went down on every table (the mean of its last kCheck
// timed hot steps below that of its first kCheck steps). The RSS check fails the
// benchmark (an exception once the figures are printed: gradwire-bench exits non-zero)
// with "rss_check": "failed" in its figure.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/error.h"
#include "gradwire/core/future.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_nn/remote_module.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/nn/linear.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/adagrad.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/parallel.h"
#include "gradwire/tensor/storage.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
using rref::RRef;

constexpr int64_t kDim = 64, kClasses = 2, kBag = 4, kBatch = 256;
constexpr int64_t kHot = 8192;  // rows in the hot set
constexpr double kLr = 0.1;
constexpr int kTrainers = 2;
constexpr int kThreads = 1;  // intra-op threads per process, every side
constexpr int kPoolThreads = 8;
constexpr int kBatches = 32;  // batches per trainer, table and kind of ids
constexpr int kCheck = 8;     // steps averaged at each end for the loss check
constexpr double kSlackMiB = 64;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr int64_t kBaseRows = 10'000;        // the baseline of ps.sparse_step_ms
constexpr int64_t kCompareRows = 1'000'000;  // ps.sparse_vs_dense, ps.sparse_vs_pytorch

enum Ids : int { kHotIds, kUniformIds };

struct RunSpec {
  std::string name;  // "sparse" or "dense": the store prefix and messages
  std::vector<int64_t> rows;
  bool sparse;
  bool uniform;  // also time blocks of uniform ids
  int warmup;    // untimed steps per trainer and table after the first
  int blocks;
  int block_steps;
};

const RunSpec kSparseRun{"sparse", {10'000, 100'000, 1'000'000, 10'000'000}, true, true, 10, 6, 20};
const RunSpec kDenseRun{"dense", {10'000, 1'000'000}, false, false, 2, 3, 4};
// PyTorch: the same blocks as the sparse run, hot ids only.
const std::vector<int64_t> kPytorchRows{10'000, 1'000'000, 10'000'000};

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("ps sparse bench: " + what);
}

// The model on the server (see the file comment).
class SparseModel : public nn::UnaryModule {
 public:
  SparseModel(int64_t rows, bool sparse) : UnaryModule("SparseModel"), gen_(uint64_t(rows)) {
    table_ = register_module("table", std::make_shared<nn::EmbeddingBag>(nn::EmbeddingBagOptions{
                                          .num_embeddings = rows,
                                          .embedding_dim = kDim,
                                          .mode = nn::EmbeddingBagMode::kSum,
                                          .generator = &gen_,
                                          .sparse = sparse}));
    head_ = register_module(
        "head", std::make_shared<nn::Linear>(nn::LinearOptions{
                    .in_features = kDim, .out_features = kClasses, .generator = &gen_}));
  }

  Tensor forward(const Tensor& ids) override {
    const Tensor h = table_->forward(ids);
    return add(matmul(h, head_->weight().clone().transpose(0, 1)), head_->bias().clone());
  }

 private:
  Generator gen_;
  std::shared_ptr<nn::EmbeddingBag> table_;
  std::shared_ptr<nn::Linear> head_;
};

using Host = dist_nn::ModuleHost<SparseModel>;

// This process's resident set and its peak, in bytes (/proc/self/status).
struct Memory {
  double rss = 0;
  double hwm = 0;
};

Memory memory() {
  std::ifstream in("/proc/self/status");
  Memory m;
  bool rss = false, hwm = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream is(line);
    std::string key;
    double kb = 0;
    is >> key >> kb;
    if (key == "VmRSS:") {
      m.rss = kb * 1024;
      rss = true;
    } else if (key == "VmHWM:") {
      m.hwm = kb * 1024;
      hwm = true;
    }
  }
  expect(rss && hwm, "/proc/self/status has no VmRSS or VmHWM");
  return m;
}

// Resets VmHWM to the current RSS (Linux 4.0 and later).
void reset_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  expect(static_cast<bool>(out), "cannot reset the peak RSS through /proc/self/clear_refs");
}

struct Batch {
  Tensor ids;     // [kBatch, kBag] int64
  Tensor labels;  // [kBatch] int64
};

// kBatches batches for a table of `rows` (see the file comment for the two kinds of ids).
std::vector<Batch> make_batches(int64_t rows, Ids kind, std::mt19937_64& rng) {
  std::vector<int64_t> by_class[kClasses];
  if (kind == kHotIds) {
    for (int64_t k = 0; k < kHot; ++k) {
      const int64_t start = k * rows / kHot, end = (k + 1) * rows / kHot;
      const int64_t row = start + static_cast<int64_t>(rng() % uint64_t(end - start));
      by_class[row % kClasses].push_back(row);
    }
    expect(!by_class[0].empty() && !by_class[1].empty(), "a hot set without both classes");
  }
  std::vector<Batch> batches;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<int64_t> ids, labels;
    for (int64_t s = 0; s < kBatch; ++s) {
      const int64_t y = static_cast<int64_t>(rng() % kClasses);
      labels.push_back(y);
      for (int64_t j = 0; j < kBag; ++j) {
        if (kind == kHotIds) {
          const auto& rows_of_y = by_class[y];
          ids.push_back(rows_of_y[rng() % rows_of_y.size()]);
        } else {
          ids.push_back(kClasses * static_cast<int64_t>(rng() % uint64_t(rows / kClasses)) + y);
        }
      }
    }
    batches.push_back({tensor<int64_t>(ids, {kBatch, kBag}), tensor<int64_t>(labels)});
  }
  return batches;
}

// What rank 0 returns: kPerTable values for each table, then kGlobal values.
enum PerTable : size_t {
  kHotMs,        // median over the trainers of their median hot step
  kUniformMs,    // the same, uniform ids (-1: not timed)
  kHotMinMs,     // the faster trainer's median hot step
  kHotMaxMs,     // the slower one's
  kForwardMs,    // the same median of the hot steps' context + forward call
  kRssBefore,    // before the table was made
  kRssMade,      // after
  kMadePeak,     // the peak while it was made
  kRssFirst,     // after both trainers' first step on it (their Adagrad sums made)
  kCacheFreed,   // host cache bytes emptied after making it (the initialisation's blocks)
  kMakeSeconds,  // making it (the N(0, 1) initialisation mostly)
  kLossFirst,    // the trainers' mean loss over their first kCheck steps
  kLossLast,     // ... over their last kCheck timed hot steps
  kPerTable
};
// Each trainer's figures per table: median hot step, median uniform step (-1: none), mean
// loss of its first kCheck steps, of its last kCheck timed hot steps, median hot forward.
constexpr size_t kTrainerFigures = 5;
enum Global : size_t {
  kRssBase,     // the server's RSS before any table
  kRssMadeAll,  // after every table was made
  kRssSteady,   // after every table's first steps
  kPeakSteps,   // the peak over the warm-up and timed steps
  kRssEnd,      // after them
  kCachedEnd,   // host cache bytes then
  kGlobal
};

std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank, const RunSpec& run) {
  set_num_threads(kThreads);
  const size_t tables = run.rows.size();
  auto slots = std::make_shared<std::vector<Future<RRef<Host>>>>(tables);
  rpc::Registry reg;
  dist_nn::register_remote_module<SparseModel>(reg, "SparseModel")
      .ctor<int64_t, bool>()
      .forward_parameters(dist_nn::ForwardParameters::kShared);
  reg.def("model", [slots](int64_t i) {
    if (i < 0 || static_cast<size_t>(i) >= slots->size())
      throw InvalidArgument("ps sparse bench: no model " + std::to_string(i) + " (the server has " +
                            std::to_string(slots->size()) + ")");
    return (*slots)[static_cast<size_t>(i)];
  });
  reg.def("ping", [] { return int64_t{0}; });
  rpc::AgentOptions options = rank_agent_options(reg);
  options.num_worker_threads = kPoolThreads;
  const std::string name = rank == 0 ? "ps" : "trainer" + std::to_string(rank);
  auto agent = rpc::make_tensorpipe_agent(name, rank, 1 + kTrainers, store, options);
  std::vector<double> out;
  if (rank == 0) {
    out.assign(tables * kPerTable + kGlobal, 0);
    auto at = [&](size_t t, PerTable k) -> double& { return out[t * kPerTable + k]; };
    auto global = [&](Global k) -> double& { return out[tables * kPerTable + k]; };
    for (int k = 1; k <= kTrainers; ++k)
      expect(agent->rpc_sync<int64_t>("trainer" + std::to_string(k), "ping") == 0, "ping");
    {
      std::vector<dist_nn::RemoteModule<SparseModel>> models;
      global(kRssBase) = memory().rss;
      for (size_t t = 0; t < tables; ++t) {
        reset_peak();
        at(t, kRssBefore) = memory().rss;
        at(t, kMakeSeconds) = time_once(
            [&] { models.emplace_back(*agent, "ps", "SparseModel", run.rows[t], run.sparse); });
        // The initialisation's temporaries, kept by the host block cache, are not the
        // table's: they go back to the system before the table's RSS is read.
        at(t, kCacheFreed) = double(host_cache_stats().cached_bytes);
        empty_host_cache();
        const Memory made = memory();
        at(t, kRssMade) = made.rss;
        at(t, kMadePeak) = made.hwm;
        (*slots)[t].set_value(models.back().module_rref());
      }
      global(kRssMadeAll) = memory().rss;
      store->set("made", "1");
      for (size_t t = 0; t < tables; ++t) {
        store->wait({"stepped" + std::to_string(t)}, 300s);
        at(t, kRssFirst) = memory().rss;
        store->set("measured" + std::to_string(t), "1");
      }
      reset_peak();
      global(kRssSteady) = memory().rss;
      store->set("steady", "1");
      std::vector<std::vector<double>> results;
      for (int k = 1; k <= kTrainers; ++k) {
        std::istringstream is(store->get_string("result" + std::to_string(k), 300s));
        std::vector<double> r;
        for (double v; is >> v;)
          r.push_back(v);
        expect(r.size() == kTrainerFigures * tables, "trainer" + std::to_string(k) + " returned " +
                                                         std::to_string(r.size()) + " figures");
        results.push_back(std::move(r));
      }
      const Memory end = memory();
      global(kPeakSteps) = end.hwm;
      global(kRssEnd) = end.rss;
      global(kCachedEnd) = double(host_cache_stats().cached_bytes);
      for (size_t t = 0; t < tables; ++t) {
        std::vector<double> hot, uniform, forward;
        at(t, kLossFirst) = at(t, kLossLast) = 0;
        for (const auto& r : results) {
          const size_t k = kTrainerFigures * t;
          hot.push_back(r[k]);
          uniform.push_back(r[k + 1]);
          at(t, kLossFirst) += r[k + 2] / kTrainers;
          at(t, kLossLast) += r[k + 3] / kTrainers;
          forward.push_back(r[k + 4]);
        }
        at(t, kHotMs) = median(hot) * 1e3;
        at(t, kUniformMs) = run.uniform ? median(uniform) * 1e3 : -1;
        at(t, kForwardMs) = median(forward) * 1e3;
        at(t, kHotMinMs) = *std::min_element(hot.begin(), hot.end()) * 1e3;
        at(t, kHotMaxMs) = *std::max_element(hot.begin(), hot.end()) * 1e3;
      }
      std::vector<std::string> keys;
      for (int k = 1; k <= kTrainers; ++k)
        keys.push_back("idle" + std::to_string(k));
      store->wait(keys, 120s);
      // Only the server's own references to its models are left.
      expect(rref::wait_owned_values(*agent, static_cast<int64_t>(tables), 60s),
             "references left on the server");
    }
  } else {
    std::mt19937_64 rng(static_cast<uint64_t>(100 + rank));
    std::vector<std::vector<Batch>> data[2];
    for (int64_t rows : run.rows) {
      data[kHotIds].push_back(make_batches(rows, kHotIds, rng));
      data[kUniformIds].push_back(run.uniform ? make_batches(rows, kUniformIds, rng)
                                              : std::vector<Batch>{});
    }
    store->wait({"made"}, 300s);
    std::ostringstream os;
    os.precision(17);
    {
      std::vector<dist_nn::RemoteModule<SparseModel>> models;
      std::vector<std::unique_ptr<dist_optim::DistributedOptimizer>> optimizers;
      for (size_t t = 0; t < tables; ++t) {
        models.emplace_back(agent->rpc_sync<RRef<Host>>("ps", "model", static_cast<int64_t>(t)));
        optimizers.push_back(std::make_unique<dist_optim::DistributedOptimizer>(
            *agent, optim::AdagradOptions{.lr = kLr}, models.back().remote_parameters(),
            dist_optim::TrainerGroup{.name = "table" + std::to_string(t), .trainers = kTrainers}));
      }
      double forward_s = 0;  // the last step's context + forward call
      auto step = [&](size_t t, Ids kind, int i) {
        const Batch& b = data[kind][t][static_cast<size_t>(i % kBatches)];
        Tensor loss;
        {
          const auto start = std::chrono::steady_clock::now();
          dist_autograd::Context ctx(*agent);
          const Tensor logits = models[t].forward(b.ids);
          forward_s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          loss = nn::cross_entropy(logits, b.labels);
          optimizers[t]->backward_and_step(ctx.id(), {loss});
        }
        return loss.item<double>();
      };
      auto barrier = [&](const std::string& key) {
        if (store->add(key, 1) == kTrainers) store->set(key + "/go", "1");
        store->wait({key + "/go"}, 300s);
      };
      std::vector<std::vector<double>> losses(tables);  // hot steps, in order
      for (size_t t = 0; t < tables; ++t) {
        losses[t].push_back(step(t, kHotIds, 0));
        const std::string key = std::to_string(t);
        if (store->add("first" + key, 1) == kTrainers) store->set("stepped" + key, "1");
        store->wait({"measured" + key}, 300s);
      }
      store->wait({"steady"}, 300s);
      for (size_t t = 0; t < tables; ++t) {
        for (int i = 1; i <= run.warmup; ++i)
          losses[t].push_back(step(t, kHotIds, i));
      }
      const size_t untimed = static_cast<size_t>(1 + run.warmup);
      std::vector<std::vector<double>> times[2];
      times[kHotIds].resize(tables);
      times[kUniformIds].resize(tables);
      std::vector<std::vector<double>> forward_times(tables);
      for (int block = 0; block < run.blocks; ++block) {
        for (size_t t = 0; t < tables; ++t) {
          for (Ids kind : {kHotIds, kUniformIds}) {
            if (kind == kUniformIds && !run.uniform) continue;
            barrier("block" + std::to_string(block) + "/" + std::to_string(t) + "/" +
                    std::to_string(int(kind)));
            for (int i = 0; i < run.block_steps; ++i) {
              const int n = 1 + run.warmup + block * run.block_steps + i;
              double loss = 0;
              times[kind][t].push_back(time_once([&] { loss = step(t, kind, n); }));
              if (kind == kHotIds) forward_times[t].push_back(forward_s);
              if (kind == kHotIds) losses[t].push_back(loss);
            }
          }
        }
      }
      for (size_t t = 0; t < tables; ++t) {
        const auto& l = losses[t];
        const size_t head = std::min<size_t>(kCheck, untimed);
        const size_t tail = std::min<size_t>(kCheck, l.size() - untimed);
        double first = 0, last = 0;
        for (size_t i = 0; i < head; ++i)
          first += l[i] / double(head);
        for (size_t i = l.size() - tail; i < l.size(); ++i)
          last += l[i] / double(tail);
        expect(last < first, name + "'s loss at " + std::to_string(run.rows[t]) +
                                 " rows did not go down (" + std::to_string(first) + " -> " +
                                 std::to_string(last) + ")");
        os << median(times[kHotIds][t]) << ' '
           << (run.uniform ? median(times[kUniformIds][t]) : -1.0) << ' ' << first << ' ' << last
           << ' ' << median(forward_times[t]) << ' ';
      }
    }
    rref::wait_idle(*agent, 60s);
    store->set("result" + std::to_string(rank), std::string_view(os.str()));
    store->set("idle" + std::to_string(rank), "1");
  }
  agent->shutdown();
  return out;
}

std::vector<double> run_ranks(uint16_t port, const RunSpec& run) {
  const std::vector<double> r = run_rank_processes(
      port, "ps_sparse_" + run.name, 1 + kTrainers,
      [&run](std::shared_ptr<c10d::Store> store, int rank) {
        return rank_body(std::move(store), rank, run);
      },
      "ps sparse (" + run.name + ")");
  expect(
      r.size() == run.rows.size() * kPerTable + kGlobal,
      "the server of the " + run.name + " run returned " + std::to_string(r.size()) + " figures");
  return r;
}

size_t index_of(const RunSpec& run, int64_t rows) {
  const auto it = std::find(run.rows.begin(), run.rows.end(), rows);
  expect(it != run.rows.end(), "no table of " + std::to_string(rows) + " rows");
  return static_cast<size_t>(it - run.rows.begin());
}

double table_bytes(int64_t rows) {
  return double(rows) * kDim * 4;
}

std::string rows_key(int64_t rows) {
  return std::to_string(rows);
}

void common_params(Figure& f) {
  f.params.push_back(
      {"model",
       "on ps: nn::EmbeddingBag(rows, 64, sum, sparse) -> nn::Linear(64, 2) (through a copy of "
       "its parameters taken at the forward's start), float32, one dist_nn::RemoteModule "
       "(kShared: forward on the table itself)"});
  f.params.push_back({"batch", double(kBatch)});
  f.params.push_back({"ids_per_sample", double(kBag)});
  f.params.push_back({"dim", double(kDim)});
  f.params.push_back({"trainers", double(kTrainers)});
  f.params.push_back(
      {"step",
       "dist_autograd::Context; logits = model.forward(ids) (RemoteModule on ps); "
       "nn::cross_entropy; DistributedOptimizer(Adagrad lr 0.1).backward_and_step(ctx, {loss}); "
       "loss.item()"});
  f.params.push_back(
      {"ids",
       "hot: 4 ids per sample drawn uniformly from a fixed hot set of 8192 rows (one at a "
       "pseudo-random place in each of 8192 equal stretches of the table), about 970 distinct "
       "rows per batch at every size; the label is the rows' parity"});
  f.params.push_back({"workers",
                      "3 processes on 127.0.0.1: ps + 2 trainers stepping at once (TensorPipe "
                      "agent, 8 pool threads, one intra-op thread each)"});
}

const Register ps_sparse_bench(
    {"ps.sparse_step_ms", "ps.sparse_rss_growth_mb", "ps.sparse_vs_dense", "ps.sparse_vs_pytorch"},
    [](const auto& emit) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
      const std::vector<double> sparse = run_ranks(server.port(), kSparseRun);
      const std::vector<double> dense = run_ranks(server.port(), kDenseRun);
      std::string why, rows_list;
      for (int64_t rows : kPytorchRows)
        rows_list += (rows_list.empty() ? "" : ",") + std::to_string(rows);
      const std::string n = std::to_string(kThreads);
      auto peer = run_pytorch_peer(
          "ps_sparse_peer.py",
          n + " " + std::to_string(kPoolThreads) + " " + std::to_string(kTrainers) + " " +
              std::to_string(kSparseRun.warmup) + " " + std::to_string(kSparseRun.blocks) + " " +
              std::to_string(kSparseRun.block_steps) + " " + std::to_string(kBatches) + " " +
              rows_list,
          "OMP_NUM_THREADS=" + n + " OPENBLAS_NUM_THREADS=" + n, why);
      if (peer && peer->seconds.size() != kPytorchRows.size()) {
        why = "the peer printed " + std::to_string(peer->seconds.size()) + " figures";
        peer.reset();
      }

      const size_t tables = kSparseRun.rows.size();
      auto at = [](const std::vector<double>& r, size_t t, PerTable k) {
        return r[t * kPerTable + k];
      };
      auto global = [](const std::vector<double>& r, size_t tables, Global k) {
        return r[tables * kPerTable + k];
      };
      const size_t base = index_of(kSparseRun, kBaseRows);
      const double base_ms = at(sparse, base, kHotMs);
      const double base_uniform_ms = at(sparse, base, kUniformMs);
      const std::string statistic = "the median over the 2 trainers of each one's median step; " +
                                    std::to_string(kSparseRun.blocks * kSparseRun.block_steps) +
                                    " timed steps per trainer and table in " +
                                    std::to_string(kSparseRun.blocks) + " blocks of " +
                                    std::to_string(kSparseRun.block_steps) +
                                    " alternating over the tables (and the kinds of ids), after " +
                                    std::to_string(1 + kSparseRun.warmup) + " untimed";

      // ps.sparse_step_ms, one per table size.
      for (size_t t = 0; t < tables; ++t) {
        const int64_t rows = kSparseRun.rows[t];
        Figure f{"ps.sparse_step_ms", at(sparse, t, kHotMs), "ms", {}};
        f.params.push_back({"rows", double(rows)});
        common_params(f);
        f.params.push_back({"optimizer", "Adagrad lr 0.1, sparse-rows gradients"});
        f.params.push_back({"statistic", statistic});
        f.params.push_back({"trainer_min_ms", at(sparse, t, kHotMinMs)});
        f.params.push_back({"trainer_max_ms", at(sparse, t, kHotMaxMs)});
        f.params.push_back({"forward_ms", at(sparse, t, kForwardMs)});
        f.params.push_back(
            {"backward_and_step_ms", at(sparse, t, kHotMs) - at(sparse, t, kForwardMs)});
        f.params.push_back({"phases",
                            "diagnostic: forward_ms, the median context + forward call (the "
                            "lookup on ps); backward_and_step_ms, the step less it "
                            "(cross-entropy, dist_autograd's backward, the server's Adagrad "
                            "step, the context's end)"});
        f.params.push_back({"baseline_rows", double(kBaseRows)});
        f.params.push_back({"baseline_step_ms", base_ms});
        f.params.push_back({"ratio", at(sparse, t, kHotMs) / base_ms});
        if (rows == kSparseRun.rows.back()) f.params.push_back({"target_ratio_max", 1.25});
        f.params.push_back({"uniform_step_ms", at(sparse, t, kUniformMs)});
        f.params.push_back({"uniform_ratio", at(sparse, t, kUniformMs) / base_uniform_ms});
        f.params.push_back(
            {"uniform",
             "diagnostic: the same steps with ids drawn uniformly from the whole table (about "
             "1020 distinct rows per batch, cache and TLB misses on a large table), blocks "
             "alternating with the hot ones; uniform_ratio: over the uniform step at " +
                 std::to_string(kBaseRows) + " rows"});
        f.params.push_back({"table_mb", table_bytes(rows) / kMiB});
        f.params.push_back({"make_s", at(sparse, t, kMakeSeconds)});
        f.params.push_back({"make",
                            "making the table on the server: nn::EmbeddingBag's N(0, 1) "
                            "initialisation (init::normal_), seeded"});
        f.params.push_back({"loss_first", at(sparse, t, kLossFirst)});
        f.params.push_back({"loss_last", at(sparse, t, kLossLast)});
        emit(f);
      }

      // ps.sparse_rss_growth_mb: the server's memory.
      double tables_bytes = 0;
      for (int64_t rows : kSparseRun.rows)
        tables_bytes += table_bytes(rows);
      const double state_bytes = tables_bytes;  // one Adagrad sum per table (the group's)
      const double expected_mb = (tables_bytes + state_bytes) / kMiB;
      const double growth_mb =
          (global(sparse, tables, kPeakSteps) - global(sparse, tables, kRssBase)) / kMiB;
      const double step_growth_mb =
          (global(sparse, tables, kPeakSteps) - global(sparse, tables, kRssSteady)) / kMiB;
      const bool rss_ok = growth_mb <= expected_mb + kSlackMiB && step_growth_mb <= kSlackMiB;
      {
        Figure f{"ps.sparse_rss_growth_mb", growth_mb, "MiB", {}};
        f.params.push_back(
            {"measure",
             "the server's peak RSS (VmHWM) over the warm-up and timed steps of the sparse run "
             "less its RSS before any table was made (its agent running)"});
        f.params.push_back({"tables_mb", tables_bytes / kMiB});
        f.params.push_back({"state_mb", state_bytes / kMiB});
        f.params.push_back({"state",
                            "Adagrad's sums: one per table (the trainers' TrainerGroup shares "
                            "one optimizer on the server), each the table's size"});
        f.params.push_back({"expected_mb", expected_mb});
        f.params.push_back({"over_expected_mb", growth_mb - expected_mb});
        f.params.push_back({"target_over_expected_max_mb", kSlackMiB});
        f.params.push_back({"step_growth_mb", step_growth_mb});
        f.params.push_back(
            {"step_growth",
             "the peak over the warm-up and timed steps less the RSS after every table's first "
             "steps (its Adagrad sums made): what the steps themselves allocate"});
        f.params.push_back({"target_step_growth_max_mb", kSlackMiB});
        for (size_t t = 0; t < tables; ++t) {
          const std::string key = "rows_" + rows_key(kSparseRun.rows[t]);
          f.params.push_back(
              {key + "_made_mb", (at(sparse, t, kRssMade) - at(sparse, t, kRssBefore)) / kMiB});
          f.params.push_back({key + "_creation_peak_mb",
                              (at(sparse, t, kMadePeak) - at(sparse, t, kRssBefore)) / kMiB});
          const double before_first =
              t == 0 ? global(sparse, tables, kRssMadeAll) : at(sparse, t - 1, kRssFirst);
          f.params.push_back(
              {key + "_first_step_mb", (at(sparse, t, kRssFirst) - before_first) / kMiB});
          f.params.push_back({key + "_init_cache_mb", at(sparse, t, kCacheFreed) / kMiB});
        }
        f.params.push_back(
            {"per_table",
             "rows_N_made_mb: RSS growth making the table (expected: its size), after the host "
             "block cache gave back the initialisation's temporaries (rows_N_init_cache_mb); "
             "rows_N_creation_peak_mb: the peak while making it, over the RSS before "
             "(nn::init::normal_ draws float64 and scales out of place); "
             "rows_N_first_step_mb: growth at both trainers' first step on it (the first "
             "steps come after every table is made; expected: 2 Adagrad sums of its size)"});
        f.params.push_back({"rss_end_mb", global(sparse, tables, kRssEnd) / kMiB});
        f.params.push_back({"host_cache_end_mb", global(sparse, tables, kCachedEnd) / kMiB});
        f.params.push_back({"rss_check", rss_ok ? "passed" : "failed"});
        emit(f);
      }

      // ps.sparse_vs_dense at 10^6 rows (and 10^4 as a diagnostic).
      {
        const size_t s = index_of(kSparseRun, kCompareRows), d = index_of(kDenseRun, kCompareRows);
        const size_t s0 = index_of(kSparseRun, kBaseRows), d0 = index_of(kDenseRun, kBaseRows);
        const double ratio = at(dense, d, kHotMs) / at(sparse, s, kHotMs);
        Figure f{"ps.sparse_vs_dense", ratio, "x", {}};
        f.params.push_back({"rows", double(kCompareRows)});
        common_params(f);
        f.params.push_back({"dense_step_ms", at(dense, d, kHotMs)});
        f.params.push_back({"sparse_step_ms", at(sparse, s, kHotMs)});
        f.params.push_back({"ratio", ratio});
        f.params.push_back({"target_ratio_min", 5.0});
        f.params.push_back({"dense_step_ms_" + rows_key(kBaseRows), at(dense, d0, kHotMs)});
        f.params.push_back(
            {"ratio_" + rows_key(kBaseRows), at(dense, d0, kHotMs) / at(sparse, s0, kHotMs)});
        f.params.push_back(
            {"dense",
             "the same model with .sparse = false (a gradient of the table's size, and a dense "
             "Adagrad step over the whole table, every step), in its own 3 processes: " +
                 std::to_string(kDenseRun.blocks * kDenseRun.block_steps) +
                 " timed steps per trainer and table in " + std::to_string(kDenseRun.blocks) +
                 " blocks alternating over 10^4 and 10^6 rows, after " +
                 std::to_string(1 + kDenseRun.warmup) +
                 " untimed; the sparse step is "
                 "ps.sparse_step_ms's"});
        const size_t dt = kDenseRun.rows.size();
        f.params.push_back(
            {"dense_step_growth_mb",
             (global(dense, dt, kPeakSteps) - global(dense, dt, kRssSteady)) / kMiB});
        f.params.push_back({"dense_step_growth",
                            "diagnostic: the dense run's server peak RSS over its steps less "
                            "its RSS after the first steps (the per-step gradients)"});
        emit(f);
      }

      // ps.sparse_vs_pytorch at 10^6 rows (and 10^4 as a diagnostic).
      {
        const size_t s = index_of(kSparseRun, kCompareRows);
        auto theirs_ms = [&](int64_t rows) {
          if (!peer) return nan;
          const auto it = std::find(kPytorchRows.begin(), kPytorchRows.end(), rows);
          return peer->seconds[static_cast<size_t>(it - kPytorchRows.begin())] * 1e3;
        };
        const double ratio = theirs_ms(kCompareRows) / at(sparse, s, kHotMs);
        Figure f{"ps.sparse_vs_pytorch", ratio, "x", {}};
        f.params.push_back({"rows", double(kCompareRows)});
        common_params(f);
        f.params.push_back({"step_ms", at(sparse, s, kHotMs)});
        f.params.push_back({"pytorch_step_ms", theirs_ms(kCompareRows)});
        f.params.push_back({"ratio", ratio});
        f.params.push_back({"target_ratio_min", 3.0});
        f.params.push_back({"step_ms_" + rows_key(kBaseRows), base_ms});
        f.params.push_back({"pytorch_step_ms_" + rows_key(kBaseRows), theirs_ms(kBaseRows)});
        f.params.push_back({"ratio_" + rows_key(kBaseRows), theirs_ms(kBaseRows) / base_ms});
        const int64_t top = kSparseRun.rows.back();
        const double top_ms = at(sparse, index_of(kSparseRun, top), kHotMs);
        f.params.push_back({"step_ms_" + rows_key(top), top_ms});
        f.params.push_back({"pytorch_step_ms_" + rows_key(top), theirs_ms(top)});
        f.params.push_back({"ratio_" + rows_key(top), theirs_ms(top) / top_ms});
        f.params.push_back({"pytorch_scale_ratio", theirs_ms(top) / theirs_ms(kBaseRows)});
        f.params.push_back({"pytorch_scale", "diagnostic: PyTorch's step at " + rows_key(top) +
                                                 " rows over its step at " + rows_key(kBaseRows) +
                                                 " (ps.sparse_step_ms's ratio, for PyTorch)"});
        if (peer) {
          f.params.push_back(
              {"pytorch",
               "torch " + peer->torch_version +
                   " nn.EmbeddingBag(rows, 64, mode='sum', sparse=True) + nn.Linear(64, 2) on ps "
                   "(rpc.remote), model_rref.rpc_sync().forward + dist_autograd.backward + "
                   "DistributedOptimizer(optim.Adagrad, lr=0.1).step, TensorPipe agent, the same "
                   "blocks, ids and statistic, its own 3 processes after ours"});
        } else {
          f.params.push_back({"pytorch", "unavailable"});
          f.params.push_back({"pytorch_reason", why});
        }
        emit(f);
      }
      expect(rss_ok,
             "the server's RSS grew " + std::to_string(growth_mb) +
                 " MiB over the steps (tables and Adagrad sums: " + std::to_string(expected_mb) +
                 " MiB; the steps themselves: " + std::to_string(step_growth_mb) + " MiB; slack " +
                 std::to_string(kSlackMiB) + " MiB)");
    });

}  // namespace
}  // namespace gradwire::bench
