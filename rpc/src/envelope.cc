// The envelope's codec (wire.h). Decoding checks every count and size of a message
// against EnvelopeLimits before it builds anything from them.
#include "wire.h"

#include "envelope_scan.h"

#include <google/protobuf/arena.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "gradwire/tensor/autograd_hooks.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/sparse.h"
#include "gradwire/tensor/storage.h"
#include "proto/envelope.pb.h"

namespace gradwire::rpc {

namespace {

[[noreturn]] void malformed(const std::string& what) {
  throw InvalidArgument("malformed rpc envelope: " + what);
}

// ---- encoding

// A tensor of the message being encoded, ready to travel, and how it travels.
struct StagedTensor {
  Tensor data;  // a contiguous CPU block
  Device target;
  bool requires_grad = false;
  Shape expand_to;  // empty, or the broadcast shape it travels for
  bool is_inline = false;
  std::optional<Loan> loan;
};

// The message's tensors, in message order (one block for all of them).
struct Encoding {
  const DeviceMapper& target_device;
  std::vector<StagedTensor> staged;
};

// A broadcast view (stride 0 along a dimension of size > 1, as an expand makes it) travels
// as its compact data: the view narrowed to one element along each such dimension. Empty
// when `t` is no such view.
Tensor compact_of_broadcast(const Tensor& t) {
  Tensor compact;
  for (size_t d = 0; d < t.sizes().size(); ++d) {
    if (t.strides()[d] == 0 && t.sizes()[d] > 1) {
      compact = (compact.defined() ? compact : t).narrow(static_cast<int64_t>(d), 0, 1);
    }
  }
  return compact;
}

// Stages one tensor that travels as data: what travels, where it goes, its flag.
void stage(const Tensor& t, Device target, bool requires_grad, Encoding& enc) {
  // A tensor that requires grad travels as data and a flag: detached, neither the staging
  // nor the packing below records anything in the sender's graph (the receiver starts a
  // graph of its own).
  Tensor travel = requires_grad ? t.detach() : t;
  // CUDA tensors are staged through host memory (no CUDA channel); a strided view is packed
  // first, so what travels is always a contiguous CPU block.
  if (travel.is_cuda()) travel = travel.to(Device::cpu());
  Shape expand_to;
  if (Tensor compact = compact_of_broadcast(travel); compact.defined()) {
    expand_to = travel.sizes();
    travel = compact;
  }
  if (enc.staged.empty()) enc.staged.reserve(8);
  StagedTensor& staged = enc.staged.emplace_back();
  staged.data = travel.contiguous();
  staged.target = target;
  staged.requires_grad = requires_grad;
  staged.expand_to = std::move(expand_to);
}

// Stages every tensor of `v`, in the order the message numbers them (a list's items in
// order, a map entry's key before its value; a sparse-rows tensor's row numbers before its
// rows).
void collect_tensors(const Value& v, Encoding& enc) {
  switch (v.type()) {
    case ValueType::kTensor: {
      const Tensor& t = v.as_tensor();
      if (!t.defined()) throw InvalidArgument("an undefined Tensor cannot be sent");
      const Device target = enc.target_device ? enc.target_device(t.device()) : Device::cpu();
      if (t.is_sparse()) {
        // Only the stored rows travel (never the dense table they stand for). A sparse
        // tensor never requires grad, nor do its parts on the wire.
        stage(t.indices(), target, false, enc);
        stage(t.values(), target, false, enc);
        return;
      }
      stage(t, target, t.requires_grad(), enc);
      return;
    }
    case ValueType::kList:
      for (const Value& item : v.as_list())
        collect_tensors(item, enc);
      return;
    case ValueType::kMap:
      for (const auto& [key, value] : v.as_map()) {
        collect_tensors(key, enc);
        collect_tensors(value, enc);
      }
      return;
    default:
      return;
  }
}

// Protobuf's wire format (envelope.proto), written back to front: a nested message's fields
// go in before its length and tag, so every length is known when it is written and nothing
// is sized twice. The bytes are the ones Protobuf's own serializer writes for the same
// message (fields in number order, proto3 defaults left out except in a oneof, repeated
// numbers packed); EnvelopeTest.EncodingIsProtobufsOwnBytes holds it to that. Building
// Protobuf's message objects only to serialize them was half of a small call's encoding.
class BackWriter {
 public:
  enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2 };

  BackWriter() = default;
  BackWriter(const BackWriter&) = delete;
  BackWriter& operator=(const BackWriter&) = delete;

  // Bytes written so far: a nested message's start, for end_message.
  size_t size() const { return cap_ - pos_; }
  std::string str() const { return std::string(data() + pos_, size()); }

  void raw(const void* p, size_t n) {
    if (n == 0) return;
    reserve(n);
    pos_ -= n;
    std::memcpy(data() + pos_, p, n);
  }
  void varint(uint64_t v) {
    if (v < 0x80 && pos_ > 0) {  // most tags, lengths and numbers: one byte
      data()[--pos_] = static_cast<char>(v);
      return;
    }
    long_varint(v);
  }
  void tag(uint32_t field, WireType type) { varint(uint64_t{field} << 3 | type); }
  void fixed64(uint64_t v) {
    uint8_t out[8];
    for (int i = 0; i < 8; ++i)
      out[i] = static_cast<uint8_t>(v >> (8 * i));
    raw(out, sizeof(out));
  }

  // Fields without presence: left out when they hold their default.
  void uint_field(uint32_t field, uint64_t v) {
    if (v == 0) return;
    varint(v);
    tag(field, kVarint);
  }
  void int32_field(uint32_t field, int32_t v) {
    // A negative int32 is sign-extended to ten bytes, as Protobuf writes it.
    uint_field(field, static_cast<uint64_t>(static_cast<int64_t>(v)));
  }
  void bool_field(uint32_t field, bool v) { uint_field(field, v ? 1 : 0); }
  void bytes_field(uint32_t field, const void* p, size_t n) {
    if (n == 0) return;
    bytes_always(field, p, n);
  }
  void bytes_field(uint32_t field, const std::string& s) { bytes_field(field, s.data(), s.size()); }
  void bytes_field(uint32_t field, const Bytes& b) { bytes_field(field, b.data(), b.size()); }
  void fixed64_field(uint32_t field, uint64_t v) {
    if (v == 0) return;
    fixed64(v);
    tag(field, kFixed64);
  }
  void packed_field(uint32_t field, const std::vector<int64_t>& values) {
    if (values.empty()) return;
    const size_t start = size();
    for (size_t i = values.size(); i-- > 0;)
      varint(static_cast<uint64_t>(values[i]));
    end_message(field, start);
  }
  // A oneof member is written whatever it holds.
  void bytes_always(uint32_t field, const void* p, size_t n) {
    raw(p, n);
    varint(n);
    tag(field, kLength);
  }
  // Closes the message (or packed field) whose content was written since `start`.
  void end_message(uint32_t field, size_t start) {
    varint(size() - start);
    tag(field, kLength);
  }

 private:
  [[gnu::noinline]] void long_varint(uint64_t v) {
    uint8_t out[10];
    size_t n = 0;
    while (v >= 0x80) {
      out[n++] = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    out[n++] = static_cast<uint8_t>(v);
    raw(out, n);
  }
  char* data() { return heap_ ? heap_.get() : inline_; }
  const char* data() const { return heap_ ? heap_.get() : inline_; }
  // Room for n more bytes in front: a larger block, what is written moved to its end.
  void reserve(size_t n) {
    if (n <= pos_) return;
    const size_t used = size();
    const size_t cap = std::max(cap_ * 2, used + n + 256);
    std::unique_ptr<char[]> grown(new char[cap]);
    std::memcpy(grown.get() + cap - used, data() + pos_, used);
    heap_ = std::move(grown);
    cap_ = cap;
    pos_ = cap - used;
  }

  char inline_[1024];
  std::unique_ptr<char[]> heap_;
  size_t cap_ = sizeof(inline_);
  size_t pos_ = sizeof(inline_);
};

void write_value(const Value& v, BackWriter& w, uint32_t& next_tensor);

// `v` as the message field `field` of the message being written.
void write_value_field(const Value& v, uint32_t field, BackWriter& w, uint32_t& next_tensor) {
  const size_t start = w.size();
  write_value(v, w, next_tensor);
  w.end_message(field, start);
}

// A Value's fields. Back to front, so its tensors are met last first: `next_tensor` counts
// down from the message's tensor count to each one's index.
void write_value(const Value& v, BackWriter& w, uint32_t& next_tensor) {
  switch (v.type()) {
    case ValueType::kNone:
      w.end_message(1, w.size());  // an empty NoneValue
      return;
    case ValueType::kBool:
      w.varint(v.as_bool() ? 1 : 0);
      w.tag(2, BackWriter::kVarint);
      return;
    case ValueType::kInt: {
      const int64_t i = v.as_int();
      w.varint((static_cast<uint64_t>(i) << 1) ^ static_cast<uint64_t>(i >> 63));  // sint64
      w.tag(3, BackWriter::kVarint);
      return;
    }
    case ValueType::kDouble: {
      uint64_t bits = 0;
      const double d = v.as_double();
      static_assert(sizeof(bits) == sizeof(d));
      std::memcpy(&bits, &d, sizeof(bits));
      w.fixed64(bits);
      w.tag(4, BackWriter::kFixed64);
      return;
    }
    case ValueType::kString: {
      const std::string& s = v.as_string();
      w.bytes_always(5, s.data(), s.size());
      return;
    }
    case ValueType::kBytes: {
      const Bytes& b = v.as_bytes();
      w.bytes_always(6, b.data(), b.size());
      return;
    }
    case ValueType::kTensor: {
      const Tensor& t = v.as_tensor();
      if (t.is_sparse()) {
        // SparseRowsValue { indices_index = 1; values_index = 2; sizes = 3 }: its two
        // tensors were staged row numbers first, so counting down meets the rows first.
        const size_t sparse = w.size();
        w.packed_field(3, t.sizes());
        w.uint_field(2, --next_tensor);
        w.uint_field(1, --next_tensor);
        w.end_message(11, sparse);
        return;
      }
      w.varint(--next_tensor);
      w.tag(7, BackWriter::kVarint);
      return;
    }
    case ValueType::kList: {
      const size_t list = w.size();
      const Value::List& items = v.as_list();
      for (size_t i = items.size(); i-- > 0;)
        write_value_field(items[i], 1, w, next_tensor);
      w.end_message(8, list);
      return;
    }
    case ValueType::kMap: {
      const size_t map = w.size();
      const Value::Map& entries = v.as_map();
      for (size_t i = entries.size(); i-- > 0;) {
        const size_t entry = w.size();
        write_value_field(entries[i].second, 2, w, next_tensor);
        write_value_field(entries[i].first, 1, w, next_tensor);
        w.end_message(1, entry);
      }
      w.end_message(9, map);
      return;
    }
    case ValueType::kRRef: {
      const RRefDescriptor& r = v.as_rref();
      const size_t rref = w.size();
      w.bytes_field(4, r.type_name);
      w.uint_field(3, r.fork_id);
      w.uint_field(2, r.rref_id);
      w.int32_field(1, r.owner);
      w.end_message(10, rref);
      return;
    }
  }
}

// A Request's or Response's extensions (field `field`), in key order.
void write_extensions(const Extensions& extensions, uint32_t field, BackWriter& w) {
  for (auto it = extensions.rbegin(); it != extensions.rend(); ++it) {
    const size_t e = w.size();
    w.bytes_field(2, it->second);
    w.bytes_field(1, it->first);
    w.end_message(field, e);
  }
}

void write_loan(const Loan& loan, uint32_t field, BackWriter& w) {
  const size_t l = w.size();
  w.fixed64_field(2, loan.token);
  w.uint_field(1, loan.slot);
  w.end_message(field, l);
}

// ---- decoding

// Every count and size is checked before the map is built: a hostile message holds at most
// max_extensions small entries.
template <typename Repeated>
Extensions decode_extensions(const Repeated& in, const EnvelopeLimits& limits) {
  if (static_cast<size_t>(in.size()) > limits.max_extensions) {
    malformed(std::to_string(in.size()) + " extensions exceed the limit of " +
              std::to_string(limits.max_extensions));
  }
  size_t value_bytes = 0;
  for (const wire::Extension& e : in) {
    if (e.key().size() > limits.max_extension_key_bytes) {
      malformed("an extension key of " + std::to_string(e.key().size()) +
                " bytes exceeds the limit of " + std::to_string(limits.max_extension_key_bytes));
    }
    value_bytes += e.value().size();
    if (value_bytes > limits.max_extension_bytes) {
      malformed("extension values of more than " + std::to_string(limits.max_extension_bytes) +
                " bytes");
    }
  }
  Extensions out;
  for (int i = 0; i < in.size(); ++i) {
    const wire::Extension& e = in.Get(i);
    // The key is not quoted: the receiver logs this message, and a hostile key is any bytes.
    if (!out.emplace(e.key(), Bytes(e.value().begin(), e.value().end())).second) {
      malformed("extension " + std::to_string(i) + " repeats the key of an earlier one");
    }
  }
  return out;
}

struct Decoder {
  const std::vector<Tensor>& tensors;
  const EnvelopeLimits& limits;
  const wire::Envelope& env;  // the tensors' descriptions
  size_t values = 0;

  Value decode(const wire::Value& v, int depth) {
    if (depth > limits.max_depth) {
      malformed("values nest deeper than " + std::to_string(limits.max_depth));
    }
    if (++values > limits.max_values) {
      malformed("more than " + std::to_string(limits.max_values) + " values");
    }
    switch (v.kind_case()) {
      case wire::Value::kNone:
        return Value();
      case wire::Value::kBoolValue:
        return Value(v.bool_value());
      case wire::Value::kIntValue:
        return Value(static_cast<int64_t>(v.int_value()));
      case wire::Value::kDoubleValue:
        return Value(v.double_value());
      case wire::Value::kStringValue:
        return Value(v.string_value());
      case wire::Value::kBytesValue:
        return Value(Bytes(v.bytes_value().begin(), v.bytes_value().end()));
      case wire::Value::kTensorIndex: {
        const uint32_t index = v.tensor_index();
        if (index >= tensors.size()) {
          malformed("tensor index " + std::to_string(index) + " is out of range (the message has " +
                    std::to_string(tensors.size()) + " tensors)");
        }
        return Value(tensors[index]);
      }
      case wire::Value::kList: {
        Value::List items;
        items.reserve(static_cast<size_t>(v.list().items_size()));
        for (const wire::Value& item : v.list().items())
          items.push_back(decode(item, depth + 1));
        return Value::list(std::move(items));
      }
      case wire::Value::kMap: {
        Value::Map entries;
        entries.reserve(static_cast<size_t>(v.map().entries_size()));
        for (const wire::MapEntry& e : v.map().entries())
          entries.emplace_back(decode(e.key(), depth + 1), decode(e.value(), depth + 1));
        try {
          return Value::map(std::move(entries));
        } catch (const InvalidArgument& e) {
          malformed(e.what());
        }
      }
      case wire::Value::kRref:
        return Value(RRefDescriptor{v.rref().owner(), v.rref().rref_id(), v.rref().fork_id(),
                                    v.rref().type_name()});
      case wire::Value::kSparseRows:
        return Value(sparse(v.sparse_rows()));
      case wire::Value::KIND_NOT_SET:
        break;
    }
    malformed("a value of no known kind");
  }

  // Tensor `index` of the message, as part `what` of a sparse-rows tensor.
  const Tensor& sparse_part(uint32_t index, const char* what) const {
    if (index >= tensors.size()) {
      malformed("a sparse tensor's " + std::string(what) + " name tensor " + std::to_string(index) +
                ", out of range (the message has " + std::to_string(tensors.size()) + " tensors)");
    }
    const Tensor& t = tensors[index];
    // The description's flag: the tensor carries it only where autograd is linked.
    if (env.tensors(static_cast<int>(index)).requires_grad()) {
      malformed("a sparse tensor's " + std::string(what) + " (tensor " + std::to_string(index) +
                ") require grad; sparse tensors never do");
    }
    return t;
  }

  // A sparse-rows tensor rebuilt from its parts: its dense shape bounded as a tensor
  // description's is, then sparse_rows() checks the parts against it (row numbers 1-d
  // integers, each within sizes[0]; rows floating point, shaped [nnz, sizes[1:]...]).
  Tensor sparse(const wire::SparseRowsValue& s) const {
    if (s.sizes_size() == 0) malformed("a sparse tensor without a dense shape");
    if (static_cast<size_t>(s.sizes_size()) > limits.max_tensor_dims) {
      malformed("a sparse tensor's dense shape has " + std::to_string(s.sizes_size()) +
                " dims, more than " + std::to_string(limits.max_tensor_dims));
    }
    const Tensor& indices = sparse_part(s.indices_index(), "row numbers");
    const Tensor& values = sparse_part(s.values_index(), "rows");
    // The shape it stands for is never allocated here, but to_dense() would: the same bound
    // as a tensor description's (no overflowing product, at most 2^46 bytes).
    Shape sizes;
    int64_t extent = element_size(values.dtype());
    for (int64_t d : s.sizes()) {
      if (d < 0)
        malformed("a sparse tensor's dense shape has a negative size " + std::to_string(d));
      const int64_t at_least_one = std::max<int64_t>(d, 1);
      if (extent > (int64_t{1} << 46) / at_least_one) {
        malformed("a sparse tensor's dense shape " +
                  shape_to_string(Shape(s.sizes().begin(), s.sizes().end())) + " is too large");
      }
      extent *= at_least_one;
      sizes.push_back(d);
    }
    try {
      return sparse_rows(indices, values, sizes);
    } catch (const InvalidArgument& e) {
      malformed(std::string("a sparse tensor does not fit its parts: ") + e.what());
    }
  }
};

// Scanned first (envelope_scan.h: every count bounded before Protobuf allocates for it),
// then parsed once.
// `env` is empty.
void parse(const std::string& payload, const EnvelopeLimits& limits, wire::Envelope& env) {
  EnvelopeShape shape;
  scan_envelope(payload, limits, shape);
  if (!env.ParseFromString(payload)) malformed("the payload does not parse");
}

// An arena whose first block is `block`: the messages of one small envelope, and their
// strings, take no allocation of their own and are dropped together. Larger ones continue
// in blocks the arena allocates.
google::protobuf::ArenaOptions arena_options(char* block, size_t size) {
  google::protobuf::ArenaOptions options;
  options.initial_block = block;
  options.initial_block_size = size;
  return options;
}

ErrorKind error_kind_from(uint32_t kind) {
  switch (static_cast<ErrorKind>(kind)) {
    case ErrorKind::kError:
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kTimeout:
    case ErrorKind::kNetwork:
    case ErrorKind::kStore:
    case ErrorKind::kRemote:
    case ErrorKind::kBusy:
      return static_cast<ErrorKind>(kind);
  }
  malformed("unknown error kind " + std::to_string(kind));
}

}  // namespace

size_t IncomingTensor::nbytes() const {
  int64_t n = element_size(dtype);
  for (int64_t s : sizes)
    n *= s;
  return static_cast<size_t>(n);
}

size_t IncomingTensor::logical_nbytes() const {
  if (expand_to.empty()) return nbytes();
  int64_t n = element_size(dtype);
  for (int64_t s : expand_to)
    n *= s;
  return static_cast<size_t>(n);
}

namespace {

// Small tensors travel inside the envelope: one TensorPipe message part instead of a
// channel transfer each, which is most of the cost of a small call. Larger ones are lent
// when `lender` takes them, else sent beside the envelope (added to `msg`).
void place_tensors(std::vector<StagedTensor>& staged, size_t inline_tensor_bytes,
                   const Lender& lender, EncodedMessage& msg) {
  size_t inlined = 0;
  for (StagedTensor& t : staged) {
    const size_t bytes = t.data.nbytes();
    if (bytes <= inline_tensor_bytes && inlined + bytes <= kMaxInlineBytesPerMessage) {
      t.is_inline = true;
      inlined += bytes;
    } else if (std::optional<Loan> loan = lender ? lender(t.data) : std::nullopt) {
      t.loan = loan;
    } else {
      msg.tensors.push_back(t.data);
      msg.targets.push_back(t.target);
    }
  }
}

void write_tensor_descs(const std::vector<StagedTensor>& staged, BackWriter& w) {
  for (size_t i = staged.size(); i-- > 0;) {
    const size_t desc = w.size();
    const StagedTensor& t = staged[i];
    w.packed_field(9, t.expand_to);
    w.bool_field(8, t.requires_grad);
    if (t.loan) write_loan(*t.loan, 7, w);
    if (t.is_inline) w.bytes_field(6, t.data.data_ptr(), t.data.nbytes());
    w.bool_field(5, t.is_inline);
    w.int32_field(4, t.target.index);
    w.int32_field(3, t.target.is_cuda() ? 1 : 0);
    w.packed_field(2, t.data.sizes());
    w.uint_field(1, static_cast<uint32_t>(t.data.dtype()));
    w.end_message(4, desc);
  }
}

void write_request_body(const Request& req, BackWriter& w, uint32_t& next_tensor) {
  const size_t body = w.size();
  write_extensions(req.extensions, 9, w);
  w.bytes_field(8, req.payload);
  w.uint_field(7, static_cast<uint64_t>(std::max<int64_t>(0, req.timeout.count())));
  w.uint_field(6, req.autograd_message_id);
  w.uint_field(5, req.autograd_context_id);
  for (size_t i = req.args.size(); i-- > 0;)
    write_value_field(req.args[i], 4, w, next_tensor);
  w.bytes_field(3, req.function);
  w.uint_field(2, req.handler);
  w.uint_field(1, req.id);
  w.end_message(2, body);
}

// `result`: the response's value, null for an error reply.
void write_response_body(const Response& resp, const Value* result, BackWriter& w,
                         uint32_t& next_tensor) {
  const size_t body = w.size();
  write_extensions(resp.extensions, 7, w);
  w.uint_field(6, resp.autograd_message_id);
  w.uint_field(5, resp.autograd_context_id);
  if (result != nullptr) {
    write_value_field(*result, 2, w, next_tensor);
  } else {
    const size_t one = w.size();
    const ErrorReply& err = std::get<ErrorReply>(resp.result);
    w.bool_field(4, err.rejected);
    w.bytes_field(3, err.worker);
    w.bytes_field(2, err.message);
    w.uint_field(1, static_cast<uint32_t>(err.kind));
    w.end_message(3, one);
  }
  w.uint_field(1, resp.id);
  w.end_message(3, body);
}

}  // namespace

EncodedMessage encode(const Envelope& envelope, const DeviceMapper& target_device,
                      size_t inline_tensor_bytes, const Lender& lender) {
  EncodedMessage msg;
  Encoding enc{target_device, {}};
  BackWriter w;
  if (const Release* release = std::get_if<Release>(&envelope.body)) {
    const size_t body = w.size();
    for (size_t i = release->loans.size(); i-- > 0;)
      write_loan(release->loans[i], 1, w);
    w.end_message(5, body);
    w.uint_field(1, kEnvelopeVersion);
    msg.payload = w.str();
    return msg;
  }
  const Request* req = std::get_if<Request>(&envelope.body);
  const Response* resp = req == nullptr ? &std::get<Response>(envelope.body) : nullptr;
  const Value* result = resp != nullptr ? std::get_if<Value>(&resp->result) : nullptr;
  if (req != nullptr) {
    for (const Value& arg : req->args)
      collect_tensors(arg, enc);
  } else if (result != nullptr) {
    collect_tensors(*result, enc);
  }
  place_tensors(enc.staged, inline_tensor_bytes, lender, msg);
  // Envelope { version = 1; request = 2 | response = 3; tensors = 4 }, last field first.
  write_tensor_descs(enc.staged, w);
  auto next_tensor = static_cast<uint32_t>(enc.staged.size());
  if (req != nullptr) {
    write_request_body(*req, w, next_tensor);
  } else {
    write_response_body(*resp, result, w, next_tensor);
  }
  w.uint_field(1, kEnvelopeVersion);
  msg.payload = w.str();
  return msg;
}

namespace {

// A broadcast's shape (t.expand_to, read from `d`): each dimension 1 (expanded) or as sent,
// and no larger than a tensor may be. Returns the bytes the tensor becomes (it is made on
// arrival, so all of them together are held within max_tensor_bytes).
size_t read_expand_to(const wire::TensorDesc& d, const std::string& which, IncomingTensor& t) {
  if (d.expand_to_size() != d.sizes_size()) {
    malformed(which + " is expanded to " + std::to_string(d.expand_to_size()) + " dims from " +
              std::to_string(d.sizes_size()));
  }
  int64_t logical = element_size(t.dtype);
  int64_t logical_extent = element_size(t.dtype);
  for (int k = 0; k < d.expand_to_size(); ++k) {
    const int64_t s = d.expand_to(k);
    if (s < 0) malformed(which + " is expanded to a negative size " + std::to_string(s));
    if (d.sizes(k) != 1 && d.sizes(k) != s) {
      malformed(which + " of size " + std::to_string(d.sizes(k)) + " in dim " + std::to_string(k) +
                " cannot be expanded to " + std::to_string(s));
    }
    const int64_t at_least_one = std::max<int64_t>(s, 1);
    if (logical_extent > (int64_t{1} << 46) / at_least_one) {
      malformed(which + " is expanded too far");
    }
    logical_extent *= at_least_one;
    logical *= s;
    t.expand_to.push_back(s);
  }
  return static_cast<size_t>(logical);
}

// The tensors an envelope announces, each description checked.
std::vector<IncomingTensor> describe_tensors(const wire::Envelope& env,
                                             const EnvelopeLimits& limits) {
  std::vector<IncomingTensor> out;
  out.reserve(static_cast<size_t>(env.tensors_size()));
  size_t expanded_bytes = 0;  // what broadcast tensors become, all together
  for (int i = 0; i < env.tensors_size(); ++i) {
    const wire::TensorDesc& d = env.tensors(i);
    const std::string which = "tensor " + std::to_string(i);
    if (d.dtype() >= static_cast<uint32_t>(kNumDTypes)) {
      malformed(which + " has unknown dtype code " + std::to_string(d.dtype()));
    }
    if (static_cast<size_t>(d.sizes_size()) > limits.max_tensor_dims) {
      malformed(which + " has " + std::to_string(d.sizes_size()) + " dims, more than " +
                std::to_string(limits.max_tensor_dims));
    }
    IncomingTensor t;
    t.dtype = dtype_from_index(static_cast<int>(d.dtype()));
    // The element count must stay within the payload limit's order of magnitude: the
    // product is checked step by step so that it cannot overflow. So must the extent with
    // empty dimensions counted as 1 (what contiguous strides multiply): a zero among the
    // sizes makes the tensor empty, but not its other sizes harmless.
    int64_t bytes = element_size(t.dtype);
    int64_t extent = element_size(t.dtype);
    for (int64_t s : d.sizes()) {
      if (s < 0) malformed(which + " has a negative size " + std::to_string(s));
      const int64_t at_least_one = std::max<int64_t>(s, 1);
      if (extent > (int64_t{1} << 46) / at_least_one) malformed(which + " is too large");
      extent *= at_least_one;
      bytes *= s;
      t.sizes.push_back(s);
    }
    if (d.device_type() != 0 || d.device_index() != 0) {
      if (d.device_type() != 1 || d.device_index() < 0 || d.device_index() > 1024) {
        malformed(which + " names an unknown device");
      }
      t.device = Device::cuda(d.device_index());
    }
    if (d.requires_grad()) {
      // Only floating-point tensors can require grad; no sender could have set it.
      if (!is_floating_point(t.dtype)) {
        malformed(which + " of dtype " + std::string(dtype_name(t.dtype)) + " requires grad");
      }
      t.requires_grad = true;
    }
    if (d.is_inline()) {
      if (static_cast<int64_t>(d.inline_data().size()) != bytes) {
        malformed(which + " carries " + std::to_string(d.inline_data().size()) +
                  " inline bytes for " + std::to_string(bytes) + " bytes of data");
      }
      t.is_inline = true;
    }
    if (d.expand_to_size() > 0) {
      expanded_bytes += read_expand_to(d, which, t);
      if (expanded_bytes > limits.max_tensor_bytes) {
        malformed("its broadcast tensors expand to " + std::to_string(expanded_bytes) +
                  " bytes or more, more than the limit of " +
                  std::to_string(limits.max_tensor_bytes) + " (max_tensor_bytes)");
      }
    }
    if (d.has_loan()) {
      if (t.is_inline) malformed(which + " is both inline and lent");
      if (d.loan().token() == 0) malformed(which + " is lent with the null token");
      t.loan = Loan{d.loan().slot(), d.loan().token()};
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

struct ParsedEnvelope::Storage {
  // Enough for a call or reply with a few small arguments and inline tensors, and small
  // enough with the arena for malloc's per-thread cache (chunks up to 1 KiB).
  alignas(std::max_align_t) char block[976];
  google::protobuf::Arena arena{arena_options(block, sizeof(block))};
};

ParsedEnvelope::ParsedEnvelope(const std::string& payload, const EnvelopeLimits& limits)
    : storage_(new Storage) {  // default-initialized: the block is not zeroed first
  static_assert(sizeof(Storage) <= 1024);
  wire::Envelope* env = google::protobuf::Arena::CreateMessage<wire::Envelope>(&storage_->arena);
  parse(payload, limits, *env);
  message_ = env;
}
ParsedEnvelope::~ParsedEnvelope() = default;
bool ParsedEnvelope::is_request() const {
  return message_->has_request();
}
bool ParsedEnvelope::is_response() const {
  return message_->has_response();
}
uint64_t ParsedEnvelope::id() const {
  if (message_->has_request()) return message_->request().id();
  if (message_->has_response()) return message_->response().id();
  return 0;
}
ParsedEnvelope::ParsedEnvelope(ParsedEnvelope&& other) noexcept
    : storage_(std::move(other.storage_)), message_(std::exchange(other.message_, nullptr)) {}
ParsedEnvelope& ParsedEnvelope::operator=(ParsedEnvelope&& other) noexcept {
  storage_ = std::move(other.storage_);
  message_ = std::exchange(other.message_, nullptr);
  return *this;
}

std::vector<IncomingTensor> peek_tensors(const std::string& payload, const EnvelopeLimits& limits) {
  return peek_tensors(ParsedEnvelope(payload, limits), limits);
}

std::vector<IncomingTensor> peek_tensors(const ParsedEnvelope& parsed,
                                         const EnvelopeLimits& limits) {
  std::vector<IncomingTensor> all = describe_tensors(parsed.message(), limits);
  std::vector<IncomingTensor> out;
  size_t total = 0;
  for (IncomingTensor& t : all) {
    if (t.is_inline) continue;
    // What the receiver is about to allocate, all tensors together (each one is already
    // bounded, so the sum cannot overflow): checked here, for every receiver.
    total += t.nbytes();
    if (total > limits.max_tensor_bytes) {
      malformed("its tensors announce " + std::to_string(total) +
                " bytes or more, more than the limit of " +
                std::to_string(limits.max_tensor_bytes) + " (max_tensor_bytes)");
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::optional<EnvelopeHeader> peek_header(const std::string& payload,
                                          const EnvelopeLimits& limits) {
  // The scan, not a parse: a message refused for its size or counts is answered without
  // building any of it.
  EnvelopeShape shape;
  try {
    scan_envelope(payload, limits, shape);
  } catch (const InvalidArgument&) {
    // What was read before the failure still names the call to answer.
  }
  if (!shape.id_seen || (!shape.is_request && !shape.is_response)) return std::nullopt;
  return EnvelopeHeader{shape.is_request, shape.id};
}

Envelope decode(const std::string& payload, const std::vector<Tensor>& tensors,
                const EnvelopeLimits& limits) {
  return decode(ParsedEnvelope(payload, limits), tensors, limits);
}

namespace {

Envelope decode_release(const wire::Envelope& env, const std::vector<Tensor>& tensors,
                        const EnvelopeLimits& limits) {
  if (env.tensors_size() != 0 || !tensors.empty()) malformed("a release with tensors");
  if (static_cast<size_t>(env.release().loans_size()) > limits.max_tensors) {
    malformed("a release of " + std::to_string(env.release().loans_size()) +
              " loans exceeds the limit of " + std::to_string(limits.max_tensors));
  }
  Release release;
  for (const wire::Loan& l : env.release().loans())
    release.loans.push_back(Loan{l.slot(), l.token()});
  return Envelope{std::move(release)};
}

// A request's or response's own fields, checked (and its few extensions built) before any
// tensor or value is.
Request decode_request_fields(const wire::Envelope& env, const EnvelopeLimits& limits) {
  const wire::Request& in = env.request();
  if (in.function().size() > limits.max_function_name_bytes) {
    malformed("a function name of " + std::to_string(in.function().size()) + " bytes");
  }
  if (in.timeout_ms() > uint64_t{1} << 40) malformed("a timeout beyond any deadline");
  Request req;
  req.id = in.id();
  req.handler = in.handler();
  req.function = in.function();
  req.autograd_context_id = in.autograd_context_id();
  req.autograd_message_id = in.autograd_message_id();
  req.timeout = std::chrono::milliseconds(static_cast<int64_t>(in.timeout_ms()));
  req.payload.assign(in.payload().begin(), in.payload().end());
  req.extensions = decode_extensions(in.extensions(), limits);
  return req;
}

Response decode_response_fields(const wire::Envelope& env, const EnvelopeLimits& limits) {
  const wire::Response& in = env.response();
  Response resp;
  resp.id = in.id();
  resp.autograd_context_id = in.autograd_context_id();
  resp.autograd_message_id = in.autograd_message_id();
  if (in.has_error()) {
    const wire::ErrorReply& e = in.error();
    if (e.worker().size() > limits.max_worker_name_bytes) {
      malformed("an error's worker name of " + std::to_string(e.worker().size()) +
                " bytes exceeds the limit of " + std::to_string(limits.max_worker_name_bytes));
    }
    resp.result = ErrorReply{error_kind_from(e.kind()), e.message(), e.worker(), e.rejected()};
  } else if (!in.has_value()) {
    malformed("a response with neither a value nor an error");
  }
  resp.extensions = decode_extensions(in.extensions(), limits);
  return resp;
}

// Every tensor of the message by index: inline ones built from their bytes, the others
// the received ones in order; each then moved to the device it was sent to.
std::vector<Tensor> gather_tensors(const wire::Envelope& env, const std::vector<Tensor>& tensors,
                                   const EnvelopeLimits& limits) {
  const std::vector<IncomingTensor> announced = describe_tensors(env, limits);
  const size_t out_of_line = static_cast<size_t>(std::count_if(
      announced.begin(), announced.end(), [](const IncomingTensor& t) { return !t.is_inline; }));
  if (out_of_line != tensors.size()) {
    malformed(std::to_string(out_of_line) + " tensors announced, " +
              std::to_string(tensors.size()) + " received");
  }
  // Without gradwire::autograd in the process, set_requires_grad(true) would throw and
  // nothing could record anyway: the flag is dropped.
  const bool can_require_grad = autograd_hooks() != nullptr;
  std::vector<Tensor> all;
  all.reserve(announced.size());
  size_t next = 0;
  for (size_t i = 0; i < announced.size(); ++i) {
    const IncomingTensor& a = announced[i];
    Tensor t;
    if (a.is_inline) {
      t = empty(a.sizes, a.dtype);
      const std::string& bytes = env.tensors(static_cast<int>(i)).inline_data();
      if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    } else {
      t = tensors[next++];
      if (t.dtype() != a.dtype || t.sizes() != a.sizes) {
        malformed("tensor " + std::to_string(i) + " does not match its description");
      }
    }
    // A broadcast tensor becomes the contiguous tensor it was sent for.
    if (!a.expand_to.empty()) t = t.expand(a.expand_to).contiguous();
    if (a.device.is_cuda() && t.device() != a.device) t = t.to(a.device);
    if (a.requires_grad && can_require_grad) {
      // A fresh leaf, as PyTorch's rpc delivers it: whatever history the buffer handed in
      // had stays behind, and gradients accumulate on this tensor.
      t = t.detach();
      t.set_requires_grad(true);
    }
    all.push_back(std::move(t));
  }

  return all;
}

}  // namespace

Envelope decode(const ParsedEnvelope& parsed, const std::vector<Tensor>& tensors,
                const EnvelopeLimits& limits) {
  const wire::Envelope& env = parsed.message();
  if (env.has_release()) return decode_release(env, tensors, limits);
  // The request's or response's own fields are checked (and its few extensions built)
  // before any tensor or value is.
  Envelope out;
  if (env.has_request()) {
    out.body = decode_request_fields(env, limits);
  } else if (env.has_response()) {
    out.body = decode_response_fields(env, limits);
  } else {
    malformed("neither a request, a response nor a release");
  }
  const std::vector<Tensor> all = gather_tensors(env, tensors, limits);
  Decoder decoder{all, limits, env};
  if (Request* req = std::get_if<Request>(&out.body)) {
    const wire::Request& in = env.request();
    req->args.reserve(static_cast<size_t>(in.args_size()));
    for (const wire::Value& arg : in.args())
      req->args.push_back(decoder.decode(arg, 1));
  } else if (env.response().has_value()) {
    std::get<Response>(out.body).result = decoder.decode(env.response().value(), 1);
  }
  return out;
}

}  // namespace gradwire::rpc
