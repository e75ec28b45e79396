// Every repeated field of every message a peer sends is counted before Protobuf builds it.
//
// The check list is not written by hand: it comes from the .proto files themselves. protoc
// compiles each module's proto/*.proto into a FileDescriptorSet at build time
// (tests/CMakeLists.txt), which this test decodes itself (the modules link Protobuf's lite
// runtime, which has no descriptors). From the message each module parses out of a peer's
// bytes (its root), it walks every message reachable, and for each repeated field — packed or
// unpacked scalars, messages, strings, bytes — it sends the module's pre-scan a payload of one
// element (accepted: the path to the field is well-formed) and one of more elements than any limit
// allows (refused, naming a limit). A field added to a .proto without teaching its scan fails here;
// so does a .proto file with no scan, or a message its root does not reach.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dist_autograd_scan.h"
#include "envelope_scan.h"
#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/payload_scan.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"
#include "rref_scan.h"
#include "support/agents.h"
#include "support/proto_bytes.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using test::proto_bytes::length_delimited;
using test::proto_bytes::tag;
using test::proto_bytes::varint;

// ---- the descriptors (google/protobuf/descriptor.proto's field numbers, which are stable)

// One field of a message on the wire: its number, wire type, and varint or bytes.
struct WireField {
  uint32_t number{0};
  uint32_t type{0};
  uint64_t value{0};
  std::string_view bytes;
};

bool read_varint(std::string_view& in, uint64_t& out) {
  out = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto b = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    out |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// The fields of a descriptor message, in order; throws on anything a descriptor set does not
// hold.
std::vector<WireField> fields_of(std::string_view in) {
  std::vector<WireField> out;
  while (!in.empty()) {
    uint64_t key = 0;
    if (!read_varint(in, key)) throw std::runtime_error("a truncated tag in the descriptors");
    WireField f{static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7), 0, {}};
    switch (f.type) {
      case 0:
        if (!read_varint(in, f.value)) throw std::runtime_error("a truncated varint");
        break;
      case 1:
      case 5: {
        const size_t n = f.type == 1 ? 8 : 4;
        if (in.size() < n) throw std::runtime_error("a truncated fixed field");
        in.remove_prefix(n);
        break;
      }
      case 2: {
        uint64_t len = 0;
        if (!read_varint(in, len) || len > in.size()) throw std::runtime_error("a bad length");
        f.bytes = in.substr(0, len);
        in.remove_prefix(len);
        break;
      }
      default:
        throw std::runtime_error("wire type " + std::to_string(f.type) + " in the descriptors");
    }
    out.push_back(f);
  }
  return out;
}

// FieldDescriptorProto.Type values.
enum FieldType : uint32_t {
  kDouble = 1,
  kFloat = 2,
  kInt64 = 3,
  kUint64 = 4,
  kInt32 = 5,
  kFixed64 = 6,
  kFixed32 = 7,
  kBool = 8,
  kString = 9,
  kGroup = 10,
  kMessage = 11,
  kBytes = 12,
  kUint32 = 13,
  kEnum = 14,
  kSfixed32 = 15,
  kSfixed64 = 16,
  kSint32 = 17,
  kSint64 = 18,
};
constexpr uint64_t kLabelRepeated = 3;

struct FieldInfo {
  std::string name;
  uint32_t number{0};
  uint32_t type{0};
  bool repeated{false};
  std::string type_name;  // a message's full name, ".package.Message"
};

struct MessageInfo {
  std::string full_name;  // ".package.Message"
  std::string file;
  std::vector<FieldInfo> fields;
};

struct Schema {
  std::vector<std::string> files;
  std::map<std::string, MessageInfo> messages;  // by full name
};

void add_message(Schema& schema, const std::string& file, const std::string& scope,
                 std::string_view descriptor) {
  MessageInfo m;
  m.file = file;
  std::vector<std::string_view> nested;
  for (const WireField& f : fields_of(descriptor)) {
    if (f.number == 1 && f.type == 2) m.full_name = scope + "." + std::string(f.bytes);
    if (f.number == 3 && f.type == 2) nested.push_back(f.bytes);  // nested_type
    if (f.number != 2 || f.type != 2) continue;                   // field
    FieldInfo field;
    for (const WireField& g : fields_of(f.bytes)) {
      if (g.number == 1) field.name = std::string(g.bytes);
      if (g.number == 3) field.number = static_cast<uint32_t>(g.value);
      if (g.number == 4) field.repeated = g.value == kLabelRepeated;
      if (g.number == 5) field.type = static_cast<uint32_t>(g.value);
      if (g.number == 6) field.type_name = std::string(g.bytes);
    }
    m.fields.push_back(field);
  }
  for (std::string_view n : nested)
    add_message(schema, file, m.full_name, n);  // map entries among them
  schema.messages[m.full_name] = std::move(m);
}

Schema load_schema() {
  std::ifstream in(GRADWIRE_PEER_DESCRIPTORS, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + std::string(GRADWIRE_PEER_DESCRIPTORS));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string set = buffer.str();
  Schema schema;
  for (const WireField& file : fields_of(set)) {  // FileDescriptorSet.file
    if (file.number != 1) continue;
    std::string name;
    std::string package;
    std::vector<std::string_view> messages;
    for (const WireField& f : fields_of(file.bytes)) {
      if (f.number == 1) name = std::string(f.bytes);
      if (f.number == 2) package = std::string(f.bytes);
      if (f.number == 4) messages.push_back(f.bytes);  // message_type
    }
    schema.files.push_back(name);
    for (std::string_view m : messages)
      add_message(schema, name, package.empty() ? "" : "." + package, m);
  }
  return schema;
}

// ---- the messages peers send, and the scan each one goes through

struct PeerRoot {
  std::string label;
  std::string file;     // as protoc names it: relative to its proto/ directory
  std::string message;  // the root's full name
  std::string prefix;   // fields every payload needs at the root (the envelope's version)
  std::function<void(std::string_view)> scan;  // throws InvalidArgument to refuse
  size_t too_many{0};                          // more elements than any limit allows
};

void scan_envelope_with(std::string_view payload, const rpc::EnvelopeLimits& limits) {
  rpc::EnvelopeShape shape;
  rpc::scan_envelope(payload, limits, shape);
}

std::vector<PeerRoot> peer_roots() {
  std::string version;
  tag(version, 1, test::proto_bytes::kVarint);
  varint(version, rpc::kEnvelopeVersion);
  // The envelope under its defaults, and under limits of 8 for every count: each repeated
  // field is refused at the limit it counts against, however small.
  const rpc::EnvelopeLimits defaults;
  rpc::EnvelopeLimits tight;
  tight.max_values = tight.max_tensors = tight.max_tensor_dims = tight.max_extensions = 8;
  const size_t largest = std::max({defaults.max_values, defaults.max_tensors,
                                   defaults.max_tensor_dims, defaults.max_extensions});
  return {
      {"rpc envelope", "envelope.proto", ".gradwire.rpc.wire.Envelope", version,
       [defaults](std::string_view p) { scan_envelope_with(p, defaults); }, largest + 1},
      {"rpc envelope, limits of 8", "envelope.proto", ".gradwire.rpc.wire.Envelope", version,
       [tight](std::string_view p) { scan_envelope_with(p, tight); }, 9},
      // Request::payload of handlers 2 and 4.
      {"rref message", "rref.proto", ".gradwire.rref.wire.RRefMessage", "",
       [](std::string_view p) { rref::check_message_counts(p); }, rref::kMaxRepeatedElements + 1},
      // Request::payload of handler 3.
      {"dist_autograd message", "dist_autograd.proto",
       ".gradwire.dist_autograd.wire.DistAutogradMessage", "",
       [](std::string_view p) { dist_autograd::internal::check_message_counts(p); },
       dist_autograd::internal::kMaxRepeatedElements + 1},
  };
}

// ---- payloads

// A repeated field and the message fields that lead to it from the root.
struct RepeatedField {
  std::string where;           // "Envelope.request > Request.args"
  std::vector<uint32_t> path;  // the message fields from the root
  FieldInfo field;
};

// Every repeated field reachable from `root`, each by the shortest path; `reached` gets the
// messages on the way.
std::vector<RepeatedField> repeated_fields(const Schema& schema, const std::string& root,
                                           std::set<std::string>& reached) {
  struct Visit {
    std::string message;
    std::vector<uint32_t> path;
    std::string where;
  };
  std::vector<RepeatedField> out;
  std::deque<Visit> queue{{root, {}, ""}};
  reached.insert(root);
  while (!queue.empty()) {
    const Visit v = queue.front();
    queue.pop_front();
    const MessageInfo& m = schema.messages.at(v.message);
    const std::string short_name = m.full_name.substr(m.full_name.rfind('.') + 1);
    for (const FieldInfo& f : m.fields) {
      const std::string where =
          (v.where.empty() ? "" : v.where + " > ") + short_name + "." + f.name;
      if (f.repeated) out.push_back({where, v.path, f});
      if ((f.type == kMessage || f.type == kGroup) && reached.insert(f.type_name).second) {
        std::vector<uint32_t> path = v.path;
        path.push_back(f.number);
        queue.push_back({f.type_name, std::move(path), where});
      }
    }
  }
  return out;
}

// One way to write n elements of a field.
struct Encoding {
  std::string name;
  std::function<std::string(size_t n)> write;
};

// Fixed-width scalars: 4 or 8 bytes; 0 for varints and length-delimited elements.
size_t fixed_width(uint32_t type) {
  switch (type) {
    case kFixed32:
    case kSfixed32:
    case kFloat:
      return 4;
    case kFixed64:
    case kSfixed64:
    case kDouble:
      return 8;
    default:
      return 0;
  }
}

std::vector<Encoding> encodings(const FieldInfo& f) {
  const uint32_t number = f.number;
  if (f.type == kMessage || f.type == kString || f.type == kBytes) {
    return {{"empty elements", [number](size_t n) {
               std::string out;
               out.reserve(n * 6);
               for (size_t i = 0; i < n; ++i)
                 length_delimited(out, number, "");
               return out;
             }}};
  }
  const size_t width = fixed_width(f.type);
  // One element: the value 1 as a varint, or `width` zero bytes.
  const std::string element = width == 0 ? std::string("\x01", 1) : std::string(width, '\0');
  const uint32_t wire_type = width == 0 ? 0 : width == 8 ? 1 : 5;
  return {{"packed",
           [number, element](size_t n) {
             std::string run;
             run.reserve(n * element.size());
             for (size_t i = 0; i < n; ++i)
               run += element;
             std::string out;
             length_delimited(out, number, run);
             return out;
           }},
          {"unpacked", [number, element, wire_type](size_t n) {
             std::string out;
             out.reserve(n * (element.size() + 5));
             for (size_t i = 0; i < n; ++i) {
               tag(out, number, wire_type);
               out += element;
             }
             return out;
           }}};
}

// The root's payload holding `elements` (fields of the innermost message) at `path`.
std::string payload_at(const PeerRoot& root, const std::vector<uint32_t>& path,
                       std::string elements) {
  for (size_t i = path.size(); i-- > 0;) {
    std::string outer;
    length_delimited(outer, path[i], elements);
    elements = std::move(outer);
  }
  return root.prefix + elements;
}

// "" when `scan` accepts `payload`, else its refusal.
std::string refusal(const PeerRoot& root, const std::string& payload) {
  try {
    root.scan(payload);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// ---- the tests

TEST(PeerMessageScan, EveryProtoFileSentByPeersHasAScan) {
  const Schema schema = load_schema();
  const std::vector<PeerRoot> roots = peer_roots();
  ASSERT_GE(schema.files.size(), 3u);
  for (const std::string& file : schema.files) {
    const bool scanned =
        std::any_of(roots.begin(), roots.end(), [&](const PeerRoot& r) { return r.file == file; });
    EXPECT_TRUE(scanned) << file
                         << " holds messages peers may send, and no pre-scan counts them: give "
                            "its module one (see rref/src/rref_scan.h) and list it in peer_roots()";
  }
  // Every message of a file is one its root reaches: a message sent some other way would
  // need a root (and a scan) of its own.
  for (const PeerRoot& root : roots) {
    ASSERT_TRUE(schema.messages.count(root.message)) << root.message;
    std::set<std::string> reached;
    repeated_fields(schema, root.message, reached);
    for (const auto& [name, m] : schema.messages) {
      if (m.file == root.file) {
        EXPECT_TRUE(reached.count(name)) << name << " is not reached from " << root.message;
      }
    }
  }
}

TEST(PeerMessageScan, EveryRepeatedFieldIsCountedBeforeParsing) {
  const Schema schema = load_schema();
  size_t checked = 0;
  for (const PeerRoot& root : peer_roots()) {
    std::set<std::string> reached;
    const std::vector<RepeatedField> fields = repeated_fields(schema, root.message, reached);
    for (const RepeatedField& r : fields) {
      ASSERT_NE(r.field.type, kGroup) << r.where << ": groups are not supported";
      for (const Encoding& e : encodings(r.field)) {
        SCOPED_TRACE(root.label + ": " + r.where + ", " + e.name);
        // One element: the path to the field is well-formed and within every limit.
        EXPECT_EQ(refusal(root, payload_at(root, r.path, e.write(1))), "");
        // More than any limit allows: refused by the scan, which names the limit.
        const std::string text = refusal(root, payload_at(root, r.path, e.write(root.too_many)));
        EXPECT_NE(text.find("more than"), std::string::npos)
            << (text.empty() ? "accepted: the scan does not count this field" : text);
        ++checked;
      }
    }
  }
  // The envelope's ten repeated fields (two encodings for the scalars), under two sets of
  // limits, and at least one field of each module.
  EXPECT_GE(checked, 2 * 11u + 2u);
}

// The scans see through what Protobuf does with a payload: elements split between packed
// and unpacked occurrences, and a sub-message sent twice (merged into one), add up.
TEST(PeerMessageScan, CountsAddUpAcrossOccurrences) {
  constexpr uint32_t kPath[] = {1, 3};
  std::string first;
  length_delimited(first, 3, std::string(40, '\x01'));  // 40 ids, packed
  std::string second;
  for (int i = 0; i < 30; ++i) {  // 30 more, unpacked, in a second Discover
    tag(second, 3, test::proto_bytes::kVarint);
    varint(second, uint64_t{1} << 40);
  }
  std::string payload;
  length_delimited(payload, 1, first);
  length_delimited(payload, 1, second);
  EXPECT_EQ(rpc::count_repeated(payload, kPath, rpc::RepeatedKind::kVarint), 70u);
  // Other fields, and the same number under another message, are not counted.
  std::string other;
  length_delimited(other, 2, first);
  EXPECT_EQ(rpc::count_repeated(other, kPath, rpc::RepeatedKind::kVarint), 0u);
  // A length past its message is no count at all.
  std::string past;
  tag(past, 1, test::proto_bytes::kLengthDelimited);
  varint(past, 100);
  EXPECT_EQ(rpc::count_repeated(past, kPath, rpc::RepeatedKind::kVarint), std::nullopt);
}

// ---- the modules' handlers refuse, on live agents

// A packed run of `n` ids at `path`: one byte each on the wire, eight once parsed.
std::string packed_ids(uint32_t op, uint32_t field, size_t n) {
  std::string body;
  length_delimited(body, field, std::string(n, '\x01'));
  std::string out;
  length_delimited(out, op, body);
  return out;
}

TEST(PeerMessageScan, HandlersRefuseTooManyIdsBeforeParsing) {
  rpc::Registry reg;
  test::Agents agents = test::start_agents(2, test::agent_options(reg));
  // Discover.message_ids (DistAutogradMessage.discover = 1, field 3).
  const std::string discover =
      test::send_forged(*agents[0], "w1", dist_autograd::kDistAutogradHandler,
                        packed_ids(1, 3, dist_autograd::internal::kMaxDiscoveredSends + 1));
  EXPECT_NE(discover.find("Discover.message_ids holds more than 1048576 message ids"),
            std::string::npos)
      << discover;
  // ChildAccepted.fork_ids (RRefMessage.child_accepted = 5, field 1), to the control handler.
  const std::string accepted = test::send_forged(*agents[0], "w1", rref::kRRefControlHandler,
                                                 packed_ids(5, 1, rref::kMaxAcceptedForks + 1));
  EXPECT_NE(accepted.find("ChildAccepted.fork_ids holds more than 65536 fork ids"),
            std::string::npos)
      << accepted;
  test::shutdown_agents(agents);
}

}  // namespace
}  // namespace gradwire
