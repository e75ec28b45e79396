#include "gradwire/c10d/verify_params.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/factory.h"
#include "rank_keys.h"

namespace gradwire::c10d {

namespace {

// Stands for an undefined tensor in place of a dtype code.
constexpr int64_t kUndefinedTensor = -1;

// One tensor as a signature describes it.
struct Entry {
  int64_t dtype = kUndefinedTensor;
  std::vector<int64_t> sizes;
  bool operator==(const Entry&) const = default;
};

// [count, then per tensor: dtype code, number of dimensions, sizes...].
std::vector<int64_t> encode(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> out{static_cast<int64_t>(tensors.size())};
  for (const Tensor& t : tensors) {
    if (!t.defined()) {
      out.push_back(kUndefinedTensor);
      out.push_back(0);
      continue;
    }
    out.push_back(static_cast<int64_t>(t.dtype()));
    out.push_back(t.dim());
    for (int64_t size : t.sizes())
      out.push_back(size);
  }
  return out;
}

// Every rank runs the same code, so a signature is well formed; the bounds are checked
// anyway, so that a damaged one is reported rather than read past its end.
std::optional<std::vector<Entry>> decode(const std::vector<int64_t>& sig) {
  if (sig.empty() || sig[0] < 0) return std::nullopt;
  std::vector<Entry> entries;
  size_t at = 1;
  for (int64_t i = 0; i < sig[0]; ++i) {
    if (at + 2 > sig.size()) return std::nullopt;
    Entry e;
    e.dtype = sig[at];
    const int64_t ndim = sig[at + 1];
    at += 2;
    if (ndim < 0 || static_cast<size_t>(ndim) > sig.size() - at) return std::nullopt;
    e.sizes.assign(sig.begin() + static_cast<std::ptrdiff_t>(at),
                   sig.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(ndim)));
    at += static_cast<size_t>(ndim);
    entries.push_back(std::move(e));
  }
  if (at != sig.size()) return std::nullopt;
  return entries;
}

// "float32[4, 5]", "undefined".
std::string entry_text(const Entry& e) {
  if (e.dtype == kUndefinedTensor) return "undefined";
  std::string s = e.dtype >= 0 && e.dtype < kNumDTypes
                      ? std::string(dtype_name(static_cast<DType>(e.dtype)))
                      : "dtype #" + std::to_string(e.dtype);
  s += "[";
  for (size_t i = 0; i < e.sizes.size(); ++i)
    s += (i > 0 ? ", " : "") + std::to_string(e.sizes[i]);
  return s + "]";
}

// How rank `r`'s list differs from rank 0's: the first differing tensor, or the count.
std::string difference(const std::vector<Entry>& expected, const std::vector<Entry>& got, int r) {
  const size_t common = std::min(expected.size(), got.size());
  for (size_t i = 0; i < common; ++i) {
    if (got[i] == expected[i]) continue;
    return "tensors[" + std::to_string(i) + "] on rank " + std::to_string(r) + " is " +
           entry_text(got[i]) + ", expected " + entry_text(expected[i]) + " as on rank 0";
  }
  return "rank " + std::to_string(r) + " holds " + std::to_string(got.size()) +
         " tensors, expected " + std::to_string(expected.size()) + " as on rank 0";
}

std::vector<int64_t> host_values(const Tensor& t) {
  return t.to(Device::cpu()).to_vector<int64_t>();
}

}  // namespace

void verify_params_across_ranks(ProcessGroup& group, const std::vector<Tensor>& tensors,
                                std::chrono::milliseconds timeout) {
  const std::string what = "verify_params_across_ranks (group '" + group.name() + "', rank " +
                           std::to_string(group.rank()) + ")";
  const Device device =
      !tensors.empty() && tensors[0].defined() ? tensors[0].device() : Device::cpu();
  const auto world = static_cast<size_t>(group.size());
  const std::vector<int64_t> mine = encode(tensors);

  // Signatures differ in length, and all_gather moves equal sizes: the lengths first, then
  // every signature padded to the longest.
  std::vector<Tensor> lengths;
  for (size_t r = 0; r < world; ++r)
    lengths.push_back(zeros({1}, TensorOptions(kInt64).device(device)));
  const Tensor my_length =
      tensor(std::vector<int64_t>{static_cast<int64_t>(mine.size())}).to(device);
  group.all_gather(lengths, my_length, {.timeout = timeout}).wait();
  std::vector<size_t> length_of(world);
  size_t longest = 0;
  for (size_t r = 0; r < world; ++r) {
    const int64_t n = host_values(lengths[r])[0];
    length_of[r] = n > 0 ? static_cast<size_t>(n) : 0;
    longest = std::max(longest, length_of[r]);
  }

  std::vector<int64_t> padded = mine;
  padded.resize(longest, 0);
  std::vector<Tensor> signatures;
  for (size_t r = 0; r < world; ++r)
    signatures.push_back(
        zeros({static_cast<int64_t>(longest)}, TensorOptions(kInt64).device(device)));
  group.all_gather(signatures, tensor(padded).to(device), {.timeout = timeout}).wait();

  std::vector<std::optional<std::vector<Entry>>> decoded;
  decoded.reserve(world);
  for (size_t r = 0; r < world; ++r) {
    std::vector<int64_t> sig = host_values(signatures[r]);
    sig.resize(std::min(length_of[r], sig.size()));
    decoded.push_back(decode(sig));
  }
  std::vector<int> differing;
  for (size_t r = 1; r < world; ++r) {
    if (!decoded[r] || !decoded[0] || *decoded[r] != *decoded[0])
      differing.push_back(static_cast<int>(r));
  }
  if (!differing.empty() || !decoded[0]) {
    const int r = differing.empty() ? 0 : differing.front();
    const auto& got = decoded[static_cast<size_t>(r)];
    std::string message = what + ": ";
    if (!decoded[0] || !got) {
      message += "rank " + std::to_string(decoded[0] ? r : 0) + " sent a malformed signature";
    } else {
      message += difference(*decoded[0], *got, r);
    }
    message += "; ranks whose tensors differ from rank 0's: " + detail::ranks_text(differing);
    throw InvalidArgument(message);
  }
  const std::vector<Entry>& agreed = *decoded[0];
  for (size_t i = 0; i < agreed.size(); ++i) {
    if (agreed[i].dtype == kUndefinedTensor) {
      throw InvalidArgument(what + ": tensors[" + std::to_string(i) +
                            "] is undefined (on every rank)");
    }
  }
}

}  // namespace gradwire::c10d
