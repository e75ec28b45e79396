// The intra-op policy (parallel.h): parallel_for's coverage of every index at sizes
// around its grain, nesting and errors; GEMMs from several threads at once against a
// float64 reference; and large elementwise ops and reductions, which must be right and,
// for reductions, bitwise the same for every thread count.
#include "gradwire/tensor/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

// The kernels' chunk sizes (loop.h kParallelGrain, reduce.cc kSumChunk), to probe sizes
// on either side of them.
constexpr int64_t kGrain = int64_t{1} << 15;
const std::vector<int> kThreadCounts = {1, 2, 3, 8};

// Restores the process-wide thread count whatever a test set.
class ParallelTest : public ::testing::Test {
 protected:
  void TearDown() override { set_num_threads(saved_); }

 private:
  int saved_ = get_num_threads();
};

// Uniform values in [-1, 1) from an LCG.
std::vector<float> uniform(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return v;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const T* p = c.template data<T>();
  return std::vector<T>(p, p + c.numel());
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.numel() == y.numel() && x.dtype() == y.dtype() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

TEST_F(ParallelTest, SetNumThreadsRejectsCountsBelowOne) {
  EXPECT_THROW(set_num_threads(0), InvalidArgument);
  EXPECT_THROW(set_num_threads(-2), InvalidArgument);
  set_num_threads(3);
  EXPECT_EQ(get_num_threads(), 3);
}

TEST_F(ParallelTest, CoversEveryIndexExactlyOnce) {
  const std::vector<int64_t> sizes = {0,
                                      1,
                                      kGrain - 1,
                                      kGrain,
                                      kGrain + 1,
                                      2 * kGrain - 1,
                                      2 * kGrain,
                                      2 * kGrain + 1,
                                      3 * kGrain + 7,
                                      8 * kGrain,
                                      8 * kGrain + 1};
  for (int threads : kThreadCounts) {
    set_num_threads(threads);
    for (int64_t grain : {int64_t{1}, int64_t{7}, kGrain}) {
      for (int64_t n : sizes) {
        const int64_t begin = 5;
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        std::atomic<int64_t> calls{0};
        std::atomic<bool> bad_range{false};
        parallel_for(begin, begin + n, grain, [&](int64_t b, int64_t e) {
          ++calls;
          if (b < begin || e > begin + n || b >= e) bad_range = true;
          if (!in_parallel_region() && calls > 1) bad_range = true;
          for (int64_t i = b; i < e && !bad_range; ++i)
            ++seen[i - begin];
        });
        ASSERT_FALSE(bad_range) << "threads " << threads << " grain " << grain << " n " << n;
        int64_t wrong = 0;
        for (auto& s : seen)
          wrong += s.load() != 1;
        EXPECT_EQ(wrong, 0) << "threads " << threads << " grain " << grain << " n " << n;
        // Never more chunks than threads, and one call for a range under two grains.
        EXPECT_LE(calls.load(), n == 0 ? 0 : threads);
        if (n > 0 && n < 2 * grain) {
          EXPECT_EQ(calls.load(), 1);
        }
      }
    }
  }
  EXPECT_FALSE(in_parallel_region());
}

TEST_F(ParallelTest, NestedLoopRunsSeriallyOnItsThread) {
  set_num_threads(4);
  const int64_t n = 8 * kGrain;
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  std::atomic<bool> inner_split{false};
  parallel_for(0, 4, 1, [&](int64_t b, int64_t e) {
    for (int64_t outer = b; outer < e; ++outer) {
      const std::thread::id self = std::this_thread::get_id();
      int inner_calls = 0;
      parallel_for(0, n, kGrain, [&](int64_t ib, int64_t ie) {
        ++inner_calls;
        if (std::this_thread::get_id() != self || ib != 0 || ie != n) inner_split = true;
        for (int64_t i = ib; i < ie; i += kGrain)
          ++seen[i];
      });
      if (inner_calls != 1) inner_split = true;
    }
  });
  EXPECT_FALSE(inner_split);
  for (int64_t i = 0; i < n; i += kGrain)
    EXPECT_EQ(seen[i].load(), 4);
}

TEST_F(ParallelTest, ExceptionFromAChunkReachesTheCallerAndThePoolStaysUsable) {
  set_num_threads(4);
  const int64_t n = 16 * kGrain;
  EXPECT_THROW(parallel_for(0, n, kGrain,
                            [&](int64_t b, int64_t e) {
                              if (b <= n / 2 && n / 2 < e) throw std::runtime_error("chunk");
                            }),
               std::runtime_error);
  std::atomic<int64_t> total{0};
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), n);
}

// C = op(A) · op(B) in double from float operands [n, k] (or [k, n] when trans_a).
std::vector<double> reference_mm(const std::vector<float>& a, const std::vector<float>& b,
                                 int64_t n, int64_t k, int64_t m, bool trans_a) {
  std::vector<double> c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double av = trans_a ? a[p * n + i] : a[i * k + p];
      for (int64_t j = 0; j < m; ++j)
        c[i * m + j] += av * static_cast<double>(b[p * m + j]);
    }
  }
  return c;
}

// Largest |c - ref| over elements; with operands in [-1, 1) a float GEMM is within
// k * 2^-23 of the exact product (each of k terms and additions rounds once at most).
double max_error(const Tensor& c, const std::vector<double>& ref) {
  const std::vector<float> got = values_of<float>(c);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - ref[i]));
  return worst;
}

struct GemmCase {
  int64_t n, k, m;
  bool trans_a;
};

// Small (one BLAS call) and large (split by rows, ragged last block, A transposed).
const std::vector<GemmCase> kGemmCases = {
    {64, 64, 64, false}, {256, 256, 256, false}, {203, 100, 150, true}, {517, 64, 96, false}};

TEST_F(ParallelTest, ConcurrentGemmsFromFourThreadsAreRight) {
  for (int threads : {1, 4}) {
    set_num_threads(threads);
    std::vector<std::vector<std::vector<double>>> refs(kGemmCases.size());
    std::vector<Tensor> as, bs;
    std::vector<std::vector<double>> expected;
    for (size_t c = 0; c < kGemmCases.size(); ++c) {
      const GemmCase& g = kGemmCases[c];
      const auto a = uniform(g.n * g.k, 11 + c), b = uniform(g.k * g.m, 29 + c);
      as.push_back(g.trans_a ? tensor<float>(a, {g.k, g.n}).t() : tensor<float>(a, {g.n, g.k}));
      bs.push_back(tensor<float>(b, {g.k, g.m}));
      expected.push_back(reference_mm(a, b, g.n, g.k, g.m, g.trans_a));
    }
    std::vector<std::vector<double>> errors(4, std::vector<double>(kGemmCases.size(), 0.0));
    std::vector<std::thread> callers;
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&, t] {
        for (int rep = 0; rep < 3; ++rep) {
          for (size_t c = 0; c < kGemmCases.size(); ++c) {
            errors[t][c] = std::max(errors[t][c], max_error(mm(as[c], bs[c]), expected[c]));
          }
        }
      });
    }
    for (auto& caller : callers)
      caller.join();
    for (int t = 0; t < 4; ++t) {
      for (size_t c = 0; c < kGemmCases.size(); ++c) {
        const double bound = static_cast<double>(kGemmCases[c].k) * std::ldexp(1.0, -23);
        EXPECT_LE(errors[t][c], bound) << "threads " << threads << " caller " << t << " case " << c;
      }
    }
  }
}

TEST_F(ParallelTest, LargeElementwiseOpsMatchTheSerialResult) {
  const int64_t rows = 301, cols = 517;  // rows of the plan split inside chunks
  const auto av = uniform(rows * cols, 3), bv = uniform(cols, 5);
  const Tensor a = tensor<float>(av, {rows, cols});
  const Tensor b = tensor<float>(bv, {cols});
  const Tensor at = tensor<float>(av, {cols, rows}).t();  // strided operand
  set_num_threads(1);
  const Tensor sum1 = a + b, exp1 = exp(a), mixed1 = at * a;
  Tensor inplace1 = a.clone();
  inplace1.add_(b);
  for (int threads : {2, 3, 8}) {
    set_num_threads(threads);
    EXPECT_TRUE(bitwise_equal(a + b, sum1)) << threads;
    EXPECT_TRUE(bitwise_equal(exp(a), exp1)) << threads;
    EXPECT_TRUE(bitwise_equal(at * a, mixed1)) << threads;
    Tensor inplace = a.clone();
    inplace.add_(b);
    EXPECT_TRUE(bitwise_equal(inplace, inplace1)) << threads;
  }
  const std::vector<float> got = values_of<float>(sum1);
  for (int64_t i = 0; i < rows * cols; i += 997)
    EXPECT_EQ(got[i], av[i] + bv[i % cols]);
}

TEST_F(ParallelTest, SumsMatchAFloat64ReferenceAndEveryThreadCountBitwise) {
  const int max_threads = 8;
  for (int64_t n :
       {int64_t{1000}, kGrain - 1, kGrain, kGrain + 1, 5 * kGrain + 3, int64_t{1} << 22}) {
    const auto v = uniform(n, static_cast<uint64_t>(n));
    const Tensor x = tensor<float>(v, {n});
    double exact = 0, magnitude = 0;
    for (float f : v) {
      exact += f;
      magnitude += std::abs(f);
    }
    set_num_threads(1);
    const Tensor s1 = sum(x);
    // Pairwise blocks of 128 in 8 lanes: a term passes through at most 16 sequential
    // additions plus one per level of the tree, each rounding by 2^-24 at most.
    const double levels = 16 + std::ceil(std::log2(static_cast<double>(n)));
    EXPECT_LE(std::abs(s1.item<double>() - exact), levels * std::ldexp(1.0, -24) * magnitude)
        << "n " << n;
    for (int threads = 2; threads <= max_threads; ++threads) {
      set_num_threads(threads);
      EXPECT_TRUE(bitwise_equal(sum(x), s1)) << "n " << n << " threads " << threads;
    }
  }
  // Row sums: many short rows (split over rows) and a few long ones (split in chunks).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3000, 100}, {5, 3 * kGrain + 11}}) {
    const auto v = uniform(rows * cols, 77);
    const Tensor x = tensor<float>(v, {rows, cols});
    set_num_threads(1);
    const Tensor s1 = sum(x, {1});
    const Tensor m1 = amax(x, {1});
    const Tensor i1 = argmax(x, 1);
    const std::vector<float> got = values_of<float>(s1);
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0, magnitude = 0;
      for (int64_t j = 0; j < cols; ++j) {
        exact += v[r * cols + j];
        magnitude += std::abs(v[r * cols + j]);
      }
      const double levels = 16 + std::ceil(std::log2(static_cast<double>(cols)));
      EXPECT_LE(std::abs(got[r] - exact), levels * std::ldexp(1.0, -24) * magnitude) << r;
    }
    for (int threads = 2; threads <= max_threads; ++threads) {
      set_num_threads(threads);
      EXPECT_TRUE(bitwise_equal(sum(x, {1}), s1)) << rows << "x" << cols << " " << threads;
      EXPECT_TRUE(bitwise_equal(amax(x, {1}), m1)) << rows << "x" << cols << " " << threads;
      EXPECT_TRUE(bitwise_equal(argmax(x, 1), i1)) << rows << "x" << cols << " " << threads;
    }
  }
}

}  // namespace
}  // namespace gradwire
