#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "gradwire/core/check.h"
#include "gradwire/core/error.h"
#include "gradwire/core/error_kind_of.h"

namespace gradwire {
namespace {

using ::testing::HasSubstr;

TEST(ErrorTest, EachTypeReportsItsKindAndName) {
  EXPECT_EQ(Error("m").kind(), ErrorKind::kError);
  EXPECT_EQ(InvalidArgument("m").kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(TimeoutError("m").kind(), ErrorKind::kTimeout);
  EXPECT_EQ(NetworkError("m").kind(), ErrorKind::kNetwork);
  EXPECT_EQ(StoreError("m").kind(), ErrorKind::kStore);
  EXPECT_EQ(RemoteError("w", "T", "m").kind(), ErrorKind::kRemote);

  EXPECT_EQ(error_kind_name(ErrorKind::kError), "Error");
  EXPECT_EQ(error_kind_name(ErrorKind::kInvalidArgument), "InvalidArgument");
  EXPECT_EQ(error_kind_name(ErrorKind::kTimeout), "TimeoutError");
  EXPECT_EQ(error_kind_name(ErrorKind::kNetwork), "NetworkError");
  EXPECT_EQ(error_kind_name(ErrorKind::kStore), "StoreError");
  EXPECT_EQ(error_kind_name(ErrorKind::kRemote), "RemoteError");
}

TEST(ErrorTest, EveryErrorIsCaughtAsErrorAndRuntimeError) {
  auto caught_as_error = [](auto error) {
    try {
      throw error;
    } catch (const Error& e) {
      return std::string(e.what()) == "msg";
    }
    return false;
  };
  EXPECT_TRUE(caught_as_error(InvalidArgument("msg")));
  EXPECT_TRUE(caught_as_error(TimeoutError("msg")));
  EXPECT_TRUE(caught_as_error(NetworkError("msg")));
  EXPECT_TRUE(caught_as_error(StoreError("msg")));
  EXPECT_THROW(throw StoreError("x"), std::runtime_error);
}

TEST(ErrorTest, ThrowErrorRebuildsTheMatchingType) {
  EXPECT_THROW(throw_error(ErrorKind::kInvalidArgument, "m"), InvalidArgument);
  EXPECT_THROW(throw_error(ErrorKind::kTimeout, "m"), TimeoutError);
  EXPECT_THROW(throw_error(ErrorKind::kNetwork, "m"), NetworkError);
  EXPECT_THROW(throw_error(ErrorKind::kStore, "m"), StoreError);
  try {
    throw_error(ErrorKind::kTimeout, "waited 5 s");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "waited 5 s");
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  }
}

TEST(ErrorTest, ThrowErrorTurnsPlainAndRemoteKindsIntoError) {
  for (ErrorKind kind : {ErrorKind::kError, ErrorKind::kRemote}) {
    try {
      throw_error(kind, "lost detail");
      ADD_FAILURE() << "throw_error returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kError);
      EXPECT_STREQ(e.what(), "lost detail");
    }
  }
}

TEST(ErrorTest, RemoteErrorKeepsItsParts) {
  const RemoteError error("ps0", "InvalidArgument", "bad shape");
  EXPECT_EQ(error.worker(), "ps0");
  EXPECT_EQ(error.remote_type(), "InvalidArgument");
  EXPECT_EQ(error.remote_message(), "bad shape");
  EXPECT_STREQ(error.what(), "InvalidArgument on worker 'ps0': bad shape");
}

TEST(CheckTest, PassingCheckDoesNotThrow) {
  EXPECT_NO_THROW(GRADWIRE_CHECK(1 + 1 == 2) << "math");
  EXPECT_NO_THROW(GRADWIRE_CHECK_ARG(true) << "fine");
}

TEST(CheckTest, FailedCheckNamesConditionFileAndLine) {
  const int line = __LINE__ + 2;
  try {
    GRADWIRE_CHECK(2 < 1) << "detail " << 42;
    ADD_FAILURE() << "GRADWIRE_CHECK did not throw";
  } catch (const InvalidArgument&) {
    ADD_FAILURE() << "a broken invariant must not look like a bad argument";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kError);
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("internal check failed: (2 < 1)"));
    EXPECT_THAT(what, HasSubstr("error_test.cc:" + std::to_string(line)));
    EXPECT_THAT(what, HasSubstr("detail 42"));
  }
}

TEST(CheckTest, FailedArgumentCheckThrowsInvalidArgumentWithTheMessage) {
  try {
    GRADWIRE_CHECK_ARG(false) << "num_threads must be positive, got " << -3;
    ADD_FAILURE() << "GRADWIRE_CHECK_ARG did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "num_threads must be positive, got -3");
  }
}

TEST(CheckTest, ThrowMacroThrowsTheNamedType) {
  try {
    GRADWIRE_THROW(TimeoutError) << "waited " << 5 << " s";
    ADD_FAILURE() << "GRADWIRE_THROW did not throw";
  } catch (const TimeoutError& e) {
    EXPECT_STREQ(e.what(), "waited 5 s");
  }
}

TEST(CheckTest, MessageIsBuiltOnlyOnFailure) {
  int evaluations = 0;
  auto expensive = [&evaluations] {
    ++evaluations;
    return std::string("costly");
  };
  GRADWIRE_CHECK(true) << expensive();
  GRADWIRE_CHECK_ARG(true) << expensive();
  EXPECT_EQ(evaluations, 0);
  EXPECT_THROW(GRADWIRE_CHECK(false) << expensive(), Error);
  EXPECT_THROW(GRADWIRE_CHECK_ARG(false) << expensive(), InvalidArgument);
  EXPECT_EQ(evaluations, 2);
}

TEST(CheckTest, ConditionIsEvaluatedOnce) {
  int evaluations = 0;
  GRADWIRE_CHECK(++evaluations > 0);
  EXPECT_EQ(evaluations, 1);
}

TEST(CheckTest, CheckInsideIfElseKeepsTheElseBranch) {
  bool else_ran = false;
  const bool condition = false;
  if (condition)
    GRADWIRE_CHECK(false) << "never";
  else
    else_ran = true;
  EXPECT_TRUE(else_ran);
}

}  // namespace
}  // namespace gradwire

namespace gradwire {
namespace {

TEST(ErrorKindOf, NamesTheKindOfTheErrorHeld) {
  auto held = [](auto e) { return std::make_exception_ptr(e); };
  EXPECT_EQ(error_kind_of(held(TimeoutError("t"))), ErrorKind::kTimeout);
  EXPECT_EQ(error_kind_of(held(NetworkError("n"))), ErrorKind::kNetwork);
  EXPECT_EQ(error_kind_of(held(InvalidArgument("i"))), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind_of(held(std::runtime_error("r"))), ErrorKind::kError);
  EXPECT_EQ(error_kind_of(held(42)), ErrorKind::kError);
  EXPECT_EQ(error_kind_of(nullptr), ErrorKind::kError);
}

}  // namespace
}  // namespace gradwire
