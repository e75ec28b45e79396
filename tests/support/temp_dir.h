// A directory of its own for one test: made empty when the test's fixture is made, removed
// with everything in it when the fixture goes.
//
//   class MyTraceTest : public ::testing::Test {
//    protected:
//     test::TempDir tmp_{"gradwire-my-trace"};   // <tmp>/gradwire-my-trace-<pid>-<test name>
//   };
//   ... tmp_.path() / "w0.trace.json" ...
//
// The name holds the process id and the running test's name, so tests of several processes
// (ctest -j) and of one binary never share a directory. Thread-safety: none needed (one
// test's fixture). Errors: a directory that cannot be made throws std::filesystem's error.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

namespace gradwire::test {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string name = prefix + "-" + std::to_string(::getpid());
    if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
      name += std::string("-") + info->test_suite_name() + "." + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';  // parameterised tests' names hold '/'
    }
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace gradwire::test
