// Where a job's secret comes from (Secret): given in the options, then GRADWIRE_SECRET, then
// GRADWIRE_SECRET_FILE; short, empty and missing ones are refused naming their source.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gradwire/core/auth.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/rpc.h"

namespace gradwire::rpc {
namespace {

TEST(Secret, GivenThenEnvironmentThenFile) {
  ::unsetenv("GRADWIRE_SECRET");
  ::unsetenv("GRADWIRE_SECRET_FILE");
  EXPECT_EQ(resolve_secret(""), "");
  const std::string given = "given in the options";
  EXPECT_EQ(resolve_secret(given), given);
  const auto file =
      std::filesystem::temp_directory_path() / ("gradwire-secret-" + std::to_string(::getpid()));
  {
    std::ofstream out(file);
    out << "from-file, sixteen bytes or more\n";
  }
  ::setenv("GRADWIRE_SECRET_FILE", file.c_str(), 1);
  // The trailing newline is dropped.
  EXPECT_EQ(resolve_secret(""), "from-file, sixteen bytes or more");
  ::setenv("GRADWIRE_SECRET", "from-env, sixteen bytes or more", 1);
  EXPECT_EQ(resolve_secret(""), "from-env, sixteen bytes or more");
  EXPECT_EQ(resolve_secret(given), given);
  // A secret short enough to guess offline is refused, naming where it came from.
  ::setenv("GRADWIRE_SECRET", "from-env", 1);
  EXPECT_THROW(
      {
        try {
          resolve_secret("");
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("GRADWIRE_SECRET"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  EXPECT_THROW(resolve_secret(std::string(kMinSecretBytes - 1, 'k')), InvalidArgument);
  EXPECT_EQ(resolve_secret(std::string(kMinSecretBytes, 'k')), std::string(kMinSecretBytes, 'k'));
  ::unsetenv("GRADWIRE_SECRET");
  { std::ofstream truncate(file); }
  EXPECT_THROW(
      {
        try {
          resolve_secret("");
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("is empty"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  std::filesystem::remove(file);
  EXPECT_THROW(
      {
        try {
          resolve_secret("");
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  ::unsetenv("GRADWIRE_SECRET_FILE");
}

}  // namespace
}  // namespace gradwire::rpc
