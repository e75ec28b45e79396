#include "gradwire/core/trace.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "support/eventually.h"
#include "support/scoped_env.h"

namespace gradwire {
namespace {

namespace fs = std::filesystem;
using gradwire::testing::eventually;

// A fresh directory per test, removed afterwards; tracing is off and empty on both sides.
class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    trace::stop();
    trace::clear();
    dir_ = fs::temp_directory_path() /
           ("gradwire-trace-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    trace::stop();
    trace::clear();
    trace::set_directory("");
    fs::remove_all(dir_);
  }

  static nlohmann::json read_json(const std::string& path) {
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << path;
    return nlohmann::json::parse(in);
  }

  // The events of the file that are not metadata, by name.
  static std::vector<nlohmann::json> named(const nlohmann::json& file, const std::string& name) {
    std::vector<nlohmann::json> out;
    for (const auto& e : file.at("traceEvents")) {
      if (e.at("ph") != "M" && e.at("name") == name) out.push_back(e);
    }
    return out;
  }

  fs::path dir_;
};

TEST_F(TraceTest, DisabledRecordsNothing) {
  ASSERT_FALSE(trace::enabled());
  {
    trace::Span span("test.off", "test", trace::Arg("n", 1));
    EXPECT_FALSE(span.active());
  }
  trace::instant("test.off_instant", "test");
  trace::complete("test.off_complete", "test", 0, 10);
  const std::string path = (dir_ / "off.json").string();
  fs::create_directories(dir_);
  trace::write(path);
  const nlohmann::json file = read_json(path);
  for (const auto& e : file.at("traceEvents"))
    EXPECT_EQ(e.at("ph"), "M") << e.dump();
}

TEST_F(TraceTest, SpansFromSeveralThreadsAppearWithNamesArgsAndNesting) {
  trace::set_process_name("tracer");
  trace::start(dir_.string());
  ASSERT_TRUE(trace::enabled());
  constexpr int kThreads = 4;
  constexpr int kSpans = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kSpans; ++i) {
        trace::Span outer("test.outer", "test", trace::Arg("thread", t), trace::Arg("i", i));
        {
          trace::Span inner("test.inner", "test", trace::Arg("ratio", 0.5),
                            trace::Arg("kind", "static"));
          const trace::Text fn{"function", "a_function_name_longer_than_the_inline_buffer_of_48"};
          trace::instant("test.mark", "test", {trace::Arg("i", i)}, &fn);
        }
        outer.arg(trace::Arg("done", int64_t{1}));
      }
    });
  }
  for (auto& th : threads)
    th.join();
  const std::string path = trace::flush();
  EXPECT_EQ(path, (dir_ / "tracer.trace.json").string());
  const nlohmann::json file = read_json(path);
  EXPECT_EQ(file.at("displayTimeUnit"), "ns");
  EXPECT_EQ(file.at("otherData").at("process_name"), "tracer");
  EXPECT_TRUE(file.at("otherData").at("clock_sync").contains("steady_ns"));
  EXPECT_TRUE(file.at("otherData").at("clock_sync").contains("system_ns"));

  const auto outers = named(file, "test.outer");
  const auto inners = named(file, "test.inner");
  const auto marks = named(file, "test.mark");
  ASSERT_EQ(outers.size(), size_t{kThreads * kSpans});
  ASSERT_EQ(inners.size(), size_t{kThreads * kSpans});
  ASSERT_EQ(marks.size(), size_t{kThreads * kSpans});

  // Every thread has its own tid, named by a metadata event; the process is named too.
  std::map<int64_t, int> spans_per_tid;
  for (const auto& e : outers) {
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_EQ(e.at("cat"), "test");
    EXPECT_EQ(e.at("pid"), ::getpid());
    EXPECT_TRUE(e.at("ts").is_number_float());
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    EXPECT_EQ(e.at("args").at("done"), 1);
    ++spans_per_tid[e.at("tid").get<int64_t>()];
  }
  ASSERT_EQ(spans_per_tid.size(), size_t{kThreads});
  for (const auto& [tid, n] : spans_per_tid)
    EXPECT_EQ(n, kSpans);
  int thread_names = 0;
  bool process_named = false;
  for (const auto& e : file.at("traceEvents")) {
    if (e.at("ph") != "M") continue;
    if (e.at("name") == "thread_name" && spans_per_tid.count(e.at("tid").get<int64_t>()))
      ++thread_names;
    if (e.at("name") == "process_name") process_named = e.at("args").at("name") == "tracer";
  }
  EXPECT_EQ(thread_names, kThreads);
  EXPECT_TRUE(process_named);

  // Each inner span lies inside an outer span of its thread with the same index.
  std::map<std::pair<int64_t, int64_t>, nlohmann::json> outer_by;  // (tid, i)
  for (const auto& e : outers)
    outer_by[{e.at("tid").get<int64_t>(), e.at("args").at("i").get<int64_t>()}] = e;
  for (const auto& e : marks) {
    EXPECT_EQ(e.at("ph"), "i");
    const std::string fn = e.at("args").at("function");
    EXPECT_EQ(fn.size(), trace::kTextBytes - 1);
    EXPECT_EQ(fn, std::string("a_function_name_longer_than_the_inline_buffer_of_48")
                      .substr(0, trace::kTextBytes - 1));
    const auto& outer = outer_by.at({e.at("tid").get<int64_t>(), e.at("args").at("i")});
    const double ts = e.at("ts");
    EXPECT_GE(ts, outer.at("ts").get<double>());
    EXPECT_LE(ts, outer.at("ts").get<double>() + outer.at("dur").get<double>());
  }
  for (const auto& e : inners) {
    EXPECT_EQ(e.at("args").at("ratio"), 0.5);
    EXPECT_EQ(e.at("args").at("kind"), "static");
  }
}

TEST_F(TraceTest, AFullRingOverwritesTheOldestAndCountsThem) {
  trace::start();
  const size_t capacity = trace::ring_capacity();
  const size_t extra = 100;
  std::thread writer([&] {
    for (size_t i = 0; i < capacity + extra; ++i)
      trace::instant("test.fill", "test", {trace::Arg("i", static_cast<int64_t>(i))});
  });
  writer.join();
  trace::stop();
  EXPECT_EQ(trace::overwritten(), extra);
  fs::create_directories(dir_);
  const std::string path = (dir_ / "full.json").string();
  trace::write(path);
  const nlohmann::json file = read_json(path);
  const auto fills = named(file, "test.fill");
  ASSERT_EQ(fills.size(), capacity);
  // The oldest went: the first kept is number `extra`, in order.
  EXPECT_EQ(fills.front().at("args").at("i"), static_cast<int64_t>(extra));
  EXPECT_EQ(fills.back().at("args").at("i"), static_cast<int64_t>(capacity + extra - 1));
  EXPECT_EQ(file.at("otherData").at("overwritten_events"), extra);
}

TEST_F(TraceTest, FlushWhileThreadsRecordIsSafeAndEveryEventIsKeptOrCounted) {
  trace::start(dir_.string());
  std::atomic<bool> go{true};
  std::atomic<int64_t> recorded{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (go.load(std::memory_order_relaxed)) {
        trace::Span span("test.busy", "test", trace::Arg("n", recorded.load()));
        recorded.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  // Flush repeatedly while the threads record; each file must parse whole.
  for (int i = 0; i < 4; ++i) {
    const nlohmann::json file = read_json(trace::flush());
    EXPECT_TRUE(file.at("traceEvents").is_array());
  }
  go.store(false);
  for (auto& th : threads)
    th.join();
  trace::stop();
  const nlohmann::json file = read_json(trace::flush());
  const uint64_t kept = named(file, "test.busy").size();
  const uint64_t overwritten = file.at("otherData").at("overwritten_events");
  const uint64_t dropped = file.at("otherData").at("dropped_events");
  EXPECT_EQ(kept + overwritten + dropped, static_cast<uint64_t>(recorded.load()));
}

TEST_F(TraceTest, ScopedCaptureTurnsTracingOnForItsScope) {
  {
    trace::ScopedCapture capture;
    EXPECT_TRUE(trace::enabled());
    trace::instant("test.scoped", "test");
  }
  EXPECT_FALSE(trace::enabled());
  trace::instant("test.after", "test");
  fs::create_directories(dir_);
  const std::string path = (dir_ / "scoped.json").string();
  trace::write(path);
  const nlohmann::json file = read_json(path);
  EXPECT_EQ(named(file, "test.scoped").size(), 1u);
  EXPECT_TRUE(named(file, "test.after").empty());
}

TEST_F(TraceTest, BadPathsAreRefusedWithTheirName) {
  EXPECT_THROW(trace::write(""), InvalidArgument);
  try {
    trace::write((dir_ / "missing" / "x.json").string());
    FAIL() << "a file in a missing directory was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

// Run only as the child of the next test, with GRADWIRE_TRACE set: records one event and
// returns, so the process exits and writes its file.
TEST(TraceChild, DISABLED_RecordsAndExits) {
  ASSERT_TRUE(trace::enabled());
  trace::set_process_name("traced-child");
  trace::instant("test.child", "test", {trace::Arg("answer", 42)});
}

TEST_F(TraceTest, GradwireTraceMakesAProcessWriteItsFileAtExit) {
  const std::string self = fs::canonical("/proc/self/exe").string();
  // The child reads it as it loads; this process read it long ago.
  const test::ScopedEnv env({{"GRADWIRE_TRACE", dir_.c_str()}});
  std::vector<std::string> args = {self, "--gtest_filter=TraceChild.DISABLED_RecordsAndExits",
                                   "--gtest_also_run_disabled_tests"};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(self.c_str(), argv.data());
    ::_exit(127);
  }
  // Waits at most 30 s for the child, polling its exit.
  int status = 0;
  pid_t done = 0;
  eventually([&] { return (done = ::waitpid(pid, &status, WNOHANG)) != 0; },
             std::chrono::seconds(30));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the traced child did not exit within 30 s";
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  const nlohmann::json file = read_json((dir_ / "traced-child.trace.json").string());
  const auto events = named(file, "test.child");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].at("args").at("answer"), 42);
  EXPECT_EQ(file.at("otherData").at("process_name"), "traced-child");
  EXPECT_NE(file.at("otherData").at("pid"), ::getpid());
}

}  // namespace
}  // namespace gradwire
