// libFuzzer target: the value converter. A Value tree built from the input (the shapes a
// decoded envelope can hold: None, bool, int, double, string, bytes, small tensors, rref
// descriptors, lists and maps, nested) is offered as the arguments of registered functions
// of many C++ signatures, as the agent does with a decoded request. The contract: a value
// that does not fit is a CallRejected (an InvalidArgument) naming the argument, stored in
// the call's future; nothing else escapes, nothing crashes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/executor.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "wire.h"

using namespace gradwire;
using namespace gradwire::rpc;

namespace {

// Reads the input front to back; past its end every read gives 0.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v |= uint64_t{byte()} << (8 * i);
    return v;
  }
  std::string text(size_t max) {
    const size_t n = byte() % (max + 1);
    std::string s;
    for (size_t i = 0; i < n && p_ < end_; ++i)
      s.push_back(static_cast<char>(byte()));
    return s;
  }
  bool empty() const { return p_ >= end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

Value make_value(Input& in, int depth, int& budget) {
  if (--budget <= 0) return Value();
  const uint8_t kind = in.byte() % (depth < 6 ? 11 : 8);
  switch (kind) {
    case 0:
      return Value();
    case 1:
      return Value((in.byte() & 1) != 0);
    case 2:
      return Value(static_cast<int64_t>(in.u64()));
    case 3: {
      const uint64_t bits = in.u64();
      double d = 0;
      static_assert(sizeof(d) == sizeof(bits));
      std::memcpy(&d, &bits, sizeof(d));
      return Value(d);
    }
    case 4:
      return Value(in.text(16));
    case 5: {
      const std::string s = in.text(16);
      return Value(Bytes(s.begin(), s.end()));
    }
    case 6: {
      static const DType kTypes[] = {kFloat32, kFloat64, kInt64, kInt32, kBool};
      const DType dtype = kTypes[in.byte() % 5];
      Shape shape;
      const int dims = in.byte() % 3;
      for (int i = 0; i < dims; ++i)
        shape.push_back(in.byte() % 4);
      return Value(zeros(shape, TensorOptions{dtype}));
    }
    case 7:
      return Value(RRefDescriptor{static_cast<int32_t>(in.byte()), in.u64(), in.u64(), in.text(8)});
    case 8:
    case 9: {
      Value::List items;
      const int n = in.byte() % 5;
      for (int i = 0; i < n; ++i)
        items.push_back(make_value(in, depth + 1, budget));
      return Value::list(std::move(items));
    }
    default: {
      Value::Map entries;
      const int n = in.byte() % 4;
      for (int i = 0; i < n; ++i) {
        // Keys as a map allows them (None, bool, int, string); Value::map checks that too.
        Value key;
        switch (in.byte() % 4) {
          case 0:
            key = Value();
            break;
          case 1:
            key = Value((in.byte() & 1) != 0);
            break;
          case 2:
            key = Value(static_cast<int64_t>(in.byte()));
            break;
          default:
            key = Value(in.text(4));
        }
        entries.emplace_back(std::move(key), make_value(in, depth + 1, budget));
      }
      return Value::map(std::move(entries));
    }
  }
}

class Inline final : public Executor {
 public:
  void execute(std::function<void()> task) override { task(); }
};

Registry& fuzz_registry() {
  static Registry* reg = [] {
    auto* r = new Registry();
    r->def("scalars", [](int64_t a, double b, bool c, const std::string& d) {
      return static_cast<double>(a) + b + (c ? 1 : 0) + static_cast<double>(d.size());
    });
    r->def("small_ints", [](int32_t a, uint8_t b, int16_t c) { return int64_t{a} + b + c; });
    r->def("containers", [](const std::vector<float>& v, const std::map<std::string, int64_t>& m) {
      return static_cast<int64_t>(v.size() + m.size());
    });
    r->def("nested",
           [](const std::vector<std::vector<int64_t>>& v, const std::optional<std::string>& name) {
             return static_cast<int64_t>(v.size()) + (name ? 1 : 0);
           });
    r->def("tensors",
           [](const Tensor& t, const std::optional<Tensor>& u, const std::vector<Tensor>& ts) {
             return t.numel() + (u ? u->numel() : 0) + static_cast<int64_t>(ts.size());
           });
    r->def("tuples",
           [](const std::tuple<int64_t, std::string>& t, const std::pair<double, bool>& p) {
             return std::get<0>(t) + static_cast<int64_t>(p.first == 0);
           });
    r->def("bytes", [](const Bytes& b, const std::map<int64_t, Bytes>& m) {
      return static_cast<int64_t>(b.size() + m.size());
    });
    r->def("none", []() { return std::string("none"); });
    return r;
  }();
  return *reg;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Input in(data + 1, size - 1);
  std::vector<Value> args;
  try {
    if (data[0] % 4 == 0) {
      // A decoded envelope's arguments, as a receiver would pass them.
      const EnvelopeLimits limits;  // the defaults every agent runs with
      const std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
      ParsedEnvelope parsed(payload, limits);
      std::vector<Tensor> received;
      for (const IncomingTensor& t : peek_tensors(parsed, limits))
        received.push_back(empty(t.sizes, TensorOptions{t.dtype}));
      Envelope e = decode(parsed, received, limits);
      if (auto* request = std::get_if<Request>(&e.body)) args = request->args;
    } else {
      int budget = 64;
      const int n = in.byte() % 5;
      for (int i = 0; i < n; ++i)
        args.push_back(make_value(in, 0, budget));
    }
  } catch (const InvalidArgument&) {
    return 0;
  }
  static const auto executor = std::make_shared<Inline>();
  for (const Signature& sig : fuzz_registry().functions()) {
    Future<Value> result = fuzz_registry().invoke(sig.name, args, executor);
    if (!result.completed()) __builtin_trap();  // every function here returns at once
    try {
      (void)result.value();
    } catch (const CallRejected&) {
    }
  }
  return 0;
}
