#include "gradwire/c10d/work.h"

#include <algorithm>
#include <string>
#include <utility>

#include "gradwire/core/error.h"

namespace gradwire::c10d {

WorkState::WorkState(std::string description, std::vector<Tensor> outputs,
                     std::chrono::milliseconds default_timeout)
    : description_(std::move(description)),
      outputs_(std::move(outputs)),
      default_timeout_(default_timeout) {}

void WorkState::wait(std::chrono::milliseconds timeout) {
  wait_for_future(timeout);
}

void WorkState::wait_for_future(std::chrono::milliseconds timeout) const {
  if (!future_.wait(timeout)) {
    throw TimeoutError(description_ + " did not complete within " +
                       std::to_string(timeout.count()) + " ms");
  }
  if (std::exception_ptr error = future_.error()) std::rethrow_exception(error);
}

void WorkState::finish() {
  future_.try_set_value(outputs_);
}

void WorkState::fail(std::exception_ptr error) {
  Future<std::vector<Tensor>> future = future_;
  future.try_set_error(std::move(error));
}

WorkState& Work::checked() const {
  if (state_ == nullptr) throw Error("Work: this handle holds no operation (default-constructed)");
  return *state_;
}

void Work::wait() const {
  WorkState& s = checked();
  // An operation ends by its own deadline; a failed collective then spends up to that
  // long again (at most kFailureReportGrace) finding out which ranks did not come. Allow
  // for both, so that wait() reports the operation's error rather than its own timeout.
  const std::chrono::milliseconds deadline = s.default_timeout();
  s.wait(deadline + std::min(deadline, kFailureReportGrace) + std::chrono::milliseconds(1000));
}

void Work::wait(std::chrono::milliseconds timeout) const {
  if (timeout.count() <= 0) {
    throw InvalidArgument("Work::wait: timeout must be positive, got " +
                          std::to_string(timeout.count()) + " ms");
  }
  checked().wait(timeout);
}

bool Work::is_completed() const {
  return checked().is_completed();
}

bool Work::is_success() const {
  WorkState& s = checked();
  return s.is_completed() && s.future().completed() && !s.future().has_error();
}

std::exception_ptr Work::exception() const {
  return checked().future().error();
}

Future<std::vector<Tensor>> Work::get_future() const {
  return checked().future();
}

std::vector<Tensor> Work::result() const {
  wait();
  return state_->outputs();
}

int Work::source_rank() const {
  return checked().source_rank();
}

const std::string& Work::description() const {
  return checked().description();
}

Work completed_work(std::string description, std::vector<Tensor> outputs) {
  auto state = std::make_shared<WorkState>(std::move(description), std::move(outputs),
                                           std::chrono::milliseconds(1));
  state->finish();
  return Work(std::move(state));
}

}  // namespace gradwire::c10d
