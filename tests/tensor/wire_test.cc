// Wire metadata (wire.h): round trips for every dtype and many geometries, the exact bytes
// of a few metas worked out by hand, every kind of malformed input, and a seeded fuzz run
// in which no byte string may crash the decoder or make it throw anything other than
// InvalidArgument.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/wire.h"

namespace gradwire {
namespace {

const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt32,   kInt64,   kUInt8,   kBool};

// A raw encoder, independent of the library's, for building malformed buffers.
void raw_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
uint64_t zz(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ (v < 0 ? ~uint64_t{0} : 0);
}

struct RawMeta {
  uint64_t version = 1, dtype = 0, device_type = 0, device_index = 0;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  uint64_t ndim_override = UINT64_MAX;  // when set, written instead of sizes.size()

  std::string bytes() const {
    std::string out;
    raw_varint(out, version);
    raw_varint(out, dtype);
    raw_varint(out, device_type);
    raw_varint(out, device_index);
    raw_varint(out, ndim_override != UINT64_MAX ? ndim_override : sizes.size());
    for (int64_t s : sizes)
      raw_varint(out, zz(s));
    for (int64_t s : strides)
      raw_varint(out, zz(s));
    raw_varint(out, zz(offset));
    return out;
  }
};

TensorMeta decode_all(const std::string& buf, int64_t max_bytes = kDefaultMaxWireBytes) {
  return decode_tensor_meta(buf.data(), buf.size(), nullptr, max_bytes);
}

void expect_decode_error(const std::string& buf, const std::string& needle,
                         int64_t max_bytes = kDefaultMaxWireBytes) {
  try {
    decode_all(buf, max_bytes);
    ADD_FAILURE() << "decode accepted a buffer that should fail with '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TensorMeta make_meta(DType dtype, Shape sizes, Shape strides, int64_t offset,
                     Device device = Device::cpu()) {
  TensorMeta m;
  m.dtype = dtype;
  m.sizes = std::move(sizes);
  m.strides = std::move(strides);
  m.storage_offset = offset;
  m.device = device;
  return m;
}

std::vector<TensorMeta> geometries(DType dtype) {
  return {
      make_meta(dtype, {}, {}, 0),
      make_meta(dtype, {0}, {1}, 0),
      make_meta(dtype, {5}, {1}, 0),
      make_meta(dtype, {3, 4}, {4, 1}, 0),
      make_meta(dtype, {4, 3}, {1, 4}, 0),  // transposed
      make_meta(dtype, {3, 4}, {0, 1}, 2),  // expanded with an offset
      make_meta(dtype, {2, 3, 4, 5, 6}, {360, 120, 30, 6, 1}, 7),
      make_meta(dtype, {4}, {-2}, 6),  // reversed with a stride of 2
      make_meta(dtype, {300, 2}, {-300, 70000}, 300 * 299),
      make_meta(dtype, {2, 2}, {2, 1}, 0, Device::cuda(3)),
      make_meta(dtype, {0, 7}, {-5, 123456789}, 99),  // no elements: any strides
  };
}

TEST(WireTest, RoundTripsEveryDTypeAndGeometry) {
  for (DType dtype : kAllDTypes) {
    for (const TensorMeta& meta : geometries(dtype)) {
      std::string buf;
      encode_tensor_meta(meta, buf);
      size_t used = 0;
      const TensorMeta back = decode_tensor_meta(buf.data(), buf.size(), &used);
      EXPECT_EQ(back, meta) << dtype << " " << shape_to_string(meta.sizes);
      EXPECT_EQ(used, buf.size());
      EXPECT_EQ(decode_all(buf), meta);
    }
  }
}

TEST(WireTest, MetaOfRealTensors) {
  const Tensor base = zeros({4, 6}, kFloat64);
  const Tensor view = base.transpose(0, 1).slice(1, 1, 4);  // [6, 3] strides [1, 6] offset 6
  const TensorMeta m = TensorMeta::of(view);
  EXPECT_EQ(m.dtype, kFloat64);
  EXPECT_EQ(m.sizes, (Shape{6, 3}));
  EXPECT_EQ(m.strides, (Shape{1, 6}));
  EXPECT_EQ(m.storage_offset, 6);
  EXPECT_EQ(m.device, Device::cpu());
  EXPECT_EQ(m.numel(), 18);
  // Highest element: 6 + 5*1 + 2*6 = 23, so 24 float64 = 192 bytes.
  EXPECT_EQ(m.span_bytes(), 192);
  std::string buf;
  encode_tensor_meta(m, buf);
  EXPECT_EQ(decode_all(buf), m);
  EXPECT_THROW(TensorMeta::of(Tensor()), InvalidArgument);
}

TEST(WireTest, ExactBytesWorkedOutByHand) {
  std::string buf;
  encode_tensor_meta(make_meta(kFloat32, {2, 3}, {3, 1}, 0), buf);
  // version 1, dtype 0, cpu, index 0, ndim 2, sizes zz(2)=4 zz(3)=6, strides 6 2, offset 0.
  EXPECT_EQ(buf, std::string("\x01\x00\x00\x00\x02\x04\x06\x06\x02\x00", 10));

  buf.clear();
  encode_tensor_meta(make_meta(kInt64, {300}, {-1}, 299, Device::cuda(2)), buf);
  // zz(300) = 600 = 0x258 -> D8 04; zz(-1) = 1; zz(299) = 598 = 0x256 -> D6 04.
  EXPECT_EQ(buf, std::string("\x01\x05\x01\x02\x01\xD8\x04\x01\xD6\x04", 10));
}

TEST(WireTest, SpanAndNumel) {
  EXPECT_EQ(make_meta(kFloat32, {}, {}, 0).numel(), 1);
  EXPECT_EQ(make_meta(kFloat32, {}, {}, 0).span_bytes(), 4);
  EXPECT_EQ(make_meta(kFloat32, {}, {}, 3).span_bytes(), 16);
  EXPECT_EQ(make_meta(kInt32, {0, 5}, {5, 1}, 100).span_bytes(), 0);
  EXPECT_EQ(make_meta(kFloat16, {3, 4}, {0, 1}, 2).span_bytes(), 2 * (2 + 3 + 1));
  EXPECT_EQ(make_meta(kFloat32, {4}, {-2}, 6).span_bytes(), 4 * 7);
  EXPECT_THROW(make_meta(kFloat32, {4}, {-2}, 5).span_bytes(), InvalidArgument);
  EXPECT_THROW(make_meta(kFloat32, {-1}, {1}, 0).numel(), InvalidArgument);
}

TEST(WireTest, ConcatenatedMetasWithConsumed) {
  std::string buf;
  const TensorMeta a = make_meta(kUInt8, {7}, {1}, 0);
  const TensorMeta b = make_meta(kBFloat16, {2, 2}, {1, 2}, 1);
  encode_tensor_meta(a, buf);
  const size_t first = buf.size();
  encode_tensor_meta(b, buf);
  buf += "payload";
  size_t used = 0;
  EXPECT_EQ(decode_tensor_meta(buf.data(), buf.size(), &used), a);
  EXPECT_EQ(used, first);
  size_t used2 = 0;
  EXPECT_EQ(decode_tensor_meta(buf.data() + used, buf.size() - used, &used2), b);
  EXPECT_EQ(buf.substr(used + used2), "payload");
}

TEST(WireTest, TrailingBytesRejectedWithoutConsumed) {
  std::string buf;
  encode_tensor_meta(make_meta(kFloat32, {2}, {1}, 0), buf);
  buf.push_back('\0');
  expect_decode_error(buf, "trailing");
}

TEST(WireTest, TruncatedAtEveryBytePosition) {
  std::string buf;
  encode_tensor_meta(make_meta(kInt64, {300, 2, 70000}, {-140000, 70000, 1}, 41860000), buf);
  ASSERT_GT(buf.size(), 15u);
  for (size_t cut = 0; cut < buf.size(); ++cut) {
    size_t used = 0;
    EXPECT_THROW(decode_tensor_meta(buf.data(), cut, &used), InvalidArgument) << "cut " << cut;
    EXPECT_THROW(decode_tensor_meta(buf.data(), cut), InvalidArgument) << "cut " << cut;
  }
  EXPECT_NO_THROW(decode_all(buf));
}

TEST(WireTest, EmptyAndNullBuffers) {
  expect_decode_error(std::string(), "ends inside version");
  EXPECT_THROW(decode_tensor_meta(nullptr, 4), InvalidArgument);
}

TEST(WireTest, BadVersion) {
  for (uint64_t v : {0ull, 2ull, 200ull, 1ull << 40}) {
    RawMeta r;
    r.version = v;
    expect_decode_error(r.bytes(), "version");
  }
}

TEST(WireTest, DTypeAndDeviceOutOfRange) {
  RawMeta r;
  r.dtype = 8;
  expect_decode_error(r.bytes(), "dtype code 8");
  r = RawMeta();
  r.dtype = 1ull << 60;
  expect_decode_error(r.bytes(), "dtype");
  r = RawMeta();
  r.device_type = 2;
  expect_decode_error(r.bytes(), "device type 2");
  r = RawMeta();
  r.device_index = 1;  // cpu with index 1
  expect_decode_error(r.bytes(), "cpu");
  r = RawMeta();
  r.device_type = 1;
  r.device_index = 32768;
  expect_decode_error(r.bytes(), "32768");
  r.device_index = 32767;
  EXPECT_EQ(decode_all(r.bytes()).device, Device::cuda(32767));
}

TEST(WireTest, NdimLimit) {
  RawMeta r;
  r.sizes.assign(kMaxWireDims, 1);
  r.strides.assign(kMaxWireDims, 1);
  EXPECT_EQ(decode_all(r.bytes()).sizes.size(), static_cast<size_t>(kMaxWireDims));
  r.sizes.push_back(1);
  r.strides.push_back(1);
  expect_decode_error(r.bytes(), "ndim 65");
  // A huge ndim with nothing behind it must fail on the count, not try to allocate.
  RawMeta huge;
  huge.ndim_override = 1ull << 62;
  expect_decode_error(huge.bytes(), "ndim");
}

TEST(WireTest, NegativeSizesAndOffset) {
  RawMeta r;
  r.sizes = {3, -2};
  r.strides = {1, 1};
  expect_decode_error(r.bytes(), "size[1] is negative");
  r = RawMeta();
  r.sizes = {3};
  r.strides = {1};
  r.offset = -5;
  expect_decode_error(r.bytes(), "negative storage offset");
}

TEST(WireTest, OverflowingNumelAndSpans) {
  RawMeta r;
  r.sizes = {int64_t{1} << 40, int64_t{1} << 40};
  r.strides = {0, 0};
  expect_decode_error(r.bytes(), "overflows");
  r = RawMeta();
  r.sizes = {3};
  r.strides = {std::numeric_limits<int64_t>::max() / 2};
  expect_decode_error(r.bytes(), "overflows");
  r = RawMeta();
  r.sizes = {2};
  r.strides = {std::numeric_limits<int64_t>::max()};
  r.offset = 1;
  expect_decode_error(r.bytes(), "overflows");
  r = RawMeta();
  r.dtype = static_cast<uint64_t>(kFloat64);
  r.sizes = {int64_t{1} << 61};
  r.strides = {0};
  expect_decode_error(r.bytes(), "overflows");  // 2^61 elements of 8 bytes
}

TEST(WireTest, StridesReachingBeforeTheBuffer) {
  RawMeta r;
  r.sizes = {3};
  r.strides = {-1};
  r.offset = 1;
  expect_decode_error(r.bytes(), "before the start");
  r.offset = 2;
  const TensorMeta m = decode_all(r.bytes());
  EXPECT_EQ(m.span_bytes(), 12);
}

TEST(WireTest, ByteLimit) {
  RawMeta r;
  r.sizes = {1 << 20};
  r.strides = {1};
  expect_decode_error(r.bytes(), "over the limit of 1000", 1000);
  EXPECT_NO_THROW(decode_all(r.bytes(), 4 << 20));
  // Few elements spread far apart: the span is what counts.
  r.sizes = {2};
  r.strides = {int64_t{1} << 30};
  expect_decode_error(r.bytes(), "span", int64_t{1} << 20);
  // Many elements over a tiny span (expanded): the element bytes count too.
  r.sizes = {int64_t{1} << 30};
  r.strides = {0};
  expect_decode_error(r.bytes(), "holds", int64_t{1} << 20);
  // Exactly at the limit passes.
  r.sizes = {250};
  r.strides = {1};
  EXPECT_NO_THROW(decode_all(r.bytes(), 1000));
  expect_decode_error(r.bytes(), "limit", 999);
  EXPECT_THROW(decode_all(r.bytes(), -1), InvalidArgument);
}

TEST(WireTest, MalformedVarints) {
  // Eleven continuation bytes: more than 64 bits.
  std::string buf(10, '\xFF');
  buf.push_back('\x01');
  expect_decode_error(buf, "64 bits");
  // Ten bytes whose last carries bits beyond 63.
  buf = std::string(9, '\x80');
  buf.push_back('\x02');
  expect_decode_error(buf, "64 bits");
  // Version 1 written in two bytes.
  expect_decode_error(std::string("\x81\x00", 2), "minimally");
  // A maximal value that fits (2^64 - 1) is read, then refused as a version.
  buf = std::string(9, '\xFF');
  buf.push_back('\x01');
  expect_decode_error(buf, "version");
}

TEST(WireTest, EncodeRefusesInvalidMetas) {
  std::string buf;
  EXPECT_THROW(encode_tensor_meta(make_meta(kFloat32, {2, 3}, {1}, 0), buf), InvalidArgument);
  EXPECT_THROW(encode_tensor_meta(make_meta(kFloat32, {-2}, {1}, 0), buf), InvalidArgument);
  EXPECT_THROW(encode_tensor_meta(make_meta(kFloat32, {2}, {1}, -1), buf), InvalidArgument);
  EXPECT_THROW(encode_tensor_meta(make_meta(kFloat32, Shape(65, 1), Shape(65, 1), 0), buf),
               InvalidArgument);
  TensorMeta bad_cpu = make_meta(kFloat32, {2}, {1}, 0);
  bad_cpu.device.index = 1;
  EXPECT_THROW(encode_tensor_meta(bad_cpu, buf), InvalidArgument);
  EXPECT_TRUE(buf.empty());
}

TEST(WireTest, EmptyForMeta) {
  const TensorMeta m = make_meta(kInt32, {3, 2}, {1, 3}, 2);
  Tensor t = empty_for_meta(m);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.sizes(), m.sizes);
  EXPECT_EQ(t.strides(), m.strides);
  EXPECT_EQ(t.storage_offset(), 2);
  EXPECT_EQ(t.storage().nbytes(), static_cast<size_t>(m.span_bytes()));
  EXPECT_EQ(m.span_bytes(), 4 * (2 + 2 + 3 + 1));
  // The bytes a sender ships (span_bytes from the storage start) fill every element.
  std::vector<int32_t> wire(8);
  for (int i = 0; i < 8; ++i)
    wire[i] = 10 * i;
  std::memcpy(t.storage().data(), wire.data(), 32);
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{20, 50, 30, 60, 40, 70}));

  // A CUDA meta still gives a CPU tensor: the caller moves it.
  const Tensor c = empty_for_meta(make_meta(kFloat16, {2}, {1}, 0, Device::cuda(1)));
  EXPECT_TRUE(c.device().is_cpu());
  EXPECT_EQ(c.dtype(), kFloat16);
  EXPECT_THROW(empty_for_meta(make_meta(kFloat32, {3}, {-1}, 0)), InvalidArgument);
}

// Whatever the bytes, decode either returns a meta that re-encodes to exactly the bytes it
// consumed (the encoding is canonical) or throws InvalidArgument.
void check_fuzz_case(const std::string& buf, int* decoded) {
  size_t used = 0;
  try {
    const TensorMeta m = decode_tensor_meta(buf.data(), buf.size(), &used, int64_t{1} << 32);
    ++*decoded;
    ASSERT_LE(used, buf.size());
    std::string again;
    encode_tensor_meta(m, again);
    EXPECT_EQ(again, buf.substr(0, used));
  } catch (const InvalidArgument&) {
    // expected for most inputs
  } catch (const std::exception& e) {
    ADD_FAILURE() << "decode threw a non-InvalidArgument exception: " << e.what();
  }
}

TEST(WireTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(20240501);
  int decoded = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string buf;
    const int len = static_cast<int>(rng() % 48);
    // Half the cases start like a valid header so that the later fields get exercised.
    if (iter % 2 == 0) {
      buf.push_back('\x01');
      buf.push_back(static_cast<char>(rng() % 9));
      buf.push_back(static_cast<char>(rng() % 3));
      buf.push_back(static_cast<char>(rng() % 2));
      buf.push_back(static_cast<char>(rng() % 6));
    }
    for (int i = 0; i < len; ++i) {
      // Mostly small bytes (short varints), some with the continuation bit.
      buf.push_back(static_cast<char>(rng() % 4 == 0 ? rng() % 256 : rng() % 16));
    }
    check_fuzz_case(buf, &decoded);
  }
  // Mutations of valid encodings: flip, drop or insert one byte.
  for (int iter = 0; iter < 2000; ++iter) {
    const auto metas = geometries(kAllDTypes[rng() % kAllDTypes.size()]);
    std::string buf;
    encode_tensor_meta(metas[rng() % metas.size()], buf);
    const size_t pos = rng() % buf.size();
    switch (rng() % 3) {
      case 0:
        buf[pos] = static_cast<char>(buf[pos] ^ (1 << (rng() % 8)));
        break;
      case 1:
        buf.erase(pos, 1);
        break;
      default:
        buf.insert(pos, 1, static_cast<char>(rng() % 256));
        break;
    }
    check_fuzz_case(buf, &decoded);
  }
  // The generator must have produced both outcomes, or the test checks little.
  EXPECT_GT(decoded, 50);
  EXPECT_LT(decoded, 6000);
}

}  // namespace
}  // namespace gradwire
