#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/core/env.h"
#include "gradwire/core/error.h"

namespace gradwire {
namespace {

using std::chrono::milliseconds;

// Sets or unsets one variable for a scope; every test uses its own name, so tests do not
// depend on the environment they run in.
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

// The message of the InvalidArgument that fn throws, or a note that it threw nothing.
template <typename F>
std::string error_of(F fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no InvalidArgument thrown>";
}

TEST(ParseIntTest, AcceptsDecimalWithOptionalSignAndSpaces) {
  EXPECT_EQ(parse_int("N", "8"), 8);
  EXPECT_EQ(parse_int("N", "-3"), -3);
  EXPECT_EQ(parse_int("N", "+4"), 4);
  EXPECT_EQ(parse_int("N", "  12\t"), 12);
  EXPECT_EQ(parse_int("N", "0"), 0);
  EXPECT_EQ(parse_int("N", "9223372036854775807"), INT64_MAX);
  EXPECT_EQ(parse_int("N", "-9223372036854775808"), INT64_MIN);
}

TEST(ParseIntTest, RangeIsInclusive) {
  EXPECT_EQ(parse_int("N", "1", 1, 1024), 1);
  EXPECT_EQ(parse_int("N", "1024", 1, 1024), 1024);
  EXPECT_THROW(parse_int("N", "0", 1, 1024), InvalidArgument);
  EXPECT_THROW(parse_int("N", "1025", 1, 1024), InvalidArgument);
}

TEST(ParseIntTest, RejectsMalformedText) {
  for (const char* text :
       {"", "  ", "abc", "8x", "x8", "1.5", "+-4", "--4", "+", "-", "1 2", "0x10", "1e3"}) {
    EXPECT_THROW(parse_int("N", text), InvalidArgument) << "text: '" << text << "'";
  }
}

TEST(ParseIntTest, ErrorNamesVariableValueAndExpectation) {
  EXPECT_EQ(error_of([] { parse_int("GRADWIRE_NUM_THREADS", "many", 1, 1024); }),
            "GRADWIRE_NUM_THREADS=\"many\" is invalid: expected an integer in [1, 1024]");
  EXPECT_EQ(error_of([] { parse_int("GRADWIRE_NUM_THREADS", "0", 1, 1024); }),
            "GRADWIRE_NUM_THREADS=\"0\" is invalid: expected an integer in [1, 1024]");
  EXPECT_EQ(error_of([] { parse_int("N", "x"); }), "N=\"x\" is invalid: expected an integer");
  EXPECT_EQ(error_of([] { parse_int("N", "-1", 0); }),
            "N=\"-1\" is invalid: expected an integer >= 0");
  EXPECT_EQ(error_of([] { parse_int("N", "7", INT64_MIN, 5); }),
            "N=\"7\" is invalid: expected an integer <= 5");
  EXPECT_EQ(error_of([] { parse_int("N", "99999999999999999999"); }),
            "N=\"99999999999999999999\" is invalid: expected an integer (value out of range)");
}

TEST(ParseIntTest, EmptyRangeIsAnInvalidArgument) {
  EXPECT_EQ(error_of([] { parse_int("N", "1", 5, 1); }), "range for N is empty: min 5 > max 1");
}

TEST(ParseBoolTest, AcceptsEveryDocumentedSpellingInAnyCase) {
  for (const char* text : {"1", "true", "TRUE", "yes", "Yes", "on", "ON", " true "}) {
    EXPECT_TRUE(parse_bool("B", text)) << text;
  }
  for (const char* text : {"0", "false", "False", "no", "NO", "off", "oFf", "\t0"}) {
    EXPECT_FALSE(parse_bool("B", text)) << text;
  }
}

TEST(ParseBoolTest, RejectsAnythingElse) {
  for (const char* text : {"", "2", "y", "n", "truee", "enable", "-1", "o"}) {
    EXPECT_THROW(parse_bool("B", text), InvalidArgument) << text;
  }
  EXPECT_EQ(error_of([] { parse_bool("GRADWIRE_TRACE", "maybe"); }),
            "GRADWIRE_TRACE=\"maybe\" is invalid: expected a boolean (1/0, true/false, yes/no, "
            "on/off)");
}

TEST(ParseDoubleTest, AcceptsDecimalAndScientific) {
  EXPECT_DOUBLE_EQ(parse_double("D", "0.5"), 0.5);
  EXPECT_DOUBLE_EQ(parse_double("D", "1e-3"), 1e-3);
  EXPECT_DOUBLE_EQ(parse_double("D", "-2"), -2.0);
  EXPECT_DOUBLE_EQ(parse_double("D", "+2.5"), 2.5);
  EXPECT_DOUBLE_EQ(parse_double("D", " 3 "), 3.0);
  EXPECT_DOUBLE_EQ(parse_double("D", "1", 0, 1), 1.0);
}

TEST(ParseDoubleTest, RejectsMalformedNonFiniteAndOutOfRange) {
  for (const char* text : {"", "abc", "1.2.3", "nan", "inf", "-inf", "1e999", "0.5x", ".", "+"}) {
    EXPECT_THROW(parse_double("D", text), InvalidArgument) << text;
  }
  EXPECT_EQ(error_of([] { parse_double("GRADWIRE_RATIO", "1.5", 0, 1); }),
            "GRADWIRE_RATIO=\"1.5\" is invalid: expected a finite number in [0, 1]");
  EXPECT_EQ(error_of([] { parse_double("D", "x"); }),
            "D=\"x\" is invalid: expected a finite number");
  EXPECT_THROW(parse_double("D", "1", 2, 1), InvalidArgument);
}

TEST(ParseDurationTest, AcceptsUnitsAndBareMilliseconds) {
  EXPECT_EQ(parse_duration_ms("T", "500ms"), milliseconds(500));
  EXPECT_EQ(parse_duration_ms("T", "2s"), milliseconds(2000));
  EXPECT_EQ(parse_duration_ms("T", "1m"), milliseconds(60'000));
  EXPECT_EQ(parse_duration_ms("T", "1h"), milliseconds(3'600'000));
  EXPECT_EQ(parse_duration_ms("T", "250"), milliseconds(250));
  EXPECT_EQ(parse_duration_ms("T", "0"), milliseconds(0));
  EXPECT_EQ(parse_duration_ms("T", " 7s "), milliseconds(7000));
}

TEST(ParseDurationTest, RejectsOtherForms) {
  for (const char* text : {"", "ms", "s5", "-5", "-5ms", "1.5s", "5 s", "5sec", "5S", "5us", "5d",
                           "+5", "99999999999999999999", "9999999999999999h"}) {
    EXPECT_THROW(parse_duration_ms("T", text), InvalidArgument) << text;
  }
  EXPECT_EQ(error_of([] { parse_duration_ms("GRADWIRE_RPC_TIMEOUT", "soon"); }),
            "GRADWIRE_RPC_TIMEOUT=\"soon\" is invalid: expected a duration such as 500ms, 2s, "
            "1m, 1h or a whole number of milliseconds");
  EXPECT_THAT(error_of([] { parse_duration_ms("T", "9999999999999999h"); }),
              ::testing::EndsWith("(value out of range)"));
}

TEST(ParseChoiceTest, ReturnsTheAllowedSpellingForAnyCase) {
  const std::vector<std::string> allowed = {"gloo", "nccl", "TCP"};
  EXPECT_EQ(parse_choice("B", "gloo", allowed), "gloo");
  EXPECT_EQ(parse_choice("B", "NCCL", allowed), "nccl");
  EXPECT_EQ(parse_choice("B", " tcp ", allowed), "TCP");
}

TEST(ParseChoiceTest, RejectsOthersListingTheChoices) {
  EXPECT_EQ(error_of([] {
              parse_choice("GRADWIRE_BACKEND", "mpi", {"gloo", "nccl"});
            }),
            "GRADWIRE_BACKEND=\"mpi\" is invalid: expected one of gloo, nccl");
  EXPECT_THROW(parse_choice("B", "", {"a"}), InvalidArgument);
  EXPECT_THROW(parse_choice("B", "glo", {"gloo"}), InvalidArgument);
  EXPECT_EQ(error_of([] { parse_choice("B", "a", {}); }), "no allowed values given for B");
}

TEST(EnvTest, RawDistinguishesUnsetFromEmpty) {
  {
    ScopedEnv env("GRADWIRE_TEST_RAW", nullptr);
    EXPECT_EQ(env_raw("GRADWIRE_TEST_RAW"), std::nullopt);
  }
  {
    ScopedEnv env("GRADWIRE_TEST_RAW", "");
    EXPECT_EQ(env_raw("GRADWIRE_TEST_RAW"), std::string());
  }
  {
    ScopedEnv env("GRADWIRE_TEST_RAW", " x ");
    EXPECT_EQ(env_raw("GRADWIRE_TEST_RAW"), std::string(" x "));
  }
}

TEST(EnvTest, StringReturnsValueAsIsOrDefault) {
  {
    ScopedEnv env("GRADWIRE_TEST_STRING", nullptr);
    EXPECT_EQ(env_string("GRADWIRE_TEST_STRING", "dflt"), "dflt");
  }
  {
    ScopedEnv env("GRADWIRE_TEST_STRING", "");
    EXPECT_EQ(env_string("GRADWIRE_TEST_STRING", "dflt"), "dflt");
  }
  {
    ScopedEnv env("GRADWIRE_TEST_STRING", " trainer0 ");
    EXPECT_EQ(env_string("GRADWIRE_TEST_STRING", "dflt"), " trainer0 ");
  }
}

TEST(EnvTest, UnsetEmptyOrBlankGivesTheDefault) {
  for (const char* value : {static_cast<const char*>(nullptr), "", "   "}) {
    ScopedEnv env("GRADWIRE_TEST_TYPED", value);
    EXPECT_EQ(env_int("GRADWIRE_TEST_TYPED", -1, 1, 10), -1);
    EXPECT_TRUE(env_bool("GRADWIRE_TEST_TYPED", true));
    EXPECT_DOUBLE_EQ(env_double("GRADWIRE_TEST_TYPED", 0.25), 0.25);
    EXPECT_EQ(env_duration_ms("GRADWIRE_TEST_TYPED", std::chrono::seconds(3)), milliseconds(3000));
    EXPECT_EQ(env_choice("GRADWIRE_TEST_TYPED", "gloo", {"gloo", "nccl"}), "gloo");
  }
}

TEST(EnvTest, SetValuesAreParsed) {
  {
    ScopedEnv env("GRADWIRE_TEST_INT", "16");
    EXPECT_EQ(env_int("GRADWIRE_TEST_INT", 4, 1, 1024), 16);
  }
  {
    ScopedEnv env("GRADWIRE_TEST_BOOL", "off");
    EXPECT_FALSE(env_bool("GRADWIRE_TEST_BOOL", true));
  }
  {
    ScopedEnv env("GRADWIRE_TEST_DOUBLE", "0.75");
    EXPECT_DOUBLE_EQ(env_double("GRADWIRE_TEST_DOUBLE", 0.0, 0.0, 1.0), 0.75);
  }
  {
    ScopedEnv env("GRADWIRE_TEST_DURATION", "2s");
    EXPECT_EQ(env_duration_ms("GRADWIRE_TEST_DURATION", milliseconds(1)), milliseconds(2000));
  }
  {
    ScopedEnv env("GRADWIRE_TEST_CHOICE", "NCCL");
    EXPECT_EQ(env_choice("GRADWIRE_TEST_CHOICE", "gloo", {"gloo", "nccl"}), "nccl");
  }
}

TEST(EnvTest, BadValuesThrowNamingTheVariable) {
  {
    ScopedEnv env("GRADWIRE_TEST_INT", "2000");
    EXPECT_EQ(error_of([] { env_int("GRADWIRE_TEST_INT", 4, 1, 1024); }),
              "GRADWIRE_TEST_INT=\"2000\" is invalid: expected an integer in [1, 1024]");
  }
  {
    ScopedEnv env("GRADWIRE_TEST_BOOL", "sure");
    EXPECT_THAT(error_of([] { env_bool("GRADWIRE_TEST_BOOL", false); }),
                ::testing::StartsWith("GRADWIRE_TEST_BOOL=\"sure\" is invalid"));
  }
  {
    ScopedEnv env("GRADWIRE_TEST_DOUBLE", "fast");
    EXPECT_THAT(error_of([] { env_double("GRADWIRE_TEST_DOUBLE", 1.0); }),
                ::testing::StartsWith("GRADWIRE_TEST_DOUBLE=\"fast\" is invalid"));
  }
  {
    ScopedEnv env("GRADWIRE_TEST_DURATION", " 5 minutes");
    EXPECT_THAT(error_of([] { env_duration_ms("GRADWIRE_TEST_DURATION", milliseconds(1)); }),
                ::testing::StartsWith("GRADWIRE_TEST_DURATION=\" 5 minutes\" is invalid"));
  }
  {
    ScopedEnv env("GRADWIRE_TEST_CHOICE", "mpi");
    EXPECT_EQ(error_of([] {
                env_choice("GRADWIRE_TEST_CHOICE", "gloo", {"gloo", "nccl"});
              }),
              "GRADWIRE_TEST_CHOICE=\"mpi\" is invalid: expected one of gloo, nccl");
  }
}

}  // namespace
}  // namespace gradwire
