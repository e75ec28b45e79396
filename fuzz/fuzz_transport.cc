// libFuzzer target: gradwire's transport handshake and framing (rpc/src/transport/). The
// first byte picks what the rest is fed to:
//   0-2  the handshake state machine as a server without a secret, as a server with one,
//        and as a client with one, fed in chunks of 1 to 48 bytes; a server that accepts
//        must have the client's whole hello, and one with a secret never sends a proof to
//        a client that has not proven itself (no input can, as none knows the nonce);
//   3    the ring setup message of the local transport;
//   4    a real tcp listener at its default limits: the rest follows a valid handshake
//        (claiming worker "fuzz") on a fresh connection, which is then half-closed; the
//        listener must close it (a frame it cannot accept, or a first frame naming another
//        worker) or read it to the end, and close it then. After the first frame, frames
//        are read as TensorPipe's pipe reads them, through the control-frame decoder
//        (brochure, brochure answer, descriptor, descriptor reply in turn). A crash, or a
//        connection still open 15 s after the client's end of the stream, is a finding;
//   5    one TensorPipe control frame after the handshake, as an agent takes it: the next
//        byte picks its kind (brochure, brochure answer, descriptor, descriptor reply, the
//        mpt channel's packet, the connection hello); the rest goes through the scan and
//        the decoder at an agent's default value limit, and a brochure or brochure answer
//        that decodes is checked against what an agent registers (tcp and local, the
//        basic, ring-like, xth and cma channels) as the listening and the connecting side
//        check them. A frame the scan passed must take no more values than the limit;
//        a decoded answer that passes the check must name a registered transport and a
//        registration for every connection its channels need.
#include <poll.h>

#include <tensorpipe/channel/basic/factory.h>
#include <tensorpipe/channel/cma/factory.h>
#include <tensorpipe/channel/mpt/nop_types.h>
#include <tensorpipe/channel/xth/factory.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/listener.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "gradwire/core/logging.h"
#include "loopback.h"
#include "tensorpipe/negotiation.h"
#include "tensorpipe/verified_channels.h"
#include "transport/handshake.h"
#include "transport/nop_scan.h"
#include "transport/ring.h"
#include "transport/stream_core.h"
#include "transport/stream_transport.h"

using namespace gradwire;
using namespace gradwire::rpc::transport;
namespace tp = tensorpipe;

namespace {

// Returns every byte the handshake sent.
std::string feed_handshake(Handshake& hs, const uint8_t* data, size_t size) {
  std::string sent;
  size_t at = 0;
  while (at < size && hs.state() == Handshake::State::kRunning) {
    // Chunks of 1 to 48 bytes, so that every boundary inside a step is exercised.
    const size_t n = std::min<size_t>(1 + (at * 7 + size) % 48, size - at);
    const size_t used = hs.feed(data + at, n);
    if (used > n) __builtin_trap();
    sent += hs.take_output();
    at += n;
  }
  if (hs.state() == Handshake::State::kFailed && hs.error().empty()) __builtin_trap();
  if (hs.state() == Handshake::State::kDone && hs.error().size() != 0) __builtin_trap();
  return sent;
}

// Reads the `n`-th frame of `conn` and the rest after it: the first (TensorPipe's hello) as
// bytes, every later one as the next of TensorPipe's control messages in turn. On an error
// the callbacks (and with them `conn`) go away.
template <typename T>
void read_control(const std::shared_ptr<tp::transport::Connection>& conn, int n);

void drain(const std::shared_ptr<tp::transport::Connection>& conn, int n = 0) {
  switch (n == 0 ? -1 : n % 4) {
    case -1:
      conn->read([conn](const tp::Error& error, const void*, size_t) {
        if (!error) drain(conn, 1);
      });
      return;
    case 0:
      read_control<tp::Brochure>(conn, n);
      return;
    case 1:
      read_control<tp::BrochureAnswer>(conn, n);
      return;
    case 2:
      read_control<tp::Descriptor>(conn, n);
      return;
    default:
      read_control<tp::DescriptorReply>(conn, n);
      return;
  }
}

template <typename T>
void read_control(const std::shared_ptr<tp::transport::Connection>& conn, int n) {
  auto holder = std::make_shared<tp::NopHolder<T>>();
  conn->read(*holder, [conn, holder, n](const tp::Error& error) {
    if (!error) drain(conn, n + 1);
  });
}

void accept_forever(const std::shared_ptr<tp::transport::Listener>& listener) {
  listener->accept(
      [listener](const tp::Error& error, std::shared_ptr<tp::transport::Connection> conn) {
        if (error) return;
        drain(conn);
        accept_forever(listener);
      });
}

// A tcp listener on 127.0.0.1 with an accept loop, for the life of the process; its port.
int listener_port() {
  static const int port = [] {
    StreamOptions options;
    options.name = "fuzz";
    options.handshake_timeout = std::chrono::milliseconds(2000);
    static auto* context = new std::shared_ptr<StreamContext>(create_stream_context(options));
    static auto* listener =
        new std::shared_ptr<tp::transport::Listener>((*context)->listen("127.0.0.1:0"));
    accept_forever(*listener);
    const std::string addr = (*listener)->addr();
    return std::stoi(addr.substr(addr.rfind(':') + 1));
  }();
  return port;
}

void through_listener(const uint8_t* data, size_t size) {
  const int fd = fuzz::connect_loopback(static_cast<uint16_t>(listener_port()));
  Handshake hs(Handshake::Role::kClient, "", {"fuzz", 0, 0});
  bool ok = fuzz::send_all(fd, hs.take_output());
  while (ok && hs.state() == Handshake::State::kRunning) {
    if (!fuzz::wait_for(fd, POLLIN, fuzz::kHangMs)) fuzz::report_hang(fd, "no handshake reply");
    uint8_t byte = 0;
    const ssize_t n = ::recv(fd, &byte, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) __builtin_trap();  // a valid handshake is never refused
    hs.feed(&byte, 1);
  }
  if (hs.state() != Handshake::State::kDone) __builtin_trap();
  fuzz::send_all(fd, std::string(reinterpret_cast<const char*>(data), size));
  fuzz::finish_and_wait_for_close(fd);
}

}  // namespace

// An agent's default limit on a control frame's values (16 x max_tensors + 4096).
constexpr size_t kAgentFrameValues = 16 * 65536 + 4096;

// What an agent registers, for the checks of brochures and answers.
const rpc::detail::Negotiation& negotiation() {
  static const auto* n = [] {
    auto* out = new rpc::detail::Negotiation();
    StreamOptions tcp;
    tcp.name = "fuzz";
    out->add_transport("tcp", create_stream_context(tcp));
    StreamOptions local = tcp;
    local.family = StreamOptions::Family::kLocal;
    out->add_transport("local", create_stream_context(local));
    auto refusals = std::make_shared<rpc::detail::ChannelRefusals>();
    out->add_channel(0, "basic", tp::channel::basic::create());
    out->add_channel(250, "ring", tp::channel::basic::create());
    out->add_channel(300, "xth",
                     rpc::detail::same_process_channel(tp::channel::xth::create(), refusals));
    out->add_channel(200, "cma",
                     rpc::detail::verified_process_channel(tp::channel::cma::create(),
                                                           "|host=fuzz|netns=1", refusals));
    out->set_first_transport("tcp");
    return out;
  }();
  return *n;
}

template <typename T>
bool decodes(T& object, const uint8_t* data, size_t size) {
  tp::NopHolder<T> holder;
  const std::string why = rpc::transport::detail::decode_nop(
      holder, reinterpret_cast<const char*>(data), size, kAgentFrameValues);
  // The decoder never takes what the scan refuses.
  if (why.empty() && !scan_nop(data, size, kAgentFrameValues).empty()) __builtin_trap();
  if (!why.empty()) return false;
  object = std::move(holder.getObject());
  return true;
}

void control_frame(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t kind = data[0] % 6;
  ++data;
  --size;
  switch (kind) {
    case 0: {
      tp::Brochure brochure;
      if (decodes(brochure, data, size)) (void)negotiation().check_brochure(brochure);
      break;
    }
    case 1: {
      tp::BrochureAnswer answer;
      if (decodes(answer, data, size) && negotiation().check(answer).empty()) {
        // What the connecting side then relies on.
        if (answer.transport != "tcp" && answer.transport != "local") __builtin_trap();
        if (answer.transportRegistrationIds.count(1) == 0) __builtin_trap();
        for (const auto& [pair, channel] : answer.channelForDevicePair) {
          if (answer.channelRegistrationIds.count(channel) == 0) __builtin_trap();
        }
      }
      break;
    }
    case 2: {
      tp::Descriptor descriptor;
      if (decodes(descriptor, data, size) &&
          descriptor.payloads.size() + descriptor.tensors.size() > kAgentFrameValues) {
        __builtin_trap();
      }
      break;
    }
    case 3: {
      tp::DescriptorReply reply;
      (void)decodes(reply, data, size);
      break;
    }
    case 4: {
      tp::channel::mpt::Packet packet;
      (void)decodes(packet, data, size);
      break;
    }
    default: {
      tp::Packet packet;
      (void)decodes(packet, data, size);
      break;
    }
  }
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(LogLevel::kOff);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 6;
  ++data;
  --size;
  switch (mode) {
    case 0: {
      Handshake hs(Handshake::Role::kServer, "");
      feed_handshake(hs, data, size);
      if (hs.state() == Handshake::State::kDone &&
          size < kHelloBytes + kIdentityHeaderBytes + hs.peer().name.size()) {
        __builtin_trap();
      }
      break;
    }
    case 1: {
      Handshake hs(Handshake::Role::kServer, "fuzz secret of the job");
      const std::string sent = feed_handshake(hs, data, size);
      // Its hello and, for a wrong proof, a refusal: never its own proof.
      if (hs.state() == Handshake::State::kDone || sent.size() > kHelloBytes + 1) __builtin_trap();
      break;
    }
    case 2: {
      Handshake hs(Handshake::Role::kClient, "fuzz secret of the job", {"fuzz", 0, 0});
      (void)hs.take_output();
      feed_handshake(hs, data, size);
      break;
    }
    case 3: {
      uint8_t setup[kRingSetupBytes] = {0};
      std::memcpy(setup, data, std::min(size, sizeof(setup)));
      std::string error;
      const size_t capacity = RingSegment::parse_setup(setup, &error);
      if ((capacity == 0) == error.empty()) __builtin_trap();
      if (capacity != 0 && (capacity < kMinRingBytes || capacity > kMaxRingBytes)) {
        __builtin_trap();
      }
      break;
    }
    case 4:
      through_listener(data, size);
      break;
    default:
      control_frame(data, size);
      break;
  }
  return 0;
}
