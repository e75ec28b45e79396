// The envelope: requests and responses round-trip with their tensors; hostile payloads
// (random bytes, truncations, bad indices, limits exceeded, unknown versions) are
// InvalidArguments, never crashes.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/envelope.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

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

TEST(EnvelopeTest, ResponsesCarryAValueOrATypedError) {
  Response ok{7, Value(full({3}, Scalar(1.5), kFloat64)), {}};
  const Response ok_back = std::get<Response>(transport(encode(Envelope{ok})).body);
  EXPECT_EQ(ok_back.id, 7u);
  EXPECT_TRUE(equal(std::get<Value>(ok_back.result).as_tensor(), full({3}, Scalar(1.5), kFloat64)));

  Response bad{
      8, ErrorReply{ErrorKind::kInvalidArgument, "argument 2 of add: expected Tensor", "ps0"}, {}};
  const Response bad_back = std::get<Response>(transport(encode(Envelope{bad})).body);
  const ErrorReply& err = std::get<ErrorReply>(bad_back.result);
  EXPECT_EQ(err.kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(err.message, "argument 2 of add: expected Tensor");
  EXPECT_EQ(err.worker, "ps0");
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
  EXPECT_NE(malformed([&] { decode(r.payload, {}, tight); }).find("a release of 2 loans"),
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
  EXPECT_NE(malformed([&] { transport(encode(Envelope{req}), tight); }).find("2 tensors exceed"),
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

TEST(EnvelopeTest, GarbageNeverCrashes) {
  Request req;
  req.function = "f";
  req.args = {Value(arange(Scalar(4), kFloat32)), Value::list({Value("x"), Value(int64_t{3})}),
              Value::map({{Value("a"), Value(1.0)}})};
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
  EXPECT_NE(malformed([&] { decode(versioned, {zeros({4})}); }).find("version 9"),
            std::string::npos);
}

}  // namespace
}  // namespace gradwire::rpc
