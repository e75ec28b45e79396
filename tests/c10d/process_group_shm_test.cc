// ProcessGroupShm beyond the shared collective suite (process_group_gloo_test.cc runs
// GlooCollectives over it as a parameter): a rank killed mid-collective, the CPU an idle
// waiter uses, peers whose segments are corrupt (bad steps, a bad header, an oversized
// length), mismatched sizes, timeouts, the fixed reduction order, tensors larger than the
// segment, results bitwise equal to Gloo's for integer types, the debug mode's check,
// point-to-point and subgroups, how make_process_group chooses the backend, and the
// hierarchical group for ranks on several hosts.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "c10d/c10d_test_util.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/harness.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using test::RankResults;

using ShmBody = std::function<void(ProcessGroupShm& group, int rank)>;

ProcessGroupOptions test_options(ProcessGroupOptions options) {
  if (options.timeout == kDefaultProcessGroupTimeout) options.timeout = 20s;
  if (!options.debug_level) options.debug_level = DebugLevel::kOff;
  return options;
}

ShmOptions test_shm_options(ShmOptions shm) {
  shm.gloo.host = "127.0.0.1";
  return shm;
}

RankResults run_threads(int world, const ShmBody& body, ProcessGroupOptions options = {},
                        ShmOptions shm = {}) {
  options = test_options(std::move(options));
  shm = test_shm_options(std::move(shm));
  auto store = std::make_shared<HashStore>(20s);
  return test::run_ranks_as_threads(
      world,
      [&](int rank) {
        auto group = ProcessGroupShm::create(store, rank, world, options, shm);
        body(*group, rank);
      },
      60s);
}

RankResults run_processes(int world, const ShmBody& body, ProcessGroupOptions options = {},
                          ShmOptions shm = {}) {
  options = test_options(std::move(options));
  shm = test_shm_options(std::move(shm));
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  return test::run_ranks_as_processes(
      world,
      [&](int rank) {
        auto store = std::make_shared<FileStore>(
            FileStoreOptions{.path = path, .num_workers = world, .timeout = 20s});
        auto group = ProcessGroupShm::create(store, rank, world, options, shm);
        body(*group, rank);
      },
      60s);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

std::string error_text(const Work& work) {
  try {
    work.wait();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// ---- a rank that dies

// Rank 2 is killed while ranks 0 and 1 wait for it inside an all_reduce: both get a
// NetworkError naming it within 2 s, and every later collective fails at once with it.
TEST(ShmFailures, ARankKilledMidCollectiveIsNamedToEverySurvivorWithinTwoSeconds) {
  const RankResults results = run_processes(
      3,
      [](ProcessGroupShm& group, int rank) {
        Tensor t = ones({1 << 16}, kFloat32);
        group.all_reduce(t).wait();
        if (rank == 2) {
          group.store()->wait({"entered0", "entered1"}, 20s);
          ::kill(::getpid(), SIGKILL);
        }
        const auto start = std::chrono::steady_clock::now();
        Work work = group.all_reduce(t);
        group.store()->set("entered" + std::to_string(rank), std::string_view("1"));
        std::string what;
        try {
          work.wait();
          ADD_FAILURE() << "rank " << rank << ": expected an error";
        } catch (const NetworkError& e) {
          what = e.what();
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << what;
        EXPECT_NE(what.find("rank 2 (pid"), std::string::npos) << what;
        EXPECT_NE(what.find("exited"), std::string::npos) << what;
        EXPECT_NE(what.find("[2]"), std::string::npos) << what;
        // The group stays failed: the next collective fails at once, with the same error.
        const auto again = std::chrono::steady_clock::now();
        Work later = group.barrier();
        EXPECT_TRUE(later.is_completed());
        EXPECT_EQ(error_text(later), what);
        EXPECT_LT(std::chrono::steady_clock::now() - again, 1s);
      },
      ProcessGroupOptions{.timeout = 30s});
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  EXPECT_TRUE(results.ranks[1].ok) << results.summary();
  EXPECT_EQ(results.ranks[2].term_signal, SIGKILL) << results.summary();
}

// ---- an idle waiter

double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& tv) { return double(tv.tv_sec) + double(tv.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Rank 0 waits a second inside an all_reduce that rank 1 has not started: its whole
// process uses under 5% of a core meanwhile (the waiter sleeps on a futex after a short
// spin). A loaded machine only lowers the figure.
TEST(ShmIdle, ARankWaitingForAPeerUsesAlmostNoCpu) {
  EXPECT_ALL_RANKS_OK(run_processes(2, [](ProcessGroupShm& group, int rank) {
    Tensor t = full({1024}, Scalar(rank + 1), kFloat32);
    if (rank == 1) {
      group.store()->wait({"measured"}, 20s);
      group.all_reduce(t).wait();
      EXPECT_TRUE(equal(t, full({1024}, Scalar(3), kFloat32)));
      return;
    }
    Work work = group.all_reduce(t);
    const double cpu0 = process_cpu_seconds();
    const auto wall0 = std::chrono::steady_clock::now();
    EXPECT_THROW(work.wait(1s), TimeoutError);
    const double cpu = process_cpu_seconds() - cpu0;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    EXPECT_LT(cpu / wall, 0.05) << cpu << " s of CPU in " << wall << " s";
    group.store()->set("measured", std::string_view("1"));
    work.wait();
    EXPECT_TRUE(equal(t, full({1024}, Scalar(3), kFloat32)));
  }));
}

// ---- corrupt segments

enum class Corruption { kStepBackwards, kStepFarAhead, kBadMagic, kOversizedLength };

class ShmCorruption : public ::testing::TestWithParam<Corruption> {};

// Rank 1 plays a hostile peer: after one good all_reduce it writes garbage into its own
// segment's header. Rank 0's next collective fails with a NetworkError naming rank 1 and
// what was wrong (no crash, no hang, nothing read out of bounds); so does the one after.
TEST_P(ShmCorruption, ThePeerIsNamedAndNothingHangs) {
  const Corruption kind = GetParam();
  const RankResults results = run_processes(2, [kind](ProcessGroupShm& group, int rank) {
    Tensor t = full({1000}, Scalar(rank + 1), kFloat32);
    group.all_reduce(t).wait();
    if (rank == 1) {
      // Only once rank 0 has seen this rank's last step of the good all_reduce.
      group.store()->wait({"first_done"}, 20s);
      ShmSegmentHeader* h = group.own_header_for_testing();
      const uint32_t step = h->step.load();
      switch (kind) {
        case Corruption::kStepBackwards:
          h->step.store(step - 1);
          break;
        case Corruption::kStepFarAhead:
          h->step.store(step + 1000);
          break;
        case Corruption::kBadMagic:
          h->magic = 0x0bad;
          break;
        case Corruption::kOversizedLength:
          for (auto& length : h->lengths)
            length.store(uint64_t{1} << 40);
          h->step.store(step + 1);  // what rank 0 will wait for next
          break;
      }
      group.store()->set("corrupted", std::string_view("1"));
      group.store()->wait({"reported"}, 20s);
      return;
    }
    group.store()->set("first_done", std::string_view("1"));
    group.store()->wait({"corrupted"}, 20s);
    const std::string what = error_text(group.all_reduce(t));
    group.store()->set("reported", std::string_view("1"));
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    switch (kind) {
      case Corruption::kStepBackwards:
        EXPECT_NE(what.find("went back"), std::string::npos) << what;
        break;
      case Corruption::kStepFarAhead:
        EXPECT_NE(what.find("is ahead of"), std::string::npos) << what;
        break;
      case Corruption::kBadMagic:
        EXPECT_NE(what.find("header is corrupt"), std::string::npos) << what;
        break;
      case Corruption::kOversizedLength:
        EXPECT_NE(what.find("more than its"), std::string::npos) << what;
        break;
    }
    EXPECT_THROW(group.barrier().wait(), NetworkError);
  });
  EXPECT_ALL_RANKS_OK(results);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ShmCorruption,
                         ::testing::Values(Corruption::kStepBackwards, Corruption::kStepFarAhead,
                                           Corruption::kBadMagic, Corruption::kOversizedLength),
                         [](const ::testing::TestParamInfo<Corruption>& info) {
                           switch (info.param) {
                             case Corruption::kStepBackwards:
                               return std::string("StepBackwards");
                             case Corruption::kStepFarAhead:
                               return std::string("StepFarAhead");
                             case Corruption::kBadMagic:
                               return std::string("BadMagic");
                             case Corruption::kOversizedLength:
                               return std::string("OversizedLength");
                           }
                           return std::string("Unknown");
                         });

// Without the debug mode, ranks that pass different sizes are told so, instead of reading
// past what a peer wrote.
TEST(ShmFailures, DifferentSizesOnTwoRanksFailBoth) {
  EXPECT_ALL_RANKS_OK(run_threads(2, [](ProcessGroupShm& group, int rank) {
    Tensor t = ones({rank == 0 ? 100 : 200}, kFloat32);
    const std::string what = error_text(group.all_reduce(t));
    EXPECT_NE(what.find("expected"), std::string::npos) << what;
  }));
}

TEST(ShmFailures, ARankThatNeverArrivesTimesOutNamed) {
  EXPECT_ALL_RANKS_OK(run_threads(
      2,
      [](ProcessGroupShm& group, int rank) {
        if (rank == 1) {
          group.store()->wait({"done"}, 20s);
          return;
        }
        Tensor t = ones({8}, kFloat32);
        try {
          group.all_reduce(t).wait();
          ADD_FAILURE() << "expected TimeoutError";
        } catch (const TimeoutError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("timed out after 300 ms"), std::string::npos) << what;
          EXPECT_NE(what.find("waited for rank 1"), std::string::npos) << what;
          EXPECT_NE(what.find("[1]"), std::string::npos) << what;
        }
        group.store()->set("done", std::string_view("1"));
      },
      ProcessGroupOptions{.timeout = 300ms}));
}

TEST(ShmErrors, BadOptionsAreRejected) {
  auto store = std::make_shared<HashStore>(5s);
  EXPECT_THROW(ProcessGroupShm::create(store, 0, 1, {}, {.buffer_bytes = 100}), InvalidArgument);
  EXPECT_THROW(ProcessGroupShm::create(store, 0, 1, {}, {.wait_slice = 0ms}), InvalidArgument);
  EXPECT_THROW(ProcessGroupShm::create(store, 0, 1, {}, {.spin = -1us}), InvalidArgument);
}

TEST(ShmErrors, CreationTimesOutNamingMissingRanks) {
  auto store = std::make_shared<HashStore>(5s);
  try {
    ProcessGroupShm::create(store, 0, 3, {.timeout = 300ms, .debug_level = DebugLevel::kOff});
    ADD_FAILURE() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks [1, 2] did not join"), std::string::npos)
        << e.what();
  }
}

// ---- determinism and agreement with Gloo

// Values whose float sum depends on the order: large terms of both signs and small ones.
Tensor order_sensitive(int rank, int64_t n) {
  std::mt19937 gen(static_cast<uint32_t>(1234 + rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v)
    x = u(gen) * (rank % 2 == 0 ? 1e7f : 1e-3f);
  return tensor(v);
}

// The sum every rank gets is x0 + x1 + ... + x(n-1), left to right in float32, at every
// element, for chunked and unchunked tensors alike, and the same on every run.
TEST(ShmDeterminism, FloatSumsFollowRankOrder) {
  constexpr int kWorld = 4;
  constexpr int64_t kN = 10'007;  // several chunks of 4 KiB, slices of unequal length
  EXPECT_ALL_RANKS_OK(run_threads(
      kWorld,
      [](ProcessGroupShm& group, int rank) {
        std::vector<float> expected(static_cast<size_t>(kN));
        for (int r = 0; r < kWorld; ++r) {
          Tensor x = order_sensitive(r, kN);
          const float* p = x.data<float>();
          for (int64_t i = 0; i < kN; ++i)
            expected[static_cast<size_t>(i)] =
                r == 0 ? p[i] : expected[static_cast<size_t>(i)] + p[i];
        }
        const Tensor want = tensor(expected);
        for (int run = 0; run < 2; ++run) {
          Tensor t = order_sensitive(rank, kN);
          group.all_reduce(t).wait();
          EXPECT_TRUE(same_bytes(t, want)) << "run " << run;
          Tensor root = order_sensitive(rank, kN);
          group.reduce(root, {.root = 3}).wait();
          if (rank == 3) {
            EXPECT_TRUE(same_bytes(root, want));
          }
        }
      },
      {}, ShmOptions{.buffer_bytes = 4096}));
}

// Integer and bool results of every reduce op (avg takes floating types only) equal Gloo's
// bit for bit: all_reduce,
// reduce and reduce_scatter, ranks holding a Gloo group and a shared-memory group each.
TEST(ShmMatchesGloo, EveryIntegerDtypeAndOpBitwise) {
  constexpr int kWorld = 3;
  auto gloo_store = std::make_shared<HashStore>(20s);
  auto shm_store = std::make_shared<HashStore>(20s);
  const ProcessGroupOptions options = test_options({});
  EXPECT_ALL_RANKS_OK(test::run_ranks_as_threads(
      kWorld,
      [&](int rank) {
        auto gloo =
            ProcessGroupGloo::create(gloo_store, rank, kWorld, options, {.host = "127.0.0.1"});
        auto shm = ProcessGroupShm::create(shm_store, rank, kWorld, options,
                                           test_shm_options({.buffer_bytes = 4096}));
        std::mt19937 gen(static_cast<uint32_t>(99 + rank));
        for (DType dtype : {kInt32, kInt64, kUInt8, kBool}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin,
                              ReduceOp::kMax}) {
            if (op == ReduceOp::kAvg) continue;  // floating-point tensors only
            // 3 * 2000 elements: chunks of the 4 KiB areas; products stay small.
            std::uniform_int_distribution<int64_t> pick(op == ReduceOp::kProduct ? -3 : -1000,
                                                        op == ReduceOp::kProduct ? 3 : 1000);
            std::vector<int64_t> values(6000);
            for (auto& v : values)
              v = dtype == kBool ? pick(gen) & 1 : pick(gen);
            const Tensor input = tensor(values).to(dtype);
            const std::string what =
                std::string(dtype_name(dtype)) + " " + std::string(reduce_op_name(op));
            Tensor a = input.clone();
            Tensor b = input.clone();
            gloo->all_reduce(a, {.op = op}).wait();
            shm->all_reduce(b, {.op = op}).wait();
            EXPECT_TRUE(same_bytes(a, b)) << "all_reduce " << what;
            a = input.clone();
            b = input.clone();
            gloo->reduce(a, {.root = 1, .op = op}).wait();
            shm->reduce(b, {.root = 1, .op = op}).wait();
            EXPECT_TRUE(same_bytes(a, b)) << "reduce " << what;
            std::vector<Tensor> parts = chunk(input, kWorld);
            Tensor ga = empty_like(parts[0]);
            Tensor gb = empty_like(parts[0]);
            gloo->reduce_scatter(ga, parts, {.op = op}).wait();
            shm->reduce_scatter(gb, parts, {.op = op}).wait();
            EXPECT_TRUE(same_bytes(ga, gb)) << "reduce_scatter " << what;
          }
        }
      },
      120s));
}

// ---- a list of tensors, reduced where they lie

// all_reduce of many tensors of two dtypes, interleaved, of odd sizes that straddle the
// 4 KiB areas' chunks and the ranks' slices: each tensor ends up holding, bit for bit, its
// part of the same data reduced as one flat tensor (the list is read and written in place,
// in the same fixed order), for a sum and an average of floats with rounding of their own.
TEST(ShmInPlace, ATensorListReducesBitForBitAsItsConcatenation) {
  constexpr int kWorld = 3;
  EXPECT_ALL_RANKS_OK(run_processes(
      kWorld,
      [](ProcessGroupShm& group, int rank) {
        EXPECT_TRUE(group.all_reduce_in_place());
        std::mt19937 gen(static_cast<uint32_t>(7 + rank));
        std::normal_distribution<double> normal(0.0, 1.0);
        std::vector<Tensor> floats, ints, list;
        for (int k = 0; k < 37; ++k) {
          const int64_t n = (k * 53 + 1) % 311 + 1;
          if (k % 4 == 3) {
            ints.push_back(full({n}, Scalar(int64_t{rank * 1000 + k}), kInt64));
            list.push_back(ints.back());
            continue;
          }
          std::vector<double> v(static_cast<size_t>(n));
          for (double& x : v)
            x = normal(gen) * 1e3;
          floats.push_back(tensor(v).to(kFloat32));
          list.push_back(floats.back());
        }
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          std::vector<Tensor> inputs;
          for (const Tensor& t : list)
            inputs.push_back(t.clone());
          std::vector<Tensor> flat_floats, flat_ints;
          for (const Tensor& t : inputs)
            (t.dtype() == kInt64 ? flat_ints : flat_floats).push_back(t);
          Tensor ff = cat(flat_floats);
          group.all_reduce(ff, {.op = op}).wait();
          Tensor fi = cat(flat_ints);
          if (op == ReduceOp::kSum) group.all_reduce(fi, {.op = op}).wait();
          std::vector<const void*> where;
          for (const Tensor& t : inputs)
            where.push_back(t.data_ptr());
          // Integers only under kSum (kAvg takes floating types).
          std::vector<Tensor> reduced;
          for (const Tensor& t : inputs)
            if (op == ReduceOp::kSum || t.dtype() != kInt64) reduced.push_back(t);
          group.all_reduce(reduced, {.op = op}).wait();
          int64_t at_f = 0, at_i = 0;
          for (size_t i = 0; i < inputs.size(); ++i) {
            const Tensor& t = inputs[i];
            EXPECT_EQ(t.data_ptr(), where[i]) << "tensor " << i << " moved";
            if (t.dtype() == kInt64) {
              if (op == ReduceOp::kSum) {
                EXPECT_TRUE(same_bytes(t, fi.narrow(0, at_i, t.numel()))) << "tensor " << i;
                // 0 + 1000 + 2000 + 3k.
                EXPECT_EQ(t.at({0}), 3000.0 + 3 * static_cast<double>(i));
              } else {
                EXPECT_TRUE(same_bytes(t, list[i])) << "tensor " << i << " not reduced";
              }
              at_i += t.numel();
            } else {
              EXPECT_TRUE(same_bytes(t, ff.narrow(0, at_f, t.numel())))
                  << "tensor " << i << " " << reduce_op_name(op);
              at_f += t.numel();
            }
          }
        }
      },
      {}, ShmOptions{.buffer_bytes = 4096}));
}

// Tensors that share bytes (one listed twice, two overlapping views of one buffer) are each
// reduced from their own input, as if alone, not from another's result: the overlap holds
// the sum once, not twice.
// kAvg divides each block of a rank's slice right after combining it: the result must be
// bit for bit what summing in rank order and then Tensor::div_ give (a divisor of 3 rounds,
// unlike 2), for float32 and float64, over several chunks of the area and blocks of a slice.
TEST(ShmInPlace, AveragesAreBitForBitTheSumThenDiv) {
  constexpr int kWorld = 3;
  EXPECT_ALL_RANKS_OK(run_processes(
      kWorld,
      [](ProcessGroupShm& group, int rank) {
        constexpr int64_t kN = 300'001;  // 1.2 MB of float32: two chunks of a 1 MiB area
        for (DType dtype : {kFloat32, kFloat64}) {
          auto input = [&](int r) {
            std::mt19937 gen(static_cast<uint32_t>(11 + r));
            std::normal_distribution<double> normal(0.0, 1.0);
            std::vector<double> v(static_cast<size_t>(kN));
            for (double& x : v)
              x = normal(gen) * 1e3;
            return tensor(v).to(dtype);
          };
          Tensor expected = add(add(input(0), input(1)), input(2));
          expected.div_(Scalar(3.0));
          Tensor mine = input(rank);
          Tensor other = input(rank).narrow(0, 0, 5'000).clone();
          group.all_reduce({mine, other}, {.op = ReduceOp::kAvg}).wait();
          EXPECT_TRUE(equal(mine, expected)) << dtype_name(dtype);
          EXPECT_TRUE(
              equal(other, add(add(input(0).narrow(0, 0, 5'000), input(1).narrow(0, 0, 5'000)),
                               input(2).narrow(0, 0, 5'000))
                               .div_(Scalar(3.0))))
              << dtype_name(dtype);
        }
      },
      {}, ShmOptions{}));
}

TEST(ShmInPlace, TensorsSharingBytesAreEachReducedFromTheirOwnInput) {
  constexpr int kWorld = 2;
  EXPECT_ALL_RANKS_OK(run_processes(
      kWorld,
      [](ProcessGroupShm& group, int rank) {
        Tensor base = full({3000}, Scalar(rank + 1), kFloat32);
        Tensor a = base.narrow(0, 0, 2000);
        Tensor b = base.narrow(0, 1000, 1500);  // overlaps a on [1000, 2000)
        Tensor c = full({700}, Scalar(10 * (rank + 1)), kFloat32);
        group.all_reduce({a, c, b, c}).wait();
        EXPECT_TRUE(equal(base.narrow(0, 0, 2500), full({2500}, Scalar(3), kFloat32)));
        EXPECT_TRUE(equal(base.narrow(0, 2500, 500), full({500}, Scalar(rank + 1), kFloat32)));
        EXPECT_TRUE(equal(c, full({700}, Scalar(30), kFloat32)));
      },
      {}, ShmOptions{.buffer_bytes = 4096}));
}

// ---- tensors larger than the segment

// Every collective with 4 KiB areas and tensors of tens of KiB (odd sizes, so the last
// chunk and the slices are short), against closed forms.
TEST(ShmChunking, EveryCollectiveWithTensorsLargerThanAnArea) {
  constexpr int kWorld = 3;
  constexpr int64_t kN = 7'777;
  EXPECT_ALL_RANKS_OK(run_processes(
      kWorld,
      [](ProcessGroupShm& group, int rank) {
        auto seq = [](int64_t n, double scale, double offset) {
          return arange(Scalar(0), Scalar(n)).to(kFloat64).mul_(Scalar(scale)).add_(Scalar(offset));
        };
        // all_reduce, several tensors of two dtypes
        Tensor a = seq(kN, rank + 1, 0);
        Tensor b = full({kN + 3}, Scalar(rank), kInt64);
        group.all_reduce({a, b}).wait();
        EXPECT_TRUE(equal(a, seq(kN, 6, 0)));
        EXPECT_TRUE(equal(b, full({kN + 3}, Scalar(3), kInt64)));
        // broadcast from rank 2
        Tensor c = seq(kN, rank, 1);
        group.broadcast(c, {.root = 2}).wait();
        EXPECT_TRUE(equal(c, seq(kN, 2, 1)));
        // all_gather and gather
        std::vector<Tensor> outs;
        for (int r = 0; r < kWorld; ++r)
          outs.push_back(empty({kN}, kFloat64));
        group.all_gather(outs, seq(kN, 1, rank)).wait();
        for (int r = 0; r < kWorld; ++r)
          EXPECT_TRUE(equal(outs[static_cast<size_t>(r)], seq(kN, 1, r)));
        std::vector<Tensor> gathered;
        if (rank == 1) {
          for (int r = 0; r < kWorld; ++r)
            gathered.push_back(empty({kN}, kFloat64));
        }
        group.gather(gathered, seq(kN, 2, rank), {.root = 1}).wait();
        for (size_t r = 0; r < gathered.size(); ++r)
          EXPECT_TRUE(equal(gathered[r], seq(kN, 2, double(r))));
        // scatter from rank 0
        std::vector<Tensor> pieces;
        if (rank == 0) {
          for (int r = 0; r < kWorld; ++r)
            pieces.push_back(seq(kN, 3, r * 10));
        }
        Tensor mine = empty({kN}, kFloat64);
        group.scatter(mine, pieces, {.root = 0}).wait();
        EXPECT_TRUE(equal(mine, seq(kN, 3, rank * 10)));
        // reduce_scatter
        std::vector<Tensor> ins;
        for (int r = 0; r < kWorld; ++r)
          ins.push_back(seq(kN, r + 1, rank));
        Tensor rs = empty({kN}, kFloat64);
        group.reduce_scatter(rs, ins, {.op = ReduceOp::kMax}).wait();
        EXPECT_TRUE(equal(rs, seq(kN, rank + 1, 2)));
        // all_to_all with unequal sizes: rank i sends (i + 1) * 1000 + j elements to rank j
        std::vector<Tensor> send;
        std::vector<Tensor> recv;
        for (int j = 0; j < kWorld; ++j) {
          send.push_back(seq((rank + 1) * 1000 + j, 1, rank * 100 + j));
          recv.push_back(empty({(j + 1) * 1000 + rank}, kFloat64));
        }
        group.all_to_all(recv, send).wait();
        for (int i = 0; i < kWorld; ++i) {
          EXPECT_TRUE(
              equal(recv[static_cast<size_t>(i)], seq((i + 1) * 1000 + rank, 1, i * 100 + rank)))
              << "from " << i;
        }
        // reduce to rank 0; the others keep theirs
        Tensor r0 = seq(kN, 1, rank);
        group.reduce(r0, {.root = 0}).wait();
        EXPECT_TRUE(equal(r0, rank == 0 ? seq(kN, 3, 3) : seq(kN, 1, rank)));
        group.barrier().wait();
      },
      {}, ShmOptions{.buffer_bytes = 4096}));
}

// ---- the base class's features over this backend

TEST(ShmDebugMode, MismatchedShapesRaiseOnEveryRank) {
  EXPECT_ALL_RANKS_OK(run_threads(
      2,
      [](ProcessGroupShm& group, int rank) {
        Tensor t = ones({rank == 0 ? 3 : 4}, kFloat32);
        try {
          group.all_reduce(t).wait();
          ADD_FAILURE() << "expected InvalidArgument";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("called different collectives"), std::string::npos)
              << e.what();
        }
        // Nothing was sent: the ranks are still in step.
        Tensor u = full({5}, Scalar(rank + 1), kFloat32);
        group.all_reduce(u).wait();
        EXPECT_TRUE(equal(u, full({5}, Scalar(3), kFloat32)));
      },
      ProcessGroupOptions{.debug_level = DebugLevel::kDetail}));
}

TEST(ShmPointToPoint, SendRecvAndMonitoredBarrier) {
  EXPECT_ALL_RANKS_OK(run_threads(3, [](ProcessGroupShm& group, int rank) {
    if (rank == 0) {
      for (int k = 0; k < 3; ++k)
        group.send(full({4}, Scalar(k), kInt32), 2, 7).wait();
    } else if (rank == 2) {
      for (int k = 0; k < 3; ++k) {
        Tensor t = empty({4}, kInt32);
        group.recv(t, 0, 7).wait();
        EXPECT_TRUE(equal(t, full({4}, Scalar(k), kInt32)));
      }
      Tensor any = empty({1}, kInt32);
      Work w = group.recv_any_source(any, 9);
      w.wait();
      EXPECT_EQ(w.source_rank(), 1);
    } else {
      group.send(full({1}, Scalar(5), kInt32), 2, 9).wait();
    }
    group.monitored_barrier(10s);
  }));
}

TEST(ShmSubgroups, EvenRanksReduceSeparately) {
  EXPECT_ALL_RANKS_OK(run_threads(4, [](ProcessGroupShm& group, int rank) {
    auto evens = group.new_group({0, 2});
    if (rank % 2 != 0) {
      EXPECT_EQ(evens, nullptr);
    } else {
      ASSERT_NE(evens, nullptr);
      EXPECT_EQ(evens->backend_name(), "shm");
      Tensor t = full({3}, Scalar(rank), kFloat32);
      evens->all_reduce(t).wait();
      EXPECT_TRUE(equal(t, full({3}, Scalar(2), kFloat32)));
    }
    group.barrier().wait();
  }));
}

// ---- choosing the backend

TEST(ShmFactory, CpuPicksSharedMemoryOnOneHost) {
  auto store = std::make_shared<HashStore>(20s);
  EXPECT_ALL_RANKS_OK(test::run_ranks_as_threads(
      2,
      [&](int rank) {
        auto group = make_process_group("cpu", store, rank, 2, test_options({}));
        EXPECT_EQ(group->backend_name(), "shm");
        Tensor t = full({3}, Scalar(rank + 1), kInt32);
        group->all_reduce(t).wait();
        EXPECT_TRUE(equal(t, full({3}, Scalar(3), kInt32)));
      },
      60s));
}

// Ranks that report different hosts (GRADWIRE_HOST_ID; ranks 0 and 2 on one, 1 and 3 on
// the other) get a HierarchicalProcessGroup from "cpu" and "shm", whose collectives match
// closed forms; ProcessGroupShm::create names the ranks elsewhere.
TEST(ShmHierarchical, RanksOnTwoHostsGetTheHierarchicalGroup) {
  constexpr int kWorld = 4;
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  EXPECT_ALL_RANKS_OK(test::run_ranks_as_processes(
      kWorld,
      [&](int rank) {
        ::setenv("GRADWIRE_HOST_ID", rank % 2 == 0 ? "host-a" : "host-b", 1);
        ::setenv("GRADWIRE_GLOO_HOST", "127.0.0.1", 1);
        auto store = std::make_shared<FileStore>(
            FileStoreOptions{.path = path, .num_workers = kWorld, .timeout = 20s});
        for (const char* backend : {"cpu", "shm"}) {
          auto group = make_process_group(backend, std::make_shared<PrefixStore>(backend, store),
                                          rank, kWorld, test_options({}));
          ASSERT_EQ(group->backend_name(), "shm-hierarchical") << backend;
          const auto& host_ranks = static_cast<HierarchicalProcessGroup&>(*group).host_ranks();
          EXPECT_EQ(host_ranks, (rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
          // all_reduce: several dtypes in one call, more elements than an area holds.
          Tensor i = full({3}, Scalar(rank + 1), kInt32);
          Tensor f = full({300'000}, Scalar(rank + 1), kFloat64);
          group->all_reduce({i, f}).wait();
          EXPECT_TRUE(equal(i, full({3}, Scalar(10), kInt32)));
          EXPECT_TRUE(equal(f, full({300'000}, Scalar(10), kFloat64)));
          Tensor avg = full({5}, Scalar(rank), kFloat32);
          group->all_reduce(avg, {.op = ReduceOp::kAvg}).wait();
          EXPECT_TRUE(equal(avg, full({5}, Scalar(1.5), kFloat32)));
          Tensor mx = full({5}, Scalar(rank * 7 % 5), kInt64);
          group->all_reduce(mx, {.op = ReduceOp::kMax}).wait();
          EXPECT_TRUE(equal(mx, full({5}, Scalar(4), kInt64)));
          // The operations on the Gloo group of every rank.
          Tensor b = full({4}, Scalar(rank), kFloat32);
          group->broadcast(b, {.root = 3}).wait();
          EXPECT_TRUE(equal(b, full({4}, Scalar(3), kFloat32)));
          std::vector<Tensor> outs;
          for (int r = 0; r < kWorld; ++r)
            outs.push_back(empty({2}, kInt32));
          group->all_gather(outs, full({2}, Scalar(rank * 10), kInt32)).wait();
          for (int r = 0; r < kWorld; ++r)
            EXPECT_TRUE(equal(outs[static_cast<size_t>(r)], full({2}, Scalar(r * 10), kInt32)));
          std::vector<Tensor> ins;
          for (int r = 0; r < kWorld; ++r)
            ins.push_back(full({3}, Scalar(r + rank), kInt32));
          Tensor rs = empty({3}, kInt32);
          group->reduce_scatter(rs, ins).wait();
          EXPECT_TRUE(equal(rs, full({3}, Scalar(4 * rank + 6), kInt32)));
          if (rank == 0) group->send(full({2}, Scalar(42), kInt32), 3, 5).wait();
          if (rank == 3) {
            Tensor got = empty({2}, kInt32);
            group->recv(got, 0, 5).wait();
            EXPECT_TRUE(equal(got, full({2}, Scalar(42), kInt32)));
          }
          group->barrier().wait();
          group->monitored_barrier(10s);
        }
        try {
          ProcessGroupShm::create(std::make_shared<PrefixStore>("direct", store), rank, kWorld,
                                  test_options({}), test_shm_options({}));
          ADD_FAILURE() << "expected InvalidArgument";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(rank % 2 == 0 ? "ranks [1, 3]" : "ranks [0, 2]"),
                    std::string::npos)
              << e.what();
        }
      },
      60s));
}

}  // namespace
}  // namespace gradwire::c10d
