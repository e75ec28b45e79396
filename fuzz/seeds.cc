// Writes the seed corpora of the fuzz targets: valid messages of every kind each target
// reads, so that fuzzing starts from inputs that get deep into the parsers. Run by
// scripts/fuzz.sh --seeds; its output is committed under fuzz/corpus/.
//   fuzz_seeds <corpus dir>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/wire.h"
#include "tcp_protocol.h"
#include "transport/handshake.h"
#include "transport/ring.h"
#include "wire.h"

using namespace gradwire;
using namespace gradwire::rpc;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::vector<std::string> envelopes() {
  std::vector<std::string> out;
  Request call;
  call.id = 7;
  call.function = "scalars";
  call.args = {Value(int64_t{3}), Value(2.5), Value(true), Value("text")};
  out.push_back(encode(Envelope{call}).payload);
  Request nested;
  nested.id = 8;
  nested.function = "containers";
  nested.args = {Value::list({Value(1.0), Value(2.0)}),
                 Value::map({{Value("a"), Value(int64_t{1})}, {Value("b"), Value(int64_t{2})}})};
  nested.extensions = {{"dist_autograd.ctx", {1, 2, 3, 4}}};
  nested.autograd_context_id = 11;
  nested.autograd_message_id = 12;
  out.push_back(encode(Envelope{nested}).payload);
  Request tensors;
  tensors.id = 9;
  tensors.function = "tensors";
  tensors.args = {Value(arange(Scalar(6), kFloat32).view({2, 3})), Value(),
                  Value::list({Value(ones({2}, kInt64))}), Value(RRefDescriptor{1, 2, 3, "PS"})};
  out.push_back(encode(Envelope{tensors}).payload);
  Response ok;
  ok.id = 7;
  ok.result = Value("done");
  out.push_back(encode(Envelope{ok}).payload);
  Response failed;
  failed.id = 8;
  failed.result = ErrorReply{ErrorKind::kInvalidArgument, "bad argument", "w1", true};
  out.push_back(encode(Envelope{failed}).payload);
  out.push_back(encode(Envelope{Release{{Loan{1, 99}, Loan{2, 100}}}}).payload);
  return out;
}

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string store_frame(c10d::proto::Op op, uint32_t id,
                        const std::function<void(c10d::proto::FrameWriter&)>& body) {
  std::string out;
  c10d::proto::FrameWriter w(out);
  w.begin(static_cast<uint8_t>(op), id);
  body(w);
  w.end();
  return out;
}

std::string tensorpipe_hello() {
  tensorpipe::NopHolder<tensorpipe::Packet> hello;
  hello.getObject() = tensorpipe::SpontaneousConnection{"seed"};
  std::string bytes(hello.getSize(), '\0');
  tensorpipe::NopWriter writer(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
  (void)hello.write(writer);
  return bytes;
}

std::string frame(const std::string& payload) {
  const uint64_t n = payload.size();
  return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + payload;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds <corpus dir>\n");
    return 2;
  }
  const fs::path root = argv[1];
  const std::vector<std::string> env = envelopes();
  for (size_t i = 0; i < env.size(); ++i) {
    write(root / "fuzz_envelope", "envelope" + std::to_string(i), env[i]);
    write(root / "fuzz_value_convert", "envelope" + std::to_string(i),
          std::string(1, '\0') + env[i]);
  }
  // Generator mode (first byte not a multiple of 4): a few argument lists.
  write(root / "fuzz_value_convert", "values0",
        std::string("\x01\x04\x02\x07\x00\x00\x00\x00\x00\x00\x00\x03\x01\x02\x04\x03"
                    "abc",
                    20));
  write(root / "fuzz_value_convert", "values1",
        std::string("\x01\x02\x08\x03\x02\x01\x00\x00\x00\x00\x00\x00\x00\x0a\x02\x03\x01k\x02\x05",
                    21));

  int n = 0;
  for (const Tensor& t : {zeros({2, 3}, kFloat32), arange(Scalar(12), kInt64).view({3, 4}).t(),
                          ones({}, kFloat64), zeros({0, 5}, kBool)}) {
    std::string meta;
    encode_tensor_meta(TensorMeta::of(t), meta);
    write(root / "fuzz_tensor_meta", "meta" + std::to_string(n++), meta);
  }

  using c10d::proto::FrameWriter;
  using c10d::proto::Op;
  const std::string set = store_frame(Op::kSet, 1, [](FrameWriter& w) {
    w.str("key");
    w.str("value");
  });
  const std::string get = store_frame(Op::kGet, 2, [](FrameWriter& w) {
    w.str("key");
    w.u64(10);
  });
  const std::string add = store_frame(Op::kAdd, 3, [](FrameWriter& w) {
    w.str("counter");
    w.i64(5);
  });
  const std::string wait = store_frame(Op::kWait, 4, [](FrameWriter& w) {
    w.u32(2);
    w.str("key");
    w.str("missing");
    w.u64(5);
  });
  const std::string multi_set = store_frame(Op::kMultiSet, 5, [](FrameWriter& w) {
    w.u32(2);
    w.str("a");
    w.str("1");
    w.str("b");
    w.str("2");
  });
  const std::string compare_set = store_frame(Op::kCompareSet, 6, [](FrameWriter& w) {
    w.str("a");
    w.str("1");
    w.str("3");
  });
  const std::string list = store_frame(Op::kListKeys, 7, [](FrameWriter&) {});
  // Mode 1: after a valid HELLO (the target adds it).
  write(root / "fuzz_store_server", "requests", std::string(1, '\x01') + set + get + add + wait);
  write(root / "fuzz_store_server", "more_requests",
        std::string(1, '\x01') + multi_set + compare_set + list);
  // Mode 0: the handshake itself.
  const std::string hello = le32(44) + std::string(1, '\x01') + le32(0) + le32(0x54535747) +
                            std::string("\x02\x00\x00", 3) + std::string(32, 'n');
  write(root / "fuzz_store_server", "hello", std::string(1, '\x00') + hello + get);
  // Mode 2: a client that claims a secret, then a proof.
  const std::string hello_secret = le32(44) + std::string(1, '\x01') + le32(0) + le32(0x54535747) +
                                   std::string("\x02\x00\x01", 3) + std::string(32, 'n');
  write(root / "fuzz_store_server", "auth",
        std::string(1, '\x02') + hello_secret + le32(37) + std::string(1, '\x0e') + le32(0) +
            std::string(32, 'p'));

  using transport::Handshake;
  Handshake client(Handshake::Role::kClient, "");
  write(root / "fuzz_transport", "server_hello", std::string(1, '\x00') + client.take_output());
  Handshake secret_client(Handshake::Role::kClient, "fuzz secret");
  write(root / "fuzz_transport", "server_hello_secret",
        std::string(1, '\x01') + secret_client.take_output() + std::string(32, 'm'));
  Handshake server(Handshake::Role::kServer, "fuzz secret");
  Handshake peer(Handshake::Role::kClient, "fuzz secret");
  server.feed(reinterpret_cast<const uint8_t*>(peer.take_output().data()), transport::kHelloBytes);
  write(root / "fuzz_transport", "client_transcript",
        std::string(1, '\x02') + server.take_output() + std::string(1, '\x01'));
  std::string error;
  auto segment = transport::RingSegment::create(64 << 10, &error);
  if (segment)
    write(root / "fuzz_transport", "ring_setup", std::string(1, '\x03') + segment->setup_message());
  write(root / "fuzz_transport", "frames",
        std::string(1, '\x04') + frame(tensorpipe_hello()) + frame("a control frame") + frame(""));
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
