// Documented paths of the TensorPipe agent (RpcAgentPaths): interceptors throwing on either
// side of a reply, a handler's pending future, and a message over the receiver's tensor
// limit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent_fixture.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/sync.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace agent_fixture;

class ThrowingInterceptor : public Interceptor {
 public:
  void on_outgoing_response(const WorkerInfo&, const Request& request, Response&) override {
    if (request.function == "spoil_reply") throw InvalidArgument("reply spoiled on the way out");
  }
  void on_incoming_response(const WorkerInfo&, Response&, const std::shared_ptr<void>&) override {
    if (refuse_replies) throw TimeoutError("reply refused on the way in");
  }
  std::atomic<bool> refuse_replies{false};
};

TEST(RpcAgentPaths, InterceptorsThrowingOnEitherSideOfTheReply) {
  Registry reg;
  register_basics(reg);
  reg.def("spoil_reply", [] { return int64_t{1}; });
  Agents agents = start_agents(2, test_options(reg));
  auto sender = std::make_shared<ThrowingInterceptor>();
  auto receiver = std::make_shared<ThrowingInterceptor>();
  agents[0]->add_interceptor(sender);
  agents[1]->add_interceptor(receiver);
  // The receiver's interceptor spoils the reply: the caller gets that error, from w1.
  try {
    agents[0]->rpc_sync<int64_t>("w1", "spoil_reply");
    FAIL() << "expected a RemoteError";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w1");
    EXPECT_NE(std::string(e.what()).find("reply spoiled on the way out"), std::string::npos);
  }
  // The caller's interceptor refuses a reply: the future fails with its error, as thrown.
  sender->refuse_replies = true;
  EXPECT_THROW(agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{1}),
               TimeoutError);
  sender->refuse_replies = false;
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", "sum_list", std::vector<int64_t>{1}), 1);
  expect_clean_shutdown(agents);
}

TEST(RpcAgentPaths, AHandlerReturningAPendingFutureRepliesWhenItCompletes) {
  Registry reg;
  Agents agents = start_agents(2, test_options(reg));
  Future<Value> answer;
  test::CountdownLatch asked{1};
  agents[1]->register_handler(300, "later", [&](const CallContext&, const Request&) {
    asked.count_down();
    return answer;  // completed by another thread, after the handler returned
  });
  Request r;
  r.handler = 300;
  Future<Value> reply = agents[0]->send("w1", r);
  ASSERT_TRUE(asked.wait(10s));
  EXPECT_FALSE(reply.completed());
  std::thread completer([&] { answer.set_value(Value(std::string("done"))); });
  EXPECT_EQ(reply.get(10s).as_string(), "done");
  completer.join();
  expect_clean_shutdown(agents);
}

TEST(RpcAgentPaths, AMessageOverTheReceiversTensorLimitIsRefused) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = test_options(reg);
  options.limits.max_tensor_bytes = 64 << 10;
  options.direct_copy_threads = 0;
  Agents agents = start_agents(2, options);
  EXPECT_EQ(agents[0]->rpc_sync<Tensor>("w1", "echo", ones({8192})).numel(), 8192);
  const std::string text =
      error_text<Error>([&] { agents[0]->rpc_sync<Tensor>("w1", "echo", ones({32768})); });
  // The receiver refuses it and closes the connection, which the sender may see while the
  // message is still being written.
  EXPECT_TRUE(text.find("more than the limit of 65536") != std::string::npos ||
              text.find("the connection to it was lost") != std::string::npos ||
              text.find("to worker 'w1' (rank 1) could not be sent") != std::string::npos)
      << text;
  expect_clean_shutdown(agents);
}

}  // namespace
}  // namespace gradwire::rpc
