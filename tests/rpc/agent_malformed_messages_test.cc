// The TensorPipe agent (RpcAgent) against malformed messages from a raw TensorPipe peer: a
// request announcing a tensor it does not send, forged loans, and noise. Each gets an error
// reply or loses its connection, and the worker serves on.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "agent_fixture.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/sync.h"
#include "transport/stream_transport.h"
#include "wire.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace agent_fixture;

// The address a worker published, read back from the store.
std::string published_url(c10d::Store& store, int rank) {
  std::istringstream in(c10d::to_string(store.get("rpc/1/worker/" + std::to_string(rank))));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("url ", 0) == 0) return line.substr(4);
  }
  return "";
}

TEST(RpcAgent, MalformedMessagesGetAnErrorReplyOrLoseTheirConnection) {
  Registry reg;
  register_basics(reg);
  const std::vector<std::string> o_transports = test_options(reg).transports;
  auto store = std::make_shared<c10d::HashStore>(20s);
  Agents agents = start_agents(1, test_options(reg), store);
  const std::string url = published_url(*store, 0);
  ASSERT_FALSE(url.empty());

  namespace tp = tensorpipe;
  auto context = std::make_shared<tp::Context>(tp::ContextOptions().name("intruder"));
  context->registerTransport(0, "tcp", transport::create_stream_context({}));
  context->registerChannel(0, "basic", tp::channel::basic::create());

  // 1. A request announcing a tensor it does not send: an error reply with its id, then
  //    the connection closes.
  {
    auto pipe = context->connect(url);
    Request req;
    req.id = 42;
    req.function = "echo";
    req.args = {Value(ones({8192}))};  // 32 KiB: travels beside the envelope
    EncodedMessage encoded = encode(Envelope{req});
    tp::Message message;
    message.metadata = encoded.payload;  // and no tensors
    test::CountdownLatch done(1);
    std::string reply_payload;
    std::string read_error;
    pipe->write(std::move(message), [](const tp::Error&) {});
    pipe->readDescriptor([&](const tp::Error& error, tp::Descriptor descriptor) {
      if (error) {
        read_error = error.what();
        done.count_down();
        return;
      }
      reply_payload = descriptor.metadata;
      pipe->read(tp::Allocation{}, [&](const tp::Error&) { done.count_down(); });
    });
    ASSERT_TRUE(done.wait(10s));
    ASSERT_EQ(read_error, "");
    Envelope reply = decode(reply_payload, {});
    const Response& response = std::get<Response>(reply.body);
    EXPECT_EQ(response.id, 42u);
    const ErrorReply& err = std::get<ErrorReply>(response.result);
    EXPECT_EQ(err.kind, ErrorKind::kInvalidArgument);
    EXPECT_TRUE(err.rejected);
    EXPECT_NE(err.message.find("1 tensors announced, 0 sent"), std::string::npos) << err.message;
    pipe->close();
  }
  // 2. A request with a forged loan: the worker names no memory to read for an unknown
  //    peer, refuses a token its lender never issued, and answers with a NetworkError.
  for (const char* as : {"intruder", "w0"}) {
    auto forger = std::make_shared<tp::Context>(tp::ContextOptions().name(as));
    // "w0" claims that name in its handshake too (without a secret the store's record backs
    // it); the intruder claims nothing and is served as an outsider.
    transport::StreamOptions forger_options;
    forger_options.name = as;
    if (std::string(as) == "w0") {
      forger_options.identity = [] { return transport::PeerIdentity{"w0", 0, 0}; };
    }
    forger->registerTransport(0, "tcp", transport::create_stream_context(forger_options));
    forger->registerChannel(0, "basic", tp::channel::basic::create());
    auto pipe = forger->connect(url);
    Request req;
    req.id = 43;
    req.function = "echo";
    req.args = {Value(ones({1 << 20}))};
    EncodedMessage encoded =
        encode(Envelope{req}, nullptr, kDefaultInlineTensorBytes, [](const Tensor&) {
          return Loan{3, 0x1234567};
        });
    ASSERT_TRUE(encoded.tensors.empty());
    tp::Message message;
    message.metadata = encoded.payload;
    test::CountdownLatch done(1);
    std::string reply_payload;
    pipe->write(std::move(message), [](const tp::Error&) {});
    // A release comes first (the forged loans are given back), then the reply.
    std::function<void()> read_one = [&] {
      pipe->readDescriptor([&](const tp::Error& error, tp::Descriptor descriptor) {
        if (error) {
          done.count_down();
          return;
        }
        std::string payload = descriptor.metadata;
        pipe->read(tp::Allocation{}, [&, payload](const tp::Error&) {
          if (std::holds_alternative<Response>(decode(payload, {}).body)) {
            reply_payload = payload;
            done.count_down();
          } else {
            read_one();
          }
        });
      });
    };
    read_one();
    ASSERT_TRUE(done.wait(10s));
    ASSERT_FALSE(reply_payload.empty()) << as;
    const Response response = std::get<Response>(decode(reply_payload, {}).body);
    EXPECT_EQ(response.id, 43u);
    const ErrorReply& err = std::get<ErrorReply>(response.result);
    EXPECT_EQ(err.kind, ErrorKind::kNetwork);
    EXPECT_NE(err.message.find("could not copy the tensors lent by worker"), std::string::npos)
        << err.message;
    // Nothing is read, wherever the loan points: an outsider's memory is never read, and a
    // claim of w0 over tcp names no process (over tcp alone, no worker's memory is read).
    const bool local =
        std::find(o_transports.begin(), o_transports.end(), "local") != o_transports.end();
    EXPECT_NE(err.message.find(std::string(as) == "w0" && local
                                   ? "no local connection with it names its process"
                                   : "cannot be read from here"),
              std::string::npos)
        << err.message;
    pipe->close();
    forger->close();
    forger->join();
  }
  // 3. Noise: the connection is dropped.
  {
    auto pipe = context->connect(url);
    tp::Message message;
    message.metadata = std::string("\xff\xff\x01 not a protobuf \x00\x07", 20);
    pipe->write(std::move(message), [](const tp::Error&) {});
    test::CountdownLatch done(1);
    bool failed = false;
    pipe->readDescriptor([&](const tp::Error& error, tp::Descriptor) {
      failed = static_cast<bool>(error);
      done.count_down();
    });
    ASSERT_TRUE(done.wait(10s));
    EXPECT_TRUE(failed);
  }
  context->close();
  context->join();
  // The worker still serves everyone else.
  EXPECT_EQ(agents[0]->rpc_sync<std::string>("w0", "concat", std::string("o"), std::string("k")),
            "ok");
  expect_clean_shutdown(agents);
}

}  // namespace
}  // namespace gradwire::rpc
