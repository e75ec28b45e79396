// ProcessGroupNCCL::Impl: issuing an operation on the communicator (creating it on first
// use), failing and aborting, the watchdog that completes or times out each operation, and
// shutting down.
#include "gradwire/config.h"

#if GRADWIRE_HAS_NCCL

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gradwire/core/logging.h"
#include "process_group_nccl_impl.h"

namespace gradwire::c10d {

using namespace nccl_detail;

// ---- issuing operations

Work ProcessGroupNCCL::Impl::issue(const OpContext& ctx, Plan plan) {
  drop_released();
  const Clock::time_point deadline = Clock::now() + ctx.timeout;
  MutexLock lock(comm_mutex);
  const int dev = bind_device_locked(ctx, plan);
  auto state =
      std::make_shared<NcclWorkState>(ctx.description, detached(plan.outputs), ctx.timeout, dev,
                                      plan.blocking_wait || options.blocking_wait, broken);
  state->tensors = std::move(plan.tensors);
  if (plan.source_rank >= 0) state->set_source_rank(plan.source_rank);
  if (broken->load()) {
    abort_locked();
    fail_as_follower(ctx, *state);
    return Work(std::move(state));
  }
  try {
    DeviceGuard guard(dev);
    state->create_event();
    if (comm == nullptr && !create_comm_locked(ctx, *state, deadline))
      return Work(std::move(state));
    // Reports an error NCCL found since the last operation (a peer that went away).
    const PollResult health = poll_locked(deadline);
    if (health.end == PollEnd::kSettled && health.state != ncclSuccess) {
      fail_locked(ctx, *state,
                  "NCCL reported an error on the communicator before " + plan.name + ": " +
                      nccl_error_text(health.state, comm),
                  false);
      return Work(std::move(state));
    }
    // The caller's kernels that write the inputs (or still read the outputs) run on the
    // legacy default stream; the group's stream starts after them.
    check_cuda(cudaEventRecord(inputs_ready, cudaStreamLegacy), "cudaEventRecord", dev);
    check_cuda(cudaStreamWaitEvent(stream, inputs_ready, 0), "cudaStreamWaitEvent", dev);
    if (!enqueue_locked(ctx, *state, plan, deadline)) return Work(std::move(state));
    for (const DeviceCopy& copy : plan.copies) {
      if (copy.bytes == 0 || copy.dst == copy.src) continue;
      check_cuda(cudaMemcpyAsync(copy.dst, copy.src, copy.bytes, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync", dev);
    }
    state->record(stream);
  } catch (const Error& e) {
    fail_locked(ctx, *state, with_context(ctx.description, e));
    return Work(std::move(state));
  } catch (...) {
    fail_locked(ctx, *state, std::current_exception());
    return Work(std::move(state));
  }
  {
    MutexLock pending_lock(mutex);
    const bool was_idle = pending.empty();
    pending.push_back(Pending{state, ctx, deadline, plan.name});
    if (was_idle) wake.notify_one();
  }
  return Work(std::move(state));
}

int ProcessGroupNCCL::Impl::bind_device_locked(const OpContext& ctx, const Plan& plan) {
  if (plan.tensors.empty()) {
    if (device >= 0) return device;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error(ctx.description + ": cudaGetDevice failed, so the group cannot tell " +
                  "which device this rank uses (no CUDA device?)");
    }
    device = current;
    return device;
  }
  // check_backend_args has checked this before the operation was numbered; checked again
  // under the lock, for a first operation issued concurrently from another thread.
  device = check_one_device(
      ctx.description, device, plan.tensors.size(),
      [&](size_t i) { return plan.tensors[i].device().index; },
      [&](size_t i) { return plan.label(i); });
  return device;
}

void ProcessGroupNCCL::Impl::create_stream_locked() {
  int least = 0;
  int greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
             "cudaDeviceGetStreamPriorityRange", device);
  check_cuda(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking,
                                          options.high_priority_stream ? greatest : least),
             "cudaStreamCreateWithPriority", device);
  check_cuda(cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming),
             "cudaEventCreateWithFlags", device);
  check_cuda(cudaMalloc(&barrier_buffer, sizeof(int32_t)), "cudaMalloc", device);
  check_cuda(cudaMemsetAsync(barrier_buffer, 0, sizeof(int32_t), stream), "cudaMemsetAsync",
             device);
}

bool ProcessGroupNCCL::Impl::share_unique_id_locked(const OpContext& ctx, NcclWorkState& state,
                                                    Clock::time_point deadline, ncclUniqueId& id) {
  // Every rank counts the communicators it made on this store; they make them in the same
  // order, so the counts agree, and a store reused by a later group gets fresh keys.
  Store& store = *group.store();
  const int rank = group.rank();
  const int64_t number = store.add("nccl/created/" + std::to_string(rank), 1);
  const std::string key = "nccl/uid/" + std::to_string(number);
  if (rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      fail_locked(ctx, state, "ncclGetUniqueId failed: " + nccl_error_text(result, nullptr), false);
      return false;
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, Bytes(bytes, bytes + sizeof(id)));
  } else {
    Bytes bytes;
    try {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      bytes = store.get(key, std::max(left, milliseconds(1)));
    } catch (const TimeoutError&) {
      fail_locked(ctx, state,
                  "rank 0 did not publish NCCL's unique id (store key '" + key +
                      "'), so the NCCL communicator could not be created",
                  true);
      return false;
    }
    if (bytes.size() != sizeof(id)) {
      fail_locked(ctx, state,
                  std::make_exception_ptr(Error(
                      ctx.description + ": the store key '" + key + "' holds " +
                      std::to_string(bytes.size()) + " bytes, not an NCCL unique id of " +
                      std::to_string(sizeof(id)) + " bytes (another program uses the key?)")));
      return false;
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  return true;
}

bool ProcessGroupNCCL::Impl::create_comm_locked(const OpContext& ctx, NcclWorkState& state,
                                                Clock::time_point deadline) {
  const int rank = group.rank();
  const int size = group.size();
  create_stream_locked();
  ncclUniqueId id;
  if (!share_unique_id_locked(ctx, state, deadline, id)) return false;

  const std::string what = "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + " on " + device_text(device) + ")";
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: creation proceeds on NCCL's threads and can be abandoned at the deadline.
  config.blocking = 0;
  ncclComm_t created = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&created, size, id, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    const std::string text = nccl_error_text(started, created);
    if (created != nullptr) (void)ncclCommAbort(created);
    fail_locked(ctx, state, what + " failed: " + text, false);
    return false;
  }
  comm = created;
  if (!settle_locked(ctx, state, deadline,
                     what + " did not finish: the other ranks did not all join",
                     what + " failed: ")) {
    return false;
  }
  if (group.debug_level() != DebugLevel::kOff) {
    GRADWIRE_LOG(kInfo) << "ProcessGroupNCCL (group '" << group.name() << "', rank " << rank
                        << " of " << size << "): NCCL communicator ready on "
                        << device_text(device);
  }
  return true;
}

bool ProcessGroupNCCL::Impl::enqueue_locked(const OpContext& ctx, NcclWorkState& state,
                                            const Plan& plan, Clock::time_point deadline) {
  NcclCalls calls(comm, stream, barrier_buffer);
  const ncclResult_t opened = ncclGroupStart();
  if (opened != ncclSuccess) {
    fail_locked(ctx, state, "ncclGroupStart failed: " + nccl_error_text(opened, comm), false);
    return false;
  }
  // The group must be closed whatever happens inside it: an open group would swallow every
  // later NCCL call of this thread.
  try {
    plan.calls(calls);
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  const ncclResult_t closed = ncclGroupEnd();
  if (calls.failed()) {
    fail_locked(ctx, state,
                std::string(calls.call()) + " failed: " + nccl_error_text(calls.result(), comm),
                false);
    return false;
  }
  if (closed == ncclSuccess) return true;
  if (closed != ncclInProgress) {
    fail_locked(ctx, state,
                "ncclGroupEnd (" + plan.name + ") failed: " + nccl_error_text(closed, comm), false);
    return false;
  }
  // A non-blocking communicator may still be launching the kernels (connecting to peers
  // first): nothing else may touch the communicator or its stream until it is done.
  return settle_locked(
      ctx, state, deadline,
      "NCCL did not finish launching " + plan.name + " (it waits for the peers to connect)",
      "ncclGroupEnd (" + plan.name + ") failed: ");
}

bool ProcessGroupNCCL::Impl::settle_locked(const OpContext& ctx, NcclWorkState& state,
                                           Clock::time_point deadline, const std::string& late,
                                           const std::string& failed) {
  const PollResult settled = poll_locked(deadline);
  switch (settled.end) {
    case PollEnd::kDeadline:
      fail_locked(ctx, state, late, true);
      return false;
    case PollEnd::kBroken:
      abort_locked();
      fail_as_follower(ctx, state);
      return false;
    case PollEnd::kSettled:
      if (settled.state != ncclSuccess) {
        fail_locked(ctx, state, failed + nccl_error_text(settled.state, comm), false);
        return false;
      }
      break;
  }
  return true;
}

PollResult ProcessGroupNCCL::Impl::poll_locked(Clock::time_point deadline) {
  // NCCL's own threads make the progress: the caller only looks now and then, starting
  // often (a launch usually settles within microseconds) and backing off.
  std::chrono::microseconds pause{1};
  while (true) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) return {PollEnd::kSettled, asked};
    if (state != ncclInProgress) return {PollEnd::kSettled, state};
    if (broken->load()) return {PollEnd::kBroken, ncclInProgress};
    if (Clock::now() >= deadline) return {PollEnd::kDeadline, ncclInProgress};
    std::this_thread::sleep_for(pause);
    pause = std::min(2 * pause, kMaxPollPause);
  }
}

bool ProcessGroupNCCL::Impl::abort_locked() {
  broken->store(true);
  if (comm == nullptr) return false;
  // Ends the communicator's kernels, so the stream, and every stream ordered after the
  // group's events, moves on.
  const ncclResult_t result = ncclCommAbort(comm);
  comm = nullptr;
  if (result != ncclSuccess && result != ncclInProgress) {
    GRADWIRE_LOG(kWarning) << "ProcessGroupNCCL (group '" << group.name() << "', rank "
                           << group.rank()
                           << "): ncclCommAbort failed: " << nccl_error_text(result, nullptr);
  }
  return true;
}

void ProcessGroupNCCL::Impl::fail_locked(const OpContext& ctx, NcclWorkState& state,
                                         const std::string& what, bool timed_out) {
  const bool aborted = abort_locked();
  group.fail_operation(
      ctx, state,
      what + (aborted ? "; the NCCL communicator was aborted (ncclCommAbort)" : std::string()),
      timed_out);
}

void ProcessGroupNCCL::Impl::fail_locked(const OpContext& ctx, NcclWorkState& state,
                                         std::exception_ptr error) {
  abort_locked();
  group.fail_operation(ctx, state, std::move(error));
}

// For an operation caught up in another's failure: it fails with the group's first error.
// That error is recorded right after the communicator is marked broken, so it is missing
// only in that moment; the operation then records a failure of its own.
void ProcessGroupNCCL::Impl::fail_as_follower(const OpContext& ctx, NcclWorkState& state) {
  if (std::exception_ptr first = group.error()) {
    state.fail(std::move(first));
    return;
  }
  group.fail_operation(ctx, state,
                       "the NCCL communicator of this group was aborted after another of its "
                       "operations failed",
                       false);
}

void ProcessGroupNCCL::Impl::drop_released() {
  std::vector<std::shared_ptr<NcclWorkState>> dropping;
  {
    MutexLock lock(mutex);
    dropping.swap(released);
  }
}

// ---- the watchdog

void ProcessGroupNCCL::Impl::watchdog_main() {
  std::vector<Pending> batch;
  std::vector<std::shared_ptr<NcclWorkState>> finished;
  while (true) {
    {
      MutexLock lock(mutex);
      for (Pending& p : batch) {
        if (p.finished) finished.push_back(std::move(p.state));
      }
      std::erase_if(batch, [](const Pending& p) { return p.finished; });
      released.insert(released.end(), std::make_move_iterator(finished.begin()),
                      std::make_move_iterator(finished.end()));
      finished.clear();
      // Operations still running go back ahead of those issued meanwhile.
      batch.insert(batch.end(), std::make_move_iterator(pending.begin()),
                   std::make_move_iterator(pending.end()));
      pending.swap(batch);
      batch.clear();
      while (pending.empty() && !stopping)
        lock.wait(wake);
      if (pending.empty()) return;
      lock.wait_until(wake, Clock::now() + options.watchdog_interval);
      batch.swap(pending);
    }
    try {
      sweep(batch);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "ProcessGroupNCCL (group '" << group.name() << "', rank "
                           << group.rank() << "): watchdog: " << e.what();
    }
  }
}

void ProcessGroupNCCL::Impl::sweep(std::vector<Pending>& batch) {
  // The watchdog's thread has no device of its own to restore.
  if (cudaSetDevice(batch.front().state->device()) != cudaSuccess) (void)cudaGetLastError();

  const Clock::time_point now = Clock::now();
  Pending* oldest_running = nullptr;
  for (Pending& p : batch) {
    NcclWorkState& state = *p.state;
    const cudaError_t query = cudaEventQuery(state.done());
    if (query != cudaSuccess && query != cudaErrorNotReady) (void)cudaGetLastError();
    // Read after the query, as in NcclWorkState::is_completed.
    if (broken->load()) {
      if (std::exception_ptr first = group.error()) {
        state.fail(std::move(first));
        p.finished = true;
      } else if (now >= p.deadline) {
        fail_as_follower(p.ctx, state);
        p.finished = true;
      }
      continue;
    }
    if (query == cudaSuccess) {
      state.finish();
      p.finished = true;
    } else if (query != cudaErrorNotReady) {
      broken->store(true);
      try_abort();
      group.fail_operation(p.ctx, state,
                           std::make_exception_ptr(
                               Error(p.ctx.description + ": cudaEventQuery failed on " +
                                     device_text(state.device()) + ": " + cuda_error_text(query))));
      p.finished = true;
    } else if (now >= p.deadline) {
      broken->store(true);
      const bool aborted = try_abort();
      group.fail_operation(p.ctx, state,
                           p.calls + " did not finish on " + device_text(state.device()) +
                               (aborted ? "; the NCCL communicator was aborted (ncclCommAbort)"
                                        : "; the NCCL communicator is being aborted"),
                           true);
      p.finished = true;
    } else if (oldest_running == nullptr) {
      oldest_running = &p;
    }
  }
  if (oldest_running == nullptr) return;

  // Operations are still running: ask NCCL whether it found an error meanwhile (a peer
  // that went away, a network failure), which they would otherwise wait out until their
  // deadline. Skipped while an operation is being issued: the issuer asks the same itself.
  std::string async_error;
  if (comm_mutex.try_lock()) {
    try {
      async_error = check_comm_locked();
    } catch (...) {
      comm_mutex.unlock();
      throw;
    }
    comm_mutex.unlock();
  }
  if (async_error.empty()) return;
  oldest_running->finished = true;
  group.fail_operation(oldest_running->ctx, *oldest_running->state,
                       "NCCL reported an error (ncclCommGetAsyncError): " + async_error +
                           "; the NCCL communicator was aborted (ncclCommAbort)",
                       false);
  // The others fail with that error on the next round.
}

// Aborts a communicator marked broken by a thread that could not abort it. Otherwise
// returns NCCL's error text when the communicator reports an asynchronous error (and
// aborts it), or an empty string.
std::string ProcessGroupNCCL::Impl::check_comm_locked() {
  if (comm == nullptr) return {};
  if (broken->load()) {
    abort_locked();
    return {};
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
  const ncclResult_t error = asked != ncclSuccess ? asked : state;
  if (error == ncclSuccess || error == ncclInProgress) return {};
  std::string text = nccl_error_text(error, comm);
  abort_locked();
  return text;
}

// Aborts the communicator unless an issuing thread holds it; that thread then sees
// `broken` and aborts it itself. Returns whether this call aborted it.
bool ProcessGroupNCCL::Impl::try_abort() {
  if (!comm_mutex.try_lock()) return false;
  bool aborted = false;
  try {
    aborted = abort_locked();
  } catch (...) {
    comm_mutex.unlock();
    throw;
  }
  comm_mutex.unlock();
  return aborted;
}

// ---- shutting down

void ProcessGroupNCCL::Impl::shutdown() {
  {
    MutexLock lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  // The watchdog leaves once every operation in flight has finished or failed, each within
  // its deadline.
  if (watchdog.joinable()) watchdog.join();
  drop_released();
  MutexLock lock(comm_mutex);
  if (stream == nullptr) return;
  DeviceGuard guard(device);
  if (comm != nullptr) {
    if (broken->load()) {
      abort_locked();
    } else {
      release_comm_locked();
    }
  }
  if (cudaStreamDestroy(stream) != cudaSuccess) (void)cudaGetLastError();
  stream = nullptr;
  if (inputs_ready != nullptr && cudaEventDestroy(inputs_ready) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  inputs_ready = nullptr;
  if (barrier_buffer != nullptr && cudaFree(barrier_buffer) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  barrier_buffer = nullptr;
}

// An idle communicator is finalized (NCCL flushes what it still has in flight) and
// destroyed; one that does not finalize within the group's timeout is aborted instead.
void ProcessGroupNCCL::Impl::release_comm_locked() {
  ncclResult_t result = ncclCommFinalize(comm);
  if (result == ncclInProgress) {
    const PollResult finalized = poll_locked(Clock::now() + group.timeout());
    result = finalized.end == PollEnd::kSettled ? finalized.state : ncclInProgress;
  }
  if (result != ncclSuccess) {
    GRADWIRE_LOG(kWarning) << "ProcessGroupNCCL (group '" << group.name() << "', rank "
                           << group.rank() << "): finalizing the NCCL communicator "
                           << (result == ncclInProgress
                                   ? std::string("did not finish")
                                   : "failed: " + nccl_error_text(result, comm))
                           << "; aborting it";
    abort_locked();
    return;
  }
  result = ncclCommDestroy(comm);
  comm = nullptr;
  if (result != ncclSuccess && result != ncclInProgress) {
    GRADWIRE_LOG(kWarning) << "ProcessGroupNCCL (group '" << group.name() << "', rank "
                           << group.rank()
                           << "): ncclCommDestroy failed: " << nccl_error_text(result, nullptr);
  }
}

}  // namespace gradwire::c10d

#endif  // GRADWIRE_HAS_NCCL
