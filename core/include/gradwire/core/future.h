// Future<T>: a value or an error that becomes available later, with continuations.
//
// Promise-less design, as in PyTorch's c10::ivalue::Future: the producer creates a
// Future, keeps a copy and completes it with set_value / set_error; consumers hold other
// copies of the same handle. A default-constructed Future is a fresh, pending state.
// Every Future completes exactly once; a second completion is refused (try_set_* returns
// false, set_* throws gradwire::Error), so races between a reply and a timeout are safe.
//
// Waiting always has a deadline: wait(timeout) returns false and get(timeout) throws
// TimeoutError when it passes. wait() and get() without an argument use the future's
// default timeout: kDefaultFutureTimeout unless its producer knows better and set another
// (an rpc call's future waits as long as the call's own deadline, so a long rpc_timeout is
// never undercut by get()). kNoTimeout waits without a deadline, for producers that
// guarantee completion themselves (a call given an infinite timeout still fails when its
// peer or agent goes).
//
// Continuations never run inline. then(executor, fn) and add_callback(executor, fn) post
// fn to the executor when the future completes, or at once if it has already completed;
// the completing thread (often an I/O loop) and the attaching thread only ever enqueue.
// fn receives the completed Future<T>, so it can inspect an error rather than be skipped.
// then() returns a Future<U> completed with fn's result; if fn returns a Future<U> it is
// flattened; if fn throws, or the executor refuses the task, the returned future holds
// that error. Callbacks keep their executor alive until they have been posted.
//
// Thread-safety: a Future is a handle like shared_ptr: copies share one state, and every
// method may be called concurrently from any thread through any copy. Only the handle
// object itself (assignment, move) needs the caller's synchronisation. References
// returned by value()/get() stay valid while any handle to the state lives; on a
// temporary Future, get() returns a copy for that reason.
//
// Errors: get()/value() rethrow the stored error as is (gradwire::Error subclasses
// rethrow as themselves); get() throws TimeoutError("future not completed within N ms").
//
// Example:
//   Future<int> answer;                                 // the producer keeps `answer`
//   Future<std::string> text = answer.then(pool, [](Future<int> done) {
//     return std::to_string(done.value());             // value() rethrows an error
//   });
//   answer.set_value(42);
//   std::string s = text.get(std::chrono::seconds(5));  // "42"
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradwire/core/check.h"
#include "gradwire/core/error.h"
#include "gradwire/core/executor.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"

namespace gradwire {

inline constexpr std::chrono::milliseconds kDefaultFutureTimeout{300'000};
// A timeout that never passes.
inline constexpr std::chrono::milliseconds kNoTimeout = std::chrono::milliseconds::max();

// now + timeout on the steady clock, saturated: kNoTimeout (or any timeout too long to
// represent) gives time_point::max(), which waits treat as "no deadline".
std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout);

template <typename T>
class Future;

namespace detail {

// The untyped part of a future's state: completion flag, error, waiters, continuations.
class FutureStateBase : public std::enable_shared_from_this<FutureStateBase> {
 public:
  // Runs on the completing thread, or on the attaching thread when attached after
  // completion. Only gradwire's own code goes here (posting to an executor, copying a
  // result into another future), never user code, and it must not throw.
  using Continuation = std::function<void(const std::shared_ptr<FutureStateBase>&)>;

  FutureStateBase() = default;
  virtual ~FutureStateBase() = default;
  FutureStateBase(const FutureStateBase&) = delete;
  FutureStateBase& operator=(const FutureStateBase&) = delete;

  bool completed() const GRADWIRE_EXCLUDES(mutex_);
  bool has_error() const GRADWIRE_EXCLUDES(mutex_);
  std::exception_ptr error() const GRADWIRE_EXCLUDES(mutex_);
  bool wait(std::chrono::milliseconds timeout) const GRADWIRE_EXCLUDES(mutex_);
  // Throws TimeoutError when the future is still pending after `timeout`.
  void wait_or_throw(std::chrono::milliseconds timeout) const GRADWIRE_EXCLUDES(mutex_);
  bool try_set_error(std::exception_ptr error) GRADWIRE_EXCLUDES(mutex_);
  void add_continuation(Continuation continuation) GRADWIRE_EXCLUDES(mutex_);
  std::chrono::milliseconds default_timeout() const {
    return std::chrono::milliseconds(default_timeout_ms_.load(std::memory_order_relaxed));
  }
  void set_default_timeout(std::chrono::milliseconds timeout) {
    default_timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }

 protected:
  // Marks the state completed; the caller has stored the value or error under the lock.
  // Returns the continuations to run once the lock is released.
  std::vector<Continuation> mark_completed_locked() GRADWIRE_REQUIRES(mutex_);
  // Wakes waiters and runs continuations; called without the lock.
  void finish(std::vector<Continuation> continuations) GRADWIRE_EXCLUDES(mutex_);

  mutable Mutex mutex_;
  mutable std::condition_variable cv_;
  bool completed_ GRADWIRE_GUARDED_BY(mutex_) = false;
  std::exception_ptr error_ GRADWIRE_GUARDED_BY(mutex_);
  std::vector<Continuation> continuations_ GRADWIRE_GUARDED_BY(mutex_);
  std::atomic<std::chrono::milliseconds::rep> default_timeout_ms_{kDefaultFutureTimeout.count()};
};

template <typename T>
class FutureState final : public FutureStateBase {
 public:
  template <typename V>
  bool try_set_value(V&& value) GRADWIRE_EXCLUDES(mutex_) {
    std::vector<Continuation> continuations;
    {
      MutexLock lock(mutex_);
      if (completed_) return false;
      value_.emplace(std::forward<V>(value));
      continuations = mark_completed_locked();
    }
    finish(std::move(continuations));
    return true;
  }

  // Only after completed() returned true and has_error() false: value_ is written once,
  // under mutex_, before completed_ is set, and never changes afterwards, so the lock
  // taken by completed() orders this read after the write.
  const T& stored_value() const { return *value_; }

 private:
  std::optional<T> value_;
};

template <>
class FutureState<void> final : public FutureStateBase {
 public:
  bool try_set_value() GRADWIRE_EXCLUDES(mutex_) {
    std::vector<Continuation> continuations;
    {
      MutexLock lock(mutex_);
      if (completed_) return false;
      continuations = mark_completed_locked();
    }
    finish(std::move(continuations));
    return true;
  }
};

// Out of line so that this header does not pull in logging.
void log_callback_error(std::exception_ptr error, const char* what);
[[noreturn]] void throw_already_completed();
[[noreturn]] void throw_not_completed();
[[noreturn]] void throw_invalid_future();

template <typename R>
struct UnwrapFuture {
  using type = R;
  static constexpr bool is_future = false;
};
template <typename U>
struct UnwrapFuture<Future<U>> {
  using type = U;
  static constexpr bool is_future = true;
};

struct FutureAccess;

// What Future<T> and Future<void> share: observing, waiting, failing, continuations.
template <typename T>
class FutureBase {
 public:
  // False only for a moved-from handle; every other method requires a valid handle.
  bool valid() const noexcept { return state_ != nullptr; }
  bool completed() const { return state().completed(); }
  bool has_error() const { return state().has_error(); }
  // The stored error, or nullptr while pending or after a value.
  std::exception_ptr error() const { return state().error(); }
  // True once completed (with a value or an error); false if `timeout` passed first.
  bool wait(std::chrono::milliseconds timeout) const { return state().wait(timeout); }
  bool wait() const { return state().wait(default_timeout()); }
  // What wait() and get() without an argument wait for (see the file comment).
  std::chrono::milliseconds default_timeout() const { return state().default_timeout(); }
  void set_default_timeout(std::chrono::milliseconds timeout) {
    state().set_default_timeout(timeout);
  }

  bool try_set_error(std::exception_ptr error) { return state().try_set_error(std::move(error)); }
  void set_error(std::exception_ptr error) {
    if (!try_set_error(std::move(error))) throw_already_completed();
  }
  // Keeps the static type of `error`: pass the concrete exception, not an Error& to it.
  template <typename E>
  requires std::derived_from<std::decay_t<E>, std::exception>
  void set_error(E&& error) { set_error(std::make_exception_ptr(std::forward<E>(error))); }

  // fn(Future<T>) -> U or Future<U>; returns Future<U>. See the file comment.
  template <typename F>
  auto then(std::shared_ptr<Executor> executor, F fn) const
      -> Future<typename UnwrapFuture<std::invoke_result_t<F&, Future<T>>>::type>;

  // fn(Future<T>), posted to `executor` on completion. If fn throws, or the executor
  // refuses the task, the error is logged: there is no one else to tell.
  template <typename F>
  void add_callback(std::shared_ptr<Executor> executor, F fn) const;

 protected:
  explicit FutureBase(std::shared_ptr<FutureState<T>> state) : state_(std::move(state)) {}

  FutureState<T>& state() const {
    if (state_ == nullptr) throw_invalid_future();
    return *state_;
  }

  // Posts task(completed future) to executor on completion; on_reject(error) if refused.
  template <typename Task, typename OnReject>
  void post_on_completion(std::shared_ptr<Executor> executor, Task task, OnReject on_reject) const;

  std::shared_ptr<FutureState<T>> state_;

 private:
  friend struct FutureAccess;
};

}  // namespace detail

// A value of type T or an error, available later; see the file comment for completion,
// waiting, continuations and the thread-safety contract (every method may be called from
// any thread; copies share one state).
template <typename T>
class Future : public detail::FutureBase<T> {
  static_assert(!std::is_reference_v<T>, "Future<T&> is not supported: store a value");

 public:
  Future() : detail::FutureBase<T>(std::make_shared<detail::FutureState<T>>()) {}

  bool try_set_value(T value) { return this->state().try_set_value(std::move(value)); }
  void set_value(T value) {
    if (!try_set_value(std::move(value))) detail::throw_already_completed();
  }

  // Does not wait: throws gradwire::Error if still pending, rethrows a stored error.
  const T& value() const {
    detail::FutureState<T>& state = this->state();
    if (!state.completed()) detail::throw_not_completed();
    if (std::exception_ptr error = state.error()) std::rethrow_exception(error);
    return state.stored_value();
  }

  const T& get(std::chrono::milliseconds timeout) const& {
    this->state().wait_or_throw(timeout);
    return value();
  }
  const T& get() const& { return get(this->default_timeout()); }
  // On a temporary (rpc_async(...).get()) a reference would dangle: return a copy.
  T get(std::chrono::milliseconds timeout) && {
    this->state().wait_or_throw(timeout);
    return value();
  }
  T get() && {
    this->state().wait_or_throw(this->default_timeout());
    return value();
  }

 private:
  friend struct detail::FutureAccess;
  explicit Future(std::shared_ptr<detail::FutureState<T>> state)
      : detail::FutureBase<T>(std::move(state)) {}
};

// Completion without a value: set_value() and get() take and return nothing.
template <>
class Future<void> : public detail::FutureBase<void> {
 public:
  Future() : detail::FutureBase<void>(std::make_shared<detail::FutureState<void>>()) {}

  bool try_set_value() { return state().try_set_value(); }
  void set_value() {
    if (!try_set_value()) detail::throw_already_completed();
  }

  // Does not wait: throws gradwire::Error if still pending, rethrows a stored error.
  void value() const {
    detail::FutureState<void>& s = state();
    if (!s.completed()) detail::throw_not_completed();
    if (std::exception_ptr error = s.error()) std::rethrow_exception(error);
  }

  void get(std::chrono::milliseconds timeout) const {
    state().wait_or_throw(timeout);
    value();
  }
  void get() const { get(default_timeout()); }

 private:
  friend struct detail::FutureAccess;
  explicit Future(std::shared_ptr<detail::FutureState<void>> state)
      : detail::FutureBase<void>(std::move(state)) {}
};

namespace detail {

struct FutureAccess {
  template <typename T>
  static Future<T> wrap(const std::shared_ptr<FutureStateBase>& base) {
    return Future<T>(std::static_pointer_cast<FutureState<T>>(base));
  }
  template <typename T>
  static FutureState<T>& state(const FutureBase<T>& future) {
    return future.state();
  }
};

// Runs fn(completed future) on the completing thread. Internal: fn must only move
// results between futures, never run user code, and must not throw.
template <typename T, typename F>
void on_complete_inline(const Future<T>& future, F fn) {
  FutureAccess::state(future).add_continuation(
      [fn = std::move(fn)](const std::shared_ptr<FutureStateBase>& base) mutable {
        fn(FutureAccess::wrap<T>(base));
      });
}

// A future of fn(completed `from`) (fn's exception becomes its error), for short library
// work that should not cost a thread hand-off: fn runs at once when `from` has completed
// already, else on the thread that completes it when that is one of `executor`'s own
// (Executor::on_own_thread: a pool worker, done with its task), else on `executor` (whose
// refusal becomes the error). then(executor, fn) always posts instead.
template <typename U, typename T, typename F>
Future<U> map_here_or_on(const Future<T>& from, std::shared_ptr<Executor> executor, F fn) {
  Future<U> out;
  auto settle = [fn = std::move(fn)](const Future<T>& done, Future<U>& result) mutable {
    try {
      result.try_set_value(fn(done));
    } catch (...) {
      result.try_set_error(std::current_exception());
    }
  };
  if (from.completed()) {
    settle(from, out);
    return out;
  }
  on_complete_inline(from,
                     [settle, out, executor = std::move(executor)](const Future<T>& done) mutable {
                       if (executor->on_own_thread()) {
                         settle(done, out);
                         return;
                       }
                       try {
                         executor->execute([settle, out, done]() mutable { settle(done, out); });
                       } catch (...) {
                         out.try_set_error(std::current_exception());
                       }
                     });
  return out;
}

// Completes `to` with whatever `from` completes with.
template <typename U>
void forward_completion(const Future<U>& from, Future<U> to) {
  on_complete_inline(from, [to](const Future<U>& done) mutable {
    try {
      if (done.has_error()) {
        to.try_set_error(done.error());
      } else if constexpr (std::is_void_v<U>) {
        to.try_set_value();
      } else {
        to.try_set_value(done.value());
      }
    } catch (...) {
      to.try_set_error(std::current_exception());
    }
  });
}

template <typename T>
template <typename Task, typename OnReject>
void FutureBase<T>::post_on_completion(std::shared_ptr<Executor> executor, Task task,
                                       OnReject on_reject) const {
  GRADWIRE_CHECK_ARG(executor != nullptr) << "a future callback needs an executor, got null";
  state().add_continuation(
      [executor = std::move(executor), task = std::move(task),
       on_reject = std::move(on_reject)](const std::shared_ptr<FutureStateBase>& base) mutable {
        Future<T> done = FutureAccess::wrap<T>(base);
        try {
          executor->execute([task = std::move(task), done]() mutable { task(std::move(done)); });
        } catch (...) {
          on_reject(std::current_exception());
        }
      });
}

template <typename T>
template <typename F>
auto FutureBase<T>::then(std::shared_ptr<Executor> executor, F fn) const
    -> Future<typename UnwrapFuture<std::invoke_result_t<F&, Future<T>>>::type> {
  using R = std::invoke_result_t<F&, Future<T>>;
  using U = typename UnwrapFuture<R>::type;
  Future<U> result;
  // Shared so that move-only callables fit in std::function.
  auto shared_fn = std::make_shared<F>(std::move(fn));
  post_on_completion(
      std::move(executor),
      [shared_fn, result](Future<T> done) mutable {
        try {
          if constexpr (UnwrapFuture<R>::is_future) {
            R inner = std::invoke(*shared_fn, std::move(done));
            if (!inner.valid()) throw_invalid_future();
            forward_completion(inner, result);
          } else if constexpr (std::is_void_v<R>) {
            std::invoke(*shared_fn, std::move(done));
            result.try_set_value();
          } else {
            result.try_set_value(std::invoke(*shared_fn, std::move(done)));
          }
        } catch (...) {
          result.try_set_error(std::current_exception());
        }
      },
      [result](std::exception_ptr rejected) mutable { result.try_set_error(rejected); });
  return result;
}

template <typename T>
template <typename F>
void FutureBase<T>::add_callback(std::shared_ptr<Executor> executor, F fn) const {
  static_assert(std::is_invocable_v<F&, Future<T>>, "add_callback needs fn(Future<T>)");
  auto shared_fn = std::make_shared<F>(std::move(fn));
  post_on_completion(
      std::move(executor),
      [shared_fn](Future<T> done) {
        try {
          std::invoke(*shared_fn, std::move(done));
        } catch (...) {
          log_callback_error(std::current_exception(), "a future callback threw");
        }
      },
      [](std::exception_ptr rejected) {
        log_callback_error(rejected, "the executor refused a future callback");
      });
}

}  // namespace detail

template <typename T>
Future<std::decay_t<T>> make_ready_future(T&& value) {
  Future<std::decay_t<T>> future;
  future.set_value(std::forward<T>(value));
  return future;
}

inline Future<void> make_ready_future() {
  Future<void> future;
  future.set_value();
  return future;
}

template <typename T>
Future<T> make_failed_future(std::exception_ptr error) {
  Future<T> future;
  future.set_error(std::move(error));
  return future;
}

// Keeps the static type of `error`: make_failed_future<int>(TimeoutError("...")).
template <typename T, typename E>
requires std::derived_from<std::decay_t<E>, std::exception> Future<T> make_failed_future(
    E&& error) {
  return make_failed_future<T>(std::make_exception_ptr(std::forward<E>(error)));
}

// Completes when every input has completed: with all values in input order, or with the
// error of the lowest-indexed failed input. An empty input gives a ready empty vector.
template <typename T>
requires(!std::is_void_v<T>) Future<std::vector<T>> collect_all(std::vector<Future<T>> futures) {
  if (futures.empty()) return make_ready_future(std::vector<T>{});
  struct Gather {
    explicit Gather(size_t n) : remaining(n), values(n), errors(n) {}
    std::atomic<size_t> remaining;
    // Each input writes only its own slot; the acq_rel countdown publishes the slots to
    // whichever input completes last.
    std::vector<std::optional<T>> values;
    std::vector<std::exception_ptr> errors;
    Future<std::vector<T>> result;
  };
  auto gather = std::make_shared<Gather>(futures.size());
  for (size_t i = 0; i < futures.size(); ++i) {
    GRADWIRE_CHECK_ARG(futures[i].valid()) << "collect_all: input " << i << " is not valid";
  }
  for (size_t i = 0; i < futures.size(); ++i) {
    detail::on_complete_inline(futures[i], [gather, i](const Future<T>& done) {
      try {
        if (done.has_error()) {
          gather->errors[i] = done.error();
        } else {
          gather->values[i].emplace(done.value());
        }
      } catch (...) {
        gather->errors[i] = std::current_exception();
      }
      if (gather->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      try {
        for (const std::exception_ptr& error : gather->errors) {
          if (error) {
            gather->result.try_set_error(error);
            return;
          }
        }
        std::vector<T> values;
        values.reserve(gather->values.size());
        for (std::optional<T>& value : gather->values)
          values.push_back(std::move(*value));
        gather->result.try_set_value(std::move(values));
      } catch (...) {
        gather->result.try_set_error(std::current_exception());
      }
    });
  }
  return gather->result;
}

// As above for Future<void>: completes when all have, failing with the lowest-indexed
// error.
Future<void> collect_all(std::vector<Future<void>> futures);

}  // namespace gradwire
