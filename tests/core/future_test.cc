#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/future.h"
#include "gradwire/core/thread_pool.h"
#include "support/executors.h"
#include "support/log_capture.h"
#include "support/sync.h"

namespace gradwire {
namespace {

using std::chrono::milliseconds;
using test::CountdownLatch;
using test::LogCapture;
using test::ManualExecutor;
using test::RejectingExecutor;
using ::testing::HasSubstr;

constexpr milliseconds kWait{10'000};

class FutureTest : public ::testing::Test {
 protected:
  std::shared_ptr<ThreadPool> pool_ =
      std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 4, .name = "future-test"});
};

// The message of the exception `fn` throws as E, or a note that it threw none.
template <typename E, typename F>
std::string message_of(F fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

TEST_F(FutureTest, ValueIsVisibleToEveryCopy) {
  Future<int> producer;
  Future<int> consumer = producer;
  EXPECT_TRUE(consumer.valid());
  EXPECT_FALSE(consumer.completed());
  producer.set_value(42);
  EXPECT_TRUE(consumer.completed());
  EXPECT_FALSE(consumer.has_error());
  EXPECT_EQ(consumer.error(), nullptr);
  EXPECT_EQ(consumer.value(), 42);
  EXPECT_EQ(consumer.get(kWait), 42);
}

TEST_F(FutureTest, GetReturnsAReferenceOnHandlesAndACopyOnTemporaries) {
  Future<std::string> f = make_ready_future(std::string("x"));
  static_assert(std::is_same_v<decltype(f.get()), const std::string&>);
  static_assert(std::is_same_v<decltype(std::move(f).get()), std::string>);
  EXPECT_EQ(&f.get(), &f.value());
  EXPECT_EQ(make_ready_future(std::string("y")).get(kWait), "y");
}

TEST_F(FutureTest, ErrorIsRethrownWithItsType) {
  Future<int> f;
  f.set_error(TimeoutError("peer slow"));
  EXPECT_TRUE(f.completed());
  EXPECT_TRUE(f.has_error());
  EXPECT_NE(f.error(), nullptr);
  EXPECT_EQ(message_of<TimeoutError>([&] { f.get(kWait); }), "peer slow");
  EXPECT_EQ(message_of<TimeoutError>([&] { f.value(); }), "peer slow");
}

TEST_F(FutureTest, ErrorFromExceptionPtr) {
  Future<int> f;
  f.set_error(std::make_exception_ptr(std::out_of_range("index 9")));
  EXPECT_THROW(f.get(kWait), std::out_of_range);
  EXPECT_THROW(f.try_set_error(nullptr), InvalidArgument);
}

TEST_F(FutureTest, SecondCompletionIsRefused) {
  Future<int> f;
  EXPECT_TRUE(f.try_set_value(1));
  EXPECT_FALSE(f.try_set_value(2));
  EXPECT_FALSE(f.try_set_error(std::make_exception_ptr(Error("late"))));
  EXPECT_EQ(message_of<Error>([&] { f.set_value(3); }), "future already completed");
  EXPECT_EQ(message_of<Error>([&] { f.set_error(Error("late")); }), "future already completed");
  EXPECT_EQ(f.value(), 1);
  EXPECT_FALSE(f.has_error());
}

TEST_F(FutureTest, ErrorCannotBeOverwrittenByAValue) {
  Future<void> f;
  EXPECT_TRUE(f.try_set_error(std::make_exception_ptr(NetworkError("lost"))));
  EXPECT_FALSE(f.try_set_value());
  EXPECT_THROW(f.set_value(), Error);
  EXPECT_THROW(f.get(kWait), NetworkError);
}

TEST_F(FutureTest, ValueBeforeCompletionIsAnError) {
  Future<int> f;
  EXPECT_EQ(message_of<Error>([&] { f.value(); }), "future value read before the future completed");
  Future<void> v;
  EXPECT_THROW(v.value(), Error);
}

TEST_F(FutureTest, WaitTimesOutWithFalse) {
  Future<int> f;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(f.wait(milliseconds(20)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(20));
  EXPECT_FALSE(f.wait(milliseconds(0)));
  EXPECT_FALSE(f.wait(milliseconds(-5)));
}

TEST_F(FutureTest, GetTimesOutWithTimeoutError) {
  Future<int> f;
  EXPECT_EQ(message_of<TimeoutError>([&] { f.get(milliseconds(20)); }),
            "future not completed within 20 ms");
  Future<void> v;
  EXPECT_EQ(message_of<TimeoutError>([&] { v.get(milliseconds(15)); }),
            "future not completed within 15 ms");
}

TEST_F(FutureTest, WaitWakesWhenAnotherThreadCompletes) {
  Future<int> f;
  std::thread completer([f]() mutable { f.set_value(5); });
  EXPECT_TRUE(f.wait(kWait));
  EXPECT_EQ(f.value(), 5);
  completer.join();
}

TEST_F(FutureTest, MovedFromHandleIsInvalid) {
  Future<int> f;
  Future<int> g = std::move(f);
  EXPECT_FALSE(f.valid());  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_TRUE(g.valid());
  EXPECT_EQ(message_of<Error>([&] { (void)f.completed(); }),
            "use of an invalid (moved-from) Future");
}

TEST_F(FutureTest, ReadyAndFailedFactories) {
  EXPECT_EQ(make_ready_future(7).get(kWait), 7);
  make_ready_future().get(kWait);
  Future<int> typed = make_failed_future<int>(StoreError("no key"));
  EXPECT_THROW(typed.get(kWait), StoreError);
  Future<void> from_ptr = make_failed_future<void>(std::make_exception_ptr(Error("x")));
  EXPECT_THROW(from_ptr.get(kWait), Error);
}

TEST_F(FutureTest, ThenChainsValues) {
  Future<int> f;
  Future<std::string> text =
      f.then(pool_, [](Future<int> done) {
         return done.value() * 2;
       }).then(pool_, [](Future<int> done) { return "v=" + std::to_string(done.value()); });
  f.set_value(21);
  EXPECT_EQ(text.get(kWait), "v=42");
}

TEST_F(FutureTest, ThenOnAnAlreadyCompletedFuture) {
  Future<int> doubled =
      make_ready_future(4).then(pool_, [](Future<int> d) { return d.value() * 2; });
  EXPECT_EQ(doubled.get(kWait), 8);
}

TEST_F(FutureTest, ThenFlattensAReturnedFuture) {
  Future<int> first;
  Future<int> inner;
  Future<int> result = first.then(pool_, [inner](Future<int> done) {
    EXPECT_EQ(done.value(), 1);
    return inner;
  });
  static_assert(std::is_same_v<decltype(result), Future<int>>);
  first.set_value(1);
  // The continuation ran, but `result` follows `inner`, which is still pending.
  EXPECT_FALSE(result.wait(milliseconds(20)));
  inner.set_value(99);
  EXPECT_EQ(result.get(kWait), 99);
}

TEST_F(FutureTest, ThenFlattensAFailedReturnedFuture) {
  Future<int> result = make_ready_future(1).then(
      pool_, [](Future<int>) { return make_failed_future<int>(NetworkError("down")); });
  EXPECT_THROW(result.get(kWait), NetworkError);
}

TEST_F(FutureTest, ThenWithVoidAndFutureVoidResults) {
  std::atomic<int> seen{0};
  Future<void> a = make_ready_future(3).then(pool_, [&seen](Future<int> d) { seen = d.value(); });
  static_assert(std::is_same_v<decltype(a), Future<void>>);
  a.get(kWait);
  EXPECT_EQ(seen.load(), 3);

  Future<void> inner;
  Future<void> b = make_ready_future().then(pool_, [inner](Future<void>) { return inner; });
  static_assert(std::is_same_v<decltype(b), Future<void>>);
  EXPECT_FALSE(b.wait(milliseconds(20)));
  inner.set_value();
  b.get(kWait);
}

TEST_F(FutureTest, ThenAcceptsMoveOnlyCallables) {
  auto owned = std::make_unique<int>(10);
  Future<int> r = make_ready_future(1).then(
      pool_, [owned = std::move(owned)](Future<int> d) { return d.value() + *owned; });
  EXPECT_EQ(r.get(kWait), 11);
}

TEST_F(FutureTest, ContinuationReturningAnInvalidFutureFailsTheResult) {
  Future<int> r = make_ready_future(1).then(pool_, [](Future<int>) {
    Future<int> f;
    Future<int> g = std::move(f);
    return f;  // NOLINT(bugprone-use-after-move): deliberately invalid
  });
  EXPECT_EQ(message_of<Error>([&] { r.get(kWait); }), "use of an invalid (moved-from) Future");
}

TEST_F(FutureTest, ContinuationsNeverRunOnTheCompletingThread) {
  Future<int> f;
  Future<std::thread::id> ran_on =
      f.then(pool_, [](Future<int>) { return std::this_thread::get_id(); });
  f.set_value(1);
  EXPECT_NE(ran_on.get(kWait), std::this_thread::get_id());
}

TEST_F(FutureTest, ContinuationsNeverRunOnTheAttachingThread) {
  Future<int> done = make_ready_future(1);
  CountdownLatch ran(1);
  std::atomic<bool> elsewhere{false};
  const std::thread::id attacher = std::this_thread::get_id();
  done.add_callback(pool_, [&, attacher](Future<int>) {
    elsewhere = std::this_thread::get_id() != attacher;
    ran.count_down();
  });
  ASSERT_TRUE(ran.wait(kWait));
  EXPECT_TRUE(elsewhere);
}

TEST_F(FutureTest, CallbacksOnlyEverGoThroughTheExecutor) {
  auto manual = std::make_shared<ManualExecutor>();
  Future<int> f;
  int callback_runs = 0;
  Future<int> next = f.then(manual, [](Future<int> d) { return d.value() + 1; });
  f.add_callback(manual, [&callback_runs](Future<int>) { ++callback_runs; });
  f.set_value(1);
  // Completion only queued the work.
  EXPECT_EQ(manual->pending(), 2u);
  EXPECT_EQ(callback_runs, 0);
  EXPECT_FALSE(next.completed());
  // Attaching to a completed future queues too.
  f.add_callback(manual, [&callback_runs](Future<int>) { ++callback_runs; });
  EXPECT_EQ(callback_runs, 0);
  EXPECT_EQ(manual->run_all(), 3u);
  EXPECT_EQ(callback_runs, 2);
  EXPECT_EQ(next.value(), 2);
}

TEST_F(FutureTest, ErrorsPropagateThroughThen) {
  Future<int> f;
  Future<int> passed_on = f.then(pool_, [](Future<int> d) {
                             return d.value() + 1;
                           }).then(pool_, [](Future<int> d) { return d.value() + 1; });
  f.set_error(TimeoutError("no reply"));
  EXPECT_EQ(message_of<TimeoutError>([&] { passed_on.get(kWait); }), "no reply");
}

TEST_F(FutureTest, ContinuationSeesTheErrorAndCanRecover) {
  Future<int> recovered =
      make_failed_future<int>(NetworkError("lost")).then(pool_, [](Future<int> d) {
        return d.has_error() ? -1 : d.value();
      });
  EXPECT_EQ(recovered.get(kWait), -1);
}

TEST_F(FutureTest, ThrowingContinuationFailsTheResult) {
  Future<int> r = make_ready_future(1).then(
      pool_, [](Future<int>) -> int { throw InvalidArgument("bad shape"); });
  EXPECT_EQ(message_of<InvalidArgument>([&] { r.get(kWait); }), "bad shape");
  Future<void> v =
      make_ready_future().then(pool_, [](Future<void>) { throw std::runtime_error("void boom"); });
  EXPECT_THROW(v.get(kWait), std::runtime_error);
}

TEST_F(FutureTest, RejectingExecutorFailsTheResult) {
  auto rejecting = std::make_shared<RejectingExecutor>("executor is closed");
  Future<int> pending;
  Future<int> later = pending.then(rejecting, [](Future<int> d) { return d.value(); });
  pending.set_value(1);
  EXPECT_EQ(message_of<Error>([&] { later.get(kWait); }), "executor is closed");

  Future<int> at_once =
      make_ready_future(1).then(rejecting, [](Future<int> d) { return d.value(); });
  EXPECT_EQ(message_of<Error>([&] { at_once.get(kWait); }), "executor is closed");
}

TEST_F(FutureTest, ShutDownPoolFailsTheResult) {
  auto closed = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "gone"});
  closed->shutdown();
  Future<int> r = make_ready_future(1).then(closed, [](Future<int> d) { return d.value(); });
  EXPECT_EQ(message_of<Error>([&] { r.get(kWait); }), "thread pool 'gone' is shut down");
}

TEST_F(FutureTest, NullExecutorIsAnInvalidArgument) {
  Future<int> f;
  EXPECT_THROW(f.then(nullptr, [](Future<int>) { return 1; }), InvalidArgument);
  EXPECT_THROW(f.add_callback(nullptr, [](Future<int>) {}), InvalidArgument);
}

TEST_F(FutureTest, AddCallbackSeesTheCompletedFuture) {
  Future<int> f;
  CountdownLatch ran(2);
  std::atomic<int> value{0};
  std::atomic<bool> saw_error{false};
  f.add_callback(pool_, [&](Future<int> d) {
    value = d.value();
    ran.count_down();
  });
  Future<int> failing;
  failing.add_callback(pool_, [&](Future<int> d) {
    saw_error = d.has_error();
    ran.count_down();
  });
  f.set_value(8);
  failing.set_error(Error("x"));
  ASSERT_TRUE(ran.wait(kWait));
  EXPECT_EQ(value.load(), 8);
  EXPECT_TRUE(saw_error);
}

TEST_F(FutureTest, ThrowingOrRejectedCallbackIsLogged) {
  LogCapture log(/*errors_expected=*/2);
  make_ready_future(1).add_callback(pool_, [](Future<int>) { throw std::runtime_error("cb"); });
  make_ready_future(1).add_callback(std::make_shared<RejectingExecutor>("closed"),
                                    [](Future<int>) {});
  ASSERT_TRUE(log.wait_for_errors(kWait));
  std::string all;
  for (const std::string& line : log.lines())
    all += line;
  EXPECT_THAT(all, HasSubstr("a future callback threw: cb"));
  EXPECT_THAT(all, HasSubstr("the executor refused a future callback: closed"));
}

TEST_F(FutureTest, CollectAllGathersValuesInInputOrder) {
  std::vector<Future<int>> inputs(4);
  Future<std::vector<int>> all = collect_all(inputs);
  // Completed from another thread, in reverse order.
  std::thread completer([inputs]() mutable {
    for (int i = 3; i >= 0; --i)
      inputs[i].set_value(i * 10);
  });
  EXPECT_EQ(all.get(kWait), (std::vector<int>{0, 10, 20, 30}));
  completer.join();
}

TEST_F(FutureTest, CollectAllWaitsForEveryInputAndReportsTheLowestIndexedError) {
  std::vector<Future<int>> inputs(3);
  Future<std::vector<int>> all = collect_all(inputs);
  inputs[2].set_error(StoreError("third"));
  inputs[1].set_error(TimeoutError("second"));
  // Not done while input 0 is pending, even though it has already failed.
  EXPECT_FALSE(all.completed());
  inputs[0].set_value(0);
  EXPECT_EQ(message_of<TimeoutError>([&] { all.get(kWait); }), "second");
}

TEST_F(FutureTest, CollectAllOfNothingIsReadyAndEmpty) {
  Future<std::vector<int>> none = collect_all(std::vector<Future<int>>{});
  ASSERT_TRUE(none.completed());
  EXPECT_TRUE(none.value().empty());
  Future<void> none_void = collect_all(std::vector<Future<void>>{});
  EXPECT_TRUE(none_void.completed());
  none_void.value();
}

TEST_F(FutureTest, CollectAllOfVoidFutures) {
  std::vector<Future<void>> inputs(3);
  Future<void> all = collect_all(inputs);
  inputs[0].set_value();
  inputs[2].set_value();
  EXPECT_FALSE(all.completed());
  inputs[1].set_value();
  all.get(kWait);

  std::vector<Future<void>> failing(3);
  Future<void> failed = collect_all(failing);
  failing[2].set_error(Error("c"));
  failing[0].set_value();
  failing[1].set_error(NetworkError("b"));
  EXPECT_EQ(message_of<NetworkError>([&] { failed.get(kWait); }), "b");
}

TEST_F(FutureTest, CollectAllRejectsInvalidInputs) {
  Future<int> f;
  Future<int> g = std::move(f);
  EXPECT_THROW(collect_all(std::vector<Future<int>>{g, f}), InvalidArgument);
}

// Callbacks attached from many threads while another thread completes the future: each
// must run exactly once, whether it was attached before or after completion.
TEST_F(FutureTest, StressConcurrentAttachAndComplete) {
  constexpr int kAttachers = 8;
  constexpr int kPerAttacher = 400;
  constexpr int kTotal = kAttachers * kPerAttacher;
  Future<int> f;
  std::vector<std::atomic<int>> runs(kTotal);
  std::vector<Future<int>> thens(kTotal / 2);
  CountdownLatch all_ran(kTotal);
  std::atomic<int> wrong_values{0};
  std::latch start(kAttachers + 1);

  std::vector<std::thread> threads;
  for (int a = 0; a < kAttachers; ++a) {
    threads.emplace_back([&, a] {
      start.arrive_and_wait();
      for (int i = 0; i < kPerAttacher; ++i) {
        const int id = a * kPerAttacher + i;
        auto body = [&, id](Future<int> done) {
          if (done.value() != 7) wrong_values.fetch_add(1);
          runs[id].fetch_add(1);
          all_ran.count_down();
          return id;
        };
        // Half through then(), half through add_callback().
        if (id % 2 == 0) {
          thens[id / 2] = f.then(pool_, body);
        } else {
          f.add_callback(pool_, body);
        }
      }
    });
  }
  threads.emplace_back([&] {
    start.arrive_and_wait();
    f.set_value(7);
  });
  for (std::thread& thread : threads)
    thread.join();

  ASSERT_TRUE(all_ran.wait(kWait)) << all_ran.count() << " callbacks never ran";
  for (int id = 0; id < kTotal; ++id)
    EXPECT_EQ(runs[id].load(), 1) << "callback " << id;
  EXPECT_EQ(wrong_values.load(), 0);
  for (int i = 0; i < kTotal / 2; ++i)
    EXPECT_EQ(thens[i].get(kWait), 2 * i);
  // Every callback has run; none may run again.
  pool_->shutdown();
  for (int id = 0; id < kTotal; ++id)
    ASSERT_EQ(runs[id].load(), 1);
}

}  // namespace
}  // namespace gradwire

namespace gradwire {
namespace {

TEST(FutureDefaultTimeout, GetWithoutArgumentUsesTheProducersDefault) {
  Future<int> pending;
  EXPECT_EQ(pending.default_timeout(), kDefaultFutureTimeout);
  pending.set_default_timeout(std::chrono::milliseconds(20));
  Future<int> copy = pending;  // the default belongs to the shared state
  EXPECT_EQ(copy.default_timeout(), std::chrono::milliseconds(20));
  try {
    copy.get();
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("within 20 ms"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(copy.wait());
  pending.set_value(7);
  EXPECT_EQ(copy.get(), 7);
  Future<void> done;
  done.set_default_timeout(std::chrono::milliseconds(1));
  EXPECT_THROW(done.get(), TimeoutError);
}

TEST(FutureDefaultTimeout, NoTimeoutWaitsUntilCompletion) {
  EXPECT_EQ(deadline_after(kNoTimeout), std::chrono::steady_clock::time_point::max());
  const auto soon = deadline_after(std::chrono::milliseconds(5));
  EXPECT_LT(soon, std::chrono::steady_clock::now() + std::chrono::seconds(1));
  Future<int> f;
  f.set_default_timeout(kNoTimeout);
  test::CountdownLatch waiting{1};
  std::thread producer([&] {
    ASSERT_TRUE(waiting.wait(std::chrono::seconds(10)));
    f.set_value(3);
  });
  waiting.count_down();
  EXPECT_EQ(f.get(), 3);  // would throw TimeoutError if the wait had a deadline in the past
  EXPECT_TRUE(f.wait(kNoTimeout));
  producer.join();
}

// map_here_or_on: at once for a completed future; on the completing thread when that is one
// of the executor's own (inside its set_value); posted to the executor from any other
// thread; fn's exception and the executor's refusal become the result's error.
TEST(FutureMapHereOrOn, RunsWhereTheValueIsWithoutAHandOffWhenItCan) {
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 2, .name = "map"});
  thread_local bool in_set_value = false;
  auto where = [](const Future<int>& done) {
    return std::make_pair(done.value() * 2, in_set_value);
  };
  using Where = std::pair<int, bool>;
  // Completed already: at once, on this thread.
  Future<Where> now = detail::map_here_or_on<Where>(make_ready_future(1), pool, where);
  ASSERT_TRUE(now.completed());
  EXPECT_EQ(now.value().first, 2);
  // Completed by a pool worker: inside its set_value.
  Future<int> by_worker;
  Future<Where> on_worker = detail::map_here_or_on<Where>(by_worker, pool, where);
  pool->submit([by_worker]() mutable {
        in_set_value = true;
        by_worker.set_value(2);
        in_set_value = false;
      })
      .get(kWait);
  EXPECT_EQ(on_worker.get(kWait), Where(4, true));
  // Completed by another thread: posted to the pool, outside that set_value.
  Future<int> by_other;
  Future<Where> posted = detail::map_here_or_on<Where>(by_other, pool, where);
  std::thread other([by_other]() mutable {
    in_set_value = true;
    by_other.set_value(3);
    in_set_value = false;
  });
  other.join();
  EXPECT_EQ(posted.get(kWait), Where(6, false));
  // Errors: fn's own, and an executor that refuses.
  Future<int> fails = detail::map_here_or_on<int>(
      make_ready_future(1), pool,
      [](const Future<int>&) -> int { throw std::runtime_error("fn failed"); });
  EXPECT_EQ(message_of<std::runtime_error>([&] { fails.get(kWait); }), "fn failed");
  Future<int> refused_later;
  Future<int> refused =
      detail::map_here_or_on<int>(refused_later, std::make_shared<RejectingExecutor>("no room"),
                                  [](const Future<int>& d) { return d.value(); });
  std::thread([refused_later]() mutable { refused_later.set_value(5); }).join();
  EXPECT_EQ(message_of<Error>([&] { refused.get(kWait); }), "no room");
  pool->shutdown();
}

}  // namespace
}  // namespace gradwire
