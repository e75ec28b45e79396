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
#include "gradwire/tensor/sparse.h"
#include "gradwire/tensor/wire.h"
#include "module_input.h"
#include "proto/dist_autograd.pb.h"
#include "proto/rref.pb.h"
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
  Request broadcast;  // a broadcast tensor travels compact, with expand_to
  broadcast.id = 10;
  broadcast.function = "broadcast";
  broadcast.args = {Value(full({}, Scalar(1.5), kFloat32).expand({4, 3})),
                    Value(tensor<double>({1, 2}, {2, 1}).expand({2, 5}))};
  out.push_back(encode(Envelope{broadcast}).payload);
  Response ok;
  ok.id = 7;
  ok.result = Value("done");
  out.push_back(encode(Envelope{ok}).payload);
  Response failed;
  failed.id = 8;
  failed.result = ErrorReply{ErrorKind::kInvalidArgument, "bad argument", "w1", true};
  out.push_back(encode(Envelope{failed}).payload);
  out.push_back(encode(Envelope{Release{{Loan{1, 99}, Loan{2, 100}}}}).payload);
  Request sparse;  // a sparse-rows tensor: its row numbers and rows are two of the tensors
  sparse.id = 11;
  sparse.function = "sparse";
  sparse.args = {Value(
      sparse_rows(tensor<int64_t>({1, 3}), arange(Scalar(6), kFloat32).view({2, 3}), {4, 3}))};
  out.push_back(encode(Envelope{sparse}).payload);
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
  // The name fuzz_transport's client claims in its handshake.
  hello.getObject() = tensorpipe::SpontaneousConnection{"fuzz"};
  std::string bytes(hello.getSize(), '\0');
  tensorpipe::NopWriter writer(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
  (void)hello.write(writer);
  return bytes;
}

// One control object in libnop's encoding.
template <typename T>
std::string nop_text(const T& object) {
  tensorpipe::NopHolder<T> holder;
  holder.getObject() = object;
  std::string bytes(holder.getSize(), '\0');
  tensorpipe::NopWriter writer(reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
  (void)holder.write(writer);
  return bytes;
}

std::string frame(const std::string& payload) {
  const uint64_t n = payload.size();
  return std::string(reinterpret_cast<const char*>(&n), sizeof(n)) + payload;
}

// Ids as worker `w` mints them.
uint64_t id(uint64_t w, uint64_t n) {
  return (w << 48) | n;
}

// Messages of fuzz_rref_message, sent by w1 (flags 0) unless the flags say otherwise.
namespace rw = gradwire::rref::wire;
std::string rref_create(uint64_t rref, uint64_t fork, const std::string& type,
                        const std::string& name, uint64_t target = 0,
                        const std::string& target_type = "") {
  rw::RRefMessage m;
  rw::Create* c = m.mutable_create();
  c->set_rref_id(rref);
  c->set_fork_id(fork);
  c->set_type_name(type);
  c->set_name(name);
  c->set_target_rref_id(target);
  c->set_target_type_name(target_type);
  return m.SerializeAsString();
}
std::string rref_fetch(uint64_t rref, const std::string& type) {
  rw::RRefMessage m;
  m.mutable_fetch()->set_rref_id(rref);
  m.mutable_fetch()->set_type_name(type);
  return m.SerializeAsString();
}
std::string rref_call(uint64_t rref, const std::string& method, const std::string& type) {
  rw::RRefMessage m;
  m.mutable_call_method()->set_rref_id(rref);
  m.mutable_call_method()->set_method(method);
  m.mutable_call_method()->set_type_name(type);
  return m.SerializeAsString();
}
std::string rref_add_fork(uint64_t rref, uint64_t fork, const std::string& type) {
  rw::RRefMessage m;
  m.mutable_add_fork()->set_rref_id(rref);
  m.mutable_add_fork()->set_fork_id(fork);
  m.mutable_add_fork()->set_type_name(type);
  return m.SerializeAsString();
}
std::string rref_accepted(uint64_t fork) {
  rw::RRefMessage m;
  m.mutable_child_accepted()->add_fork_ids(fork);
  return m.SerializeAsString();
}
std::string rref_delete(uint64_t rref, uint64_t fork) {
  rw::RRefMessage m;
  m.mutable_delete_fork()->set_rref_id(rref);
  m.mutable_delete_fork()->set_fork_id(fork);
  return m.SerializeAsString();
}

// Arguments in fuzz::read_value's encoding.
const std::string kIntArg("\x01\x03", 2);                       // int 3
const std::string kTensorArg("\x03\x01\x01\x02", 4);            // float64 ones of shape {2}
const std::string kRRefArg("\x05\x00\x01\x01\x02\x09\x00", 7);  // owner 0, RRef 1:1, fork 2:9
constexpr uint8_t kOneArg = 1 << 2;
constexpr uint8_t kNoWait = 1 << 5;

void rref_seeds(const fs::path& dir) {
  using fuzz::write_message;
  const uint64_t r = id(1, 1), f = id(1, 2);
  write(dir, "create", write_message(kOneArg, rref_create(r, f, "Tensor", "make")) + kIntArg);
  write(dir, "lifecycle",
        write_message(kOneArg, rref_create(r, f, "Tensor", "make")) + kIntArg +
            write_message(0, rref_fetch(r, "Tensor")) +
            write_message(0, rref_add_fork(r, id(2, 5), "Tensor")) +
            write_message(0, rref_delete(r, id(2, 5))) + write_message(0, rref_delete(r, f)));
  write(dir, "counter",
        write_message(kOneArg, rref_create(r, f, "Counter", "Counter")) + kIntArg +
            write_message(kOneArg, rref_call(r, "add", "Counter")) + kIntArg +
            write_message(0, rref_create(id(1, 3), id(1, 4), "int", "get", r, "Counter")) +
            write_message(0, rref_fetch(id(1, 3), "int")));
  write(dir, "early_fetch",
        write_message(kNoWait, rref_fetch(r, "Tensor")) +
            write_message(kOneArg, rref_create(r, f, "Tensor", "make")) + kIntArg);
  write(dir, "failing_create",
        write_message(kOneArg, rref_create(r, f, "int", "fail")) + kIntArg +
            write_message(0, rref_fetch(r, "int")));
  write(dir, "rref_argument",
        write_message(kOneArg, rref_create(r, f, "Tensor", "make")) + kIntArg +
            write_message(kOneArg, rref_create(id(1, 3), id(1, 4), "int", "ident")) + kRRefArg);
  write(dir, "child_accepted", write_message(0, rref_accepted(f)));
  write(dir, "wrong_handler", write_message(1, rref_fetch(r, "Tensor")));
}

// Messages of fuzz_dist_autograd_message, with ids below 16 naming what the target
// recorded (flags bit 0): context 1 (its message 1) and context 2 (its message 2).
namespace dw = gradwire::dist_autograd::wire;
std::string da_discover(uint64_t ctx, uint64_t pass, uint64_t message) {
  dw::DistAutogradMessage m;
  m.mutable_discover()->set_context_id(ctx);
  m.mutable_discover()->set_pass_id(pass);
  m.mutable_discover()->add_message_ids(message);
  return m.SerializeAsString();
}
std::string da_propagate(uint64_t ctx, uint64_t pass, uint64_t message) {
  dw::DistAutogradMessage m;
  m.mutable_propagate()->set_context_id(ctx);
  m.mutable_propagate()->set_pass_id(pass);
  m.mutable_propagate()->set_message_id(message);
  return m.SerializeAsString();
}
std::string da_wait(uint64_t ctx, uint64_t pass) {
  dw::DistAutogradMessage m;
  m.mutable_wait()->set_context_id(ctx);
  m.mutable_wait()->set_pass_id(pass);
  return m.SerializeAsString();
}
std::string da_release(uint64_t ctx) {
  dw::DistAutogradMessage m;
  m.mutable_release()->set_context_id(ctx);
  return m.SerializeAsString();
}

void dist_autograd_seeds(const fs::path& dir) {
  using fuzz::write_message;
  constexpr uint8_t kIds = 1;
  const uint64_t pass = id(1, 100);
  for (uint64_t ctx : {1, 2}) {
    const std::string n = std::to_string(ctx);
    write(dir, "discover" + n, write_message(kIds, da_discover(ctx, pass, ctx)));
    write(dir, "pass" + n,
          write_message(kIds, da_discover(ctx, pass, ctx)) +
              write_message(kIds | kOneArg, da_propagate(ctx, pass, ctx)) + kTensorArg +
              write_message(kIds, da_wait(ctx, pass)));
    write(dir, "wait_then_release" + n,
          write_message(kIds, da_discover(ctx, pass, ctx)) +
              write_message(kIds | kNoWait, da_wait(ctx, pass)) +
              write_message(kIds, da_release(ctx)));
  }
  write(dir, "propagate_first",
        write_message(kIds | kOneArg, da_propagate(1, pass, 1)) + kTensorArg);
  write(dir, "release", write_message(kIds, da_release(1)) + write_message(kIds, da_release(2)));
  write(dir, "unknown_context", write_message(0, da_wait(id(2, 7), pass)));
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
  // TIME: no payload; twice, pipelined.
  const std::string time = store_frame(Op::kTime, 8, [](FrameWriter&) {});
  const std::string time2 = store_frame(Op::kTime, 9, [](FrameWriter&) {});
  write(root / "fuzz_store_server", "time", std::string(1, '\x01') + time + time2);
  // Mode 0: the handshake itself.
  const std::string hello = le32(44) + std::string(1, '\x01') + le32(0) + le32(0x54535747) +
                            std::string("\x03\x00\x00", 3) + std::string(32, 'n');
  write(root / "fuzz_store_server", "hello", std::string(1, '\x00') + hello + get);
  // Mode 2: a client that claims a secret, then a proof.
  const std::string hello_secret = le32(44) + std::string(1, '\x01') + le32(0) + le32(0x54535747) +
                                   std::string("\x03\x00\x01", 3) + std::string(32, 'n');
  write(root / "fuzz_store_server", "auth",
        std::string(1, '\x02') + hello_secret + le32(37) + std::string(1, '\x0e') + le32(0) +
            std::string(32, 'p'));

  using transport::Handshake;
  const std::string fuzz_secret = "fuzz secret of the job";
  Handshake client(Handshake::Role::kClient, "", {"fuzz", 0, 0});
  write(root / "fuzz_transport", "server_hello", std::string(1, '\x00') + client.take_output());
  Handshake secret_client(Handshake::Role::kClient, fuzz_secret, {"fuzz", 0, 0});
  write(root / "fuzz_transport", "server_hello_secret",
        std::string(1, '\x01') + secret_client.take_output() + std::string(32, 'm'));
  Handshake server(Handshake::Role::kServer, fuzz_secret);
  Handshake peer(Handshake::Role::kClient, fuzz_secret, {"fuzz", 0, 0});
  const std::string peer_hello = peer.take_output();
  server.feed(reinterpret_cast<const uint8_t*>(peer_hello.data()), peer_hello.size());
  // The server's hello, an acceptance, and a proof (wrong: the nonces differ).
  write(root / "fuzz_transport", "client_transcript",
        std::string(1, '\x02') + server.take_output() + std::string(1, '\x01') +
            std::string(32, 'p'));
  std::string error;
  auto segment = transport::RingSegment::create(64 << 10, &error);
  if (segment)
    write(root / "fuzz_transport", "ring_setup", std::string(1, '\x03') + segment->setup_message());
  write(root / "fuzz_transport", "frames",
        std::string(1, '\x04') + frame(tensorpipe_hello()) + frame("a control frame") + frame(""));
  // Mode 5: one control frame of each kind, as an agent's peer sends it.
  {
    tensorpipe::Brochure brochure;
    brochure.transportDomainDescriptors["tcp"] = "gradwire-tcp";
    brochure.channelDeviceDescriptors["basic"][tensorpipe::Device{"cpu", 0}] = "any";
    write(root / "fuzz_transport", "control_brochure",
          std::string("\x05\x00", 2) + nop_text(brochure));
    tensorpipe::BrochureAnswer answer;
    answer.transport = "tcp";
    answer.address = "127.0.0.1:1";
    answer.transportRegistrationIds[1] = 7;
    answer.transportDomainDescriptor = "gradwire-tcp";
    answer.channelRegistrationIds["basic"] = {8};
    answer.channelDeviceDescriptors["basic"][tensorpipe::Device{"cpu", 0}] = "any";
    answer.channelForDevicePair[{tensorpipe::Device{"cpu", 0}, tensorpipe::Device{"cpu", 0}}] =
        "basic";
    write(root / "fuzz_transport", "control_answer", std::string("\x05\x01", 2) + nop_text(answer));
    tensorpipe::Descriptor descriptor;
    descriptor.metadata = "an envelope";
    descriptor.tensors.resize(2);
    write(root / "fuzz_transport", "control_descriptor",
          std::string("\x05\x02", 2) + nop_text(descriptor));
  }
  rref_seeds(root / "fuzz_rref_message");
  dist_autograd_seeds(root / "fuzz_dist_autograd_message");
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
