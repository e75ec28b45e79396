#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"

namespace gradwire {
namespace {

using ::testing::AllOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

struct CapturedLine {
  LogLevel level;
  std::string text;
};

// Installs a capturing sink and restores the previous sink and level afterwards.
class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_level_ = log_level();
    saved_sink_ = set_log_sink([this](LogLevel level, std::string_view line) {
      MutexLock lock(mutex_);
      lines_.push_back({level, std::string(line)});
    });
  }
  void TearDown() override {
    set_log_sink(saved_sink_);
    set_log_level(saved_level_);
  }
  std::vector<CapturedLine> lines() {
    MutexLock lock(mutex_);
    return lines_;
  }

 private:
  LogLevel saved_level_ = LogLevel::kWarning;
  LogSink saved_sink_;
  Mutex mutex_;
  std::vector<CapturedLine> lines_ GRADWIRE_GUARDED_BY(mutex_);
};

// Sets or unsets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST_F(LoggingTest, LinesBelowTheThresholdAreDropped) {
  set_log_level(LogLevel::kWarning);
  GRADWIRE_LOG(kDebug) << "debug";
  GRADWIRE_LOG(kInfo) << "info";
  GRADWIRE_LOG(kWarning) << "warning";
  GRADWIRE_LOG(kError) << "error";
  const std::vector<CapturedLine> got = lines();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].level, LogLevel::kWarning);
  EXPECT_THAT(got[0].text, HasSubstr("] warning\n"));
  EXPECT_EQ(got[1].level, LogLevel::kError);
  EXPECT_THAT(got[1].text, HasSubstr("] error\n"));
}

TEST_F(LoggingTest, DebugThresholdLetsEverythingThrough) {
  set_log_level(LogLevel::kDebug);
  EXPECT_EQ(log_level(), LogLevel::kDebug);
  GRADWIRE_LOG(kDebug) << "d";
  GRADWIRE_LOG(kInfo) << "i";
  EXPECT_EQ(lines().size(), 2u);
  EXPECT_TRUE(log_enabled(LogLevel::kDebug));
}

TEST_F(LoggingTest, OffSilencesEveryLevel) {
  set_log_level(LogLevel::kOff);
  GRADWIRE_LOG(kError) << "error";
  EXPECT_TRUE(lines().empty());
  EXPECT_FALSE(log_enabled(LogLevel::kError));
  EXPECT_FALSE(log_enabled(LogLevel::kOff));
}

TEST_F(LoggingTest, DisabledStatementDoesNotEvaluateItsOperands) {
  set_log_level(LogLevel::kError);
  int evaluations = 0;
  auto expensive = [&evaluations] { return ++evaluations; };
  GRADWIRE_LOG(kInfo) << expensive();
  EXPECT_EQ(evaluations, 0);
  GRADWIRE_LOG(kError) << expensive();
  EXPECT_EQ(evaluations, 1);
}

TEST_F(LoggingTest, LineCarriesTimestampLevelThreadAndLocation) {
  set_log_level(LogLevel::kInfo);
  const int line = __LINE__ + 1;
  GRADWIRE_LOG(kInfo) << "worker " << 3 << " joined";
  const std::vector<CapturedLine> got = lines();
  ASSERT_EQ(got.size(), 1u);
  const std::string& text = got[0].text;
  EXPECT_THAT(text,
              MatchesRegex("\\[gradwire [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\."
                           "[0-9]{6}Z INFO tid=[0-9]+ logging_test\\.cc:[0-9]+\\] worker 3 "
                           "joined\n"));
  EXPECT_THAT(text, HasSubstr("logging_test.cc:" + std::to_string(line) + "]"));
}

TEST_F(LoggingTest, MessageWithTrailingNewlineGetsNoSecondOne) {
  GRADWIRE_LOG(kError) << "already terminated\n";
  const std::vector<CapturedLine> got = lines();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_THAT(got[0].text, EndsWith("already terminated\n"));
  EXPECT_THAT(got[0].text, ::testing::Not(EndsWith("\n\n")));
}

TEST_F(LoggingTest, LogInsideIfElseKeepsTheElseBranch) {
  bool else_ran = false;
  const bool condition = false;
  if (condition)
    GRADWIRE_LOG(kError) << "never";
  else
    else_ran = true;
  EXPECT_TRUE(else_ran);
  EXPECT_TRUE(lines().empty());
}

TEST_F(LoggingTest, LinesFromManyThreadsArriveWhole) {
  set_log_level(LogLevel::kInfo);
  constexpr int kThreads = 4;
  constexpr int kLines = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i)
        GRADWIRE_LOG(kInfo) << "thread " << t << " line " << i;
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  const std::vector<CapturedLine> got = lines();
  ASSERT_EQ(got.size(), static_cast<size_t>(kThreads * kLines));
  for (const CapturedLine& line : got) {
    EXPECT_THAT(line.text, MatchesRegex(".*\\] thread [0-9] line [0-9]+\n"));
  }
}

TEST_F(LoggingTest, SetLogSinkReturnsThePreviousSink) {
  int calls = 0;
  LogSink mine = [&calls](LogLevel, std::string_view) { ++calls; };
  LogSink capturing = set_log_sink(mine);
  ASSERT_TRUE(capturing);
  GRADWIRE_LOG(kError) << "to mine";
  LogSink returned = set_log_sink(capturing);
  ASSERT_TRUE(returned);
  returned(LogLevel::kError, "direct");
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(lines().empty());
}

TEST_F(LoggingTest, DefaultSinkWritesOneLineToStderr) {
  set_log_sink(nullptr);
  ::testing::internal::CaptureStderr();
  GRADWIRE_LOG(kError) << "to stderr";
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err,
              AllOf(StartsWith("[gradwire "), HasSubstr(" ERROR tid="), EndsWith("] to stderr\n")));
}

TEST(LogLevelTest, NamesAreUpperCase) {
  EXPECT_EQ(log_level_name(LogLevel::kDebug), "DEBUG");
  EXPECT_EQ(log_level_name(LogLevel::kInfo), "INFO");
  EXPECT_EQ(log_level_name(LogLevel::kWarning), "WARNING");
  EXPECT_EQ(log_level_name(LogLevel::kError), "ERROR");
  EXPECT_EQ(log_level_name(LogLevel::kOff), "OFF");
}

TEST(LogLevelTest, ParsesEveryLevelInAnyCase) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("INFO"), LogLevel::kInfo);
  EXPECT_EQ(parse_log_level("Warning"), LogLevel::kWarning);
  EXPECT_EQ(parse_log_level(" error "), LogLevel::kError);
  EXPECT_EQ(parse_log_level("oFF"), LogLevel::kOff);
}

TEST(LogLevelTest, RejectsUnknownLevelNamingTheVariableAndChoices) {
  try {
    parse_log_level("verbose");
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "GRADWIRE_LOG_LEVEL=\"verbose\" is invalid: expected one of debug, info, "
                 "warning, error, off");
  }
  EXPECT_THROW(parse_log_level("warn"), InvalidArgument);
  EXPECT_THROW(parse_log_level(""), InvalidArgument);
}

TEST_F(LoggingTest, EnvironmentLevelIsReadWithWarningAsDefault) {
  {
    ScopedEnv env("GRADWIRE_LOG_LEVEL", nullptr);
    EXPECT_EQ(log_level_from_env(), LogLevel::kWarning);
  }
  {
    ScopedEnv env("GRADWIRE_LOG_LEVEL", "");
    EXPECT_EQ(log_level_from_env(), LogLevel::kWarning);
  }
  {
    ScopedEnv env("GRADWIRE_LOG_LEVEL", "DEBUG");
    EXPECT_EQ(log_level_from_env(), LogLevel::kDebug);
  }
  {
    ScopedEnv env("GRADWIRE_LOG_LEVEL", "off");
    EXPECT_EQ(log_level_from_env(), LogLevel::kOff);
  }
  EXPECT_TRUE(lines().empty());
}

TEST_F(LoggingTest, BadEnvironmentLevelWarnsOnceAndFallsBackToWarning) {
  // The warning is written even when the program has silenced logging.
  set_log_level(LogLevel::kOff);
  ScopedEnv env("GRADWIRE_LOG_LEVEL", "loud");
  EXPECT_EQ(log_level_from_env(), LogLevel::kWarning);
  const std::vector<CapturedLine> got = lines();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].level, LogLevel::kWarning);
  EXPECT_THAT(got[0].text, HasSubstr("GRADWIRE_LOG_LEVEL=\"loud\" is invalid"));
  EXPECT_THAT(got[0].text, HasSubstr("using WARNING"));
}

// The process-wide level is read from the environment once, on first use; these run in a
// fresh process (threadsafe death tests re-execute the binary) to see that first use.
TEST(LoggingEnvDeathTest, FirstUseReadsTheEnvironmentOnce) {
  ScopedEnv env("GRADWIRE_LOG_LEVEL", "info");
  EXPECT_EXIT(
      {
        const bool first = log_level() == LogLevel::kInfo;
        ::setenv("GRADWIRE_LOG_LEVEL", "error", 1);
        const bool kept = log_level() == LogLevel::kInfo;
        std::exit(first && kept ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(LoggingEnvDeathTest, BadEnvironmentValueWarnsOnStderrAndUsesWarning) {
  ScopedEnv env("GRADWIRE_LOG_LEVEL", "bogus");
  EXPECT_EXIT(
      {
        const bool ok = log_level() == LogLevel::kWarning && !log_enabled(LogLevel::kInfo) &&
                        log_enabled(LogLevel::kWarning);
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "WARNING tid=[0-9]+ logging\\.cc:[0-9]+\\] GRADWIRE_LOG_LEVEL=\"bogus\" is invalid");
}

TEST(LoggingEnvDeathTest, ProgramLevelSetBeforeFirstUseWinsOverTheEnvironment) {
  ScopedEnv env("GRADWIRE_LOG_LEVEL", "debug");
  EXPECT_EXIT(
      {
        set_log_level(LogLevel::kError);
        std::exit(log_level() == LogLevel::kError ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gradwire
