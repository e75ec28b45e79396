// Work: the handle a ProcessGroup operation returns.
//
// Operations are asynchronous: all_reduce(...) enqueues the collective and returns at
// once; the Work tells when it is done. It also hands out a Future that completes with the
// operation's output tensors (the tensors the caller passed, now holding the result), so
// a continuation can run on an executor of the caller's choosing instead of a thread
// blocking in wait().
//
//   wait([timeout])   blocks until the operation finished; rethrows its error. Without an
//                     argument it waits as long as the operation can take to end: its
//                     deadline (the group's timeout unless the call named one), plus the
//                     time a failed collective takes to find out which ranks did not come. A Work
//                     of a CUDA backend returns as soon as the caller's stream is ordered after the
//                     operation (the host does not block) — see ProcessGroupNCCL.
//   is_completed()    finished, successfully or not (never blocks)
//   is_success()      finished without an error (never blocks)
//   exception()       the error, or nullptr (never blocks)
//   get_future()      Future<std::vector<Tensor>> completed with the outputs
//   result()          wait(), then the output tensors
//   source_rank()     for recv_any_source: the rank the message came from
//
// Thread-safety: a Work is a handle like shared_ptr; copies share one state and every
// method may be called from any thread.
// Errors: wait/result throw TimeoutError ("all_reduce #7 (group 'default', rank 1) did
// not complete within 500 ms") when the wait runs out — the operation itself keeps its own
// deadline, the group's timeout —, and otherwise rethrow what failed the operation
// (TimeoutError, NetworkError naming the peer ranks, InvalidArgument, Error). Calling
// anything on a default-constructed Work throws gradwire::Error.
//
// Example:
//   Work w = group->all_reduce(grads);
//   compute_something_else();
//   w.wait();                                         // grads now hold the sum
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/core/future.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::c10d {

// How long a rank that saw a collective fail waits (at most) for its peers to report that
// they reached it too, so that the error can name the ranks that did not. Peers fail at
// about the same moment, since they wait on each other; this bounds the wait for ranks
// that never came. Work::wait() without a timeout allows for it. One second: a rank killed
// mid-collective is then named to every survivor well within 2 s of its connections
// dropping, and live peers, which fail within milliseconds of each other, still make it.
inline constexpr std::chrono::milliseconds kFailureReportGrace{1000};

// The shared state behind a Work. Backends derive from it when waiting means more than
// waiting for the future (the NCCL backend orders the caller's stream instead).
class WorkState {
 public:
  // `description` names the operation for messages ("all_reduce #7 (group 'default', rank
  // 1)"); `default_timeout` is what wait() without an argument uses.
  WorkState(std::string description, std::vector<Tensor> outputs,
            std::chrono::milliseconds default_timeout);
  virtual ~WorkState() = default;
  WorkState(const WorkState&) = delete;
  WorkState& operator=(const WorkState&) = delete;

  virtual void wait(std::chrono::milliseconds timeout);
  virtual bool is_completed() const { return future_.completed(); }

  // Completes the operation: the future gets the outputs, or the error.
  void finish();
  void fail(std::exception_ptr error);

  const std::string& description() const { return description_; }
  const std::vector<Tensor>& outputs() const { return outputs_; }
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  const Future<std::vector<Tensor>>& future() const { return future_; }
  int source_rank() const { return source_rank_.load(); }
  void set_source_rank(int rank) { source_rank_.store(rank); }

 protected:
  // Waits for the future, throwing TimeoutError with the description when it runs out,
  // then rethrows a stored error.
  void wait_for_future(std::chrono::milliseconds timeout) const;

 private:
  std::string description_;
  std::vector<Tensor> outputs_;
  std::chrono::milliseconds default_timeout_;
  Future<std::vector<Tensor>> future_;
  std::atomic<int> source_rank_{-1};
};

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  void wait() const;
  void wait(std::chrono::milliseconds timeout) const;
  bool is_completed() const;
  bool is_success() const;
  std::exception_ptr exception() const;
  Future<std::vector<Tensor>> get_future() const;
  std::vector<Tensor> result() const;
  int source_rank() const;
  const std::string& description() const;

  bool valid() const noexcept { return state_ != nullptr; }
  const std::shared_ptr<WorkState>& state() const { return state_; }

 private:
  WorkState& checked() const;
  std::shared_ptr<WorkState> state_;
};

// A Work that is already complete, with `outputs` (world size 1, empty operations).
Work completed_work(std::string description, std::vector<Tensor> outputs);

}  // namespace gradwire::c10d
