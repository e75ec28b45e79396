#include "gradwire/core/future.h"

#include <algorithm>
#include <string>

#include "gradwire/core/logging.h"

namespace gradwire {

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  // Compare in milliseconds, where neither side can overflow.
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  if (timeout >= room) return Clock::time_point::max();
  return now + timeout;
}

namespace detail {

bool FutureStateBase::completed() const {
  MutexLock lock(mutex_);
  return completed_;
}

bool FutureStateBase::has_error() const {
  MutexLock lock(mutex_);
  return completed_ && error_ != nullptr;
}

std::exception_ptr FutureStateBase::error() const {
  MutexLock lock(mutex_);
  return error_;
}

bool FutureStateBase::wait(std::chrono::milliseconds timeout) const {
  const auto deadline = deadline_after(std::max(timeout, std::chrono::milliseconds(0)));
  MutexLock lock(mutex_);
  while (!completed_) {
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      lock.wait(cv_);
    } else if (lock.wait_until(cv_, deadline) == std::cv_status::timeout) {
      return completed_;
    }
  }
  return true;
}

void FutureStateBase::wait_or_throw(std::chrono::milliseconds timeout) const {
  if (!wait(timeout)) {
    throw TimeoutError("future not completed within " + std::to_string(timeout.count()) + " ms");
  }
}

bool FutureStateBase::try_set_error(std::exception_ptr error) {
  GRADWIRE_CHECK_ARG(error != nullptr) << "a future cannot fail with a null exception_ptr";
  std::vector<Continuation> continuations;
  {
    MutexLock lock(mutex_);
    if (completed_) return false;
    error_ = std::move(error);
    continuations = mark_completed_locked();
  }
  finish(std::move(continuations));
  return true;
}

void FutureStateBase::add_continuation(Continuation continuation) {
  {
    MutexLock lock(mutex_);
    if (!completed_) {
      continuations_.push_back(std::move(continuation));
      return;
    }
  }
  // Already complete: the continuation only posts work, so running it here is not
  // running user code on the attaching thread.
  continuation(shared_from_this());
}

std::vector<FutureStateBase::Continuation> FutureStateBase::mark_completed_locked() {
  completed_ = true;
  return std::exchange(continuations_, {});
}

void FutureStateBase::finish(std::vector<Continuation> continuations) {
  cv_.notify_all();
  if (continuations.empty()) return;
  const std::shared_ptr<FutureStateBase> self = shared_from_this();
  for (Continuation& continuation : continuations) {
    try {
      continuation(self);
    } catch (...) {
      log_callback_error(std::current_exception(), "a future continuation threw");
    }
  }
}

void log_callback_error(std::exception_ptr error, const char* what) {
  std::string detail = "unknown exception";
  try {
    std::rethrow_exception(std::move(error));
  } catch (const std::exception& e) {
    detail = e.what();
  } catch (...) {
  }
  GRADWIRE_LOG(kError) << what << ": " << detail;
}

void throw_already_completed() {
  throw Error("future already completed");
}

void throw_not_completed() {
  throw Error("future value read before the future completed");
}

void throw_invalid_future() {
  throw Error("use of an invalid (moved-from) Future");
}

}  // namespace detail

Future<void> collect_all(std::vector<Future<void>> futures) {
  if (futures.empty()) return make_ready_future();
  struct Gather {
    explicit Gather(size_t n) : remaining(n), errors(n) {}
    std::atomic<size_t> remaining;
    std::vector<std::exception_ptr> errors;
    Future<void> result;
  };
  for (size_t i = 0; i < futures.size(); ++i) {
    GRADWIRE_CHECK_ARG(futures[i].valid()) << "collect_all: input " << i << " is not valid";
  }
  auto gather = std::make_shared<Gather>(futures.size());
  for (size_t i = 0; i < futures.size(); ++i) {
    detail::on_complete_inline(futures[i], [gather, i](const Future<void>& done) {
      gather->errors[i] = done.error();
      if (gather->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      for (const std::exception_ptr& error : gather->errors) {
        if (error) {
          gather->result.try_set_error(error);
          return;
        }
      }
      gather->result.try_set_value();
    });
  }
  return gather->result;
}

}  // namespace gradwire
