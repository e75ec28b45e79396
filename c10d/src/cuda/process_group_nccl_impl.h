// ProcessGroupNCCL's internals: the CUDA and NCCL helpers, an operation's plan and work
// state, and the Impl that owns the communicator, its stream and the watchdog. The Impl's
// methods are in process_group_nccl_impl.cc; the group's operations, which build plans, in
// process_group_nccl.cc. Included only where GRADWIRE_HAS_NCCL is set.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gradwire/c10d/process_group_nccl.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"

// Non-blocking communicators (whose creation and operations can be abandoned with
// ncclCommAbort when a deadline passes), ncclCommFinalize, ncclAvg and ncclBfloat16.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "gradwire's NCCL backend needs NCCL 2.14 or newer (non-blocking communicators)"
#endif

namespace gradwire::c10d {
namespace nccl_detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The longest pause between two looks at a communicator that NCCL's own threads are still
// setting up (creation, connecting to peers, finalizing). Short enough to add little to an
// operation, long enough not to compete with those threads for a core.
inline constexpr std::chrono::microseconds kMaxPollPause{1000};

inline std::string device_text(int device) {
  return "cuda:" + std::to_string(device);
}

inline std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")";
}

// Throws gradwire::Error for a failed CUDA runtime call, naming the call and the device.
inline void check_cuda(cudaError_t err, const char* call, int device) {
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

inline std::string_view result_name(ncclResult_t result) {
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
inline std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text =
      std::string(ncclGetErrorString(result)) + " (" + std::string(result_name(result)) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += "; NCCL's last error: " + std::string(last);
  return text;
}

inline ncclDataType_t nccl_type(DType dtype) {
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

inline ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
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
inline std::exception_ptr with_context(const std::string& description, const Error& e) {
  try {
    throw_error(e.kind(), description + ": " + e.what());
  } catch (...) {
    return std::current_exception();
  }
}

inline size_t count_of(const Tensor& t) {
  return static_cast<size_t>(t.numel());
}

inline std::vector<Tensor> detached(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors)
    out.push_back(t.detach());
  return out;
}

// Whether `parts` are consecutive pieces of one buffer, so that one NCCL collective can
// address them all. One storage is required, not just adjacent addresses: two allocations
// that happen to touch must not be treated as one buffer.
inline bool packed(const std::vector<Tensor>& parts) {
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

// The device an operation's tensors must be on: `bound`, this rank's device once known,
// else the first tensor's. Throws InvalidArgument naming the first tensor elsewhere.
inline int check_one_device(const std::string& description, int bound, size_t count,
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

}  // namespace nccl_detail

struct ProcessGroupNCCL::Impl {
  struct Pending {
    std::shared_ptr<nccl_detail::NcclWorkState> state;
    OpContext ctx;
    nccl_detail::Clock::time_point deadline;
    std::string calls;
    bool finished = false;
  };

  Impl(ProcessGroupNCCL& group, const NcclOptions& options) : group(group), options(options) {}

  Work issue(const OpContext& ctx, nccl_detail::Plan plan);
  int bind_device_locked(const OpContext& ctx, const nccl_detail::Plan& plan)
      GRADWIRE_REQUIRES(comm_mutex);
  // Creates the communicator on first use: its stream, event and barrier buffer, NCCL's
  // unique id through the store, then the non-blocking ncclCommInitRankConfig. False (the
  // operation failed) when any of them does not succeed by `deadline`.
  bool create_comm_locked(const OpContext& ctx, nccl_detail::NcclWorkState& state,
                          nccl_detail::Clock::time_point deadline) GRADWIRE_REQUIRES(comm_mutex);
  void create_stream_locked() GRADWIRE_REQUIRES(comm_mutex);
  // Rank 0 makes NCCL's unique id and publishes it in the store; the others read it.
  bool share_unique_id_locked(const OpContext& ctx, nccl_detail::NcclWorkState& state,
                              nccl_detail::Clock::time_point deadline, ncclUniqueId& id)
      GRADWIRE_REQUIRES(comm_mutex);
  bool enqueue_locked(const OpContext& ctx, nccl_detail::NcclWorkState& state,
                      const nccl_detail::Plan& plan, nccl_detail::Clock::time_point deadline)
      GRADWIRE_REQUIRES(comm_mutex);
  nccl_detail::PollResult poll_locked(nccl_detail::Clock::time_point deadline)
      GRADWIRE_REQUIRES(comm_mutex);
  // Waits for NCCL to settle the communicator's work in progress (creation or a launch).
  // False, the operation failed, when it does not by `deadline` (the message `late`), when
  // the group broke meanwhile, or when NCCL reports an error (`failed` and NCCL's text).
  bool settle_locked(const OpContext& ctx, nccl_detail::NcclWorkState& state,
                     nccl_detail::Clock::time_point deadline, const std::string& late,
                     const std::string& failed) GRADWIRE_REQUIRES(comm_mutex);
  bool abort_locked() GRADWIRE_REQUIRES(comm_mutex);
  void fail_locked(const OpContext& ctx, nccl_detail::NcclWorkState& state, const std::string& what,
                   bool timed_out) GRADWIRE_REQUIRES(comm_mutex);
  void fail_locked(const OpContext& ctx, nccl_detail::NcclWorkState& state,
                   std::exception_ptr error) GRADWIRE_REQUIRES(comm_mutex);
  void fail_as_follower(const OpContext& ctx, nccl_detail::NcclWorkState& state);
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
  std::vector<std::shared_ptr<nccl_detail::NcclWorkState>> released GRADWIRE_GUARDED_BY(mutex);
  bool stopping GRADWIRE_GUARDED_BY(mutex) = false;
  std::thread watchdog;
};

}  // namespace gradwire::c10d
