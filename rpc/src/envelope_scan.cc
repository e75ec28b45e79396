// The envelope's pre-scan (envelope_scan.h): Protobuf's wire format walked by hand against
// envelope.proto's field numbers. Keep on_varint() and on_bytes() in step with the .proto
// (tests/security/peer_message_scan_test.cc checks every repeated field against it).
#include "envelope_scan.h"

#include "wire_reader.h"

#include <string>

namespace gradwire::rpc {
namespace {

[[noreturn]] void malformed(const std::string& what) {
  throw InvalidArgument("malformed rpc envelope: " + what);
}

// The messages of envelope.proto whose fields the scan looks into.
enum class Msg {
  kEnvelope,
  kRequest,
  kResponse,
  kRelease,
  kValue,
  kList,
  kMap,
  kMapEntry,
  kTensorDesc,
  kExtension,
  kErrorReply,
  kSparseRows,  // SparseRowsValue: its dense shape counted like a tensor's sizes
  kLeaf,        // NoneValue, RRefValue, Loan: scalars and bytes only, walked for well-formedness
};

using detail::kFixed32;
using detail::kFixed64;
using detail::kLengthDelimited;
using detail::kVarint;
using detail::read_varint;

std::string count_text(size_t n) {
  return std::to_string(n);
}

// What one TensorDesc's (or SparseRowsValue's) repeated int64 fields hold so far.
struct Dims {
  size_t sizes{0};
  size_t expand_to{0};
};

class Scanner {
 public:
  Scanner(const EnvelopeLimits& limits, EnvelopeShape& shape) : limits_(limits), shape_(shape) {}

  void envelope(const uint8_t* p, const uint8_t* end) {
    message(Msg::kEnvelope, p, end, 0);
    if (version_ != kEnvelopeVersion) {
      malformed("version " + std::to_string(version_) + ", this worker speaks version " +
                std::to_string(kEnvelopeVersion));
    }
  }

 private:
  // Walks one message's fields; `depth` is the Value nesting of the message (0 above the
  // values).
  void message(Msg kind, const uint8_t* p, const uint8_t* end, int depth) {
    // A TensorDesc's sizes and its expand_to, each packed and unpacked together.
    Dims dims;
    while (p < end) {
      uint64_t tag = 0;
      if (!read_varint(p, end, tag)) malformed("a truncated field tag");
      const uint64_t field = tag >> 3;
      const auto type = static_cast<uint32_t>(tag & 7);
      if (field == 0 || field > 536'870'911) malformed("a field numbered " + count_text(field));
      switch (type) {
        case kVarint: {
          uint64_t v = 0;
          if (!read_varint(p, end, v)) malformed("a truncated varint");
          on_varint(kind, field, v, dims);
          break;
        }
        case kFixed64:
          if (end - p < 8) malformed("a truncated 64-bit field");
          p += 8;
          break;
        case kFixed32:
          if (end - p < 4) malformed("a truncated 32-bit field");
          p += 4;
          break;
        case kLengthDelimited: {
          uint64_t len = 0;
          if (!read_varint(p, end, len)) malformed("a truncated length");
          if (len > static_cast<uint64_t>(end - p)) {
            malformed("a field of " + count_text(len) + " bytes runs past the end of its message");
          }
          const uint8_t* body = p;
          p += len;
          on_bytes(kind, field, body, p, depth, dims);
          break;
        }
        default:
          // Groups (3, 4) and the unused wire types: nothing gradwire sends.
          malformed("wire type " + std::to_string(type) + " in field " + count_text(field));
      }
    }
  }

  void on_varint(Msg kind, uint64_t field, uint64_t v, Dims& dims) {
    switch (kind) {
      case Msg::kEnvelope:
        if (field == 1) version_ = v;
        return;
      case Msg::kRequest:
      case Msg::kResponse:
        if (field == 1) {
          shape_.id = v;
          shape_.id_seen = true;
        }
        return;
      case Msg::kTensorDesc:
        if (field == 2) add_dims(dims.sizes, 1, "dims");  // sizes, unpacked
        if (field == 9) add_dims(dims.expand_to, 1, "expand_to dims");
        return;
      case Msg::kSparseRows:
        if (field == 3) add_sparse_dims(dims.sizes, 1);  // sizes, unpacked
        return;
      default:
        return;
    }
  }

  // One length-delimited field of a message of `kind`: a nested message to scan, or bytes
  // whose size is checked against the limits.
  void on_bytes(Msg kind, uint64_t field, const uint8_t* p, const uint8_t* end, int depth,
                Dims& dims) {
    const size_t size = static_cast<size_t>(end - p);
    switch (kind) {
      case Msg::kEnvelope:
        return on_envelope_bytes(field, p, end);
      case Msg::kRequest:
        return on_request_bytes(field, p, end, size);
      case Msg::kResponse:
        return on_response_bytes(field, p, end);
      case Msg::kRelease:
        return on_release_bytes(field, p, end);
      case Msg::kValue:
        return on_value_bytes(field, p, end, depth);
      case Msg::kList:
        if (field == 1) value(p, end, depth + 1);
        return;
      case Msg::kMap:
        if (field == 1) {
          count_value();  // the entry itself is built whether or not it holds anything
          message(Msg::kMapEntry, p, end, depth);
        }
        return;
      case Msg::kMapEntry:
        if (field == 1 || field == 2) value(p, end, depth + 1);
        return;
      case Msg::kTensorDesc:
        return on_tensor_desc_bytes(field, p, end, dims);
      case Msg::kExtension:
        return on_extension_bytes(field, size);
      case Msg::kErrorReply:
        return on_error_reply_bytes(field, size);
      case Msg::kSparseRows:
        if (field == 3) add_sparse_dims(dims.sizes, packed_varints(p, end));
        return;
      case Msg::kLeaf:
        return;
    }
  }

  void on_envelope_bytes(uint64_t field, const uint8_t* p, const uint8_t* end) {
    switch (field) {
      case 2:  // request (a oneof: the last body seen is the one kept)
        set_body(true, false, false);
        return message(Msg::kRequest, p, end, 0);
      case 3:
        set_body(false, true, false);
        return message(Msg::kResponse, p, end, 0);
      case 5:
        set_body(false, false, true);
        return message(Msg::kRelease, p, end, 0);
      case 4:
        if (++shape_.tensors > limits_.max_tensors) {
          malformed("more than " + count_text(limits_.max_tensors) + " tensors (max_tensors)");
        }
        return message(Msg::kTensorDesc, p, end, 0);
      default:
        return;
    }
  }

  void on_request_bytes(uint64_t field, const uint8_t* p, const uint8_t* end, size_t size) {
    switch (field) {
      case 3:
        if (size > limits_.max_function_name_bytes) {
          malformed("a function name of " + count_text(size) + " bytes, more than " +
                    count_text(limits_.max_function_name_bytes));
        }
        return;
      case 4:
        return value(p, end, 1);
      case 9:
        return extension(p, end);
      default:
        return;
    }
  }

  void on_response_bytes(uint64_t field, const uint8_t* p, const uint8_t* end) {
    switch (field) {
      case 2:
        return value(p, end, 1);
      case 3:
        return message(Msg::kErrorReply, p, end, 0);
      case 7:
        return extension(p, end);
      default:
        return;
    }
  }

  void on_release_bytes(uint64_t field, const uint8_t* p, const uint8_t* end) {
    if (field == 1) {
      if (++loans_ > limits_.max_tensors) {
        malformed("a release of more than " + count_text(limits_.max_tensors) + " loans");
      }
      message(Msg::kLeaf, p, end, 0);
    }
  }

  void on_value_bytes(uint64_t field, const uint8_t* p, const uint8_t* end, int depth) {
    switch (field) {
      case 1:   // none
      case 10:  // rref
        return message(Msg::kLeaf, p, end, depth);
      case 8:
        return message(Msg::kList, p, end, depth);
      case 9:
        return message(Msg::kMap, p, end, depth);
      case 11:  // sparse_rows
        return message(Msg::kSparseRows, p, end, depth);
      default:
        return;
    }
  }

  void on_tensor_desc_bytes(uint64_t field, const uint8_t* p, const uint8_t* end, Dims& dims) {
    if (field == 2) {
      add_dims(dims.sizes, packed_varints(p, end), "dims");
    } else if (field == 9) {
      // A broadcast's shape: as many int64 as sizes once built, so bounded the same.
      add_dims(dims.expand_to, packed_varints(p, end), "expand_to dims");
    } else if (field == 7) {
      message(Msg::kLeaf, p, end, 0);
    }
  }

  void on_extension_bytes(uint64_t field, size_t size) {
    if (field == 1 && size > limits_.max_extension_key_bytes) {
      malformed("an extension key of " + count_text(size) + " bytes exceeds the limit of " +
                count_text(limits_.max_extension_key_bytes));
    }
    if (field == 2) {
      extension_bytes_ += size;
      if (extension_bytes_ > limits_.max_extension_bytes) {
        malformed("extension values of more than " + count_text(limits_.max_extension_bytes) +
                  " bytes");
      }
    }
  }

  void on_error_reply_bytes(uint64_t field, size_t size) {
    if (field == 3 && size > limits_.max_worker_name_bytes) {
      malformed("an error's worker name of " + count_text(size) + " bytes exceeds the limit of " +
                count_text(limits_.max_worker_name_bytes));
    }
  }

  void set_body(bool request, bool response, bool release) {
    shape_.is_request = request;
    shape_.is_response = response;
    shape_.is_release = release;
  }

  void count_value() {
    if (++shape_.values > limits_.max_values) {
      malformed("more than " + count_text(limits_.max_values) +
                " values (max_values; map entries count as values)");
    }
  }

  void value(const uint8_t* p, const uint8_t* end, int depth) {
    if (depth > limits_.max_depth) {
      malformed("values nest deeper than " + std::to_string(limits_.max_depth));
    }
    if (depth > shape_.depth) shape_.depth = depth;
    count_value();
    message(Msg::kValue, p, end, depth);
  }

  void extension(const uint8_t* p, const uint8_t* end) {
    if (++shape_.extensions > limits_.max_extensions) {
      malformed("more than " + count_text(limits_.max_extensions) + " extensions");
    }
    message(Msg::kExtension, p, end, 0);
  }

  // The elements of a packed run of varints: one per byte that ends a varint.
  static size_t packed_varints(const uint8_t* p, const uint8_t* end) {
    size_t n = 0;
    for (; p < end; ++p)
      n += (*p & 0x80) == 0 ? 1 : 0;
    return n;
  }

  // `what` names the field in the refusal: "dims" (sizes) or "expand_to dims".
  void add_dims(size_t& dims, size_t n, const char* what) {
    dims += n;
    if (dims > limits_.max_tensor_dims) {
      malformed("tensor " + count_text(shape_.tensors - 1) + " has more than " +
                count_text(limits_.max_tensor_dims) + " " + what + " (max_tensor_dims)");
    }
  }

  // A SparseRowsValue's dense shape: as many int64 as a tensor's sizes once built.
  void add_sparse_dims(size_t& dims, size_t n) {
    dims += n;
    if (dims > limits_.max_tensor_dims) {
      malformed("a sparse tensor's dense shape has more than " +
                count_text(limits_.max_tensor_dims) + " dims (max_tensor_dims)");
    }
  }

  const EnvelopeLimits& limits_;
  EnvelopeShape& shape_;
  uint64_t version_ = 0;
  size_t loans_ = 0;
  size_t extension_bytes_ = 0;
};

}  // namespace

void scan_envelope(std::string_view payload, const EnvelopeLimits& limits, EnvelopeShape& shape) {
  if (payload.size() > limits.max_payload_bytes) {
    malformed("payload of " + count_text(payload.size()) + " bytes exceeds the limit of " +
              count_text(limits.max_payload_bytes));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  Scanner(limits, shape).envelope(p, p + payload.size());
}

}  // namespace gradwire::rpc
