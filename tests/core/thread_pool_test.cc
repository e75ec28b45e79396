#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_pool.h"
#include "support/log_capture.h"
#include "support/sync.h"

namespace gradwire {
namespace {

using test::CountdownLatch;
using test::LogCapture;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr std::chrono::milliseconds kWait{10'000};

std::string current_thread_name() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

TEST(ThreadPoolTest, SubmitReturnsTheResult) {
  ThreadPool pool({.num_threads = 2, .name = "results"});
  Future<int> answer = pool.submit([] { return 6 * 7; });
  Future<std::string> text = pool.submit([] { return std::string("hello"); });
  EXPECT_EQ(answer.get(kWait), 42);
  EXPECT_EQ(text.get(kWait), "hello");
  EXPECT_EQ(pool.name(), "results");
  EXPECT_EQ(pool.num_threads(), 2);
}

TEST(ThreadPoolTest, SubmitOfVoidFunctionCompletesAfterItRan) {
  ThreadPool pool({.num_threads = 1});
  std::atomic<bool> ran{false};
  Future<void> done = pool.submit([&ran] { ran = true; });
  done.get(kWait);
  EXPECT_TRUE(ran);
}

TEST(ThreadPoolTest, SubmitAcceptsMoveOnlyCallables) {
  ThreadPool pool({.num_threads = 1});
  auto owned = std::make_unique<int>(5);
  Future<int> result = pool.submit([owned = std::move(owned)] { return *owned + 1; });
  EXPECT_EQ(result.get(kWait), 6);
}

TEST(ThreadPoolTest, ExceptionInSubmittedTaskBecomesTheFuturesError) {
  ThreadPool pool({.num_threads = 1});
  Future<int> failed = pool.submit([]() -> int { throw TimeoutError("took too long"); });
  ASSERT_TRUE(failed.wait(kWait));
  EXPECT_TRUE(failed.has_error());
  EXPECT_THROW(failed.get(kWait), TimeoutError);
  // The worker survived and keeps serving.
  EXPECT_EQ(pool.submit([] { return 1; }).get(kWait), 1);
}

TEST(ThreadPoolTest, ExceptionInExecutedTaskIsLoggedAndTheWorkerGoesOn) {
  LogCapture log(/*errors_expected=*/2);
  ThreadPool pool({.num_threads = 1, .name = "loud"});
  pool.execute([] { throw std::runtime_error("boom"); });
  pool.execute([] { throw 42; });
  ASSERT_TRUE(log.wait_for_errors(kWait));
  EXPECT_EQ(pool.submit([] { return 7; }).get(kWait), 7);
  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("ERROR"));
  EXPECT_THAT(lines[0], HasSubstr("thread pool 'loud': a task threw: boom"));
  EXPECT_THAT(lines[1], HasSubstr("thread pool 'loud': a task threw a non-std::exception"));
}

TEST(ThreadPoolTest, TasksRunOnNamedWorkerThreads) {
  ThreadPool pool({.num_threads = 3, .name = "worker"});
  const std::thread::id caller = std::this_thread::get_id();
  Future<std::string> name = pool.submit([] { return current_thread_name(); });
  Future<bool> elsewhere = pool.submit([caller] { return std::this_thread::get_id() != caller; });
  EXPECT_THAT(name.get(kWait), MatchesRegex("worker-[0-2]"));
  EXPECT_TRUE(elsewhere.get(kWait));
}

TEST(ThreadPoolTest, LongNamesAreCutToFifteenCharactersKeepingTheIndex) {
  ThreadPool pool({.num_threads = 1, .name = "averyveryverylongpoolname"});
  EXPECT_EQ(pool.submit([] { return current_thread_name(); }).get(kWait), "averyveryvery-0");
}

TEST(ThreadPoolTest, OptionsAreValidated) {
  for (int bad : {0, -1, 1025}) {
    try {
      ThreadPool pool({.num_threads = bad});
      ADD_FAILURE() << "accepted num_threads " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                "ThreadPoolOptions.num_threads must be in [1, 1024], got " + std::to_string(bad));
    }
  }
  EXPECT_THROW(ThreadPool({.num_threads = 1, .name = ""}), InvalidArgument);
  EXPECT_NO_THROW(ThreadPool({.num_threads = 1}));
}

TEST(ThreadPoolTest, ShutdownRunsEverythingAlreadyQueued) {
  ThreadPool pool({.num_threads = 1});
  CountdownLatch gate(1);
  std::atomic<int> ran{0};
  // The gate keeps the single worker busy, so the rest is still queued at shutdown.
  pool.execute([&gate] { gate.wait(kWait); });
  constexpr int kTasks = 500;
  for (int i = 0; i < kTasks; ++i)
    pool.execute([&ran] { ran.fetch_add(1); });
  gate.count_down();
  pool.shutdown();
  EXPECT_EQ(ran.load(), kTasks);
}

TEST(ThreadPoolTest, WorkAfterShutdownIsRejected) {
  ThreadPool pool({.num_threads = 2, .name = "closed"});
  pool.shutdown();
  try {
    pool.execute([] {});
    ADD_FAILURE() << "execute after shutdown did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "thread pool 'closed' is shut down");
  }
  Future<int> rejected = pool.submit([] { return 1; });
  ASSERT_TRUE(rejected.completed());
  try {
    rejected.get(kWait);
    ADD_FAILURE() << "submit after shutdown did not fail";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "thread pool 'closed' is shut down");
  }
}

TEST(ThreadPoolTest, ShutdownIsIdempotentAndSafeFromSeveralThreads) {
  ThreadPool pool({.num_threads = 2});
  std::vector<std::thread> closers;
  for (int i = 0; i < 3; ++i)
    closers.emplace_back([&pool] { pool.shutdown(); });
  for (std::thread& closer : closers)
    closer.join();
  pool.shutdown();
  EXPECT_THROW(pool.execute([] {}), Error);
}

TEST(ThreadPoolTest, EmptyTaskIsAnInvalidArgument) {
  ThreadPool pool({.num_threads = 1});
  EXPECT_THROW(pool.execute(std::function<void()>()), InvalidArgument);
}

TEST(ThreadPoolTest, ManyProducersSubmitConcurrently) {
  ThreadPool pool({.num_threads = 4});
  static constexpr int kProducers = 8;
  static constexpr int kTasksEach = 500;
  std::atomic<int> ran{0};
  std::vector<std::vector<Future<int>>> futures(kProducers);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kTasksEach; ++i) {
        futures[p].push_back(pool.submit([&ran, p, i] {
          ran.fetch_add(1);
          return p * kTasksEach + i;
        }));
      }
    });
  }
  for (std::thread& producer : producers)
    producer.join();
  for (int p = 0; p < kProducers; ++p) {
    for (int i = 0; i < kTasksEach; ++i)
      EXPECT_EQ(futures[p][i].get(kWait), p * kTasksEach + i);
  }
  EXPECT_EQ(ran.load(), kProducers * kTasksEach);
}

// Each round needs every worker at once (a task returns only when all have started), so a
// worker left parked with a task waiting, or a wake-up lost between a worker listing itself
// idle and a task arriving, makes a round fail instead of passing slowly.
TEST(ThreadPoolTest, EveryParkedWorkerIsWokenWhenTasksArrive) {
  static constexpr int kWorkers = 4;
  static constexpr int kRounds = 200;
  ThreadPool pool({.num_threads = kWorkers, .name = "park"});
  for (int round = 0; round < kRounds; ++round) {
    CountdownLatch started(kWorkers);
    std::vector<Future<bool>> all;
    for (int i = 0; i < kWorkers; ++i) {
      all.push_back(pool.submit([&started] {
        started.count_down();
        return started.wait(kWait);
      }));
    }
    for (Future<bool>& f : all)
      ASSERT_TRUE(f.get(kWait)) << "round " << round;
  }
  // Workers parked between rounds are woken by shutdown, which joins them all.
  pool.shutdown();
  EXPECT_THROW(pool.execute([] {}), Error);
}

// A burst of tasks wakes one parked worker, which wakes the next when it finds more queued
// (and so on): here a task queues one task per other worker and then waits until all of
// them run at once, which only works if the chain of wake-ups reaches every worker. Also
// from outside the pool, with every worker parked, and with bursts larger than the pool.
TEST(ThreadPoolTest, ABurstOfTasksReachesEveryWorkerThroughAChainOfWakeUps) {
  static constexpr int kWorkers = 6;
  ThreadPool pool({.num_threads = kWorkers, .name = "burst"});
  for (int round = 0; round < 50; ++round) {
    // Shared: the tasks may still be leaving wait() when the next round begins.
    auto started = std::make_shared<CountdownLatch>(kWorkers);
    Future<bool> poster = pool.submit([&pool, started] {
      for (int i = 1; i < kWorkers; ++i) {
        pool.execute([started] {
          started->count_down();
          started->wait(kWait);
        });
      }
      started->count_down();
      return started->wait(kWait);
    });
    ASSERT_TRUE(poster.get(kWait)) << "round " << round;
  }
  for (int round = 0; round < 50; ++round) {
    static constexpr int kTasks = 3 * kWorkers;
    CountdownLatch started(kWorkers);
    std::atomic<int> ran{0};
    std::vector<Future<bool>> all;
    for (int i = 0; i < kTasks; ++i) {
      // The first kWorkers wait for each other; the rest only count.
      all.push_back(pool.submit([&started, &ran, i] {
        ran.fetch_add(1);
        if (i >= kWorkers) return true;
        started.count_down();
        return started.wait(kWait);
      }));
    }
    for (Future<bool>& f : all)
      ASSERT_TRUE(f.get(kWait)) << "round " << round;
    EXPECT_EQ(ran.load(), kTasks);
  }
}

TEST(ThreadPoolTest, ShutdownFromInsideATaskDoesNotDeadlock) {
  ThreadPool pool({.num_threads = 2});
  Future<void> done = pool.submit([&pool] { pool.shutdown(); });
  done.get(kWait);
  EXPECT_THROW(pool.execute([] {}), Error);
  pool.shutdown();  // from outside: joins the workers
}

TEST(ThreadPoolTest, LastReferenceDroppedOnAWorkerThread) {
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 2});
  std::weak_ptr<ThreadPool> weak = pool;
  CountdownLatch released(1);
  std::shared_ptr<ThreadPool> keep = pool;
  Future<bool> destroyed = pool->submit([keep = std::move(keep), &released, weak]() mutable {
    released.wait(kWait);
    keep.reset();  // the last reference: ~ThreadPool runs here, on its own worker
    return weak.expired();
  });
  pool.reset();
  released.count_down();
  EXPECT_TRUE(destroyed.get(kWait));
}

}  // namespace
}  // namespace gradwire

namespace gradwire {
namespace {

TEST(ThreadPoolShutdownNow, DiscardsTheQueueAndBoundsTheWaitForRunningTasks) {
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "now"});
  // Shared with the task, which outlives shutdown_now on its detached worker: nothing it
  // touches may live on this test's stack once the test returns.
  struct Shared {
    test::CountdownLatch entered{1}, release{1}, finished{1};
    std::atomic<int> later_runs{0};
    std::atomic<bool> on_worker{false};
  };
  auto shared = std::make_shared<Shared>();
  std::weak_ptr<ThreadPool> weak_pool = pool;
  pool->execute([shared, weak_pool] {
    if (auto p = weak_pool.lock()) shared->on_worker = p->is_worker_thread();
    shared->entered.count_down();
    EXPECT_TRUE(shared->release.wait(std::chrono::seconds(20)));
    shared->finished.count_down();
  });
  ASSERT_TRUE(shared->entered.wait(std::chrono::seconds(10)));
  pool->execute([shared] { ++shared->later_runs; });
  pool->execute([shared] { ++shared->later_runs; });
  EXPECT_FALSE(pool->is_worker_thread());
  // The running task never returns within the bound: shutdown_now leaves it and returns.
  EXPECT_EQ(pool->shutdown_now(std::chrono::milliseconds(50)), 2u);
  EXPECT_THROW(pool->execute([] {}), Error);
  shared->release.count_down();
  pool.reset();  // the detached worker finishes on its own state
  EXPECT_TRUE(shared->finished.wait(std::chrono::seconds(10)));
  EXPECT_TRUE(shared->on_worker);
  EXPECT_EQ(shared->later_runs, 0);
}

TEST(ThreadPoolShutdownNow, JoinsWorkersThatFinishInTime) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "now2"});
  std::atomic<int> runs{0};
  Future<void> done = pool.submit([&] { ++runs; });
  done.get(std::chrono::seconds(10));
  EXPECT_EQ(pool.shutdown_now(std::chrono::seconds(10)), 0u);
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace gradwire
