// ddp/: DistributedDataParallel against single-process training of the same model on the
// concatenated batch (float64, 1e-10), no_sync accumulation, unused parameters, uneven
// inputs under Join, the communication hooks (fp16/bf16 within their precision, PowerSGD
// exact on gradients of rank <= its rank and its error feedback's invariant, a user hook),
// the cross-rank shape check, bucket rebuilding in arrival order and DistributedSampler.
// Ranks run as threads (a shared HashStore) and as forked processes (a FileStore) over Gloo.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "c10d/c10d_test_util.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/autograd/gradient_sink.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/core/error.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/ddp/ddp.h"
#include "gradwire/nn/nn.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/harness.h"

namespace gradwire::ddp {
namespace {

using namespace std::chrono_literals;
using c10d::ProcessGroup;

// kShmProcesses: processes over the shared-memory group (ProcessGroupShm).
enum class Mode { kThreads, kProcesses, kShmProcesses };
using Body = std::function<void(std::shared_ptr<ProcessGroup> group, int rank)>;

// kDetail makes every collective check that the ranks issued the same one (the same
// tensors' shapes and dtypes): a rank that packed its gradients while another passed them as
// a list would fail.
test::RankResults run_group(Mode mode, int world, const Body& body,
                            c10d::DebugLevel debug = c10d::DebugLevel::kOff) {
  c10d::ProcessGroupOptions options;
  options.timeout = 20s;
  options.debug_level = debug;
  const c10d::GlooOptions gloo{.host = "127.0.0.1"};
  if (mode == Mode::kThreads) {
    auto store = std::make_shared<c10d::HashStore>(20s);
    return test::run_ranks_as_threads(
        world,
        [&](int rank) {
          body(c10d::ProcessGroupGloo::create(store, rank, world, options, gloo), rank);
        },
        60s);
  }
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  return test::run_ranks_as_processes(
      world,
      [&](int rank) {
        auto store = std::make_shared<c10d::FileStore>(
            c10d::FileStoreOptions{.path = path, .num_workers = world, .timeout = 20s});
        if (mode == Mode::kShmProcesses) {
          body(c10d::ProcessGroupShm::create(store, rank, world, options, {.gloo = gloo}), rank);
        } else {
          body(c10d::ProcessGroupGloo::create(store, rank, world, options, gloo), rank);
        }
      },
      60s);
}

constexpr int64_t kIn = 5;
constexpr int64_t kHidden = 7;
constexpr int64_t kOut = 3;

// The model every test trains: 5-7-3 ReLU MLP in float64. `seed` only matters for the
// reference; DDP replicas are made equal by the constructor's broadcast.
std::shared_ptr<nn::MLP> make_mlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::MLP>(
      nn::MLPOptions{.sizes = {kIn, kHidden, kOut}, .dtype = kFloat64, .generator = &gen});
}

struct Batch {
  Tensor x;
  Tensor y;
};

// Rank `rank`'s batch number `step` (n rows): the same values whoever asks.
Batch batch(int rank, int step, int64_t n = 4) {
  Generator gen(1000 + 97 * static_cast<uint64_t>(rank) + 13 * static_cast<uint64_t>(step));
  return {randn({n, kIn}, &gen, kFloat64), randn({n, kOut}, &gen, kFloat64)};
}

Batch concat(const std::vector<Batch>& parts) {
  std::vector<Tensor> xs;
  std::vector<Tensor> ys;
  for (const Batch& b : parts) {
    xs.push_back(b.x);
    ys.push_back(b.y);
  }
  return {cat(xs), cat(ys)};
}

void sgd(const std::vector<Tensor>& params, double lr) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) {
      Tensor q = p;
      q.sub_(g, Scalar(lr));
    }
  }
}

void zero(const std::vector<Tensor>& params) {
  for (const Tensor& p : params)
    p.set_grad(Tensor());
}

// Reference: `steps` SGD steps of one model on the concatenation of every rank's batch.
std::vector<Tensor> reference(int world, int steps, double lr) {
  auto net = make_mlp(7);
  for (int s = 0; s < steps; ++s) {
    std::vector<Batch> parts;
    for (int r = 0; r < world; ++r)
      parts.push_back(batch(r, s));
    Batch all = concat(parts);
    zero(net->parameters());
    nn::mse_loss(net->forward(all.x), all.y).backward();
    sgd(net->parameters(), lr);
  }
  return net->parameters();
}

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = max(abs(sub(got[i], want[i]))).item<double>();
    EXPECT_LE(diff, tol) << "parameter " << i;
  }
}

// ---------------------------------------------------------------- equivalence

struct EquivalenceCase {
  Mode mode;
  int world;
  bool bucket_view;
  double cap_mb;
};

class Equivalence : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(Equivalence, StepsEqualSingleProcessOnConcatenatedBatch) {
  const EquivalenceCase c = GetParam();
  constexpr int kSteps = 3;
  constexpr double kLr = 0.1;
  const auto want = reference(c.world, kSteps, kLr);
  auto results = run_group(c.mode, c.world, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    // Different initial values on every rank: the constructor's broadcast must fix them.
    auto net = make_mlp(rank == 0 ? 7 : 100 + rank);
    DistributedDataParallel model(net, group,
                                  {.bucket_cap_mb = c.cap_mb,
                                   .first_bucket_mb = c.cap_mb,
                                   .gradient_as_bucket_view = c.bucket_view});
    for (int s = 0; s < kSteps; ++s) {
      Batch b = batch(rank, s);
      zero(net->parameters());
      nn::mse_loss(model.forward(b.x), b.y).backward();
      sgd(net->parameters(), kLr);
    }
    expect_close(net->parameters(), want, 1e-10);
    // Over shared memory, without bucket views, the gradients are averaged where they lie.
    EXPECT_EQ(model.reducer().averages_in_place(), c.mode == Mode::kShmProcesses && !c.bucket_view);
    if (c.bucket_view) {
      // Each .grad() is a view into its bucket: the buckets' storages, no private copy.
      std::set<const void*> storages;
      for (const Tensor& p : net->parameters())
        storages.insert(p.grad().storage().data());
      EXPECT_EQ(storages.size(), model.reducer().bucket_indices().size());
    }
  });
  EXPECT_ALL_RANKS_OK(results);
}

INSTANTIATE_TEST_SUITE_P(Ddp, Equivalence,
                         ::testing::Values(EquivalenceCase{Mode::kThreads, 2, false, 25.0},
                                           EquivalenceCase{Mode::kThreads, 2, true, 0.0001},
                                           EquivalenceCase{Mode::kProcesses, 2, false, 0.0001},
                                           EquivalenceCase{Mode::kProcesses, 2, true, 25.0},
                                           EquivalenceCase{Mode::kThreads, 4, true, 0.0001},
                                           EquivalenceCase{Mode::kShmProcesses, 2, false, 25.0},
                                           EquivalenceCase{Mode::kShmProcesses, 3, true, 0.0001}),
                         [](const auto& info) {
                           const EquivalenceCase& c = info.param;
                           const char* mode = c.mode == Mode::kThreads     ? "Threads"
                                              : c.mode == Mode::kProcesses ? "Processes"
                                                                           : "ShmProcesses";
                           return std::string(mode) + std::to_string(c.world) +
                                  (c.bucket_view ? "BucketView" : "Copy") +
                                  (c.cap_mb < 1 ? "SmallBuckets" : "OneBucket");
                         });

// ---------------------------------------------------------------- no_sync

TEST(Ddp, NoSyncForKStepsEqualsOneStepOnKTimesTheBatch) {
  constexpr int kMicro = 3;
  constexpr int kWorld = 2;
  constexpr double kLr = 0.1;
  // Reference: one step on all ranks' micro-batches at once. The accumulated DDP gradient
  // is the sum over micro-batches of means, kMicro times the mean over the whole batch.
  auto ref = make_mlp(7);
  {
    std::vector<Batch> parts;
    for (int r = 0; r < kWorld; ++r)
      for (int m = 0; m < kMicro; ++m)
        parts.push_back(batch(r, m));
    Batch all = concat(parts);
    nn::mse_loss(ref->forward(all.x), all.y).backward();
    sgd(ref->parameters(), kLr);
  }
  // Over shared memory without bucket views the accumulated .grad() is averaged in place.
  for (auto [mode, view] : {std::pair{Mode::kThreads, false}, std::pair{Mode::kThreads, true},
                            std::pair{Mode::kShmProcesses, false}}) {
    auto results = run_group(mode, kWorld, [&](std::shared_ptr<ProcessGroup> group, int rank) {
      auto net = make_mlp(7);
      DistributedDataParallel model(net, group, {.gradient_as_bucket_view = view});
      for (int m = 0; m < kMicro - 1; ++m) {
        auto guard = model.no_sync();
        Batch b = batch(rank, m);
        nn::mse_loss(model.forward(b.x), b.y).backward();
      }
      // Inside no_sync nothing was averaged: the two ranks' gradients still differ.
      Batch last = batch(rank, kMicro - 1);
      nn::mse_loss(model.forward(last.x), last.y).backward();
      sgd(net->parameters(), kLr / kMicro);
      expect_close(net->parameters(), ref->parameters(), 1e-10);
    });
    EXPECT_ALL_RANKS_OK(results) << "gradient_as_bucket_view=" << view << ", shm "
                                 << (mode == Mode::kShmProcesses);
  }
}

// ---------------------------------------------------------------- unused parameters

// Two heads over one trunk; `use_b` decides whether head b takes part; head c never does.
class TwoHeads : public nn::UnaryModule {
 public:
  TwoHeads() : UnaryModule("TwoHeads") {
    Generator gen(3);
    trunk_ = register_module("trunk", std::make_shared<nn::Linear>(
                                          nn::LinearOptions{kIn, kHidden, true, kFloat64, &gen}));
    a_ = register_module(
        "a", std::make_shared<nn::Linear>(nn::LinearOptions{kHidden, kOut, true, kFloat64, &gen}));
    b_ = register_module(
        "b", std::make_shared<nn::Linear>(nn::LinearOptions{kHidden, kOut, true, kFloat64, &gen}));
    c_ = register_module(
        "c", std::make_shared<nn::Linear>(nn::LinearOptions{kHidden, kOut, true, kFloat64, &gen}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(trunk_->forward(x));
    Tensor out = a_->forward(h);
    if (use_b) out = add(out, b_->forward(h));
    return out;
  }
  bool use_b = true;
  std::shared_ptr<nn::Linear> trunk_, a_, b_, c_;
};

TEST(Ddp, UnusedParametersAverageWithZerosAndUnusedEverywhereStayUndefined) {
  constexpr int kWorld = 2;
  // Reference gradients: rank r's mean loss on its own model, averaged by hand.
  std::vector<std::vector<Tensor>> grads(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    TwoHeads net;
    net.use_b = r == 0;
    Batch b = batch(r, 0);
    nn::mse_loss(net.forward(b.x), b.y).backward();
    for (const Tensor& p : net.parameters())
      grads[r].push_back(p.grad().defined() ? p.grad().clone() : zeros_like(p));
  }
  // Variant 2 declares a static graph: the unused set is learnt in the first pass and the
  // graph is not walked again.
  // Variants 3 and 4 are 0 and 2 over shared memory, where the gradients are averaged
  // where they lie (a parameter marked ready without a hook through a private tensor).
  for (int variant : {0, 1, 2, 3, 4}) {
    const bool view = variant == 1;
    const bool static_graph = variant == 2 || variant == 4;
    const Mode mode = variant >= 3 ? Mode::kShmProcesses : Mode::kThreads;
    auto results = run_group(mode, kWorld, [&](std::shared_ptr<ProcessGroup> group, int rank) {
      auto net = std::make_shared<TwoHeads>();
      net->use_b = rank == 0;
      DistributedDataParallel model(net, group,
                                    {.find_unused_parameters = !static_graph,
                                     .static_graph = static_graph,
                                     .gradient_as_bucket_view = view});
      for (int step = 0; step < 3; ++step) {  // later passes run on rebuilt buckets
        zero(net->parameters());
        Batch b = batch(rank, 0);
        nn::mse_loss(model.forward(b.x), b.y).backward();
        const auto params = net->parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          const bool head_c =
              params[i].is_same(net->c_->weight()) || params[i].is_same(net->c_->bias());
          if (head_c) {
            EXPECT_FALSE(params[i].grad().defined()) << "unused on every rank";
            continue;
          }
          ASSERT_TRUE(params[i].grad().defined()) << i;
          Tensor want = div(add(grads[0][i], grads[1][i]), Scalar(2.0));
          EXPECT_LE(max(abs(sub(params[i].grad(), want))).item<double>(), 1e-12) << i;
        }
      }
      // find_unused_parameters all-reduces the used flags every pass; a static graph
      // only in its first.
      EXPECT_EQ(model.reducer().used_flag_reductions(), static_graph ? 1 : 3);
    });
    EXPECT_ALL_RANKS_OK(results) << "variant " << variant;
  }
}

TEST(Ddp, UnusedParameterWithoutFindUnusedNamesItWithTheHint) {
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int) {
    auto net = std::make_shared<TwoHeads>();
    net->use_b = false;  // b and c unused on every rank: every rank fails the same way
    DistributedDataParallel model(net, group, {.bucket_cap_mb = 25});
    Batch b = batch(0, 0);
    try {
      nn::mse_loss(model.forward(b.x), b.y).backward();
      ADD_FAILURE() << "backward succeeded";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'b.weight'"), std::string::npos) << what;
      EXPECT_NE(what.find("'c.bias'"), std::string::npos) << what;
      EXPECT_EQ(what.find("'a.weight'"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters"), std::string::npos) << what;
    }
  });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(Ddp, ParameterMarkedReadyTwiceIsAClearError) {
  // With find_unused_parameters, a forward whose returned output does not reach head b,
  // while the loss does (through a tensor the forward did not return), marks b ready twice.
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int) {
    auto net = std::make_shared<TwoHeads>();
    DistributedDataParallel model(net, group, {.find_unused_parameters = true});
    Batch b = batch(0, 0);
    Tensor hidden;
    auto outs = model.forward_with([&](nn::Module&) {
      hidden = relu(net->trunk_->forward(b.x));
      return std::vector<Tensor>{net->a_->forward(hidden)};
    });
    Tensor loss = add(nn::mse_loss(outs[0], b.y), sum(net->b_->forward(hidden)));
    try {
      loss.backward();
      ADD_FAILURE() << "backward succeeded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("marked ready twice"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'b."), std::string::npos) << e.what();
    }
  });
  EXPECT_ALL_RANKS_OK(results);
}

// A pass whose gradient sink cannot hand gradients back (a plain collector) fails at DDP's
// first hook, on every rank, before any collective starts, rather than leaving the sink
// un-averaged gradients (autograd/gradient_sink.h).
TEST(Ddp, ASinkThatHoldsNoGradientsFailsThePassClearly) {
  struct Collector : autograd::GradientSink {
    void accumulate(const Tensor&, const Tensor&) override { ++count; }
    std::atomic<int> count{0};
  };
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = make_mlp(7);
    DistributedDataParallel model(net, group);
    Batch b = batch(rank, 0);
    Tensor loss = nn::mse_loss(model.forward(b.x), b.y);
    autograd::ExecuteOptions options;
    auto sink = std::make_shared<Collector>();
    options.sink = sink;
    try {
      autograd::execute(autograd::make_roots({loss}), options);
      ADD_FAILURE() << "the pass succeeded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("does not hold gradients"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(sink->count.load(), 0) << "no un-averaged gradient reached the sink";
  });
  EXPECT_ALL_RANKS_OK(results);
}

// ---------------------------------------------------------------- Join

TEST(Ddp, JoinWithoutInitialWorldSizeDivisionAveragesOverRanksWithData) {
  for (int world : {2, 4}) {
    // Rank r has r + 2 batches. Reference: step s averages the ranks that still have data.
    constexpr double kLr = 0.1;
    auto ref = make_mlp(7);
    const int steps = world + 1;
    for (int s = 0; s < steps; ++s) {
      std::vector<Batch> parts;
      for (int r = 0; r < world; ++r)
        if (s < r + 2) parts.push_back(batch(r, s));
      Batch all = concat(parts);  // equal batch sizes: the mean of means is the mean
      zero(ref->parameters());
      nn::mse_loss(ref->forward(all.x), all.y).backward();
      sgd(ref->parameters(), kLr);
    }
    auto results =
        run_group(Mode::kThreads, world, [&](std::shared_ptr<ProcessGroup> group, int rank) {
          auto net = make_mlp(7);
          DistributedDataParallel model(net, group,
                                        {.bucket_cap_mb = 0.0001,
                                         .first_bucket_mb = 0.0001,
                                         .gradient_as_bucket_view = true});
          Join join({&model}, {.divide_by_initial_world_size = false});
          for (int s = 0; s < rank + 2; ++s) {
            Batch b = batch(rank, s);
            zero(net->parameters());
            nn::mse_loss(model.forward(b.x), b.y).backward();
            sgd(net->parameters(), kLr);
          }
          const int64_t shadowed = join.join();
          EXPECT_EQ(shadowed, steps - (rank + 2));
          expect_close(net->parameters(), ref->parameters(), 1e-10);
        });
    EXPECT_ALL_RANKS_OK(results) << "world " << world;
  }
}

// PyTorch's default: a step's sum is divided by the initial world size, the ranks that ran
// out counting as zeros. Rank r has r + 1 batches (world 3).
TEST(Ddp, JoinDividesByTheInitialWorldSizeByDefault) {
  constexpr int kWorld = 3;
  constexpr double kLr = 0.1;
  auto ref = make_mlp(7);
  for (int s = 0; s < kWorld; ++s) {
    std::vector<Batch> parts;
    for (int r = 0; r < kWorld; ++r)
      if (s < r + 1) parts.push_back(batch(r, s));
    Batch all = concat(parts);
    zero(ref->parameters());
    // The mean over the participants, times participants / world: their sum over world.
    const double scale = static_cast<double>(parts.size()) / kWorld;
    mul(nn::mse_loss(ref->forward(all.x), all.y), scale).backward();
    sgd(ref->parameters(), kLr);
  }
  // Over shared memory the ranks with data average their gradients where they lie, and the
  // joined ranks' shadow all-reduces must be the same collectives (checked by kDetail).
  for (Mode mode : {Mode::kThreads, Mode::kShmProcesses}) {
    auto results = run_group(
        mode, kWorld,
        [&](std::shared_ptr<ProcessGroup> group, int rank) {
          auto net = make_mlp(7);
          DistributedDataParallel model(net, group, {.bucket_cap_mb = 0.0001});
          Join join({&model});
          for (int s = 0; s < rank + 1; ++s) {
            Batch b = batch(rank, s);
            zero(net->parameters());
            nn::mse_loss(model.forward(b.x), b.y).backward();
            sgd(net->parameters(), kLr);
          }
          EXPECT_EQ(join.join(), kWorld - (rank + 1));
          expect_close(net->parameters(), ref->parameters(), 1e-10);
        },
        mode == Mode::kShmProcesses ? c10d::DebugLevel::kDetail : c10d::DebugLevel::kOff);
    EXPECT_ALL_RANKS_OK(results) << "shm " << (mode == Mode::kShmProcesses);
  }
}

// no_sync under a Join: rank 0 has 2 batches, rank 1 has 4; even steps accumulate under
// no_sync, odd steps synchronise and take an SGD step. Rank 0 joins after step 1 and
// shadows step 3's all-reduces (with zeros), not step 2's (no_sync). Reference: one model,
// update 1 from the sum of all four step-0/1 mean losses over 2, update 2 from rank 1's
// steps 2 and 3 over 2 (the initial world size).
TEST(Ddp, JoinFollowsNoSyncStepsOfTheRanksWithData) {
  constexpr double kLr = 0.1;
  auto ref = make_mlp(7);
  auto update = [&](const std::vector<std::pair<int, int>>& rank_steps) {
    zero(ref->parameters());
    Tensor loss;
    for (auto [r, s] : rank_steps) {
      Batch b = batch(r, s);
      Tensor l = nn::mse_loss(ref->forward(b.x), b.y);
      loss = loss.defined() ? add(loss, l) : l;
    }
    mul(loss, 0.5).backward();
    sgd(ref->parameters(), kLr);
  };
  update({{0, 0}, {0, 1}, {1, 0}, {1, 1}});
  update({{1, 2}, {1, 3}});
  for (Mode mode : {Mode::kThreads, Mode::kShmProcesses}) {
    auto results = run_group(mode, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
      auto net = make_mlp(7);
      DistributedDataParallel model(net, group, {.bucket_cap_mb = 0.0001});
      Join join({&model});
      zero(net->parameters());
      for (int s = 0; s < 2 + 2 * rank; ++s) {
        Batch b = batch(rank, s);
        if (s % 2 == 0) {
          auto guard = model.no_sync();
          nn::mse_loss(model.forward(b.x), b.y).backward();
        } else {
          nn::mse_loss(model.forward(b.x), b.y).backward();
          sgd(net->parameters(), kLr);
          zero(net->parameters());
        }
      }
      EXPECT_EQ(join.join(), rank == 0 ? 2 : 0);
      expect_close(net->parameters(), ref->parameters(), 1e-10);
    });
    EXPECT_ALL_RANKS_OK(results) << "shm " << (mode == Mode::kShmProcesses);
  }
}

// throw_on_early_termination: at the first step where rank 0 has run out, rank 1's forward
// and rank 0's join() both throw, naming rank 0; nobody is left waiting.
TEST(Ddp, JoinThrowsOnEveryRankOnEarlyTerminationWhenAsked) {
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = make_mlp(7);
    DistributedDataParallel model(net, group);
    Join join({&model}, {.throw_on_early_termination = true});
    int steps = 0;
    try {
      for (int s = 0; s < 2 + 2 * rank; ++s) {
        Batch b = batch(rank, s);
        nn::mse_loss(model.forward(b.x), b.y).backward();
        ++steps;
      }
      join.join();
      ADD_FAILURE() << "rank " << rank << " did not throw";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank(s) [0] exhausted"), std::string::npos) << what;
      EXPECT_NE(what.find("throw_on_early_termination"), std::string::npos) << what;
    }
    EXPECT_EQ(steps, 2) << "rank " << rank << " stopped at the first step rank 0 missed";
  });
  EXPECT_ALL_RANKS_OK(results);
}

// ---------------------------------------------------------------- comm hooks

// Trains kSteps after `setup` (which registers a hook) and returns the largest deviation from the
// reference.
double train_with_hook(Mode mode, const std::function<void(DistributedDataParallel&)>& setup) {
  constexpr int kSteps = 3;
  constexpr double kLr = 0.1;
  const auto want = reference(2, kSteps, kLr);
  std::atomic<double> worst{0};
  auto results = run_group(mode, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = make_mlp(7);
    DistributedDataParallel model(net, group, {.bucket_cap_mb = 0.0001, .first_bucket_mb = 0.0001});
    setup(model);
    for (int s = 0; s < kSteps; ++s) {
      Batch b = batch(rank, s);
      zero(net->parameters());
      nn::mse_loss(model.forward(b.x), b.y).backward();
      sgd(net->parameters(), kLr);
    }
    const auto got = net->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = max(abs(sub(got[i], want[i]))).item<double>();
      double seen = worst.load();
      while (d > seen && !worst.compare_exchange_weak(seen, d)) {
      }
    }
  });
  EXPECT_ALL_RANKS_OK(results);
  return worst.load();
}

TEST(DdpHooks, Fp16AndBf16CompressWithinTheirPrecision) {
  // Gradients here are O(1): float16 keeps ~1e-3 relative, bfloat16 ~8e-3; three steps of
  // lr 0.1 bound the parameter error accordingly.
  const double fp16 = train_with_hook(
      Mode::kThreads, [](DistributedDataParallel& m) { m.register_comm_hook(fp16_compress_hook); });
  EXPECT_LE(fp16, 2e-3);
  EXPECT_GT(fp16, 0.0);  // it did go through float16
  const double bf16 = train_with_hook(
      Mode::kThreads, [](DistributedDataParallel& m) { m.register_comm_hook(bf16_compress_hook); });
  EXPECT_LE(bf16, 1.5e-2);
  EXPECT_GT(bf16, fp16);
}

TEST(DdpHooks, UserHookIsCalledPerBucketAndItsResultUsed) {
  std::atomic<int> calls{0};
  const double err = train_with_hook(Mode::kProcesses, [&](DistributedDataParallel& m) {
    m.register_comm_hook([&](GradBucket& b) {
      ++calls;
      // Sum in float64 by hand: all_reduce, then divide in the continuation.
      c10d::Work w = b.group->all_reduce(b.buffer);
      Tensor out = b.buffer;
      const double d = b.divisor;
      return w.get_future().then(b.executor, [out, d](Future<std::vector<Tensor>> f) mutable {
        f.value();
        out.div_(Scalar(d));
        return out;
      });
    });
  });
  EXPECT_LE(err, 1e-10);
  // Counted in the children (processes): check the hook ran with threads too.
  const double err2 = train_with_hook(Mode::kThreads, [&](DistributedDataParallel& m) {
    m.register_comm_hook([&](GradBucket& b) {
      ++calls;
      return allreduce_hook(b);
    });
  });
  EXPECT_LE(err2, 1e-10);
  // The 4 parameters fill 2 buckets at a 105-byte cap ({2.bias, 2.weight}, {0.bias,
  // 0.weight}); 3 steps on 2 ranks.
  EXPECT_EQ(calls.load(), 2 * 3 * 2);
}

TEST(DdpHooks, DefaultHookAveragesInTheGroupBitForBitAsSumThenDivide) {
  // The default hook asks the group for kAvg (over shared memory each rank divides its own
  // slice as it reduces it); the same training with a hook that sums and divides the whole
  // bucket afterwards must give the same bits. Three ranks: a divisor that is not a power
  // of two, and slices of uneven length.
  constexpr int kSteps = 3;
  constexpr double kLr = 0.1;
  auto results =
      run_group(Mode::kShmProcesses, 3, [&](std::shared_ptr<ProcessGroup> group, int rank) {
        auto train = [&](bool by_hand) {
          auto net = make_mlp(7);
          DistributedDataParallel model(net, group,
                                        {.bucket_cap_mb = 0.0001, .first_bucket_mb = 0.0001});
          if (by_hand) {
            model.register_comm_hook([](GradBucket& b) {
              c10d::Work w = b.group->all_reduce(b.buffer);
              Tensor out = b.buffer;
              const double d = b.divisor;
              return w.get_future().then(b.executor,
                                         [out, d](Future<std::vector<Tensor>> f) mutable {
                                           f.value();
                                           out.div_(Scalar(d));
                                           return out;
                                         });
            });
          }
          for (int s = 0; s < kSteps; ++s) {
            Batch b = batch(rank, s);
            zero(net->parameters());
            nn::mse_loss(model.forward(b.x), b.y).backward();
            sgd(net->parameters(), kLr);
          }
          return net->parameters();
        };
        const std::vector<Tensor> averaged = train(false);
        const std::vector<Tensor> by_hand = train(true);
        ASSERT_EQ(averaged.size(), by_hand.size());
        for (size_t i = 0; i < averaged.size(); ++i) {
          EXPECT_TRUE(equal(averaged[i], by_hand[i])) << "parameter " << i;
          // Training moved it (the comparison is not between two untouched copies).
          EXPECT_FALSE(equal(averaged[i], make_mlp(7)->parameters()[i])) << "parameter " << i;
        }
      });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(DdpHooks, PowerSgdReproducesLowRankGradientsExactly) {
  // One Linear layer 6 -> 5 and a batch of one row per rank: each rank's weight gradient
  // is rank 1, the two ranks' sum rank 2, so a rank-2 PowerSGD reproduces the average up to
  // rounding, and error feedback (the local part not transmitted) sums to zero across
  // ranks, keeping later steps exact too. A wrong error term would break the equality.
  constexpr double kLr = 0.1;
  constexpr int kSteps = 4;
  auto make = [] {
    Generator gen(5);
    return std::make_shared<nn::Linear>(nn::LinearOptions{6, 5, true, kFloat64, &gen});
  };
  auto data = [](int rank, int step) {
    Generator gen(50 + 10 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(step));
    return Batch{randn({1, 6}, &gen, kFloat64), randn({1, 5}, &gen, kFloat64)};
  };
  auto ref = make();
  for (int s = 0; s < kSteps; ++s) {
    Batch all = concat({data(0, s), data(1, s)});
    zero(ref->parameters());
    nn::mse_loss(ref->forward(all.x), all.y).backward();
    sgd(ref->parameters(), kLr);
  }
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = make();
    DistributedDataParallel model(net, group);
    // (5 + 6) * 2 = 22 < 30 = 5 * 6: compressed at a minimum rate of 1 (not at 2).
    auto state = std::make_shared<PowerSGDState>(
        PowerSGDOptions{.rank = 2, .start_iteration = 0, .min_compression_rate = 1.0});
    model.register_comm_hook(make_powersgd_hook(state));
    for (int s = 0; s < kSteps; ++s) {
      Batch b = data(rank, s);
      zero(net->parameters());
      nn::mse_loss(model.forward(b.x), b.y).backward();
      sgd(net->parameters(), kLr);
    }
    expect_close(net->parameters(), ref->parameters(), 1e-10);
    EXPECT_EQ(state->iteration(), kSteps);
    Tensor e = state->error(0);
    ASSERT_TRUE(e.defined());
    EXPECT_GT(max(abs(e)).item<double>(), 1e-3);  // the local part the others did not have
  });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(DdpHooks, PowerSgdErrorFeedbackLosesNothingOverTime) {
  // Fixed full-rank gradients G_r, rank-1 compression, T rounds. With error feedback every
  // round transmits avg(G + e_prev) approximately and keeps the rest: the sum of what was
  // applied equals T * avg(G) minus the average of the ranks' current errors, exactly.
  constexpr int kRounds = 6;
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    Generator gen(70 + static_cast<uint64_t>(rank));
    Tensor g = randn({6, 5}, &gen, kFloat64);
    Tensor p = ones({6, 5}, kFloat64).set_requires_grad(true);
    auto state = std::make_shared<PowerSGDState>(PowerSGDOptions{.rank = 1, .start_iteration = 0});
    auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "t"});
    Tensor applied = zeros({30}, kFloat64);
    for (int t = 0; t < kRounds; ++t) {
      GradBucket b;
      b.buffer = g.reshape({-1}).clone();
      b.gradients = {b.buffer.view({6, 5})};
      b.parameters = {p};
      b.parameter_names = {"p"};
      b.group = group;
      b.divisor = 2;
      b.executor = pool;
      b.is_last = true;
      Tensor out = powersgd_hook(state, b).get(10s);
      applied.add_(out);
      if (t == 0) {
        // Rank-1 approximation of a rank-5 average: not the average.
        Tensor avg = g.reshape({-1}).clone();
        group->all_reduce(avg).wait();
        avg.div_(Scalar(2.0));
        EXPECT_GT(max(abs(sub(out, avg))).item<double>(), 1e-3);
      }
    }
    Tensor total = g.reshape({-1}).clone().mul_(Scalar(double{kRounds}));
    group->all_reduce(total).wait();
    total.div_(Scalar(2.0));
    Tensor err = state->error(0);
    group->all_reduce(err).wait();
    err.div_(Scalar(2.0));
    EXPECT_LE(max(abs(sub(add(applied, err), total))).item<double>(), 1e-10);
  });
  EXPECT_ALL_RANKS_OK(results);
}

// One PowerSGD round on rank-local gradient `g` of `params` (one bucket) with `state`.
Tensor powersgd_round(const std::shared_ptr<PowerSGDState>& state,
                      const std::shared_ptr<ProcessGroup>& group,
                      const std::shared_ptr<Executor>& pool, const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, size_t index, uint64_t layout,
                      bool is_last) {
  GradBucket b;
  std::vector<Tensor> flat;
  for (const Tensor& g : grads)
    flat.push_back(g.reshape({-1}));
  b.buffer = cat(flat).clone();
  int64_t offset = 0;
  for (const Tensor& g : grads) {
    b.gradients.push_back(b.buffer.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
  b.parameters = params;
  for (size_t i = 0; i < params.size(); ++i)
    b.parameter_names.push_back("p" + std::to_string(i));
  b.group = group;
  b.divisor = group->size();
  b.executor = pool;
  b.index = index;
  b.layout = layout;
  b.is_last = is_last;
  return powersgd_hook(state, b).get(10s);
}

Tensor rank_mean(const std::shared_ptr<ProcessGroup>& group, Tensor t) {
  t = t.clone();
  group->all_reduce(t).wait();
  return t.div_(Scalar(static_cast<double>(group->size())));
}

TEST(DdpHooks, PowerSgdStateFollowsTheBucketsParametersAndResetsOnRebuild) {
  // Two 6x5 parameters in two buckets of one size, full-rank gradients, rank 1. Layout 1
  // has p in bucket 0 and q in bucket 1, for two rounds (their residuals are not zero);
  // the rebuild (layout 2) swaps them. The state restarts: the first round after it
  // compresses each gradient alone, so what it applies plus the ranks' mean new residual
  // is exactly the true average. Carried by index, q would have received p's residual.
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    Generator gen(90 + static_cast<uint64_t>(rank));
    Tensor gp = randn({6, 5}, &gen, kFloat64);
    Tensor gq = randn({6, 5}, &gen, kFloat64);
    Tensor p = ones({6, 5}, kFloat64).set_requires_grad(true);
    Tensor q = ones({6, 5}, kFloat64).set_requires_grad(true);
    auto state = std::make_shared<PowerSGDState>(PowerSGDOptions{.rank = 1, .start_iteration = 0});
    auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "t"});
    for (int t = 0; t < 2; ++t) {
      powersgd_round(state, group, pool, {p}, {gp}, 0, 1, false);
      powersgd_round(state, group, pool, {q}, {gq}, 1, 1, true);
    }
    Tensor ep = state->error({p});
    ASSERT_TRUE(ep.defined());
    EXPECT_GT(max(abs(rank_mean(group, ep))).item<double>(), 1e-3);
    EXPECT_TRUE(state->error(0).defined());
    // The rebuild: q first.
    Tensor out_q = powersgd_round(state, group, pool, {q}, {gq}, 0, 2, false);
    Tensor out_p = powersgd_round(state, group, pool, {p}, {gp}, 1, 2, true);
    for (auto& [out, g, param] : {std::tuple{out_q, gq, q}, std::tuple{out_p, gp, p}}) {
      Tensor err = state->error({param});
      ASSERT_TRUE(err.defined());
      Tensor lhs = add(out, rank_mean(group, err));
      EXPECT_LE(max(abs(sub(lhs, rank_mean(group, g.reshape({-1}))))).item<double>(), 1e-10);
      EXPECT_GT(max(abs(sub(out, rank_mean(group, g.reshape({-1}))))).item<double>(), 1e-3)
          << "rank 1 of a full-rank average: compressed";
    }
    // error(index) follows the new layout: bucket 0 now holds q.
    EXPECT_LE(max(abs(sub(state->error(0), state->error({q})))).item<double>(), 0.0);
  });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(DdpHooks, PowerSgdCompressesOnlyAtItsMinimumCompressionRate) {
  // A 6x5 gradient at rank 2: factors of (6 + 5) * 2 = 22 values against 30. At the default
  // rate 2 (44 > 30) it travels uncompressed: the exact average; at rate 1 it is compressed.
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    Generator gen(120 + static_cast<uint64_t>(rank));
    Tensor g = randn({6, 5}, &gen, kFloat64);
    Tensor p = ones({6, 5}, kFloat64).set_requires_grad(true);
    auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "t"});
    const Tensor avg = rank_mean(group, g.reshape({-1}));
    auto plain = std::make_shared<PowerSGDState>(PowerSGDOptions{.rank = 2, .start_iteration = 0});
    Tensor out = powersgd_round(plain, group, pool, {p}, {g}, 0, 1, true);
    EXPECT_LE(max(abs(sub(out, avg))).item<double>(), 1e-12);
    auto eager = std::make_shared<PowerSGDState>(
        PowerSGDOptions{.rank = 2, .start_iteration = 0, .min_compression_rate = 1.0});
    out = powersgd_round(eager, group, pool, {p}, {g}, 0, 1, true);
    EXPECT_GT(max(abs(sub(out, avg))).item<double>(), 1e-3);
  });
  EXPECT_ALL_RANKS_OK(results);
  EXPECT_THROW(PowerSGDOptions{.min_compression_rate = 0.0}.validate(), InvalidArgument);
}

// ---------------------------------------------------------------- construction

// A frozen parameter (requires_grad = false) is part of the replica: checked across ranks
// and broadcast from rank 0 at construction, as in PyTorch; it is not reduced.
class WithFrozen : public nn::UnaryModule {
 public:
  WithFrozen(int rank, int64_t frozen_size) : UnaryModule("WithFrozen") {
    Generator gen(3 + static_cast<uint64_t>(rank));
    fc = register_module(
        "fc", std::make_shared<nn::Linear>(nn::LinearOptions{kIn, kOut, true, kFloat64, &gen}));
    scale = register_parameter(
        "scale", full({frozen_size}, Scalar(1.0 + static_cast<double>(rank)), kFloat64),
        /*requires_grad=*/false);
  }
  Tensor forward(const Tensor& x) override { return mul(fc->forward(x), scale); }
  std::shared_ptr<nn::Linear> fc;
  Tensor scale;
};

TEST(Ddp, FrozenParametersAreCheckedAndBroadcastAtConstruction) {
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = std::make_shared<WithFrozen>(rank, kOut);
    DistributedDataParallel model(net, group);
    EXPECT_LE(max(abs(sub(net->scale, full({kOut}, Scalar(1.0), kFloat64)))).item<double>(), 0.0)
        << "rank 0's frozen values";
    auto fresh = std::make_shared<WithFrozen>(0, kOut);
    expect_close(net->fc->parameters(), fresh->fc->parameters(), 0.0);
    EXPECT_EQ(model.reducer().parameters().size(), 2u) << "the frozen one is not reduced";
    Batch b = batch(rank, 0);
    nn::mse_loss(model.forward(b.x), b.y).backward();
    EXPECT_FALSE(net->scale.grad().defined());
  });
  EXPECT_ALL_RANKS_OK(results);
  auto mismatch = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = std::make_shared<WithFrozen>(rank, rank == 0 ? kOut : kOut + 1);
    try {
      DistributedDataParallel model(net, group);
      ADD_FAILURE() << "construction succeeded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'scale'"), std::string::npos) << e.what();
    }
  });
  EXPECT_ALL_RANKS_OK(mismatch);
}

TEST(Ddp, ShapeMismatchAcrossRanksNamesTheParameter) {
  auto results = run_group(Mode::kProcesses, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    Generator gen(1);
    auto net = std::make_shared<nn::MLP>(
        nn::MLPOptions{.sizes = {kIn, rank == 0 ? kHidden : kHidden + 1, kOut},
                       .dtype = kFloat64,
                       .generator = &gen});
    try {
      DistributedDataParallel model(net, group);
      ADD_FAILURE() << "construction succeeded";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'0.weight'"), std::string::npos) << what;
      EXPECT_NE(what.find("[8, 5]"), std::string::npos) << what;
      EXPECT_NE(what.find("[7, 5]"), std::string::npos) << what;
    }
  });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(Ddp, BadOptionsAreRefused) {
  EXPECT_THROW((DdpOptions{.bucket_cap_mb = 0}).validate(), InvalidArgument);
  EXPECT_THROW((DdpOptions{.first_bucket_mb = -1}).validate(), InvalidArgument);
  EXPECT_THROW((PowerSGDOptions{.rank = 0}).validate(), InvalidArgument);
}

// ---------------------------------------------------------------- bucket rebuild

// Three square layers registered a, b, c but applied b, a, c: gradients arrive c, a, b.
class Shuffled : public nn::UnaryModule {
 public:
  Shuffled() : UnaryModule("Shuffled") {
    Generator gen(9);
    for (const char* name : {"a", "b", "c"})
      layers_.push_back(register_module(
          name, std::make_shared<nn::Linear>(nn::LinearOptions{4, 4, false, kFloat64, &gen})));
  }
  Tensor forward(const Tensor& x) override {
    return layers_[2]->forward(relu(layers_[0]->forward(relu(layers_[1]->forward(x)))));
  }
  std::vector<std::shared_ptr<nn::Linear>> layers_;
};

TEST(Ddp, BucketsAreRebuiltOnceInArrivalOrder) {
  auto results = run_group(Mode::kThreads, 2, [&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = std::make_shared<Shuffled>();
    // 128 bytes per weight; a cap of 100 bytes gives one bucket per parameter.
    DistributedDataParallel model(net, group, {.bucket_cap_mb = 1e-4, .first_bucket_mb = 1e-4});
    using Buckets = std::vector<std::vector<size_t>>;
    EXPECT_EQ(model.reducer().bucket_indices(), (Buckets{{2}, {1}, {0}}));  // reverse order
    Generator gen(11 + static_cast<uint64_t>(rank));
    for (int s = 0; s < 3; ++s) {
      Tensor x = randn({2, 4}, &gen, kFloat64);
      sum(model.forward(x)).backward();
      if (s == 0) {
        EXPECT_FALSE(model.reducer().buckets_rebuilt());
      }
    }
    EXPECT_TRUE(model.reducer().buckets_rebuilt());
    EXPECT_EQ(model.reducer().bucket_indices(), (Buckets{{2}, {0}, {1}}));  // c, a, b
  });
  EXPECT_ALL_RANKS_OK(results);
}

// ---------------------------------------------------------------- sampler

TEST(DistributedSampler, ShardsAreDisjointCoverAndFollowTheEpoch) {
  for (bool drop_last : {false, true}) {
    std::vector<int64_t> seen;
    for (int r = 0; r < 3; ++r) {
      DistributedSampler s(
          {.dataset_size = 10, .world_size = 3, .rank = r, .seed = 4, .drop_last = drop_last});
      s.set_epoch(2);
      auto idx = s.indices();
      EXPECT_EQ(static_cast<int64_t>(idx.size()), drop_last ? 3 : 4);
      seen.insert(seen.end(), idx.begin(), idx.end());
    }
    std::set<int64_t> distinct(seen.begin(), seen.end());
    if (drop_last) {
      EXPECT_EQ(distinct.size(), 9u);  // disjoint, one sample dropped
    } else {
      EXPECT_EQ(distinct.size(), 10u);  // all covered, two padded twice
      EXPECT_EQ(seen.size(), 12u);
    }
  }
  DistributedSampler a({.dataset_size = 100, .world_size = 2, .rank = 0, .seed = 1});
  DistributedSampler b({.dataset_size = 100, .world_size = 2, .rank = 0, .seed = 1});
  EXPECT_EQ(a.indices(), b.indices());  // same seed and epoch: same shard on every call
  auto e0 = a.indices();
  a.set_epoch(1);
  EXPECT_NE(a.indices(), e0);
  DistributedSampler plain({.dataset_size = 5, .world_size = 2, .rank = 1, .shuffle = false});
  EXPECT_EQ(plain.indices(), (std::vector<int64_t>{1, 3, 0}));  // padded with index 0
  EXPECT_THROW(DistributedSampler({.dataset_size = 5, .world_size = 2, .rank = 2}),
               InvalidArgument);
}

}  // namespace
}  // namespace gradwire::ddp
