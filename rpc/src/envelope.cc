// The envelope's codec (wire.h). Decoding checks every count and size of a message
// against EnvelopeLimits before it builds anything from them.
#include "wire.h"

#include "envelope_scan.h"

#include <google/protobuf/arena.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "gradwire/tensor/autograd_hooks.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/storage.h"
#include "proto/envelope.pb.h"

namespace gradwire::rpc {

namespace {

[[noreturn]] void malformed(const std::string& what) {
  throw InvalidArgument("malformed rpc envelope: " + what);
}

// ---- encoding

// The message being built, and each of its tensors' requires_grad, in message order.
struct Encoding {
  EncodedMessage& msg;
  std::vector<bool> requires_grad;
  std::vector<Shape> expand_to;  // per tensor: empty, or the broadcast shape it travels for
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

void encode_value(const Value& v, wire::Value* out, Encoding& enc) {
  EncodedMessage& msg = enc.msg;
  switch (v.type()) {
    case ValueType::kNone:
      out->mutable_none();
      return;
    case ValueType::kBool:
      out->set_bool_value(v.as_bool());
      return;
    case ValueType::kInt:
      out->set_int_value(v.as_int());
      return;
    case ValueType::kDouble:
      out->set_double_value(v.as_double());
      return;
    case ValueType::kString:
      out->set_string_value(v.as_string());
      return;
    case ValueType::kBytes: {
      const Bytes& b = v.as_bytes();
      out->set_bytes_value(std::string(b.begin(), b.end()));
      return;
    }
    case ValueType::kTensor: {
      const Tensor& t = v.as_tensor();
      if (!t.defined()) throw InvalidArgument("an undefined Tensor cannot be sent");
      out->set_tensor_index(static_cast<uint32_t>(msg.tensors.size()));
      // A tensor that requires grad travels as data and a flag: detached, neither the
      // staging nor the packing below records anything in the sender's graph (the receiver
      // starts a graph of its own).
      const bool requires_grad = t.requires_grad();
      Tensor travel = requires_grad ? t.detach() : t;
      // CUDA tensors are staged through host memory (no CUDA channel); a strided view is
      // packed first, so what travels is always a contiguous CPU block.
      if (travel.is_cuda()) travel = travel.to(Device::cpu());
      Shape expand_to;
      if (Tensor compact = compact_of_broadcast(travel); compact.defined()) {
        expand_to = travel.sizes();
        travel = compact;
      }
      msg.tensors.push_back(travel.contiguous());
      msg.targets.push_back(msg.target_device ? msg.target_device(t.device()) : Device::cpu());
      enc.requires_grad.push_back(requires_grad);
      enc.expand_to.push_back(std::move(expand_to));
      return;
    }
    case ValueType::kList: {
      wire::ListValue* list = out->mutable_list();
      for (const Value& item : v.as_list())
        encode_value(item, list->add_items(), enc);
      return;
    }
    case ValueType::kMap: {
      wire::MapValue* map = out->mutable_map();
      for (const auto& [key, value] : v.as_map()) {
        wire::MapEntry* entry = map->add_entries();
        encode_value(key, entry->mutable_key(), enc);
        encode_value(value, entry->mutable_value(), enc);
      }
      return;
    }
    case ValueType::kRRef: {
      const RRefDescriptor& r = v.as_rref();
      wire::RRefValue* out_r = out->mutable_rref();
      out_r->set_owner(r.owner);
      out_r->set_rref_id(r.rref_id);
      out_r->set_fork_id(r.fork_id);
      out_r->set_type_name(r.type_name);
      return;
    }
  }
}

template <typename Repeated>
void encode_extensions(const Extensions& extensions, Repeated* out) {
  for (const auto& [key, value] : extensions) {
    wire::Extension* e = out->Add();
    e->set_key(key);
    e->set_value(std::string(value.begin(), value.end()));
  }
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
      case wire::Value::KIND_NOT_SET:
        break;
    }
    malformed("a value of no known kind");
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

EncodedMessage encode(const Envelope& envelope, const DeviceMapper& target_device,
                      size_t inline_tensor_bytes, const Lender& lender) {
  EncodedMessage msg;
  Encoding enc{msg, {}, {}};
  msg.target_device = target_device;
  // Built on an arena that starts on the stack: no allocation per field or nested message,
  // and nothing to free one by one once serialized.
  alignas(std::max_align_t) char block[2048];
  google::protobuf::Arena arena(arena_options(block, sizeof(block)));
  wire::Envelope& env = *google::protobuf::Arena::CreateMessage<wire::Envelope>(&arena);
  env.set_version(kEnvelopeVersion);
  if (const Release* release = std::get_if<Release>(&envelope.body)) {
    wire::Release* out = env.mutable_release();
    for (const Loan& loan : release->loans) {
      wire::Loan* l = out->add_loans();
      l->set_slot(loan.slot);
      l->set_token(loan.token);
    }
    msg.target_device = nullptr;
    msg.payload = env.SerializeAsString();
    return msg;
  }
  if (const Request* req = std::get_if<Request>(&envelope.body)) {
    wire::Request* out = env.mutable_request();
    out->set_id(req->id);
    out->set_handler(req->handler);
    out->set_function(req->function);
    for (const Value& arg : req->args)
      encode_value(arg, out->add_args(), enc);
    out->set_autograd_context_id(req->autograd_context_id);
    out->set_autograd_message_id(req->autograd_message_id);
    out->set_timeout_ms(static_cast<uint64_t>(std::max<int64_t>(0, req->timeout.count())));
    out->set_payload(std::string(req->payload.begin(), req->payload.end()));
    encode_extensions(req->extensions, out->mutable_extensions());
  } else {
    const Response& resp = std::get<Response>(envelope.body);
    wire::Response* out = env.mutable_response();
    out->set_id(resp.id);
    out->set_autograd_context_id(resp.autograd_context_id);
    out->set_autograd_message_id(resp.autograd_message_id);
    if (const Value* value = std::get_if<Value>(&resp.result)) {
      encode_value(*value, out->mutable_value(), enc);
    } else {
      const ErrorReply& err = std::get<ErrorReply>(resp.result);
      wire::ErrorReply* out_err = out->mutable_error();
      out_err->set_kind(static_cast<uint32_t>(err.kind));
      out_err->set_message(err.message);
      out_err->set_worker(err.worker);
      out_err->set_rejected(err.rejected);
    }
    encode_extensions(resp.extensions, out->mutable_extensions());
  }
  // Small tensors travel inside the envelope: one TensorPipe message part instead of a
  // channel transfer each, which is most of the cost of a small call.
  std::vector<Tensor> out_of_line;
  std::vector<Device> out_of_line_targets;
  size_t inlined = 0;
  for (size_t i = 0; i < msg.tensors.size(); ++i) {
    const Tensor& t = msg.tensors[i];
    wire::TensorDesc* desc = env.add_tensors();
    desc->set_dtype(static_cast<uint32_t>(t.dtype()));
    for (int64_t s : t.sizes())
      desc->add_sizes(s);
    desc->set_device_type(msg.targets[i].is_cuda() ? 1 : 0);
    desc->set_device_index(msg.targets[i].index);
    desc->set_requires_grad(enc.requires_grad[i]);
    for (int64_t s : enc.expand_to[i])
      desc->add_expand_to(s);
    const size_t bytes = t.nbytes();
    if (bytes <= inline_tensor_bytes && inlined + bytes <= kMaxInlineBytesPerMessage) {
      desc->set_inline_data(static_cast<const char*>(t.data_ptr()), bytes);
      desc->set_is_inline(true);
      inlined += bytes;
    } else if (std::optional<Loan> loan = lender ? lender(t) : std::nullopt) {
      desc->mutable_loan()->set_slot(loan->slot);
      desc->mutable_loan()->set_token(loan->token);
    } else {
      out_of_line.push_back(t);
      out_of_line_targets.push_back(msg.targets[i]);
    }
  }
  msg.tensors = std::move(out_of_line);
  msg.targets = std::move(out_of_line_targets);
  msg.target_device = nullptr;
  msg.payload = env.SerializeAsString();
  return msg;
}

namespace {

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
      // Broadcast: each dimension 1 (expanded) or as sent, no larger than a tensor may be,
      // and what all of them become within max_tensor_bytes (they are made on arrival).
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
          malformed(which + " of size " + std::to_string(d.sizes(k)) + " in dim " +
                    std::to_string(k) + " cannot be expanded to " + std::to_string(s));
        }
        const int64_t at_least_one = std::max<int64_t>(s, 1);
        if (logical_extent > (int64_t{1} << 46) / at_least_one) {
          malformed(which + " is expanded too far");
        }
        logical_extent *= at_least_one;
        logical *= s;
        t.expand_to.push_back(s);
      }
      expanded_bytes += static_cast<size_t>(logical);
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

Envelope decode(const ParsedEnvelope& parsed, const std::vector<Tensor>& tensors,
                const EnvelopeLimits& limits) {
  const wire::Envelope& env = parsed.message();
  if (env.has_release()) {
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
  // The request's or response's own fields are checked (and its few extensions built)
  // before any tensor or value is.
  Envelope out;
  if (env.has_request()) {
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
    out.body = std::move(req);
  } else if (env.has_response()) {
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
    out.body = std::move(resp);
  } else {
    malformed("neither a request, a response nor a release");
  }

  const std::vector<IncomingTensor> announced = describe_tensors(env, limits);
  // Every tensor of the message by index: inline ones built from their bytes, the others
  // the received ones in order; each then moved to the device it was sent to.
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

  Decoder decoder{all, limits};
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
