// Sets or unsets environment variables for a scope and restores what was there before.
//
// Tests that read options from the environment use it so that they do not depend on the
// environment they run in, and leave it as they found it. Not thread-safe (setenv is not):
// create and destroy guards on the test's thread while no other thread reads the
// environment.
//
// Example:
//   ScopedEnv env({{"RANK", "3"}, {"WORLD_SIZE", nullptr}});  // sets RANK, unsets WORLD_SIZE
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradwire::test {

class ScopedEnv {
 public:
  // Each pair is a name and a value; a null value unsets the variable.
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      std::optional<std::string> old;
      if (const char* current = std::getenv(name)) old = current;
      saved_.emplace_back(name, std::move(old));
      if (value != nullptr) {
        ::setenv(name, value, 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace gradwire::test
