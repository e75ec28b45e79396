#include "gradwire/rpc/value.h"

#include <sstream>

#include "gradwire/core/error.h"
#include "gradwire/core/printable.h"
#include "gradwire/rpc/value_convert.h"

namespace gradwire::rpc {
namespace {

// How much of an RRef's type name a description shows (rref/ admits type names of up to
// 1024 bytes).
constexpr size_t kShownTypeNameBytes = 1024;

}  // namespace

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::kNone:
      return "None";
    case ValueType::kBool:
      return "bool";
    case ValueType::kInt:
      return "int";
    case ValueType::kDouble:
      return "double";
    case ValueType::kString:
      return "string";
    case ValueType::kBytes:
      return "bytes";
    case ValueType::kTensor:
      return "Tensor";
    case ValueType::kList:
      return "list";
    case ValueType::kMap:
      return "map";
    case ValueType::kRRef:
      return "RRef";
  }
  return "unknown";
}

Value Value::list(List items) {
  Value v;
  v.data_ = std::make_shared<const ListBox>(ListBox{std::move(items)});
  return v;
}

Value Value::map(Map entries) {
  for (const auto& [key, value] : entries) {
    switch (key.type()) {
      case ValueType::kNone:
      case ValueType::kBool:
      case ValueType::kInt:
      case ValueType::kString:
        break;
      default:
        throw InvalidArgument("a map key must be None, bool, int or string, got " + key.describe());
    }
  }
  Value v;
  v.data_ = std::make_shared<const MapBox>(MapBox{std::move(entries)});
  return v;
}

void Value::throw_wrong(ValueType expected) const {
  throw InvalidArgument("expected a value of type " + std::string(value_type_name(expected)) +
                        ", got " + describe());
}

bool Value::as_bool() const {
  if (type() != ValueType::kBool) throw_wrong(ValueType::kBool);
  return std::get<bool>(data_);
}

int64_t Value::as_int() const {
  if (type() != ValueType::kInt) throw_wrong(ValueType::kInt);
  return std::get<int64_t>(data_);
}

double Value::as_double() const {
  if (type() == ValueType::kInt) return static_cast<double>(std::get<int64_t>(data_));
  if (type() != ValueType::kDouble) throw_wrong(ValueType::kDouble);
  return std::get<double>(data_);
}

const std::string& Value::as_string() const {
  if (type() != ValueType::kString) throw_wrong(ValueType::kString);
  return std::get<std::string>(data_);
}

const Bytes& Value::as_bytes() const {
  if (type() != ValueType::kBytes) throw_wrong(ValueType::kBytes);
  return std::get<Bytes>(data_);
}

const Tensor& Value::as_tensor() const {
  if (type() != ValueType::kTensor) throw_wrong(ValueType::kTensor);
  return std::get<Tensor>(data_);
}

const Value::List& Value::as_list() const {
  if (type() != ValueType::kList) throw_wrong(ValueType::kList);
  return std::get<std::shared_ptr<const ListBox>>(data_)->items;
}

const Value::Map& Value::as_map() const {
  if (type() != ValueType::kMap) throw_wrong(ValueType::kMap);
  return std::get<std::shared_ptr<const MapBox>>(data_)->entries;
}

const RRefDescriptor& Value::as_rref() const {
  if (type() != ValueType::kRRef) throw_wrong(ValueType::kRRef);
  return std::get<RRefDescriptor>(data_);
}

bool Value::operator==(const Value& other) const {
  if (type() != other.type()) return false;
  switch (type()) {
    case ValueType::kNone:
      return true;
    case ValueType::kBool:
      return as_bool() == other.as_bool();
    case ValueType::kInt:
      return as_int() == other.as_int();
    case ValueType::kDouble:
      return as_double() == other.as_double();
    case ValueType::kString:
      return as_string() == other.as_string();
    case ValueType::kBytes:
      return as_bytes() == other.as_bytes();
    case ValueType::kTensor: {
      const Tensor& a = as_tensor();
      const Tensor& b = other.as_tensor();
      if (a.is_same(b)) return true;
      if (!a.defined() || !b.defined()) return false;
      if (a.is_sparse() || b.is_sparse()) {
        // The same rows over the same shape: both parts are the same data.
        return a.is_sparse() && b.is_sparse() && a.sizes() == b.sizes() &&
               Value(a.indices()) == Value(b.indices()) && Value(a.values()) == Value(b.values());
      }
      return a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
             a.dtype() == b.dtype();
    }
    case ValueType::kList:
      return as_list() == other.as_list();
    case ValueType::kMap:
      return as_map() == other.as_map();
    case ValueType::kRRef:
      return as_rref() == other.as_rref();
  }
  return false;
}

std::string Value::describe() const {
  switch (type()) {
    case ValueType::kNone:
      return "None";
    case ValueType::kBool:
      return as_bool() ? "bool true" : "bool false";
    case ValueType::kInt:
      return "int " + std::to_string(as_int());
    case ValueType::kDouble: {
      std::ostringstream os;
      os << "double " << as_double();
      return os.str();
    }
    case ValueType::kString: {
      // Escaped (printable()): the string may be a peer's, and descriptions go into errors
      // and log lines. So is an RRef's type name below.
      const std::string& s = as_string();
      if (s.size() <= 32) return "string \"" + printable(s, 32) + "\"";
      return "string \"" + printable(std::string_view(s).substr(0, 29)) + "...\"";
    }
    case ValueType::kBytes:
      return "bytes[" + std::to_string(as_bytes().size()) + "]";
    case ValueType::kTensor: {
      const Tensor& t = as_tensor();
      if (!t.defined()) return "Tensor (undefined)";
      if (t.is_sparse()) {
        return "Tensor sparse_rows " + std::string(dtype_name(t.dtype())) + t.shape_string() +
               " (" + std::to_string(t.nnz()) + " rows stored)";
      }
      return "Tensor " + std::string(dtype_name(t.dtype())) + t.shape_string();
    }
    case ValueType::kList:
      return "list[" + std::to_string(as_list().size()) + "]";
    case ValueType::kMap:
      return "map[" + std::to_string(as_map().size()) + "]";
    case ValueType::kRRef:
      return "RRef(" + printable(as_rref().type_name, kShownTypeNameBytes) + ")";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, const Value& v) {
  return os << v.describe();
}

void Where::append_to(std::string& out) const {
  if (parent_ != nullptr) parent_->append_to(out);
  switch (kind_) {
    case Kind::kText:
      out += text_;
      break;
    case Kind::kElement:
      out += " [" + std::to_string(index_) + "]";
      break;
    case Kind::kMapKey:
      out += " key";
      break;
    case Kind::kMapValue:
      out += " [" + static_cast<const Value*>(subject_)->describe() + "]";
      break;
    case Kind::kCustom:
      render_(out, subject_, index_);
      break;
  }
}

std::string Where::str() const {
  std::string out;
  append_to(out);
  return out;
}

namespace detail {

const CallContext& no_call_context() {
  static const CallContext* const context = new CallContext();
  return *context;
}

void throw_type_mismatch(const Where& where, const std::string& expected, const Value& received) {
  throw InvalidArgument(where.str() + ": expected " + expected + ", got " + received.describe());
}

void throw_out_of_range(const Where& where, const std::string& expected, int64_t received) {
  throw InvalidArgument(where.str() + ": expected " + expected + ", got int " +
                        std::to_string(received) + ", which is out of its range");
}

void throw_duplicate_key(const Where& where, const Value& key) {
  throw InvalidArgument(where.str() + ": duplicate map key " + key.describe());
}

}  // namespace detail

}  // namespace gradwire::rpc
