#include "gradwire/tensor/factory.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "dispatch.h"
#include "gradwire/core/check.h"

namespace gradwire {

Tensor empty(const Shape& shape, TensorOptions options) {
  const int64_t n = shape_numel(shape);
  Storage storage = Storage::allocate(static_cast<size_t>(n * element_size(options.dtype_)),
                                      options.device_);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, options.dtype_);
}

Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions options) {
  GRADWIRE_CHECK_ARG(shape.size() == strides.size())
      << "empty_strided: " << shape.size() << " sizes but " << strides.size() << " strides";
  int64_t span = shape_numel(shape) == 0 ? 0 : 1;
  for (size_t d = 0; d < shape.size() && span > 0; ++d) {
    GRADWIRE_CHECK_ARG(strides[d] >= 0) << "empty_strided: negative stride in "
                                        << shape_to_string(strides);
    span += strides[d] * (shape[d] - 1);
  }
  Storage storage = Storage::allocate(static_cast<size_t>(span * element_size(options.dtype_)),
                                      options.device_);
  return Tensor(std::move(storage), shape, strides, 0, options.dtype_);
}

Tensor zeros(const Shape& shape, TensorOptions options) {
  Tensor t = empty(shape, options);
  t.zero_();
  return t;
}

Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1, options); }

Tensor full(const Shape& shape, Scalar value, TensorOptions options) {
  Tensor t = empty(shape, options);
  t.fill_(value);
  return t;
}

Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), t.options()); }
Tensor full_like(const Tensor& t, Scalar value) { return full(t.sizes(), value, t.options()); }

Tensor arange(Scalar end) { return arange(0, end, 1); }
Tensor arange(Scalar end, TensorOptions options) { return arange(0, end, 1, options); }

Tensor arange(Scalar start, Scalar end, Scalar step) {
  const bool integral = !start.is_floating_point() && !end.is_floating_point() &&
                        !step.is_floating_point();
  return arange(start, end, step, TensorOptions(integral ? kInt64 : kFloat32));
}

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions options) {
  const double s = start.to_double(), e = end.to_double(), d = step.to_double();
  GRADWIRE_CHECK_ARG(d != 0) << "arange: step must be non-zero";
  GRADWIRE_CHECK_ARG(std::isfinite(s) && std::isfinite(e))
      << "arange: start " << s << " and end " << e << " must be finite";
  GRADWIRE_CHECK_ARG((d > 0 && e >= s) || (d < 0 && e <= s))
      << "arange: step " << step << " has the wrong sign for start " << start << " and end "
      << end;
  int64_t n;
  if (!start.is_floating_point() && !end.is_floating_point() && !step.is_floating_point()) {
    const int64_t si = start.to_int(), ei = end.to_int(), di = step.to_int();
    n = di > 0 ? (ei - si + di - 1) / di : (si - ei - di - 1) / (-di);
  } else {
    n = static_cast<int64_t>(std::ceil((e - s) / d));
  }
  Tensor host = empty({n}, options.dtype_);
  detail::dispatch_numeric(options.dtype_, "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = host.data<T>();
    if constexpr (detail::is_floating_v<T>) {
      for (int64_t i = 0; i < n; ++i) p[i] = T(static_cast<detail::compute_t<T>>(s + i * d));
    } else {
      const int64_t si = start.to_int(), di = step.is_floating_point() ? 0 : step.to_int();
      for (int64_t i = 0; i < n; ++i) {
        p[i] = di != 0 ? static_cast<T>(si + i * di) : static_cast<T>(s + i * d);
      }
    }
  });
  return host.to(options.device_);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  GRADWIRE_CHECK_ARG(steps >= 0) << "linspace: steps must be non-negative, got " << steps;
  Tensor host = empty({steps}, kFloat64);
  double* p = host.data<double>();
  const double delta = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  for (int64_t i = 0; i < steps; ++i) p[i] = start + delta * static_cast<double>(i);
  if (steps > 1) p[steps - 1] = end;
  return host.to(options.dtype_).to(options.device_);
}

Tensor eye(int64_t n, TensorOptions options) {
  GRADWIRE_CHECK_ARG(n >= 0) << "eye: n must be non-negative, got " << n;
  Tensor host = zeros({n, n}, options.dtype_);
  for (int64_t i = 0; i < n; ++i) host.select(0, i).select(0, i).fill_(1);
  return host.to(options.device_);
}

namespace {
// Fills `count` values by calling emit(block_words, index) over Philox blocks reserved
// from `gen`, 4 words per block.
template <typename Emit>
void draw_words(Generator* gen, int64_t count, Emit emit) {
  Generator& g = gen ? *gen : default_generator();
  const uint64_t blocks = static_cast<uint64_t>((count + 3) / 4);
  const uint64_t first = g.reserve(blocks);
  const uint64_t seed = g.state().seed;
  uint32_t words[4];
  for (uint64_t b = 0; b < blocks; ++b) {
    Generator::philox(seed, first + b, words);
    for (int k = 0; k < 4; ++k) {
      const int64_t i = static_cast<int64_t>(b * 4 + k);
      if (i < count) emit(words, k, i);
    }
  }
}

// A double in [0, 1) from the top 53 bits of two words.
inline double unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}
}  // namespace

Tensor rand(const Shape& shape, Generator* gen, TensorOptions options) {
  GRADWIRE_CHECK_ARG(is_floating_point(options.dtype_))
      << "rand: dtype must be floating, got " << dtype_name(options.dtype_);
  const int64_t n = shape_numel(shape);
  Tensor host = empty(shape, kFloat64);
  double* p = host.data<double>();
  // Two words per value: each block gives two uniforms.
  draw_words(gen, 2 * n, [&](const uint32_t* w, int k, int64_t i) {
    if (k % 2 == 1) p[i / 2] = unit_double(w[k - 1], w[k]);
  });
  Tensor out = host.to(options.dtype_);
  if (options.dtype_ != kFloat64) {
    // Rounding a value just below 1 to float may give exactly 1: keep the interval open.
    detail::dispatch_floating(options.dtype_, "rand", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* q = out.data<T>();
      for (int64_t i = 0; i < n; ++i) {
        if (static_cast<double>(q[i]) >= 1.0) q[i] = T(0.0f);
      }
    });
  }
  return out.to(options.device_);
}

Tensor randn(const Shape& shape, Generator* gen, TensorOptions options) {
  GRADWIRE_CHECK_ARG(is_floating_point(options.dtype_))
      << "randn: dtype must be floating, got " << dtype_name(options.dtype_);
  const int64_t n = shape_numel(shape);
  Tensor host = empty(shape, kFloat64);
  double* p = host.data<double>();
  // Box-Muller: one block (four words) gives two uniforms, hence two normals.
  const int64_t pairs = (n + 1) / 2;
  draw_words(gen, 4 * pairs, [&](const uint32_t* w, int k, int64_t i) {
    if (k != 3) return;
    const int64_t pair = i / 4;
    const double u1 = 1.0 - unit_double(w[0], w[1]);  // (0, 1]: log is finite
    const double u2 = unit_double(w[2], w[3]);
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * 3.14159265358979323846 * u2;
    if (2 * pair < n) p[2 * pair] = r * std::cos(theta);
    if (2 * pair + 1 < n) p[2 * pair + 1] = r * std::sin(theta);
  });
  return host.to(options.dtype_).to(options.device_);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen,
               TensorOptions options) {
  GRADWIRE_CHECK_ARG(low < high) << "randint: low " << low << " must be below high " << high;
  const int64_t n = shape_numel(shape);
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  Tensor host = empty(shape, kInt64);
  int64_t* p = host.data<int64_t>();
  draw_words(gen, 2 * n, [&](const uint32_t* w, int k, int64_t i) {
    if (k % 2 == 0) return;
    const uint64_t bits = (static_cast<uint64_t>(w[k - 1]) << 32) | w[k];
    // The modulo bias is below range / 2^64, negligible for any realistic range.
    p[i / 2] = low + static_cast<int64_t>(bits % range);
  });
  return host.to(options.dtype_).to(options.device_);
}

Tensor randperm(int64_t n, Generator* gen) {
  GRADWIRE_CHECK_ARG(n >= 0) << "randperm: n must be non-negative, got " << n;
  Tensor out = arange(n);
  if (n < 2) return out;
  // Fisher-Yates with one random draw per position.
  Tensor r = randint(0, std::numeric_limits<int64_t>::max(), {n}, gen);
  int64_t* p = out.data<int64_t>();
  const int64_t* q = r.data<int64_t>();
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[q[i] % (i + 1)]);
  return out;
}

Tensor from_blob(void* data, const Shape& shape, TensorOptions options,
                 std::function<void(void*)> deleter) {
  return from_blob(data, shape, contiguous_strides(shape), options, std::move(deleter));
}

Tensor from_blob(void* data, const Shape& shape, const Shape& strides, TensorOptions options,
                 std::function<void(void*)> deleter) {
  GRADWIRE_CHECK_ARG(data != nullptr || shape_numel(shape) == 0)
      << "from_blob: null data pointer for shape " << shape_to_string(shape);
  GRADWIRE_CHECK_ARG(shape.size() == strides.size())
      << "from_blob: " << shape.size() << " sizes but " << strides.size() << " strides";
  int64_t span = shape_numel(shape) == 0 ? 0 : 1;
  for (size_t d = 0; d < shape.size() && span > 0; ++d) {
    GRADWIRE_CHECK_ARG(strides[d] >= 0) << "from_blob: negative stride in "
                                        << shape_to_string(strides);
    span += strides[d] * (shape[d] - 1);
  }
  Storage storage = Storage::borrow(data, static_cast<size_t>(span * element_size(options.dtype_)),
                                    options.device_, std::move(deleter));
  return Tensor(std::move(storage), shape, strides, 0, options.dtype_);
}

template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  GRADWIRE_CHECK_ARG(shape_numel(shape) == static_cast<int64_t>(values.size()))
      << "tensor: " << values.size() << " values do not fill shape " << shape_to_string(shape);
  Tensor out = empty(shape, dtype_of<T>);
  T* p = out.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return out;
}
template Tensor tensor<float>(const std::vector<float>&, const Shape&);
template Tensor tensor<double>(const std::vector<double>&, const Shape&);
template Tensor tensor<Half>(const std::vector<Half>&, const Shape&);
template Tensor tensor<BFloat16>(const std::vector<BFloat16>&, const Shape&);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, const Shape&);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, const Shape&);
template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, const Shape&);
template Tensor tensor<bool>(const std::vector<bool>&, const Shape&);

Tensor scalar_tensor(Scalar value, TensorOptions options) { return full({}, value, options); }
Tensor scalar_tensor(Scalar value) { return full({}, value, value.default_dtype()); }

}  // namespace gradwire
