#include "gradwire/config.h"

#if GRADWIRE_HAS_NCCL

#include "gradwire/c10d/process_group_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

// Non-blocking communicators (whose creation and operations can be abandoned with
// ncclCommAbort when a deadline passes), ncclCommFinalize, ncclAvg and ncclBfloat16.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "gradwire's NCCL backend needs NCCL 2.14 or newer (non-blocking communicators)"
#endif

namespace gradwire::c10d {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The longest pause between two looks at a communicator that NCCL's own threads are still
// setting up (creation, connecting to peers, finalizing). Short enough to add little to an
// operation, long enough not to compete with those threads for a core.
constexpr std::chrono::microseconds kMaxPollPause{1000};

std::string device_text(int device) {
  return "cuda:" + std::to_string(device);
}

std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")";
}

// Throws gradwire::Error for a failed CUDA runtime call, naming the call and the device.
void check_cuda(cudaError_t err, const char* call, int device) {
  if (err == cudaSuccess) return;
  // Clears a non-sticky error so that later, unrelated calls do not report it again.
  (void)cudaGetLastError();
  throw Error(std::string(call) + " failed on " + device_text(device) + ": " +
              cuda_error_text(err));
}

// Makes `device` current for the scope and restores the caller's device afterwards, so
// that the group never leaves a user's thread on another device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (previous_ != device) {
      check_cuda(cudaSetDevice(device), "cudaSetDevice", device);
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    // Failing to switch back means the driver is already broken; the next checked call
    // reports it.
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

std::string_view result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    case ncclNumResults:
      break;
  }
  return "unknown ncclResult_t";
}

// NCCL's description of `result`, with the detail NCCL logged for it when there is one.
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text =
      std::string(ncclGetErrorString(result)) + " (" + std::string(result_name(result)) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += "; NCCL's last error: " + std::string(last);
  return text;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
    case DType::kBool:  // one byte holding 0 or 1
      return ncclUint8;
  }
  throw Error("ProcessGroupNCCL: no NCCL type for dtype " +
              std::to_string(static_cast<int>(dtype)));
}

ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  if (dtype == DType::kBool) {
    // On bytes holding 0 or 1 the maximum is a logical OR and the minimum a logical AND; a
    // byte sum would leave values other than 0 and 1 (and wrap to 0 at 256 ranks).
    return op == ReduceOp::kProduct || op == ReduceOp::kMin ? ncclMin : ncclMax;
  }
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  throw Error("ProcessGroupNCCL: no NCCL reduction for ReduceOp " +
              std::to_string(static_cast<int>(op)));
}

// The same kind of error, its message prefixed with the operation it broke (a CUDA call or
// the store knows nothing of the operation that made it).
std::exception_ptr with_context(const std::string& description, const Error& e) {
  try {
    throw_error(e.kind(), description + ": " + e.what());
  } catch (...) {
    return std::current_exception();
  }
}

size_t count_of(const Tensor& t) {
  return static_cast<size_t>(t.numel());
}

std::vector<Tensor> detached(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors)
    out.push_back(t.detach());
  return out;
}

// Whether `parts` are consecutive pieces of one buffer, so that one NCCL collective can
// address them all. One storage is required, not just adjacent addresses: two allocations
// that happen to touch must not be treated as one buffer.
bool packed(const std::vector<Tensor>& parts) {
  const auto* base = static_cast<const char*>(parts.front().data_ptr());
  const size_t bytes = parts.front().nbytes();
  for (size_t i = 1; i < parts.size(); ++i) {
    if (!parts[i].storage().is_same(parts.front().storage()) ||
        static_cast<const char*>(parts[i].data_ptr()) != base + i * bytes) {
      return false;
    }
  }
  return true;
}

// The NCCL calls of one operation, made between ncclGroupStart and ncclGroupEnd. Inside a
// group NCCL only records the calls; the first one it refuses is kept for the message.
class NcclCalls {
 public:
  NcclCalls(ncclComm_t comm, cudaStream_t stream, void* barrier_buffer)
      : comm_(comm), stream_(stream), barrier_buffer_(barrier_buffer) {}

  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  // One int32 on the device, for barrier's all-reduce.
  void* barrier_buffer() const { return barrier_buffer_; }

  void check(ncclResult_t result, const char* call) {
    if (result == ncclSuccess || result == ncclInProgress || failed()) return;
    result_ = result;
    call_ = call;
  }
  bool failed() const { return call_ != nullptr; }
  ncclResult_t result() const { return result_; }
  const char* call() const { return call_; }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  void* barrier_buffer_;
  ncclResult_t result_ = ncclSuccess;
  const char* call_ = nullptr;
};

// A copy between two buffers of the device, on the group's stream: the part of gather,
// scatter and all_to_all that stays on this rank.
struct DeviceCopy {
  void* dst;
  const void* src;
  size_t bytes;
};

// What one operation does; built by a do_* method and run by Impl::issue while the
// method's arguments are still alive (so `calls` may capture them by reference).
struct Plan {
  explicit Plan(std::string name) : name(std::move(name)) {}

  void add(const Tensor& t, const char* what, int index = -1) {
    tensors.push_back(t);
    labels.emplace_back(what, index);
  }
  std::string label(size_t i) const {
    const auto& [what, index] = labels[i];
    return index < 0 ? std::string(what) : std::string(what) + "[" + std::to_string(index) + "]";
  }

  std::string name;  // the NCCL calls, for messages: "ncclAllReduce"
  std::vector<Tensor> tensors;
  std::vector<std::pair<const char*, int>> labels;
  std::vector<Tensor> outputs;
  std::function<void(NcclCalls&)> calls;
  std::vector<DeviceCopy> copies;
  bool blocking_wait = false;
  int source_rank = -1;
};

// One operation of the group. wait() orders the caller's stream after the operation
// instead of blocking the host; the watchdog completes the future once the GPU is done.
class NcclWorkState final : public WorkState {
 public:
  NcclWorkState(std::string description, std::vector<Tensor> outputs, milliseconds timeout,
                int device, bool blocking_wait, std::shared_ptr<const std::atomic<bool>> broken)
      : WorkState(std::move(description), std::move(outputs), timeout),
        device_(device),
        blocking_wait_(blocking_wait),
        broken_(std::move(broken)) {}

  ~NcclWorkState() override {
    // An event the GPU has not reached yet may be destroyed: CUDA frees it once reached.
    if (done_ != nullptr && cudaEventDestroy(done_) != cudaSuccess) (void)cudaGetLastError();
  }

  void wait(milliseconds timeout) override {
    if (blocking_wait_) {
      wait_for_future(timeout);
      return;
    }
    // The operation's own deadline bounds it (the watchdog aborts it then), so ordering
    // the stream cannot outlast `timeout` by more than that.
    if (std::exception_ptr error = future().error()) std::rethrow_exception(error);
    if (!recorded_) return;
    DeviceGuard guard(device_);
    check_cuda(cudaStreamWaitEvent(cudaStreamLegacy, done_, 0), "cudaStreamWaitEvent", device_);
  }

  bool is_completed() const override {
    if (future().completed()) return true;
    if (!recorded_) return false;
    const cudaError_t query = cudaEventQuery(done_);
    if (query != cudaSuccess && query != cudaErrorNotReady) (void)cudaGetLastError();
    // Read after the query: once the communicator is aborted, its kernels end early and
    // the event completes without the operation having succeeded.
    return query == cudaSuccess && !broken_->load();
  }

  // Called with the device current.
  void create_event() {
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags",
               device_);
  }
  void record(cudaStream_t stream) {
    check_cuda(cudaEventRecord(done_, stream), "cudaEventRecord", device_);
    recorded_ = true;
  }
  cudaEvent_t done() const { return done_; }
  int device() const { return device_; }

  // Every tensor the operation reads or writes: held until the GPU is done with them,
  // since the caller may drop its handles as soon as the call returns.
  std::vector<Tensor> tensors;

 private:
  const int device_;
  const bool blocking_wait_;
  const std::shared_ptr<const std::atomic<bool>> broken_;
  cudaEvent_t done_ = nullptr;
  // Set before the Work is handed out, and never again.
  bool recorded_ = false;
};

enum class PollEnd { kSettled, kDeadline, kBroken };
struct PollResult {
  PollEnd end;
  ncclResult_t state;  // when settled: ncclSuccess or the error
};

}  // namespace

struct ProcessGroupNCCL::Impl {
  struct Pending {
    std::shared_ptr<NcclWorkState> state;
    OpContext ctx;
    Clock::time_point deadline;
    std::string calls;
    bool finished = false;
  };

  Impl(ProcessGroupNCCL& group, const NcclOptions& options) : group(group), options(options) {}

  Work issue(const OpContext& ctx, Plan plan);
  int bind_device_locked(const OpContext& ctx, const Plan& plan) GRADWIRE_REQUIRES(comm_mutex);
  bool create_comm_locked(const OpContext& ctx, NcclWorkState& state, Clock::time_point deadline)
      GRADWIRE_REQUIRES(comm_mutex);
  bool enqueue_locked(const OpContext& ctx, NcclWorkState& state, const Plan& plan,
                      Clock::time_point deadline) GRADWIRE_REQUIRES(comm_mutex);
  PollResult poll_locked(Clock::time_point deadline) GRADWIRE_REQUIRES(comm_mutex);
  bool abort_locked() GRADWIRE_REQUIRES(comm_mutex);
  void fail_locked(const OpContext& ctx, NcclWorkState& state, const std::string& what,
                   bool timed_out) GRADWIRE_REQUIRES(comm_mutex);
  void fail_locked(const OpContext& ctx, NcclWorkState& state, std::exception_ptr error)
      GRADWIRE_REQUIRES(comm_mutex);
  void fail_as_follower(const OpContext& ctx, NcclWorkState& state);
  void drop_released() GRADWIRE_EXCLUDES(mutex);

  void watchdog_main() GRADWIRE_EXCLUDES(mutex, comm_mutex);
  void sweep(std::vector<Pending>& batch) GRADWIRE_EXCLUDES(mutex, comm_mutex);
  std::string check_comm_locked() GRADWIRE_REQUIRES(comm_mutex);
  bool try_abort() GRADWIRE_EXCLUDES(comm_mutex);
  void shutdown() GRADWIRE_EXCLUDES(mutex, comm_mutex);
  void release_comm_locked() GRADWIRE_REQUIRES(comm_mutex);

  ProcessGroupNCCL& group;
  const NcclOptions options;
  // Set once the communicator must be abandoned, before it is aborted: completions seen
  // afterwards may come from kernels NCCL cut short. Shared with the states, which may
  // outlive the group.
  const std::shared_ptr<std::atomic<bool>> broken = std::make_shared<std::atomic<bool>>(false);

  // Serializes every NCCL call on the communicator (NCCL calls on one communicator must
  // not overlap) and guards its lifetime: ncclCommAbort frees it.
  Mutex comm_mutex;
  int device GRADWIRE_GUARDED_BY(comm_mutex) = -1;  // this rank's device, once known
  ncclComm_t comm GRADWIRE_GUARDED_BY(comm_mutex) = nullptr;
  cudaStream_t stream GRADWIRE_GUARDED_BY(comm_mutex) = nullptr;
  cudaEvent_t inputs_ready GRADWIRE_GUARDED_BY(comm_mutex) = nullptr;
  void* barrier_buffer GRADWIRE_GUARDED_BY(comm_mutex) = nullptr;

  Mutex mutex;
  std::condition_variable wake;
  // Operations on the GPU, in issue order.
  std::vector<Pending> pending GRADWIRE_GUARDED_BY(mutex);
  // Finished operations, whose tensors the next issuing thread releases: freeing device
  // memory waits for the whole device, which the watchdog must never do, or an operation
  // that hangs would keep it from ever noticing the deadline.
  std::vector<std::shared_ptr<NcclWorkState>> released GRADWIRE_GUARDED_BY(mutex);
  bool stopping GRADWIRE_GUARDED_BY(mutex) = false;
  std::thread watchdog;
};

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

namespace {

// The device an operation's tensors must be on: `bound`, this rank's device once known,
// else the first tensor's. Throws InvalidArgument naming the first tensor elsewhere.
int check_one_device(const std::string& description, int bound, size_t count,
                     const std::function<int(size_t)>& device_of,
                     const std::function<std::string(size_t)>& label) {
  const int wanted = bound >= 0 ? bound : device_of(0);
  for (size_t i = 0; i < count; ++i) {
    const int on = device_of(i);
    if (on == wanted) continue;
    const std::string why =
        bound >= 0
            ? "this rank of the group uses " + device_text(wanted) +
                  " (the device of the first tensor it was given; a group uses one "
                  "device per rank)"
            : label(0) + " is on " + device_text(wanted) + " (one operation runs on one device)";
    throw InvalidArgument(description + ": " + label(i) + " is on " + device_text(on) + ", but " +
                          why);
  }
  return wanted;
}

}  // namespace

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

bool ProcessGroupNCCL::Impl::create_comm_locked(const OpContext& ctx, NcclWorkState& state,
                                                Clock::time_point deadline) {
  const int rank = group.rank();
  const int size = group.size();
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

  // Every rank counts the communicators it made on this store; they make them in the same
  // order, so the counts agree, and a store reused by a later group gets fresh keys.
  Store& store = *group.store();
  const int64_t number = store.add("nccl/created/" + std::to_string(rank), 1);
  const std::string key = "nccl/uid/" + std::to_string(number);
  ncclUniqueId id;
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
  const PollResult ready = poll_locked(deadline);
  switch (ready.end) {
    case PollEnd::kDeadline:
      fail_locked(ctx, state, what + " did not finish: the other ranks did not all join", true);
      return false;
    case PollEnd::kBroken:
      abort_locked();
      fail_as_follower(ctx, state);
      return false;
    case PollEnd::kSettled:
      if (ready.state != ncclSuccess) {
        fail_locked(ctx, state, what + " failed: " + nccl_error_text(ready.state, comm), false);
        return false;
      }
      break;
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
  const PollResult launched = poll_locked(deadline);
  switch (launched.end) {
    case PollEnd::kDeadline:
      fail_locked(
          ctx, state,
          "NCCL did not finish launching " + plan.name + " (it waits for the peers to connect)",
          true);
      return false;
    case PollEnd::kBroken:
      abort_locked();
      fail_as_follower(ctx, state);
      return false;
    case PollEnd::kSettled:
      if (launched.state != ncclSuccess) {
        fail_locked(
            ctx, state,
            "ncclGroupEnd (" + plan.name + ") failed: " + nccl_error_text(launched.state, comm),
            false);
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

// ---- the group

std::shared_ptr<ProcessGroupNCCL> ProcessGroupNCCL::create(std::shared_ptr<Store> store, int rank,
                                                           int size, ProcessGroupOptions options,
                                                           NcclOptions nccl_options) {
  return std::shared_ptr<ProcessGroupNCCL>(new ProcessGroupNCCL(
      std::move(store), rank, size, std::move(options), std::move(nccl_options)));
}

namespace {

// NCCL picks the interface of its own sockets (bootstrap and, without InfiniBand, data)
// from NCCL_SOCKET_IFNAME. A job that names its interface once, for every gradwire
// transport, through GRADWIRE_SOCKET_IFNAME gets the same one for NCCL, unless
// NCCL_SOCKET_IFNAME says otherwise. Done once, before the first communicator reads it.
void apply_socket_ifname() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* ours = std::getenv("GRADWIRE_SOCKET_IFNAME");
    const char* theirs = std::getenv("NCCL_SOCKET_IFNAME");
    if (ours == nullptr || *ours == '\0' || (theirs != nullptr && *theirs != '\0')) return;
    ::setenv("NCCL_SOCKET_IFNAME", ours, 1);
    GRADWIRE_LOG(kInfo) << "ProcessGroupNCCL: NCCL_SOCKET_IFNAME=" << ours
                        << " (from GRADWIRE_SOCKET_IFNAME)";
  });
}

}  // namespace

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options, NcclOptions nccl_options)
    : ProcessGroup(std::move(store), rank, size, std::move(options)),
      nccl_options_(std::move(nccl_options)) {
  apply_socket_ifname();
  if (nccl_options_.watchdog_interval.count() <= 0) {
    throw InvalidArgument("ProcessGroupNCCL (group '" + name() + "', rank " +
                          std::to_string(this->rank()) +
                          "): NcclOptions::watchdog_interval must be positive, got " +
                          std::to_string(nccl_options_.watchdog_interval.count()) + " us");
  }
  impl_ = std::make_unique<Impl>(*this, nccl_options_);
  impl_->watchdog = std::thread([impl = impl_.get()] {
    // Names the thread in debuggers and `top -H`; 15 characters at most.
    pthread_setname_np(pthread_self(), "gw-nccl-watch");
    impl->watchdog_main();
  });
}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  try {
    impl_->shutdown();
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kError) << "ProcessGroupNCCL (group '" << name() << "', rank " << rank()
                         << "): releasing the group failed: " << e.what();
  } catch (...) {
    GRADWIRE_LOG(kError) << "ProcessGroupNCCL (group '" << name() << "', rank " << rank()
                         << "): releasing the group failed with a non-standard exception";
  }
}

void ProcessGroupNCCL::check_backend_args(const OpContext& ctx,
                                          const std::vector<TensorArg>& args) const {
  if (args.empty()) return;
  int bound = -1;
  {
    MutexLock lock(impl_->comm_mutex);
    bound = impl_->device;
  }
  check_one_device(
      ctx.description, bound, args.size(), [&](size_t i) { return args[i].tensor->device().index; },
      [&](size_t i) { return args[i].what; });
}

Work ProcessGroupNCCL::do_all_reduce(std::vector<Tensor> tensors, ReduceOp op,
                                     const OpContext& ctx) {
  Plan plan("ncclAllReduce");
  for (size_t i = 0; i < tensors.size(); ++i)
    plan.add(tensors[i], "tensors", static_cast<int>(i));
  plan.outputs = tensors;
  plan.calls = [&](NcclCalls& c) {
    for (const Tensor& t : tensors) {
      if (t.numel() == 0) continue;
      c.check(ncclAllReduce(t.data_ptr(), t.data_ptr(), count_of(t), nccl_type(t.dtype()),
                            nccl_op(op, t.dtype()), c.comm(), c.stream()),
              "ncclAllReduce");
    }
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_broadcast(std::vector<Tensor> tensors, int root, const OpContext& ctx) {
  Plan plan("ncclBroadcast");
  for (size_t i = 0; i < tensors.size(); ++i)
    plan.add(tensors[i], "tensors", static_cast<int>(i));
  plan.outputs = tensors;
  plan.calls = [&](NcclCalls& c) {
    for (const Tensor& t : tensors) {
      if (t.numel() == 0) continue;
      c.check(ncclBroadcast(t.data_ptr(), t.data_ptr(), count_of(t), nccl_type(t.dtype()), root,
                            c.comm(), c.stream()),
              "ncclBroadcast");
    }
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_broadcast_coalesced(std::vector<Tensor> tensors,
                                              std::vector<std::vector<size_t>> buckets, int root,
                                              const OpContext& ctx) {
  Plan plan("ncclBroadcast");
  for (size_t i = 0; i < tensors.size(); ++i)
    plan.add(tensors[i], "tensors", static_cast<int>(i));
  plan.outputs = tensors;
  // One buffer per bucket: a lone tensor itself, else a staging buffer. The root packs
  // its tensors on the legacy default stream, which the group's stream waits for; the
  // others unpack on the group's stream after the broadcasts (the plan's copies).
  std::vector<Tensor> buffers;
  buffers.reserve(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::vector<size_t>& bucket = buckets[b];
    if (bucket.size() == 1) {
      buffers.push_back(tensors[bucket[0]]);
      continue;
    }
    std::vector<Tensor> members;
    members.reserve(bucket.size());
    for (size_t i : bucket)
      members.push_back(tensors[i]);
    Tensor flat;
    if (rank() == root) {
      flat = flatten_dense_tensors(members);
    } else {
      int64_t numel = 0;
      for (const Tensor& t : members)
        numel += t.numel();
      flat = empty({numel}, members[0].options());
      size_t offset = 0;
      for (const Tensor& t : members) {
        plan.copies.push_back(DeviceCopy{
            t.data_ptr(), static_cast<const char*>(flat.data_ptr()) + offset, t.nbytes()});
        offset += t.nbytes();
      }
    }
    plan.add(flat, "staging buffer", static_cast<int>(b));
    buffers.push_back(std::move(flat));
  }
  plan.calls = [&](NcclCalls& c) {
    for (const Tensor& t : buffers) {
      if (t.numel() == 0) continue;
      c.check(ncclBroadcast(t.data_ptr(), t.data_ptr(), count_of(t), nccl_type(t.dtype()), root,
                            c.comm(), c.stream()),
              "ncclBroadcast");
    }
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_reduce(const Tensor& tensor, int root, ReduceOp op,
                                 const OpContext& ctx) {
  Plan plan("ncclReduce");
  plan.add(tensor, "the tensor");
  plan.outputs = {tensor};
  const bool is_root = rank() == root;
  plan.calls = [&](NcclCalls& c) {
    if (tensor.numel() == 0) return;
    // Only the root's buffer receives; the others pass none, so theirs stay unchanged.
    c.check(ncclReduce(tensor.data_ptr(), is_root ? tensor.data_ptr() : nullptr, count_of(tensor),
                       nccl_type(tensor.dtype()), nccl_op(op, tensor.dtype()), root, c.comm(),
                       c.stream()),
            "ncclReduce");
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_all_gather(std::vector<Tensor> outputs, const Tensor& input,
                                     const OpContext& ctx) {
  const bool one_buffer = packed(outputs);
  Plan plan(one_buffer ? "ncclAllGather" : "ncclBroadcast from every rank");
  plan.add(input, "the input");
  for (size_t i = 0; i < outputs.size(); ++i)
    plan.add(outputs[i], "outputs", static_cast<int>(i));
  plan.outputs = outputs;
  plan.calls = [&](NcclCalls& c) {
    if (input.numel() == 0) return;
    const ncclDataType_t type = nccl_type(input.dtype());
    if (one_buffer) {
      c.check(ncclAllGather(input.data_ptr(), outputs.front().data_ptr(), count_of(input), type,
                            c.comm(), c.stream()),
              "ncclAllGather");
      return;
    }
    for (size_t r = 0; r < outputs.size(); ++r) {
      c.check(ncclBroadcast(input.data_ptr(), outputs[r].data_ptr(), count_of(input), type,
                            static_cast<int>(r), c.comm(), c.stream()),
              "ncclBroadcast");
    }
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_gather(std::vector<Tensor> outputs, const Tensor& input, int root,
                                 const OpContext& ctx) {
  Plan plan("ncclSend/ncclRecv");
  plan.add(input, "the input");
  for (size_t i = 0; i < outputs.size(); ++i)
    plan.add(outputs[i], "outputs", static_cast<int>(i));
  plan.outputs = outputs;
  const int me = rank();
  plan.calls = [&](NcclCalls& c) {
    if (input.numel() == 0) return;
    const ncclDataType_t type = nccl_type(input.dtype());
    if (me != root) {
      c.check(ncclSend(input.data_ptr(), count_of(input), type, root, c.comm(), c.stream()),
              "ncclSend");
      return;
    }
    for (int r = 0; r < size(); ++r) {
      if (r == me) continue;
      c.check(ncclRecv(outputs[static_cast<size_t>(r)].data_ptr(), count_of(input), type, r,
                       c.comm(), c.stream()),
              "ncclRecv");
    }
  };
  if (me == root) {
    plan.copies.push_back(
        {outputs[static_cast<size_t>(me)].data_ptr(), input.data_ptr(), input.nbytes()});
  }
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_scatter(const Tensor& output, std::vector<Tensor> inputs, int root,
                                  const OpContext& ctx) {
  Plan plan("ncclSend/ncclRecv");
  plan.add(output, "the output");
  for (size_t i = 0; i < inputs.size(); ++i)
    plan.add(inputs[i], "inputs", static_cast<int>(i));
  plan.outputs = {output};
  const int me = rank();
  plan.calls = [&](NcclCalls& c) {
    if (output.numel() == 0) return;
    const ncclDataType_t type = nccl_type(output.dtype());
    if (me != root) {
      c.check(ncclRecv(output.data_ptr(), count_of(output), type, root, c.comm(), c.stream()),
              "ncclRecv");
      return;
    }
    for (int r = 0; r < size(); ++r) {
      if (r == me) continue;
      c.check(ncclSend(inputs[static_cast<size_t>(r)].data_ptr(), count_of(output), type, r,
                       c.comm(), c.stream()),
              "ncclSend");
    }
  };
  if (me == root) {
    plan.copies.push_back(
        {output.data_ptr(), inputs[static_cast<size_t>(me)].data_ptr(), output.nbytes()});
  }
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_reduce_scatter(const Tensor& output, std::vector<Tensor> inputs,
                                         ReduceOp op, const OpContext& ctx) {
  const bool one_buffer = packed(inputs);
  Plan plan(one_buffer ? "ncclReduceScatter" : "ncclReduce to every rank");
  plan.add(output, "the output");
  for (size_t i = 0; i < inputs.size(); ++i)
    plan.add(inputs[i], "inputs", static_cast<int>(i));
  plan.outputs = {output};
  const int me = rank();
  plan.calls = [&](NcclCalls& c) {
    if (output.numel() == 0) return;
    const ncclDataType_t type = nccl_type(output.dtype());
    const ncclRedOp_t red = nccl_op(op, output.dtype());
    if (one_buffer) {
      c.check(ncclReduceScatter(inputs.front().data_ptr(), output.data_ptr(), count_of(output),
                                type, red, c.comm(), c.stream()),
              "ncclReduceScatter");
      return;
    }
    for (int r = 0; r < size(); ++r) {
      c.check(ncclReduce(inputs[static_cast<size_t>(r)].data_ptr(),
                         r == me ? output.data_ptr() : nullptr, count_of(output), type, red, r,
                         c.comm(), c.stream()),
              "ncclReduce");
    }
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_all_to_all(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                                     const OpContext& ctx) {
  Plan plan("ncclSend/ncclRecv");
  for (size_t i = 0; i < inputs.size(); ++i)
    plan.add(inputs[i], "inputs", static_cast<int>(i));
  for (size_t i = 0; i < outputs.size(); ++i)
    plan.add(outputs[i], "outputs", static_cast<int>(i));
  plan.outputs = outputs;
  const int me = rank();
  plan.calls = [&](NcclCalls& c) {
    const ncclDataType_t type = nccl_type(inputs.front().dtype());
    for (int r = 0; r < size(); ++r) {
      if (r == me) continue;
      const Tensor& in = inputs[static_cast<size_t>(r)];
      const Tensor& out = outputs[static_cast<size_t>(r)];
      // Both sides of a pair see the same size, so both skip an empty message.
      if (in.numel() > 0) {
        c.check(ncclSend(in.data_ptr(), count_of(in), type, r, c.comm(), c.stream()), "ncclSend");
      }
      if (out.numel() > 0) {
        c.check(ncclRecv(out.data_ptr(), count_of(out), type, r, c.comm(), c.stream()), "ncclRecv");
      }
    }
  };
  const auto self = static_cast<size_t>(me);
  plan.copies.push_back({outputs[self].data_ptr(), inputs[self].data_ptr(), inputs[self].nbytes()});
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_barrier(const OpContext& ctx) {
  Plan plan("ncclAllReduce");
  // A barrier is for the host: its wait() blocks until every rank has arrived.
  plan.blocking_wait = true;
  plan.calls = [](NcclCalls& c) {
    c.check(ncclAllReduce(c.barrier_buffer(), c.barrier_buffer(), 1, ncclInt32, ncclSum, c.comm(),
                          c.stream()),
            "ncclAllReduce");
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) {
  Plan plan("ncclSend");
  plan.add(tensor, "the tensor");
  plan.outputs = {tensor};
  plan.calls = [&](NcclCalls& c) {
    if (tensor.numel() == 0) return;
    c.check(ncclSend(tensor.data_ptr(), count_of(tensor), nccl_type(tensor.dtype()), dst, c.comm(),
                     c.stream()),
            "ncclSend");
  };
  return impl_->issue(ctx, std::move(plan));
}

Work ProcessGroupNCCL::do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) {
  if (src < 0) {
    throw InvalidArgument(ctx.description +
                          ": NCCL cannot receive from any source; name the sending rank "
                          "(recv), or use a gloo group for recv_any_source");
  }
  Plan plan("ncclRecv");
  plan.add(tensor, "the tensor");
  plan.outputs = {tensor};
  plan.source_rank = src;
  plan.calls = [&](NcclCalls& c) {
    if (tensor.numel() == 0) return;
    c.check(ncclRecv(tensor.data_ptr(), count_of(tensor), nccl_type(tensor.dtype()), src, c.comm(),
                     c.stream()),
            "ncclRecv");
  };
  return impl_->issue(ctx, std::move(plan));
}

std::shared_ptr<ProcessGroup> ProcessGroupNCCL::make_subgroup(std::shared_ptr<Store> store,
                                                              int rank, int size,
                                                              ProcessGroupOptions options) {
  return create(std::move(store), rank, size, std::move(options), nccl_options_);
}

}  // namespace gradwire::c10d

#endif  // GRADWIRE_HAS_NCCL
