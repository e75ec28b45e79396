// CPU row reductions (kernels.h: cpu::reduce_rows).
//
// Every reduction sees a contiguous [rows, cols] matrix and reduces each row. Sums use
// blocked pairwise summation: eight independent partial sums over blocks of 128 elements
// (which also lets the compiler vectorise), combined in a binary tree, so the rounding
// error grows with log(cols) instead of cols. Integer sums and products accumulate in
// uint64_t so that overflow wraps like two's complement instead of being undefined.
//
// Large reductions use the intra-op threads (parallel.h) without letting the thread
// count change a single bit of the result: rows are independent, and a row longer than
// kSumChunk is summed in fixed chunks of kSumChunk elements (pairwise within each) whose
// partial sums are then added pairwise in chunk order. The chunking depends on the row
// length only, so every thread count, 1 included, computes the same additions; rows of
// up to kSumChunk elements keep the single pairwise sum.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/reduce_leading.h"
#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/parallel.h"
#include "kernels.h"
#include "loop.h"

namespace gradwire::detail::cpu {

namespace {

// The accumulator a reduction of T computes in: float for float/half/bfloat16, double
// for double, int64 for integers and bool.
template <typename T>
using reduce_acc_t = std::conditional_t<is_floating_v<T>, acc_t<T>, int64_t>;

template <typename T>
constexpr bool is_float_like = is_floating_v<T>;

template <typename A, typename T>
inline A load_as(const T& v) {
  return convert<A>(v);
}

template <typename T>
reduce_acc_t<T> pairwise_sum(const T* x, int64_t n) {
  using A = reduce_acc_t<T>;
  if constexpr (!is_float_like<T>) {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; ++i)
      s += static_cast<uint64_t>(load_as<int64_t>(x[i]));
    return static_cast<int64_t>(s);
  } else {
    constexpr int64_t kBlock = 128;
    if (n <= kBlock) {
      A s[8] = {};
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; ++j)
          s[j] += load_as<A>(x[i + j]);
      }
      A r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      for (; i < n; ++i)
        r += load_as<A>(x[i]);
      return r;
    }
    // Split on a multiple of 8 so both halves keep full unrolled blocks.
    int64_t half = (n / 2) & ~int64_t{7};
    return pairwise_sum(x, half) + pairwise_sum(x + half, n - half);
  }
}

template <typename T>
reduce_acc_t<T> row_prod(const T* x, int64_t n) {
  using A = reduce_acc_t<T>;
  if constexpr (!is_float_like<T>) {
    uint64_t p = 1;
    for (int64_t i = 0; i < n; ++i)
      p *= static_cast<uint64_t>(load_as<int64_t>(x[i]));
    return static_cast<int64_t>(p);
  } else {
    A p = 1;
    for (int64_t i = 0; i < n; ++i)
      p *= load_as<A>(x[i]);
    return p;
  }
}

// Max (kIsMax) or min of a non-empty row; a nan anywhere makes the result nan. The nan
// test is kept apart from the compare so the loop stays branch-free and vectorises.
template <bool kIsMax, typename T>
compute_t<T> row_extreme(const T* x, int64_t n) {
  using C = compute_t<T>;
  C m = static_cast<C>(x[0]);
  if constexpr (is_float_like<T>) {
    bool nan = m != m;
    for (int64_t i = 1; i < n; ++i) {
      const C v = static_cast<C>(x[i]);
      nan |= v != v;
      m = kIsMax ? (v > m ? v : m) : (v < m ? v : m);
    }
    return nan ? std::numeric_limits<C>::quiet_NaN() : m;
  } else {
    for (int64_t i = 1; i < n; ++i) {
      const C v = static_cast<C>(x[i]);
      m = kIsMax ? (v > m ? v : m) : (v < m ? v : m);
    }
    return m;
  }
}

// Value and index of the first extreme of a non-empty row; the first nan wins.
template <bool kIsMax, typename T>
std::pair<compute_t<T>, int64_t> row_arg_extreme(const T* x, int64_t n) {
  using C = compute_t<T>;
  C best = static_cast<C>(x[0]);
  int64_t best_i = 0;
  if constexpr (is_float_like<T>) {
    if (best != best) return {best, 0};
  }
  for (int64_t i = 1; i < n; ++i) {
    const C v = static_cast<C>(x[i]);
    if constexpr (is_float_like<T>) {
      if (v != v) return {v, i};
    }
    if (kIsMax ? v > best : v < best) {
      best = v;
      best_i = i;
    }
  }
  return {best, best_i};
}

// Elements per chunk of a long row's sum. Fixed, never derived from the thread count,
// so that results are the same for every count; a multiple of 8 for pairwise_sum.
constexpr int64_t kSumChunk = int64_t{1} << 15;

// Stores row_value(r) for every row into `out`, converting from A when out's dtype is a
// different one (e.g. a half sum accumulated in float, or sum(..., dtype=int32)). Each
// row_value(r) reads `cols` elements; rows are split over the intra-op threads when there
// are enough of them, each row still computed whole by one thread.
template <typename A, typename F>
void write_rows(const Tensor& out, int64_t rows, int64_t cols, F&& row_value) {
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, cols));
  if (out.dtype() == dtype_of<A>) {
    A* o = static_cast<A*>(out.data_ptr());
    parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        o[r] = row_value(r);
    });
    return;
  }
  dispatch_all(out.dtype(), "reduce_rows", [&](auto tag) {
    using O = typename decltype(tag)::type;
    O* o = static_cast<O*>(out.data_ptr());
    parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        o[r] = convert<O>(row_value(r));
    });
  });
}

template <typename A>
A add_acc(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    return a + b;
  } else {
    return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
}

// Pairwise sum of n >= 1 chunk partials, in chunk order.
template <typename A>
A combine_partials(const A* p, int64_t n) {
  if (n == 1) return p[0];
  const int64_t half = n / 2;
  return add_acc(combine_partials(p, half), combine_partials(p + half, n - half));
}

// Row sums of a contiguous [rows, cols > kSumChunk] matrix: every (row, chunk) pair is
// one task for the intra-op threads, then each row combines its partials in order.
template <typename T>
void chunked_row_sums(const Tensor& out, const T* x, int64_t rows, int64_t cols) {
  using A = reduce_acc_t<T>;
  const int64_t chunks = (cols + kSumChunk - 1) / kSumChunk;
  std::vector<A> partials(static_cast<size_t>(rows * chunks));
  parallel_for(0, rows * chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t r = t / chunks, c = t % chunks;
      const int64_t begin = c * kSumChunk;
      partials[t] = pairwise_sum(x + r * cols + begin, std::min(kSumChunk, cols - begin));
    }
  });
  write_rows<A>(out, rows, chunks,
                [&](int64_t r) { return combine_partials(partials.data() + r * chunks, chunks); });
}

// Column sums of a contiguous [rows, cols] block into acc[cols], pairwise over rows: the
// leaves add up to kLeafRows rows straight down each column (contiguous, vectorisable
// across columns), and halves are combined through a temporary, so the error grows with
// log(rows) like the row sums.
template <typename T>
void pairwise_column_sum(const T* x, int64_t rows, int64_t cols, reduce_acc_t<T>* acc) {
  using A = reduce_acc_t<T>;
  constexpr int64_t kLeafRows = 8;
  if (rows <= kLeafRows) {
    for (int64_t j = 0; j < cols; ++j)
      acc[j] = A(0);
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = x + i * cols;
      if constexpr (is_float_like<T>) {
        for (int64_t j = 0; j < cols; ++j)
          acc[j] += load_as<A>(row[j]);
      } else {
        // Wrapping integer addition, as in pairwise_sum.
        for (int64_t j = 0; j < cols; ++j) {
          acc[j] = static_cast<A>(static_cast<uint64_t>(acc[j]) +
                                  static_cast<uint64_t>(load_as<int64_t>(row[j])));
        }
      }
    }
    return;
  }
  const int64_t half = rows / 2;
  pairwise_column_sum(x, half, cols, acc);
  std::vector<A> rest(static_cast<size_t>(cols));
  pairwise_column_sum(x + half * cols, rows - half, cols, rest.data());
  for (int64_t j = 0; j < cols; ++j) {
    if constexpr (is_float_like<T>) {
      acc[j] += rest[j];
    } else {
      acc[j] = static_cast<A>(static_cast<uint64_t>(acc[j]) + static_cast<uint64_t>(rest[j]));
    }
  }
}

template <typename T>
void column_prod(const T* x, int64_t rows, int64_t cols, reduce_acc_t<T>* acc) {
  using A = reduce_acc_t<T>;
  for (int64_t j = 0; j < cols; ++j)
    acc[j] = A(1);
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = x + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      if constexpr (is_float_like<T>) {
        acc[j] *= load_as<A>(row[j]);
      } else {
        acc[j] = static_cast<A>(static_cast<uint64_t>(acc[j]) *
                                static_cast<uint64_t>(load_as<int64_t>(row[j])));
      }
    }
  }
}

// Column max/min of a [rows >= 1, cols] block; a nan in a column makes it nan (once m is
// nan, neither comparison replaces it).
template <bool kIsMax, typename T>
void column_extreme(const T* x, int64_t rows, int64_t cols, compute_t<T>* m) {
  using C = compute_t<T>;
  for (int64_t j = 0; j < cols; ++j)
    m[j] = static_cast<C>(x[j]);
  for (int64_t i = 1; i < rows; ++i) {
    const T* row = x + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const C v = static_cast<C>(row[j]);
      bool take = kIsMax ? v > m[j] : v < m[j];
      if constexpr (is_float_like<T>) take = take || v != v;
      m[j] = take ? v : m[j];
    }
  }
}

}  // namespace

void reduce_rows(ReduceOp op, const Tensor& out, const Tensor& index, const Tensor& in) {
  const int64_t rows = in.size(0);
  const int64_t cols = in.size(1);
  int64_t* idx = index.defined() ? static_cast<int64_t*>(index.data_ptr()) : nullptr;
  dispatch_all(in.dtype(), "reduce_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    auto row = [&](int64_t r) { return x + r * cols; };
    switch (op) {
      case ReduceOp::kSum:
        if (cols > kSumChunk) {
          chunked_row_sums(out, x, rows, cols);
        } else {
          write_rows<reduce_acc_t<T>>(out, rows, cols,
                                      [&](int64_t r) { return pairwise_sum(row(r), cols); });
        }
        break;
      case ReduceOp::kProd:
        write_rows<reduce_acc_t<T>>(out, rows, cols,
                                    [&](int64_t r) { return row_prod(row(r), cols); });
        break;
      case ReduceOp::kMax:
      case ReduceOp::kMin: {
        const bool is_max = op == ReduceOp::kMax;
        if (idx != nullptr) {
          write_rows<C>(out, rows, cols, [&](int64_t r) {
            auto [v, i] =
                is_max ? row_arg_extreme<true>(row(r), cols) : row_arg_extreme<false>(row(r), cols);
            idx[r] = i;
            return v;
          });
        } else {
          write_rows<C>(out, rows, cols, [&](int64_t r) {
            return is_max ? row_extreme<true>(row(r), cols) : row_extreme<false>(row(r), cols);
          });
        }
        break;
      }
      case ReduceOp::kArgMax:
      case ReduceOp::kArgMin: {
        const bool is_max = op == ReduceOp::kArgMax;
        write_rows<C>(out, rows, cols, [&](int64_t r) {
          auto [v, i] =
              is_max ? row_arg_extreme<true>(row(r), cols) : row_arg_extreme<false>(row(r), cols);
          idx[r] = i;
          return v;
        });
        break;
      }
    }
  });
}

void reduce_leading(ReduceOp op, const Tensor& out, const Tensor& in) {
  const int64_t rows = in.size(0);
  const int64_t cols = in.size(1);
  dispatch_all(in.dtype(), "reduce_leading", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kProd: {
        std::vector<reduce_acc_t<T>> acc(static_cast<size_t>(cols));
        if (op == ReduceOp::kSum) {
          pairwise_column_sum(x, rows, cols, acc.data());
        } else {
          column_prod(x, rows, cols, acc.data());
        }
        write_rows<reduce_acc_t<T>>(out, cols, 1, [&](int64_t j) { return acc[j]; });
        break;
      }
      case ReduceOp::kMax:
      case ReduceOp::kMin: {
        // Not std::vector: vector<bool> has no data().
        auto m = std::make_unique<C[]>(static_cast<size_t>(cols));
        if (op == ReduceOp::kMax) {
          column_extreme<true>(x, rows, cols, m.get());
        } else {
          column_extreme<false>(x, rows, cols, m.get());
        }
        write_rows<C>(out, cols, 1, [&](int64_t j) { return m[j]; });
        break;
      }
      case ReduceOp::kArgMax:
      case ReduceOp::kArgMin:
        GRADWIRE_CHECK(false) << "reduce_leading: arg reductions go through reduce_rows";
    }
  });
}

}  // namespace gradwire::detail::cpu
