// Value: the typed values that remote calls carry — arguments and results.
//
// Nothing received from the wire is ever turned into code: a call names a registered
// function, and its arguments arrive as a tree of Values whose kinds are fixed here:
//
//   kNone     no value (a void result, an empty std::optional)
//   kBool     bool
//   kInt      int64_t (every C++ integer type converts, range-checked)
//   kDouble   double (float converts)
//   kString   std::string
//   kBytes    Bytes (std::vector<uint8_t>)
//   kTensor   Tensor (strided, or sparse rows: tensor/sparse.h; only the stored rows travel)
//   kList     std::vector<Value> (std::vector<T>, std::array, std::pair and std::tuple)
//   kMap      ordered (key, value) pairs; keys are None, bool, int or string
//             (std::map, std::unordered_map)
//   kRRef     an RRefDescriptor: the slot the rref/ module fills with a remote reference
//
// ValueConverter<T> (value_convert.h) maps C++ types to and from Values; the registry uses
// it to call typed C++ functions with Values and to describe their signatures.
//
// Thread-safety: a Value is a plain value (copies are deep, except that tensors share
// storage like Tensor copies); const use from several threads is safe.
// Errors: the as_* accessors throw InvalidArgument naming the expected and the received
// kind; a map key of another kind is InvalidArgument too.
//
// Example:
//   Value v = Value::list({Value(int64_t{3}), Value("three")});
//   int64_t n = v.as_list()[0].as_int();
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire::rpc {

using Bytes = std::vector<uint8_t>;

enum class ValueType : uint8_t {
  kNone = 0,
  kBool = 1,
  kInt = 2,
  kDouble = 3,
  kString = 4,
  kBytes = 5,
  kTensor = 6,
  kList = 7,
  kMap = 8,
  kRRef = 9,
};

// "None", "bool", "int", "double", "string", "bytes", "Tensor", "list", "map", "RRef".
std::string_view value_type_name(ValueType type);

// Where a remote reference lives and which one it is; rref/ gives it meaning.
struct RRefDescriptor {
  int32_t owner{-1};      // worker id of the owner
  uint64_t rref_id{0};    // unique on the owner
  uint64_t fork_id{0};    // this user's fork of it
  std::string type_name;  // the registered type the reference points to
  bool operator==(const RRefDescriptor&) const = default;
};

class Value {
 public:
  using List = std::vector<Value>;
  using Map = std::vector<std::pair<Value, Value>>;

  Value() = default;  // None
  explicit Value(bool v) : data_(v) {}
  explicit Value(int64_t v) : data_(v) {}
  explicit Value(double v) : data_(v) {}
  explicit Value(std::string v) : data_(std::move(v)) {}
  explicit Value(const char* v) : data_(std::string(v)) {}
  explicit Value(Bytes v) : data_(std::move(v)) {}
  explicit Value(Tensor v) : data_(std::move(v)) {}
  explicit Value(RRefDescriptor v) : data_(std::move(v)) {}
  static Value list(List items);
  // Throws InvalidArgument when a key is not None, bool, int or string.
  static Value map(Map entries);

  ValueType type() const { return static_cast<ValueType>(data_.index()); }
  std::string_view type_name() const { return value_type_name(type()); }
  bool is_none() const { return type() == ValueType::kNone; }

  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;  // an int converts too
  const std::string& as_string() const;
  const Bytes& as_bytes() const;
  const Tensor& as_tensor() const;
  const List& as_list() const;
  const Map& as_map() const;
  const RRefDescriptor& as_rref() const;

  // Structural equality; tensors compare by identity of their data (same storage, offset,
  // shape and dtype), since comparing contents is a numerical question.
  bool operator==(const Value& other) const;

  // A short description for messages: "int", "list[3]", "Tensor float32[2, 3]".
  std::string describe() const;

 private:
  struct ListBox {
    List items;
  };
  struct MapBox {
    Map entries;
  };
  using Data =
      std::variant<std::monostate, bool, int64_t, double, std::string, Bytes, Tensor,
                   std::shared_ptr<const ListBox>, std::shared_ptr<const MapBox>, RRefDescriptor>;
  [[noreturn]] void throw_wrong(ValueType expected) const;
  Data data_;
};

std::ostream& operator<<(std::ostream& os, const Value& v);

}  // namespace gradwire::rpc
