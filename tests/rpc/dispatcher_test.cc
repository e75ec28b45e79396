// White-box tests of rpc/'s Dispatcher (rpc/src/dispatcher.h): where a request runs.
#include "dispatcher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/agents.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;

// Keeps the replies the dispatcher writes, by request id.
class KeptReplies : public detail::ReplyWriter {
 public:
  bool write_reply(const std::shared_ptr<detail::Link>&, const Request& request,
                   const Response& response, bool, size_t*) override {
    MutexLock lock(mutex_);
    auto it = replies_.find(request.id);
    if (it != replies_.end()) it->second.set_value(response);
    return true;
  }
  void request_done(const detail::Link&, size_t) override {}
  Future<Response> expect(uint64_t id) {
    MutexLock lock(mutex_);
    return replies_[id];
  }

 private:
  Mutex mutex_;
  std::map<uint64_t, Future<Response>> replies_ GRADWIRE_GUARDED_BY(mutex_);
};

Request call_of(uint64_t id, std::string function) {
  Request request;
  request.id = id;
  request.function = std::move(function);
  return request;
}

// An inline function runs on the thread that hands the request over; but a thread inside a
// send (a SendingMark: TensorPipe may run its loop, and so deliver requests, on a thread that
// is writing) runs none of it: an inline request goes to the dispatcher's inline thread, and
// is answered even while the pool's only thread is held; a pool request waits for the pool.
TEST(Dispatcher, AnInlineRequestTakenByASendingThreadRunsOnTheInlineThreadWhileThePoolIsBusy) {
  Registry reg;
  Mutex mutex;
  std::map<uint64_t, std::thread::id> ran_on;
  auto record = [&](int64_t id) {
    MutexLock lock(mutex);
    ran_on[static_cast<uint64_t>(id)] = std::this_thread::get_id();
    return id;
  };
  reg.def("inline", record, Execution::kInline);
  reg.def("pool", record);
  AgentOptions options;
  options.registry = &reg;
  options.transports = test::transports_under_test(options.transports);
  std::shared_ptr<RpcAgent> agent =
      make_tensorpipe_agent("w0", 0, 1, std::make_shared<c10d::HashStore>(20s), options);

  KeptReplies replies;
  detail::Dispatcher dispatcher(WorkerInfo{"w0", 0}, replies);
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "disp"});
  dispatcher.start(pool);
  auto link = std::make_shared<detail::Link>();
  link->peer = WorkerInfo{"w0", 0};
  auto serve = [&](uint64_t id, const std::string& function) {
    Request request = call_of(id, function);
    request.args.emplace_back(static_cast<int64_t>(id));
    Future<Response> reply = replies.expect(id);
    dispatcher.serve(agent, link, std::move(request), 0);
    return reply;
  };
  auto answered = [](Future<Response> reply, const std::string& function) {
    const Response response = reply.get(10s);
    EXPECT_TRUE(std::holds_alternative<Value>(response.result)) << function;
  };
  const std::thread::id here = std::this_thread::get_id();
  answered(serve(1, "inline"), "inline");
  answered(serve(2, "pool"), "pool");
  // The pool's only thread is held until the inline request below is answered: a request
  // that waited for the pool would never be.
  Future<bool> gate;
  Future<bool> held = pool->submit([gate] { return gate.get(20s); });
  {
    const detail::SendingMark sending;
    EXPECT_TRUE(detail::sending_on_this_thread());
    {
      const detail::SendingMark nested;  // marks nest
    }
    EXPECT_TRUE(detail::sending_on_this_thread());
    answered(serve(3, "inline"), "inline");
    Future<Response> pooled = serve(4, "pool");
    EXPECT_FALSE(pooled.completed());  // behind the held thread
    gate.set_value(true);
    answered(pooled, "pool");
  }
  EXPECT_TRUE(held.get(10s));
  EXPECT_FALSE(detail::sending_on_this_thread());
  answered(serve(5, "inline"), "inline");
  MutexLock lock(mutex);
  EXPECT_EQ(ran_on[1], here);
  EXPECT_NE(ran_on[2], here);
  EXPECT_NE(ran_on[3], here);
  EXPECT_NE(ran_on[3], ran_on[2]);  // not the pool's thread
  EXPECT_EQ(ran_on[4], ran_on[2]);  // the pool's one thread
  EXPECT_EQ(ran_on[5], here);
  lock.unlock();
  pool->shutdown();
  agent->shutdown();
}

}  // namespace
}  // namespace gradwire::rpc
