// The TensorPipe agent: graceful shutdown (the barriers of the group directory) and close.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include <iostream>

#include "gradwire/core/logging.h"
#include "text.h"

namespace gradwire::rpc::detail {

void TensorPipeAgent::wait_until_idle(Clock::time_point deadline) {
  // Pending calls, running handlers and loans (a peer may still be copying a reply this
  // worker lent it) must all be done at once: a handler may still make a call, so the
  // table is checked again once the handlers are done.
  for (;;) {
    const bool calls_done = calls_.wait_until_idle(deadline);
    MutexLock lock(mutex_);
    auto busy = [&]() GRADWIRE_REQUIRES(mutex_) {
      return active_handlers_ > 0 || outstanding_loans() > 0;
    };
    bool timed_out = !calls_done;
    while (!timed_out && busy()) {
      timed_out = lock.wait_until(idle_cv_, deadline) == std::cv_status::timeout && busy();
    }
    const size_t pending = calls_.size();
    if (!timed_out && pending == 0) return;
    if (timed_out) {
      throw TimeoutError("rpc agent " + self_.describe() + ": graceful shutdown waited " +
                         ms_text(options_.join_timeout) + " for " + std::to_string(pending) +
                         " pending calls, " + std::to_string(active_handlers_) +
                         " running handlers and " + std::to_string(outstanding_loans()) +
                         " tensors lent to peers");
    }
  }
}

void TensorPipeAgent::shutdown(bool graceful) {
  if (dispatcher_.serving_on_this_thread()) {
    throw InvalidArgument("rpc agent " + self_.describe() +
                          ": shutdown() was called from a request this agent is serving; it "
                          "would wait for that request itself. Shut the agent down from "
                          "outside its handlers");
  }
  {
    MutexLock lock(mutex_);
    // A second shutdown returns at once; calls may still be made while a graceful one
    // waits for the other workers.
    if (state_ != State::kRunning || shutdown_started_) return;
    shutdown_started_ = true;
  }
  if (graceful) {
    const Clock::time_point deadline = Clock::now() + options_.join_timeout;
    try {
      // The modules above send their last messages (rref/: deletes) while every worker
      // still serves.
      notify_graceful_shutdown(deadline);
      // Each worker first finishes its own calls; once all agree, no new call can depend
      // on a worker that has gone, and a second round lets replies still in flight land.
      wait_until_idle(deadline);
      group_.barrier("1", deadline);
      wait_until_idle(deadline);
      // Every worker is past the first barrier: none sends anything new, and a peer closes
      // its connections only once it is past the second, which this worker enters now (a
      // peer that dies instead is named by that barrier's timeout).
      departing_.store(true, std::memory_order_release);
      group_.barrier("2", deadline);
      group_.depart(deadline);
    } catch (...) {
      {
        // Later operations fail with this error, not a generic "shut down".
        MutexLock lock(mutex_);
        if (failure_ == nullptr) failure_ = std::current_exception();
      }
      close();
      throw;
    }
  }
  close();
}

void TensorPipeAgent::close() {
  {
    MutexLock lock(mutex_);
    if (state_ == State::kClosed || state_ == State::kClosing) return;
    state_ = State::kClosing;
    running_.store(false, std::memory_order_release);
    idle_cv_.notify_all();
  }
  if (print_stats_) {
    // One write, so the tables of agents closing together do not interleave.
    const std::string text = "rpc worker " + self_.describe() + " statistics:\n" + stats().table();
    std::cerr.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::cerr.flush();
  }
  // Fails what is pending and stops the timer.
  calls_.close([this](const PendingCall& call) {
    return std::make_exception_ptr(Error("rpc agent " + self_.describe() +
                                         " was shut down before " + call.what() + " to worker " +
                                         call.to.describe() + " completed"));
  });
  admission_.close("this worker is shutting down");
  if (listener_) listener_->close();
  if (context_) {
    context_->close();
    context_->join();
  }
  // Queued requests have lost their connections: drop them; handlers still running get
  // close_timeout to return, then are left to finish on their own.
  if (pool_) pool_->shutdown_now(options_.close_timeout);
  if (loans_) loans_->release_all();
  std::vector<std::shared_ptr<Connection>> clients;
  std::map<uint64_t, std::shared_ptr<Connection>> servers;
  std::vector<std::shared_ptr<tp::Pipe>> spare;
  {
    MutexLock lock(mutex_);
    state_ = State::kClosed;
    spare.swap(spare_pipes_);
    for (int r = 0; r < group_.slots(); ++r)
      clients.push_back(clients_[static_cast<size_t>(r)].exchange(nullptr));
    servers.swap(servers_);
  }
  notify_closed();
}

}  // namespace gradwire::rpc::detail
