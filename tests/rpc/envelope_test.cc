// The envelope: requests and responses round-trip with their tensors, requires_grad flags
// and extensions; hostile payloads (random bytes, truncations, bad indices, limits
// exceeded, unknown versions) are InvalidArguments, never crashes. The encoder writes the
// bytes Protobuf's own serializer writes for the same message.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gradwire/autograd/variable.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/envelope.h"
#include "gradwire/tensor/autograd_hooks.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "proto/envelope.pb.h"
#include "wire.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;

// What a transport does: allocate each announced tensor, copy the data in, decode.
Envelope transport(const EncodedMessage& m, const EnvelopeLimits& limits = {}) {
  std::vector<Tensor> received;
  for (const IncomingTensor& t : peek_tensors(m.payload, limits)) {
    Tensor buffer = empty(t.sizes, t.dtype);
    received.push_back(buffer);
  }
  for (size_t i = 0; i < received.size(); ++i)
    received[i].copy_(m.tensors[i]);
  return decode(m.payload, received, limits);
}

std::string malformed(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

TEST(EnvelopeTest, RequestsRoundTripWithTheirTensors) {
  Tensor a = arange(Scalar(6), kFloat32).view({2, 3});
  Tensor strided = arange(Scalar(12), kInt64).view({3, 4}).t();  // not contiguous
  Request req;
  req.id = 42;
  req.function = "add";
  req.args = {Value(a),
              Value::list({Value(int64_t{-7}), Value(2.5), Value("s"), Value(Bytes{1, 2})}),
              Value::map({{Value("k"), Value(strided)}, {Value(int64_t{3}), Value()}}),
              Value(RRefDescriptor{2, 9, 10, "PS"}), Value(true)};
  req.autograd_context_id = 5;
  req.autograd_message_id = 6;
  req.timeout = 1500ms;
  req.payload = {9, 8};
  req.extensions = {{"rref.fork", {1, 2, 3}}, {"", {}}, {"dist_autograd.ctx", {0, 255}}};
  EncodedMessage m = encode(Envelope{req}, nullptr, /*inline_tensor_bytes=*/0);
  ASSERT_EQ(m.tensors.size(), 2u);
  EXPECT_TRUE(m.tensors[1].is_contiguous());
  // By default, small tensors travel inside the payload and come back the same.
  EncodedMessage small = encode(Envelope{req});
  EXPECT_EQ(small.tensors.size(), 0u);
  const Request inlined = std::get<Request>(transport(small).body);
  EXPECT_TRUE(equal(inlined.args[0].as_tensor(), a));
  EXPECT_TRUE(equal(inlined.args[2].as_map()[0].second.as_tensor(), strided));

  const Request back = std::get<Request>(transport(m).body);
  EXPECT_EQ(back.id, 42u);
  EXPECT_EQ(back.handler, kCallHandler);
  EXPECT_EQ(back.function, "add");
  EXPECT_EQ(back.autograd_context_id, 5u);
  EXPECT_EQ(back.autograd_message_id, 6u);
  EXPECT_EQ(back.timeout, 1500ms);
  EXPECT_EQ(back.payload, (Bytes{9, 8}));
  EXPECT_EQ(back.extensions,
            (Extensions{{"", {}}, {"dist_autograd.ctx", {0, 255}}, {"rref.fork", {1, 2, 3}}}));
  ASSERT_EQ(back.args.size(), 5u);
  EXPECT_TRUE(equal(back.args[0].as_tensor(), a));
  EXPECT_FALSE(back.args[0].as_tensor().is_same(a));  // it travelled
  EXPECT_EQ(back.args[1], req.args[1]);
  const Value::Map& map = back.args[2].as_map();
  EXPECT_TRUE(equal(map[0].second.as_tensor(), strided));
  EXPECT_TRUE(map[1].second.is_none());
  EXPECT_EQ(back.args[3].as_rref(), (RRefDescriptor{2, 9, 10, "PS"}));
  EXPECT_TRUE(back.args[4].as_bool());
}

TEST(EnvelopeTest, AMessageParsedOnceDecodesAsFromItsPayload) {
  Tensor big = arange(Scalar(8192), kFloat32);  // 32 KiB: travels beside the payload
  Request req;
  req.id = 3;
  req.function = "sum";
  req.args = {Value(big), Value(int64_t{8})};
  req.extensions = {{"k", {7}}};
  const EncodedMessage m = encode(Envelope{req});
  const ParsedEnvelope parsed(m.payload, EnvelopeLimits{});
  const std::vector<IncomingTensor> announced = peek_tensors(parsed);
  ASSERT_EQ(announced.size(), 1u);
  EXPECT_EQ(announced[0].sizes, (Shape{8192}));
  std::vector<Tensor> received{empty(announced[0].sizes, announced[0].dtype)};
  received[0].copy_(m.tensors[0]);
  const Request once = std::get<Request>(decode(parsed, received).body);
  const Request twice = std::get<Request>(decode(m.payload, received).body);
  EXPECT_EQ(once.id, twice.id);
  EXPECT_EQ(once.function, twice.function);
  EXPECT_TRUE(equal(once.args[0].as_tensor(), big));
  EXPECT_EQ(once.args[1].as_int(), 8);
  EXPECT_EQ(once.extensions, twice.extensions);
  // Parsing checks what peek_tensors checked: garbage and foreign versions are refused.
  EXPECT_NE(malformed([] {
              ParsedEnvelope junk(std::string("\xff\xff\xff"), EnvelopeLimits{});
            }).find("malformed rpc envelope"),
            std::string::npos);
}

TEST(EnvelopeTest, ResponsesCarryAValueOrATypedError) {
  Response ok;
  ok.id = 7;
  ok.result = Value(full({3}, Scalar(1.5), kFloat64));
  ok.autograd_context_id = 11;
  ok.autograd_message_id = 12;
  ok.extensions = {{"rref.confirm", {4}}};
  const Response ok_back = std::get<Response>(transport(encode(Envelope{ok})).body);
  EXPECT_EQ(ok_back.id, 7u);
  EXPECT_TRUE(equal(std::get<Value>(ok_back.result).as_tensor(), full({3}, Scalar(1.5), kFloat64)));
  EXPECT_EQ(ok_back.autograd_context_id, 11u);
  EXPECT_EQ(ok_back.autograd_message_id, 12u);
  EXPECT_EQ(ok_back.extensions, (Extensions{{"rref.confirm", {4}}}));

  Response bad;
  bad.id = 8;
  bad.result = ErrorReply{ErrorKind::kInvalidArgument, "argument 2 of add: expected Tensor", "ps0",
                          /*rejected=*/true};
  const Response bad_back = std::get<Response>(transport(encode(Envelope{bad})).body);
  const ErrorReply& err = std::get<ErrorReply>(bad_back.result);
  EXPECT_EQ(err.kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(err.message, "argument 2 of add: expected Tensor");
  EXPECT_EQ(err.worker, "ps0");
  EXPECT_TRUE(err.rejected);
  EXPECT_TRUE(bad_back.extensions.empty());
}

// The worker an error came from is a worker name: at most max_worker_name_bytes.
TEST(EnvelopeTest, AnErrorsWorkerRoundTripsWithinItsBound) {
  Response remote;
  remote.id = 3;
  remote.result = ErrorReply{ErrorKind::kRemote, "boom", std::string(128, 'w'), false};
  const Response back = std::get<Response>(transport(encode(Envelope{remote})).body);
  EXPECT_EQ(std::get<ErrorReply>(back.result).worker, std::string(128, 'w'));
  EXPECT_EQ(std::get<ErrorReply>(back.result).kind, ErrorKind::kRemote);
  EXPECT_FALSE(std::get<ErrorReply>(back.result).rejected);

  remote.result = ErrorReply{ErrorKind::kRemote, "boom", std::string(129, 'w'), false};
  EXPECT_NE(malformed([&] {
              transport(encode(Envelope{remote}));
            }).find("an error's worker name of 129 bytes exceeds the limit of 128"),
            std::string::npos);
  EnvelopeLimits tight;
  tight.max_worker_name_bytes = 3;
  remote.result = ErrorReply{ErrorKind::kRemote, "boom", "ps0", false};
  EXPECT_NO_THROW(transport(encode(Envelope{remote}), tight));
  remote.result = ErrorReply{ErrorKind::kRemote, "boom", "ps10", false};
  EXPECT_NE(malformed([&] {
              transport(encode(Envelope{remote}), tight);
            }).find("worker name of 4 bytes exceeds the limit of 3"),
            std::string::npos);
}

// Takes the hooks gradwire::autograd installed away for the guard's scope: the process then
// behaves as one without autograd linked.
class WithoutAutograd {
 public:
  WithoutAutograd() : hooks_(set_autograd_hooks(nullptr)) {}
  ~WithoutAutograd() { set_autograd_hooks(hooks_); }
  WithoutAutograd(const WithoutAutograd&) = delete;
  WithoutAutograd& operator=(const WithoutAutograd&) = delete;

 private:
  AutogradHooks* hooks_;
};

// requires_grad travels as a flag: the data is sent detached (encoding records nothing),
// and the receiver's tensor is a fresh leaf of its own graph.
TEST(EnvelopeTest, RequiresGradTravelsAndTheReceivedTensorIsAFreshLeaf) {
  ASSERT_TRUE(autograd::ensure_registered());
  Tensor x = arange(Scalar(6), kFloat32).view({2, 3});
  x.set_requires_grad(true);
  const Tensor y = x.t();  // a non-leaf view that is not contiguous: packing it copies
  ASSERT_FALSE(y.is_leaf());
  const Tensor n = arange(Scalar(3), kInt64);
  const Tensor plain = full({2}, Scalar(0.5), kFloat64);
  Request req;
  req.function = "f";
  req.args = {Value(x), Value(y), Value(n), Value(plain)};
  for (size_t inline_bytes : {size_t{0}, kDefaultInlineTensorBytes}) {
    SCOPED_TRACE("inline_tensor_bytes " + std::to_string(inline_bytes));
    const EncodedMessage m = encode(Envelope{req}, nullptr, inline_bytes);
    for (const Tensor& t : m.tensors) {
      EXPECT_FALSE(t.requires_grad());
      EXPECT_EQ(t.grad_fn(), nullptr);  // the packing of y was not recorded
    }
    if (inline_bytes == 0) {
      const std::vector<IncomingTensor> announced = peek_tensors(m.payload);
      ASSERT_EQ(announced.size(), 4u);
      EXPECT_TRUE(announced[0].requires_grad);
      EXPECT_TRUE(announced[1].requires_grad);
      EXPECT_FALSE(announced[2].requires_grad);
      EXPECT_FALSE(announced[3].requires_grad);
    }
    const Request back = std::get<Request>(transport(m).body);
    const Tensor bx = back.args[0].as_tensor();
    const Tensor by = back.args[1].as_tensor();
    EXPECT_TRUE(bx.requires_grad());
    EXPECT_TRUE(bx.is_leaf());
    EXPECT_TRUE(by.requires_grad());
    EXPECT_TRUE(by.is_leaf());  // a leaf, although the sender's was a view of x
    EXPECT_EQ(by.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
    EXPECT_FALSE(back.args[2].as_tensor().requires_grad());
    EXPECT_FALSE(back.args[3].as_tensor().requires_grad());
    // Gradients accumulate on the received leaf; the sender's tensor is untouched.
    sum(mul(by, Scalar(3.0))).backward();
    EXPECT_EQ(by.grad().to_vector<float>(), (std::vector<float>(6, 3.0f)));
    EXPECT_FALSE(x.grad().defined());
  }
  // The reply direction carries it the same way.
  Response resp;
  resp.result = Value(x);
  const Response resp_back = std::get<Response>(transport(encode(Envelope{resp})).body);
  EXPECT_TRUE(std::get<Value>(resp_back.result).as_tensor().requires_grad());
}

// Without gradwire::autograd in the receiving process the flag still arrives (peek_tensors
// reports it) but decode drops it: nothing there could record.
TEST(EnvelopeTest, WithoutAutogradTheRequiresGradFlagIsDropped) {
  ASSERT_TRUE(autograd::ensure_registered());
  Tensor small = arange(Scalar(4), kFloat32);  // 16 bytes: inline
  Tensor large = arange(Scalar(8), kFloat32);  // 32 bytes: beside the payload
  small.set_requires_grad(true);
  large.set_requires_grad(true);
  Request req;
  req.function = "f";
  req.args = {Value(small), Value(large)};
  const EncodedMessage m = encode(Envelope{req}, nullptr, /*inline_tensor_bytes=*/16);
  ASSERT_EQ(m.tensors.size(), 1u);
  Request back;
  {
    WithoutAutograd no_autograd;
    ASSERT_EQ(autograd_hooks(), nullptr);
    const std::vector<IncomingTensor> announced = peek_tensors(m.payload);
    ASSERT_EQ(announced.size(), 1u);
    EXPECT_TRUE(announced[0].requires_grad);
    back = std::get<Request>(transport(m).body);
  }
  // Asked with autograd back in place, so that the answer is the tensors' own state.
  ASSERT_NE(autograd_hooks(), nullptr);
  ASSERT_EQ(back.args.size(), 2u);
  EXPECT_FALSE(back.args[0].as_tensor().requires_grad());
  EXPECT_FALSE(back.args[1].as_tensor().requires_grad());
  EXPECT_TRUE(equal(back.args[0].as_tensor(), arange(Scalar(4), kFloat32)));
  EXPECT_TRUE(equal(back.args[1].as_tensor(), arange(Scalar(8), kFloat32)));
}

// Only floating-point tensors can require grad: the flag on another dtype is malformed,
// refused before anything is allocated (peek_tensors already).
TEST(EnvelopeTest, RequiresGradOnANonFloatingDtypeIsMalformed) {
  Request req;
  req.function = "f";
  req.args = {Value(zeros({3}, kInt64))};
  std::string forged = encode(Envelope{req}, nullptr, 0).payload;
  // The description comes last: field 4, length 5, dtype 5 (int64), packed sizes [3]. Add
  // field 8 (requires_grad) = 1.
  ASSERT_EQ(forged.substr(forged.size() - 7), std::string("\x22\x05\x08\x05\x12\x01\x03", 7));
  forged[forged.size() - 6] = '\x07';
  forged += std::string("\x40\x01", 2);
  EXPECT_NE(malformed([&] { peek_tensors(forged); }).find("tensor 0 of dtype int64 requires grad"),
            std::string::npos);
  EXPECT_NE(malformed([&] { decode(forged, {zeros({3}, kInt64)}); }).find("requires grad"),
            std::string::npos);
}

// An empty tensor's other sizes still count: [0, 2^40, 2^40] holds no element, but its
// contiguous strides would overflow int64 (fuzz/regressions/fuzz_envelope keeps such an
// input). Refused before anything is allocated.
TEST(EnvelopeTest, AnEmptyTensorWithHugeOtherSizesIsMalformed) {
  Request req;
  req.function = "f";
  req.args = {Value(zeros({1, 3}, kInt64))};
  std::string forged = encode(Envelope{req}, nullptr, 0).payload;
  // The description comes last: field 4, length 6, dtype 5 (int64), packed sizes [1, 3].
  const std::string tail("\x22\x06\x08\x05\x12\x02\x01\x03", 8);
  ASSERT_EQ(forged.substr(forged.size() - 8), tail);
  forged.resize(forged.size() - 8);
  const std::string two_pow_40("\x80\x80\x80\x80\x80\x20", 6);
  forged += std::string("\x22\x11\x08\x05\x12\x0d\x00", 7) + two_pow_40 + two_pow_40;
  EXPECT_NE(malformed([&] { peek_tensors(forged); }).find("tensor 0 is too large"),
            std::string::npos);
}

// The tensors a message announces are bounded together by max_tensor_bytes before the
// receiver allocates anything, by peek_tensors itself rather than later by the agent
// (fuzz/regressions/fuzz_envelope keeps an announcement of 560 GB).
TEST(EnvelopeTest, TensorsAnnouncedTogetherAreBoundedByMaxTensorBytes) {
  Request req;
  req.function = "f";
  req.args = {Value(zeros({1000}, kFloat32)), Value(zeros({1000}, kFloat32))};
  const std::string payload = encode(Envelope{req}, nullptr, 0).payload;
  EnvelopeLimits limits;
  limits.max_tensor_bytes = 8000;
  EXPECT_EQ(peek_tensors(payload, limits).size(), 2u);  // exactly at the limit
  limits.max_tensor_bytes = 7999;
  EXPECT_NE(malformed([&] { peek_tensors(payload, limits); }).find("max_tensor_bytes"),
            std::string::npos);
}

// A broadcast view travels as its compact data with the shape it expands to, and decodes
// as the whole contiguous tensor; an ordinary view travels whole.
TEST(EnvelopeTest, BroadcastTensorsTravelCompactAndDecodeWhole) {
  Request req;
  req.function = "f";
  Tensor scalar_wide = full({}, Scalar(1.5), kFloat64).expand({64, 32});
  Tensor column = tensor<float>({1, 2, 3}, {3, 1}).expand({3, 5});
  Tensor middle = tensor<int64_t>({4, 5}, {2, 1, 1}).expand({2, 3, 1});
  req.args = {Value(scalar_wide), Value(column), Value(middle)};
  EncodedMessage m = encode(Envelope{req}, nullptr, /*inline_tensor_bytes=*/0);
  ASSERT_EQ(m.tensors.size(), 3u);
  EXPECT_EQ(m.tensors[0].sizes(), (Shape{1, 1}));
  EXPECT_EQ(m.tensors[1].sizes(), (Shape{3, 1}));
  EXPECT_EQ(m.tensors[2].sizes(), (Shape{2, 1, 1}));
  const std::vector<IncomingTensor> announced = peek_tensors(m.payload);
  EXPECT_EQ(announced[0].expand_to, (Shape{64, 32}));
  EXPECT_EQ(announced[0].nbytes(), 8u);
  EXPECT_EQ(announced[0].logical_nbytes(), 64u * 32 * 8);
  for (const EncodedMessage& sent : {m, encode(Envelope{req})}) {  // out of line, inline
    const Request back = std::get<Request>(transport(sent).body);
    for (size_t i = 0; i < 3; ++i) {
      const Tensor& t = back.args[i].as_tensor();
      EXPECT_TRUE(t.is_contiguous()) << i;
      EXPECT_TRUE(equal(t, req.args[i].as_tensor())) << i;
    }
  }
  // Not a broadcast: a transposed view travels whole, with no expansion.
  req.args = {Value(arange(Scalar(6), kFloat32).view({2, 3}).t())};
  EncodedMessage plain = encode(Envelope{req}, nullptr, 0);
  EXPECT_EQ(plain.tensors[0].sizes(), (Shape{3, 2}));
  EXPECT_TRUE(peek_tensors(plain.payload)[0].expand_to.empty());
}

// Protobuf varint of a (two's complement) int64.
std::string varint(int64_t value) {
  auto v = static_cast<uint64_t>(value);
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}

// A request with one int64 tensor of `sizes` whose description is given expand_to (field
// 9, packed) as a forger would.
std::string forged_expand(const Shape& sizes, const std::vector<int64_t>& expand_to) {
  Request req;
  req.function = "f";
  req.args = {Value(zeros(sizes, kInt64))};
  std::string payload = encode(Envelope{req}, nullptr, 0).payload;
  std::string packed_sizes;
  for (int64_t s : sizes)
    packed_sizes += varint(s);
  const std::string desc =
      std::string("\x08\x05\x12", 3) + varint(packed_sizes.size()) + packed_sizes;
  const std::string tail = "\x22" + varint(desc.size()) + desc;
  EXPECT_EQ(payload.substr(payload.size() - tail.size()), tail);
  payload.resize(payload.size() - tail.size());
  std::string packed;
  for (int64_t s : expand_to)
    packed += varint(s);
  const std::string forged = desc + "\x4a" + varint(packed.size()) + packed;
  return payload + "\x22" + varint(forged.size()) + forged;
}

// A forged expansion is refused before anything is allocated: a different number of dims,
// a dimension neither 1 nor the target, a negative target, one past the size any tensor
// may have, and expansions that together pass max_tensor_bytes.
TEST(EnvelopeTest, ForgedBroadcastExpansionsAreMalformed) {
  EXPECT_EQ(peek_tensors(forged_expand({1, 3}, {4, 3}))[0].expand_to, (Shape{4, 3}));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {forged_expand({1, 3}, {4}), "is expanded to 1 dims from 2"},
      {forged_expand({2, 3}, {4, 3}), "of size 2 in dim 0 cannot be expanded to 4"},
      {forged_expand({1, 3}, {-4, 3}), "is expanded to a negative size -4"},
      {forged_expand({1, 1}, {int64_t{1} << 40, int64_t{1} << 40}), "is expanded too far"},
      {forged_expand({1}, {int64_t{1} << 31}), "max_tensor_bytes"}};
  for (const auto& [payload, why] : cases) {
    const std::string text = malformed([&] { peek_tensors(payload); });
    EXPECT_NE(text.find(why), std::string::npos) << text;
    EXPECT_NE(malformed([&] { decode(payload, {}); }).find("malformed"), std::string::npos);
  }
}

// Extensions: at most max_extensions entries, keys of at most max_extension_key_bytes, and
// max_extension_bytes of values in all; each bound holds exactly at its limit.
TEST(EnvelopeTest, ExtensionsAreBoundedInNumberKeyLengthAndValueBytes) {
  const EnvelopeLimits defaults;
  EXPECT_EQ(defaults.max_extensions, 16u);
  EXPECT_EQ(defaults.max_extension_key_bytes, 64u);
  EXPECT_EQ(defaults.max_extension_bytes, 64u * 1024);
  Request req;
  req.function = "f";
  for (int i = 0; i < 16; ++i)
    req.extensions["module." + std::to_string(i)] = Bytes{static_cast<uint8_t>(i)};
  EXPECT_EQ(std::get<Request>(transport(encode(Envelope{req})).body).extensions, req.extensions);
  req.extensions["module.16"] = Bytes{16};
  EXPECT_NE(malformed([&] { transport(encode(Envelope{req})); }).find("more than 16 extensions"),
            std::string::npos);

  req.extensions = {{std::string(64, 'k'), {1}}};
  EXPECT_EQ(std::get<Request>(transport(encode(Envelope{req})).body).extensions, req.extensions);
  req.extensions = {{std::string(65, 'k'), {1}}};
  EXPECT_NE(malformed([&] {
              transport(encode(Envelope{req}));
            }).find("an extension key of 65 bytes exceeds the limit of 64"),
            std::string::npos);

  req.extensions = {{"a", Bytes(40 * 1024, 7)}, {"b", Bytes(24 * 1024, 9)}};  // 64 KiB exactly
  EXPECT_EQ(std::get<Request>(transport(encode(Envelope{req})).body).extensions, req.extensions);
  req.extensions["c"] = Bytes{1};
  EXPECT_NE(malformed([&] {
              transport(encode(Envelope{req}));
            }).find("extension values of more than 65536 bytes"),
            std::string::npos);

  // A response is held to the same limits, which the receiver chooses.
  Response resp;
  resp.result = Value();
  resp.extensions = {{"x", {1, 2}}, {"y", {3}}};
  EnvelopeLimits tight;
  tight.max_extensions = 1;
  EXPECT_NE(
      malformed([&] { transport(encode(Envelope{resp}), tight); }).find("more than 1 extensions"),
      std::string::npos);
  tight = {};
  tight.max_extension_bytes = 2;
  EXPECT_NE(malformed([&] {
              transport(encode(Envelope{resp}), tight);
            }).find("extension values of more than 2 bytes"),
            std::string::npos);
  tight.max_extension_bytes = 3;
  EXPECT_EQ(std::get<Response>(transport(encode(Envelope{resp}), tight).body).extensions,
            resp.extensions);
}

// Keys are unique within a message: a forged repeat is malformed, not silently merged.
TEST(EnvelopeTest, ARepeatedExtensionKeyIsMalformed) {
  Request req;
  req.function = "f";
  req.extensions = {{"k", {1}}};
  std::string forged = encode(Envelope{req}).payload;
  // version (08 02), then the request (12, one length byte) whose last field is the
  // extension: field 9, length 6, key "k", value {1}. Repeat it.
  const std::string extension("\x4a\x06\x0a\x01k\x12\x01\x01", 8);
  ASSERT_EQ(forged.substr(0, 3), std::string("\x08\x02\x12", 3));
  ASSERT_EQ(forged.substr(forged.size() - 8), extension);
  ASSERT_LT(static_cast<uint8_t>(forged[3]), 100);
  forged[3] = static_cast<char>(forged[3] + 8);
  forged += extension;
  EXPECT_NE(
      malformed([&] { decode(forged, {}); }).find("extension 1 repeats the key of an earlier one"),
      std::string::npos);
}

// A lender takes the tensors it wants (never inline ones); they are announced with their
// loan and do not travel beside the payload; a Release round-trips its loans.
TEST(EnvelopeTest, LentTensorsAreAnnouncedWithTheirLoanAndReleasesRoundTrip) {
  Request req;
  req.id = 1;
  req.function = "f";
  const Tensor big = arange(Scalar(10000), kFloat32);  // 40 KB: lent
  const Tensor other = arange(Scalar(9000), kInt64);   // 72 KB: refused by the lender
  const Tensor tiny = arange(Scalar(4), kFloat32);     // inline, never offered
  req.args = {Value(big), Value(other), Value(tiny)};
  std::vector<int64_t> offered;
  EncodedMessage m = encode(Envelope{req}, nullptr, kDefaultInlineTensorBytes,
                            [&](const Tensor& t) -> std::optional<Loan> {
                              offered.push_back(t.numel());
                              if (t.dtype() == kFloat32) return Loan{7, 0xabcdef};
                              return std::nullopt;
                            });
  EXPECT_EQ(offered, (std::vector<int64_t>{10000, 9000}));
  ASSERT_EQ(m.tensors.size(), 1u);  // only `other` travels beside the payload
  EXPECT_EQ(m.tensors[0].numel(), 9000);
  const std::vector<IncomingTensor> announced = peek_tensors(m.payload);
  ASSERT_EQ(announced.size(), 2u);
  ASSERT_TRUE(announced[0].loan.has_value());
  EXPECT_EQ(*announced[0].loan, (Loan{7, 0xabcdef}));
  EXPECT_EQ(announced[0].nbytes(), 40000u);
  EXPECT_FALSE(announced[1].loan.has_value());
  // The receiver supplies the lent tensor's bytes itself; decode takes both in order.
  const Request back = std::get<Request>(decode(m.payload, {big.clone(), other.clone()}).body);
  EXPECT_TRUE(equal(back.args[0].as_tensor(), big));
  EXPECT_TRUE(equal(back.args[1].as_tensor(), other));
  EXPECT_TRUE(equal(back.args[2].as_tensor(), tiny));

  const Release release{{Loan{1, 2}, Loan{4095, ~uint64_t{0}}}};
  EncodedMessage r = encode(Envelope{release});
  EXPECT_TRUE(r.tensors.empty());
  EXPECT_FALSE(peek_header(r.payload).has_value());
  const Release got = std::get<Release>(decode(r.payload, {}).body);
  EXPECT_EQ(got.loans, release.loans);
  // A release may not announce tensors, nor more loans than the limit.
  EnvelopeLimits tight;
  tight.max_tensors = 1;
  EXPECT_NE(malformed([&] { decode(r.payload, {}, tight); }).find("a release of more than 1 loans"),
            std::string::npos);
}

// The null token is never issued: a loan carrying it is refused before anything is read.
TEST(EnvelopeTest, ALoanWithTheNullTokenIsMalformed) {
  Request req;
  req.function = "f";
  req.args = {Value(arange(Scalar(10000), kFloat32))};
  EncodedMessage m = encode(Envelope{req}, nullptr, kDefaultInlineTensorBytes, [](const Tensor&) {
    return Loan{0, 0};
  });
  EXPECT_NE(malformed([&] { peek_tensors(m.payload); }).find("lent with the null token"),
            std::string::npos);
}

TEST(EnvelopeTest, LimitsAreEnforcedBeforeBuilding) {
  Value deep = Value();
  for (int i = 0; i < 10; ++i)
    deep = Value::list({deep});
  Request req;
  req.args = {deep};
  EnvelopeLimits tight;
  tight.max_depth = 5;
  EXPECT_NE(malformed([&] { transport(encode(Envelope{req}), tight); }).find("nest deeper than 5"),
            std::string::npos);

  Value::List many(100, Value(int64_t{1}));
  req.args = {Value::list(many)};
  tight = {};
  tight.max_values = 50;
  EXPECT_NE(malformed([&] { transport(encode(Envelope{req}), tight); }).find("more than 50 values"),
            std::string::npos);

  req.args = {Value(zeros({2})), Value(zeros({3}))};
  tight = {};
  tight.max_tensors = 1;
  EXPECT_NE(malformed([&] {
              transport(encode(Envelope{req}), tight);
            }).find("more than 1 tensors (max_tensors)"),
            std::string::npos);

  tight = {};
  tight.max_payload_bytes = 8;
  req.function = std::string(64, 'f');
  EXPECT_NE(malformed([&] { transport(encode(Envelope{req}), tight); }).find("exceeds the limit"),
            std::string::npos);
}

TEST(EnvelopeTest, MismatchedTensorsAndIndicesAreRejected) {
  Request req;
  req.args = {Value(zeros({2, 2}))};
  EncodedMessage m = encode(Envelope{req}, nullptr, 0);
  EXPECT_NE(malformed([&] { decode(m.payload, {}); }).find("1 tensors announced, 0 received"),
            std::string::npos);
  EXPECT_NE(malformed([&] { decode(m.payload, {zeros({4})}); }).find("does not match"),
            std::string::npos);
  EXPECT_NE(malformed([&] {
              decode(m.payload, {zeros({2, 2}, kInt32)});
            }).find("does not match"),
            std::string::npos);
  // A payload whose values name a tensor it does not announce: the descriptions come
  // last in the encoding, so dropping the last one (field 4: 0x22, length 3, then the
  // packed sizes [3]: 0x12 0x01 0x03) leaves tensor index 1 without a tensor.
  Request two;
  two.args = {Value(zeros({2})), Value(zeros({3}))};
  std::string forged = encode(Envelope{two}, nullptr, 0).payload;
  ASSERT_EQ(forged.substr(forged.size() - 5), std::string("\x22\x03\x12\x01\x03"));
  forged.resize(forged.size() - 5);
  EXPECT_NE(malformed([&] {
              decode(forged, {zeros({2})});
            }).find("tensor index 1 is out of range (the message has 1 tensors)"),
            std::string::npos);
}

// Protobuf's own bytes for `payload`: parsed by the generated code and serialized again
// (fields in number order, defaults left out, repeated numbers packed).
std::string reserialized(const std::string& payload) {
  wire::Envelope env;
  EXPECT_TRUE(env.ParseFromString(payload));
  return env.SerializeAsString();
}

// A value of every kind, nested up to `depth`, from `rng`.
Value random_value(std::mt19937& rng, int depth) {
  const int kinds = depth > 0 ? 10 : 8;
  switch (rng() % kinds) {
    case 0:
      return Value();
    case 1:
      return Value(rng() % 2 == 0);
    case 2: {
      // The varint lengths' edges, the extremes, and anything (C++20 converts modulo 2^64).
      const int64_t edges[] = {0, 1, -1, 63, 64, -64, -65, 1 << 20, INT64_MIN, INT64_MAX};
      if (rng() % 3 == 0) return Value(static_cast<int64_t>(uint64_t{rng()} << 32 | rng()));
      return Value(edges[rng() % 10]);
    }
    case 3: {
      const double doubles[] = {0.0, -0.0, 2.5, -1e300, std::numeric_limits<double>::quiet_NaN()};
      return Value(doubles[rng() % 5]);
    }
    case 4:
      return Value(std::string(rng() % 3 == 0 ? 0 : rng() % 200, 'x'));
    case 5:
      return Value(Bytes(rng() % 3 == 0 ? 0 : rng() % 40, 7));
    case 6: {
      const int64_t n = static_cast<int64_t>(rng() % 5);
      Tensor t = arange(Scalar(n * 3), kFloat32).view({n, 3});
      if (rng() % 4 == 0) t = t.t();  // strided: packed before it travels
      if (rng() % 4 == 0) t = full({1}, Scalar(2.0), kFloat64).expand({4, 5});  // broadcast
      if (rng() % 5 == 0) t = arange(Scalar(5000), kInt64);  // beside the payload
      return Value(t);
    }
    case 7: {
      const int32_t owners[] = {-1, 0, 3};
      return Value(RRefDescriptor{owners[rng() % 3], rng() % 2 == 0 ? 0 : uint64_t{1} << 50,
                                  rng() % 9, rng() % 2 == 0 ? "" : "PS"});
    }
    case 8: {
      Value::List items;
      for (size_t i = rng() % 4; i > 0; --i)
        items.push_back(random_value(rng, depth - 1));
      return Value::list(std::move(items));
    }
    default: {
      Value::Map entries;
      for (size_t i = rng() % 4; i > 0; --i)
        entries.emplace_back(Value(static_cast<int64_t>(i)), random_value(rng, depth - 1));
      return Value::map(std::move(entries));
    }
  }
}

// Whether `got` is what `sent` decodes as: tensors by dtype, shape and elements, doubles
// bit for bit (NaN included), everything else as Value compares it.
bool same_value(const Value& sent, const Value& got) {
  if (sent.type() != got.type()) return false;
  switch (sent.type()) {
    case ValueType::kTensor: {
      const Tensor& a = sent.as_tensor();
      const Tensor& b = got.as_tensor();
      return a.dtype() == b.dtype() && a.sizes() == b.sizes() && equal(a, b);
    }
    case ValueType::kDouble: {
      const double a = sent.as_double();
      const double b = got.as_double();
      return std::memcmp(&a, &b, sizeof(a)) == 0;
    }
    case ValueType::kList: {
      const Value::List& a = sent.as_list();
      const Value::List& b = got.as_list();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!same_value(a[i], b[i])) return false;
      return true;
    }
    case ValueType::kMap: {
      const Value::Map& a = sent.as_map();
      const Value::Map& b = got.as_map();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!same_value(a[i].first, b[i].first) || !same_value(a[i].second, b[i].second))
          return false;
      return true;
    }
    default:
      return sent == got;
  }
}

TEST(EnvelopeTest, EncodingIsProtobufsOwnBytes) {
  std::mt19937 rng(20261128);
  int lent = 0;
  const Lender lender = [&](const Tensor& t) -> std::optional<Loan> {
    if (t.nbytes() % 2 == 0 && ++lent % 2 == 0) return Loan{static_cast<uint32_t>(lent), 0xabcd};
    return std::nullopt;
  };
  const DeviceMapper to_cuda = [](const Device&) { return Device::cuda(2); };
  for (int i = 0; i < 400; ++i) {
    Request req;
    req.id = i % 3 == 0 ? 0 : uint64_t{1} << (i % 64);
    req.handler = static_cast<uint32_t>(i % 5);
    req.function = i % 4 == 0 ? "" : "f" + std::to_string(i);
    for (size_t a = rng() % 5; a > 0; --a)
      req.args.push_back(random_value(rng, 3));
    req.autograd_context_id = i % 2 == 0 ? 0 : 77;
    req.autograd_message_id = i % 3 == 0 ? 0 : 78;
    req.timeout = std::chrono::milliseconds(i % 4 == 0 ? -5 : i * 10);
    req.payload = Bytes(static_cast<size_t>(i % 7), 1);
    if (i % 2 == 0) req.extensions = {{"", {}}, {"b", {1}}, {"a", {}}};
    for (const size_t inline_bytes : {size_t{0}, size_t{16} << 10}) {
      const EncodedMessage m =
          encode(Envelope{req}, i % 9 == 0 ? to_cuda : nullptr, inline_bytes, lender);
      ASSERT_EQ(m.payload, reserialized(m.payload)) << "request " << i;
      // And it says what was sent (no loans, no devices, so that it can travel here).
      const Request back =
          std::get<Request>(transport(encode(Envelope{req}, nullptr, inline_bytes)).body);
      EXPECT_EQ(back.id, req.id);
      EXPECT_EQ(back.handler, req.handler);
      EXPECT_EQ(back.function, req.function);
      EXPECT_EQ(back.autograd_context_id, req.autograd_context_id);
      EXPECT_EQ(back.autograd_message_id, req.autograd_message_id);
      EXPECT_EQ(back.timeout, std::max(req.timeout, std::chrono::milliseconds(0)));
      EXPECT_EQ(back.payload, req.payload);
      EXPECT_EQ(back.extensions, req.extensions);
      ASSERT_EQ(back.args.size(), req.args.size());
      for (size_t a = 0; a < req.args.size(); ++a)
        EXPECT_TRUE(same_value(req.args[a], back.args[a])) << "request " << i << ", argument " << a;
    }
    Response resp;
    resp.id = req.id;
    resp.autograd_context_id = req.autograd_context_id;
    resp.autograd_message_id = req.autograd_message_id;
    resp.extensions = req.extensions;
    if (i % 3 == 0) {
      resp.result = ErrorReply{static_cast<ErrorKind>(i % 7), i % 2 == 0 ? "" : "went wrong",
                               i % 4 == 0 ? "" : "w1", i % 5 == 0};
    } else {
      resp.result = random_value(rng, 4);
    }
    const EncodedMessage r = encode(Envelope{resp}, nullptr, kDefaultInlineTensorBytes, lender);
    ASSERT_EQ(r.payload, reserialized(r.payload)) << "response " << i;
    const Response got = std::get<Response>(transport(encode(Envelope{resp})).body);
    EXPECT_EQ(got.id, resp.id);
    EXPECT_EQ(got.autograd_context_id, resp.autograd_context_id);
    EXPECT_EQ(got.autograd_message_id, resp.autograd_message_id);
    EXPECT_EQ(got.extensions, resp.extensions);
    if (const auto* err = std::get_if<ErrorReply>(&resp.result)) {
      const ErrorReply& e = std::get<ErrorReply>(got.result);
      EXPECT_EQ(e.kind, err->kind);
      EXPECT_EQ(e.message, err->message);
      EXPECT_EQ(e.worker, err->worker);
      EXPECT_EQ(e.rejected, err->rejected);
    } else {
      EXPECT_TRUE(same_value(std::get<Value>(resp.result), std::get<Value>(got.result)))
          << "response " << i;
    }
  }
  Release release;
  release.loans = {{0, 0}, {3, 1}, {4294967295u, ~uint64_t{0}}};
  const EncodedMessage m = encode(Envelope{release});
  EXPECT_EQ(m.payload, reserialized(m.payload));
  EXPECT_EQ(std::get<Release>(transport(m).body).loans, release.loans);
  // Large enough to outgrow the encoder's first block several times.
  Request big;
  big.function = "big";
  big.args = {Value(std::string(100000, 'y')), Value(arange(Scalar(4000), kFloat32))};
  const EncodedMessage b = encode(Envelope{big});
  EXPECT_EQ(b.payload, reserialized(b.payload));
  const Request back = std::get<Request>(transport(b).body);
  EXPECT_EQ(back.args[0].as_string(), std::string(100000, 'y'));
  EXPECT_TRUE(equal(back.args[1].as_tensor(), arange(Scalar(4000), kFloat32)));
}

TEST(EnvelopeTest, GarbageNeverCrashes) {
  Request req;
  req.function = "f";
  Tensor grad = arange(Scalar(3), kFloat64);
  grad.set_requires_grad(true);
  req.args = {Value(arange(Scalar(4), kFloat32)), Value::list({Value("x"), Value(int64_t{3})}),
              Value::map({{Value("a"), Value(1.0)}}), Value(grad)};
  req.extensions = {{"rref.fork", {1, 2}}, {"dist_autograd.ctx", {3}}};
  const EncodedMessage m = encode(Envelope{req});
  std::mt19937 rng(1234);
  int rejected = 0;
  auto attempt = [&](const std::string& payload) {
    try {
      std::vector<Tensor> bufs;
      for (const IncomingTensor& t : peek_tensors(payload))
        bufs.push_back(zeros(t.sizes, t.dtype));
      decode(payload, bufs);
    } catch (const InvalidArgument&) {
      ++rejected;
    }
  };
  // Truncations of a valid payload.
  for (size_t n = 0; n < m.payload.size(); ++n)
    attempt(m.payload.substr(0, n));
  // Random bit flips.
  for (int i = 0; i < 3000; ++i) {
    std::string p = m.payload;
    const size_t at = rng() % p.size();
    p[at] = static_cast<char>(p[at] ^ (1 << (rng() % 8)));
    attempt(p);
  }
  // Pure noise.
  for (int i = 0; i < 3000; ++i) {
    std::string p(rng() % 64, '\0');
    for (char& c : p)
      c = static_cast<char>(rng());
    attempt(p);
  }
  EXPECT_GT(rejected, 3000);
  // An unknown version is named.
  std::string versioned = m.payload;
  ASSERT_EQ(versioned[0], '\x08');  // field 1, varint: the version comes first
  versioned[1] = '\x09';
  EXPECT_NE(malformed([&] { decode(versioned, {}); }).find("version 9"), std::string::npos);
  // So is version 1's format: this worker speaks version 2 only.
  versioned[1] = '\x01';
  EXPECT_NE(
      malformed([&] { decode(versioned, {}); }).find("version 1, this worker speaks version 2"),
      std::string::npos);
  EXPECT_EQ(kEnvelopeVersion, 2u);
}

}  // namespace
}  // namespace gradwire::rpc
