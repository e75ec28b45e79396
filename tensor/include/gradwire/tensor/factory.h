// Creating tensors: empty, zeros, ones, full, arange, rand, randn, from_blob, tensor(...).
//
// Every factory takes TensorOptions (dtype, default float32, and device, default cpu),
// except where the dtype follows from the values (arange of integers is int64, tensor()
// of a std::vector<T> is dtype_of<T>).
//
// Errors: a negative size, an arange with a zero step or the wrong sign, or a value list
// whose length does not match the shape throws InvalidArgument naming the factory.
//
// Thread-safety: all factories may be called from any thread; rand/randn draw from the
// given Generator, whose own lock makes concurrent draws safe (each draw is atomic).
//
// Example:
//   Tensor x = randn({64, 784}, gen);                 // float32, N(0, 1)
//   Tensor i = tensor<int64_t>({0, 2, 1});            // 1-d int64
//   Tensor w = from_blob(ptr, {3, 4}, kFloat32, [](void* p) { free(p); });
#pragma once

#include <functional>
#include <vector>

#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire {

Tensor empty(const Shape& shape, TensorOptions options = {});
// A tensor with the given geometry whose storage is exactly large enough.
Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, Scalar value, TensorOptions options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar value);

// [start, end) by step. With integral start/end/step and no dtype the result is int64,
// otherwise float32 (or the dtype given). The length is ceil((end - start) / step).
Tensor arange(Scalar end);
Tensor arange(Scalar end, TensorOptions options);
Tensor arange(Scalar start, Scalar end, Scalar step = 1);
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions options);
// `steps` points evenly spaced over [start, end].
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
Tensor eye(int64_t n, TensorOptions options = {});

// Uniform on [0, 1) and standard normal, from `gen` (the default generator when null).
// Only floating dtypes. Values are reproducible for a given seed and shape.
Tensor rand(const Shape& shape, Generator* gen = nullptr, TensorOptions options = {});
Tensor randn(const Shape& shape, Generator* gen = nullptr, TensorOptions options = {});
// Integers uniform on [low, high), int64 by default.
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen = nullptr,
               TensorOptions options = TensorOptions(kInt64));
// A random permutation of 0..n-1 (int64).
Tensor randperm(int64_t n, Generator* gen = nullptr);

// Wraps memory the caller owns without copying. `deleter` (optional) runs when the last
// tensor or view over it goes away; without one the memory must outlive every view.
Tensor from_blob(void* data, const Shape& shape, TensorOptions options,
                 std::function<void(void*)> deleter = {});
Tensor from_blob(void* data, const Shape& shape, const Shape& strides, TensorOptions options,
                 std::function<void(void*)> deleter = {});

// Copies values into a new CPU tensor; shape defaults to 1-d of values.size().
template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape);
template <typename T>
Tensor tensor(const std::vector<T>& values) {
  return tensor<T>(values, Shape{static_cast<int64_t>(values.size())});
}
extern template Tensor tensor<float>(const std::vector<float>&, const Shape&);
extern template Tensor tensor<double>(const std::vector<double>&, const Shape&);
extern template Tensor tensor<Half>(const std::vector<Half>&, const Shape&);
extern template Tensor tensor<BFloat16>(const std::vector<BFloat16>&, const Shape&);
extern template Tensor tensor<int32_t>(const std::vector<int32_t>&, const Shape&);
extern template Tensor tensor<int64_t>(const std::vector<int64_t>&, const Shape&);
extern template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, const Shape&);
extern template Tensor tensor<bool>(const std::vector<bool>&, const Shape&);

// A zero-dimensional tensor holding `value` (dtype from the scalar, or the given one).
Tensor scalar_tensor(Scalar value, TensorOptions options);
Tensor scalar_tensor(Scalar value);

}  // namespace gradwire
