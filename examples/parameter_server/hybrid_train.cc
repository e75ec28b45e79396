// hybrid_train: a parameter server and data parallelism in one model — PyTorch's "combining
// DDP with the RPC framework" design, in C++. An embedding table lives on the server, a
// RemoteModule (dist_nn/); the dense layers are replicated on the trainers and kept in step by DDP
// among them. One dist_autograd context and one backward carry gradients both to the
// remote embedding (through the recorded remote call) and into DDP's all-reduce (through
// its hooks: the Reducer reads the context's gradients and writes their averages back
// before the pass ends, ddp/reducer.h); DistributedOptimizers then step the embedding on the
// server and each trainer's own dense replica. The table's gradient is sparse rows (only the
// ids a batch used travel and are stepped, by SparseAdam on the server; docs/sparse.md) unless
// --dense-table, which steps it densely with Adam like the dense layers.
//
//   gradwire-run --nproc-per-node 3 gradwire-hybrid-train [--epochs N] [--min-accuracy A]
//       [--ddp-options default|bucket-view|find-unused|static-graph] [--backend cpu|shm|gloo]
//       [--dense-table]
// --ddp-options picks the DDP's options: PyTorch's defaults (the default), bucket views
// (gradient_as_bucket_view), find_unused_parameters, or static_graph. The dense part has a
// second, "shortcut" linear layer beside the MLP; under find-unused it takes part in
// every other batch, alternating between the trainers (so at each step one trainer does
// not use it), and under static-graph on the first trainer only; otherwise always.
// Rank 0 is the server "ps0"; ranks 1..T are trainers, which form a process group of their
// own for DDP: --backend cpu (the default) makes it over shared memory when the trainers
// share a host and a network namespace and over Gloo otherwise (c10d::make_process_group),
// shm and gloo force one. The task: bags of 4 token ids out of 40; the label is the class whose
// hidden per-token scores sum highest (an embedding and a linear layer can learn it). Each
// trainer prints one line per epoch; at the end the trainers check that their dense
// replicas are identical and that the held-out accuracy reaches --min-accuracy.
// --trace DIR: every process records trace spans (docs/observability.md) and writes
// DIR/<worker>.trace.json at exit, as GRADWIRE_TRACE=DIR does; each trainer's batch is one
// span "step" (category train, argument step: 1, 2, ... over the whole run) with spans
// train.forward, train.backward and train.optimizer inside it.
#include <gradwire/core/trace.h>
#include <gradwire/gradwire.h>
#include <gradwire/tensor/parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../common/args.h"

using namespace gradwire;
using rref::RRef;

namespace {

constexpr int64_t kVocabulary = 40;
constexpr int64_t kBagLength = 4;
constexpr int64_t kDim = 16;
constexpr int64_t kClasses = 3;

enum class DdpMode { kDefault, kBucketView, kFindUnused, kStaticGraph };

struct Options {
  int epochs = 12;
  int64_t batch = 32;
  double min_accuracy = 0.85;
  DdpMode ddp = DdpMode::kDefault;
  std::string trace;            // --trace DIR: trace files written there at exit
  std::string backend = "cpu";  // --backend: the trainers' DDP group
  bool dense_table = false;     // --dense-table: the table's gradient dense, stepped by Adam
};

DdpMode parse_ddp_mode(const std::string& text) {
  if (text == "default") return DdpMode::kDefault;
  if (text == "bucket-view") return DdpMode::kBucketView;
  if (text == "find-unused") return DdpMode::kFindUnused;
  if (text == "static-graph") return DdpMode::kStaticGraph;
  throw InvalidArgument("--ddp-options=\"" + text +
                        "\" is invalid: expected default, bucket-view, find-unused or "
                        "static-graph");
}

ddp::DdpOptions ddp_options(DdpMode mode) {
  switch (mode) {
    case DdpMode::kBucketView:
      return {.gradient_as_bucket_view = true};
    case DdpMode::kFindUnused:
      return {.find_unused_parameters = true};
    case DdpMode::kStaticGraph:
      return {.static_graph = true};
    case DdpMode::kDefault:
      break;
  }
  return {};
}

// Whether trainer `trainer` (1-based) uses the shortcut layer in batch `batch`.
bool uses_shortcut(DdpMode mode, int trainer, int64_t batch) {
  switch (mode) {
    case DdpMode::kFindUnused:
      return (batch + trainer) % 2 == 0;
    case DdpMode::kStaticGraph:
      return trainer == 1;
    default:
      return true;
  }
}

// The trainers' dense part: an MLP and a linear shortcut whose logits are added.
class Dense : public nn::Module {
 public:
  explicit Dense(Generator* gen) : Module("Dense") {
    mlp = register_module("mlp", std::make_shared<nn::MLP>(nn::MLPOptions{
                                     .sizes = {kDim, 32, kClasses}, .generator = gen}));
    shortcut = register_module(
        "shortcut", std::make_shared<nn::Linear>(nn::LinearOptions{
                        .in_features = kDim, .out_features = kClasses, .generator = gen}));
  }
  Tensor forward(const Tensor& x, bool with_shortcut) {
    Tensor out = mlp->forward(x);
    return with_shortcut ? add(out, shortcut->forward(x)) : out;
  }
  std::shared_ptr<nn::MLP> mlp;
  std::shared_ptr<nn::Linear> shortcut;
};

Options parse_args(int argc, char** argv) {
  Options o;
  examples::Args args(argc, argv,
                      "--epochs N, --batch B, --min-accuracy A, "
                      "--ddp-options default|bucket-view|find-unused|static-graph, --trace DIR, "
                      "--backend cpu|shm|gloo, --dense-table");
  while (args.next()) {
    if (args.is("--epochs")) {
      o.epochs = static_cast<int>(args.integer(1, 100000));
    } else if (args.is("--batch")) {
      o.batch = args.integer(1, 1 << 20);
    } else if (args.is("--min-accuracy")) {
      o.min_accuracy = args.number(0.0, 1.0);
    } else if (args.is("--ddp-options")) {
      o.ddp = parse_ddp_mode(args.value());
    } else if (args.is("--trace")) {
      o.trace = args.non_empty("a directory");
    } else if (args.is("--backend")) {
      o.backend = args.one_of({"cpu", "shm", "gloo"});
    } else if (args.is("--dense-table")) {
      o.dense_table = true;
    } else {
      args.unknown();
    }
  }
  return o;
}

// `n` bags and their labels, from a fixed hidden score table (the same on every process).
std::pair<Tensor, Tensor> bags(int64_t n, Generator& gen) {
  Generator table_gen(11);
  const Tensor scores = randn({kVocabulary, kClasses}, &table_gen);
  const Tensor ids = randint(0, kVocabulary, {n, kBagLength}, &gen);
  const Tensor total =
      sum(index_select(scores, 0, ids.reshape({n * kBagLength})).reshape({n, kBagLength, kClasses}),
          Shape{1});
  auto [best, label] = max(total, 1);
  return {ids, label};
}

// The embedding table, on the server: a RemoteModule<nn::EmbeddingBag> (mean of each bag's
// rows: ids [B, L] -> [B, kDim]). A lookup copies only the rows it uses and its backward
// does not need the table, so forward runs on the table itself, never a copy of it
// (dist_nn::ForwardParameters::kShared, the default for lookup tables).
std::shared_ptr<nn::EmbeddingBag> make_table(int64_t seed, bool sparse) {
  auto table = std::make_shared<nn::EmbeddingBag>(nn::EmbeddingBagOptions{
      .num_embeddings = kVocabulary, .embedding_dim = kDim, .sparse = sparse});
  Generator gen(static_cast<uint64_t>(seed));
  table->reset_parameters(&gen);
  return table;
}

struct ServerSlot {
  Future<RRef<dist_nn::ModuleHost<nn::EmbeddingBag>>> table;
};

void register_all(rpc::Registry& reg, const std::shared_ptr<ServerSlot>& slot) {
  dist_nn::register_remote_module<nn::EmbeddingBag>(reg, "EmbeddingTable")
      .ctor<int64_t, bool>(&make_table);
  reg.def("embedding_table", [slot] { return slot->table; });
}

int run_trainer(rpc::RpcAgent& agent, const std::shared_ptr<c10d::Store>& store, int trainer,
                int trainers, const Options& opt) {
  const std::string me = agent.worker_info().name;
  // The trainers' own group, for DDP.
  auto group = c10d::make_process_group(
      opt.backend, std::make_shared<c10d::PrefixStore>("hybrid/ddp", store), trainer - 1, trainers,
      {.timeout = std::chrono::seconds(60), .name = "hybrid-ddp"});
  if (trainer == 1) {
    std::printf("%s: DDP among %d trainers over the %s backend\n", me.c_str(), trainers,
                std::string(group->backend_name()).c_str());
  }
  Generator init_gen(static_cast<uint64_t>(20 + trainer));  // different on purpose: DDP
  auto dense = std::make_shared<Dense>(&init_gen);          // broadcasts rank 0's
  ddp::DistributedDataParallel model(dense, group, ddp_options(opt.ddp));

  const dist_nn::RemoteModule<nn::EmbeddingBag> table(
      agent.rpc_sync<RRef<dist_nn::ModuleHost<nn::EmbeddingBag>>>("ps0", "embedding_table"));
  // Adam for the dense replica (and a dense table); SparseAdam for a sparse table's rows.
  std::vector<RRef<Tensor>> params;
  for (const Tensor& p : dense->parameters())
    params.push_back(rref::make_local(agent, p));
  std::unique_ptr<dist_optim::DistributedOptimizer> table_optimizer;
  if (opt.dense_table) {
    for (auto& p : table.remote_parameters())
      params.push_back(std::move(p));
  } else {
    table_optimizer = std::make_unique<dist_optim::DistributedOptimizer>(
        agent, optim::SparseAdamOptions{.lr = 0.02}, table.remote_parameters());
  }
  dist_optim::DistributedOptimizer optimizer(agent, optim::AdamOptions{.lr = 0.02}, params);

  Generator data_gen(5);
  auto [all_x, all_y] = bags(1200, data_gen);
  auto [test_x, test_y] = bags(400, data_gen);
  // Each trainer's share, the same number of batches on each (DDP steps together).
  ddp::DistributedSampler sampler({.dataset_size = all_x.size(0),
                                   .world_size = trainers,
                                   .rank = trainer - 1,
                                   .shuffle = true,
                                   .seed = 9});
  const auto start = std::chrono::steady_clock::now();
  double test_accuracy = 0;
  int64_t steps = 0;  // over the whole run: the trace's step numbers
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const Tensor mine = tensor<int64_t>(sampler.indices());
    double loss_sum = 0;
    int64_t seen = 0;
    for (int64_t b = 0; b < mine.size(0); b += opt.batch) {
      // The whole batch, the context's release at the end of the scope included.
      const trace::Span step("step", "train", trace::Arg("step", ++steps));
      const Tensor rows = mine.slice(0, b, b + opt.batch);
      const Tensor xb = index_select(all_x, 0, rows), yb = index_select(all_y, 0, rows);
      dist_autograd::Context ctx(agent);
      Tensor loss;
      {
        const trace::Span phase("train.forward", "train");
        Tensor embedded = table.forward(xb);
        const bool with_shortcut = uses_shortcut(opt.ddp, trainer, b / opt.batch);
        auto logits = model.forward_with([&](nn::Module&) {
          return std::vector<Tensor>{dense->forward(embedded, with_shortcut)};
        });
        loss = nn::cross_entropy(logits[0], yb);
      }
      {
        const trace::Span phase("train.backward", "train");
        dist_autograd::backward(agent, ctx.id(), {loss});
      }
      {
        const trace::Span phase("train.optimizer", "train");
        optimizer.step(ctx.id());
        if (table_optimizer) table_optimizer->step(ctx.id());
      }
      loss_sum += loss.item<double>() * static_cast<double>(xb.size(0));
      seen += xb.size(0);
    }
    {
      autograd::NoGradGuard no_grad;
      Tensor logits = dense->forward(table.forward(test_x), true);
      auto [best, predicted] = max(logits, 1);
      test_accuracy = mean(eq(predicted, test_y).to(kFloat32)).item<double>();
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s epoch %2d/%d  loss %.4f  test accuracy %.3f  %.2f s\n", me.c_str(), epoch,
                opt.epochs, loss_sum / static_cast<double>(seen), test_accuracy, elapsed);
    std::fflush(stdout);
  }
  // The dense replicas must be identical, every value of every parameter: DDP averaged the
  // same gradients on every trainer.
  std::vector<Tensor> flat;
  for (const Tensor& p : dense->parameters())
    flat.push_back(p.detach().reshape({-1}));
  const Tensor mine_all = cat(flat);
  std::vector<Tensor> all;
  for (int r = 0; r < trainers; ++r)
    all.push_back(zeros_like(mine_all));
  group->all_gather(all, mine_all).wait();
  for (int r = 1; r < trainers; ++r) {
    if (!equal(all[static_cast<size_t>(r)], all[0])) {
      const double gap = max(abs(sub(all[static_cast<size_t>(r)], all[0]))).item<double>();
      std::fprintf(stderr,
                   "%s: the dense replicas differ between trainers (trainer %d and trainer 1 "
                   "by up to %.3g)\n",
                   me.c_str(), r + 1, gap);
      return 1;
    }
  }
  std::printf("%s done: held-out accuracy %.3f; dense replicas identical on %d trainers\n",
              me.c_str(), test_accuracy, trainers);
  if (test_accuracy < opt.min_accuracy) {
    std::fprintf(stderr, "%s: held-out accuracy %.3f is below %.3f\n", me.c_str(), test_accuracy,
                 opt.min_accuracy);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse_args(argc, argv);
    // Files named after the worker (init_rpc names the process), written at exit.
    if (!opt.trace.empty()) trace::start(opt.trace);
    auto [store, rank, world] = c10d::rendezvous("env://");
    if (world < 3) throw InvalidArgument("hybrid_train needs a server and at least two trainers");
    auto slot = std::make_shared<ServerSlot>();
    register_all(rpc::registry(), slot);
    set_num_threads(1);  // several processes share this machine's cores
    rpc::AgentOptions options;
    options.rpc_timeout = std::chrono::seconds(60);
    options.store = std::make_shared<c10d::PrefixStore>("hybrid/rpc", store);
    const std::string name = rank == 0 ? "ps0" : "trainer" + std::to_string(rank);
    auto agent = rpc::init_rpc(name, rank, world, options);
    if (rank == 0) {
      const dist_nn::RemoteModule<nn::EmbeddingBag> table(*agent, "ps0", "EmbeddingTable",
                                                          int64_t{3}, !opt.dense_table);
      slot->table.set_value(table.module_rref());
      std::printf("ps0 serving the embedding table to %d trainers\n", world - 1);
      std::fflush(stdout);
      rpc::shutdown();
      return 0;
    }
    const int status = run_trainer(*agent, store, rank, world - 1, opt);
    rpc::shutdown();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybrid_train: %s\n", e.what());
    return 1;
  }
}
