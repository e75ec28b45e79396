// The examples' command lines: "--flag value" pairs and bare switches, read in order, each
// value checked where it is read, every error an InvalidArgument naming the flag.
//
//   examples::Args args(argc, argv, "--epochs N, --lr LR, --resume");
//   while (args.next()) {
//     if (args.is("--epochs")) o.epochs = static_cast<int>(args.integer(1, 100000));
//     else if (args.is("--lr")) o.lr = args.number(0.0, 1e6);
//     else if (args.is("--resume")) o.resume = true;
//     else args.unknown();
//   }
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "gradwire/core/env.h"
#include "gradwire/core/error.h"

namespace gradwire::examples {

class Args {
 public:
  // `expected`: the accepted flags, as an unknown one's error lists them.
  Args(int argc, char** argv, std::string expected)
      : argc_(argc), argv_(argv), expected_(std::move(expected)) {}

  // Moves to the next flag; false once all are read.
  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    return true;
  }
  bool is(const char* name) const { return flag_ == name; }

  // The current flag's value (the next argument).
  std::string value() {
    if (i_ + 1 >= argc_) throw InvalidArgument("missing value after " + flag_);
    return argv_[++i_];
  }
  int64_t integer(int64_t min, int64_t max) { return parse_int(flag_, value(), min, max); }
  double number(double min, double max) { return parse_double(flag_, value(), min, max); }
  // A value that must not be empty; `what` says what it names ("a directory").
  std::string non_empty(const char* what) {
    std::string v = value();
    if (v.empty()) throw InvalidArgument(flag_ + " needs " + what + ", got an empty one");
    return v;
  }
  // One of `choices`, whose list the error gives: --backend="mpi" is invalid: expected
  // cpu, shm or gloo.
  std::string one_of(std::initializer_list<const char*> choices) {
    std::string v = value();
    std::string listed;
    size_t i = 0;
    for (const char* c : choices) {
      if (v == c) return v;
      listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(c);
      ++i;
    }
    throw InvalidArgument(flag_ + "=\"" + v + "\" is invalid: expected " + listed);
  }

  [[noreturn]] void unknown() const {
    throw InvalidArgument("unknown argument '" + flag_ + "' (expected " + expected_ + ")");
  }

 private:
  int argc_;
  char** argv_;
  std::string expected_;
  int i_ = 0;
  std::string flag_;
};

}  // namespace gradwire::examples
