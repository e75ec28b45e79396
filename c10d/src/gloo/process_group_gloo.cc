#include "gradwire/c10d/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/rendezvous.h"
#include "gradwire/core/env.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/net.h"
#include "gradwire/core/signals.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "rank_keys.h"
#include "reduce_kernels.h"

namespace gradwire::c10d {

namespace {

using std::chrono::milliseconds;

// Slot prefixes of gradwire's own messages; Gloo's algorithms use small prefixes of their
// own, so these stay clear of them.
constexpr uint8_t kReduceScatterPrefix = 0x40;
constexpr uint8_t kUserP2PPrefix = 0x41;
constexpr uint8_t kInternalP2PPrefix = 0x42;

using Clock = std::chrono::steady_clock;

// Gloo has no exception type of its own for a deadline: a wait that runs out and a socket
// that fails are both IoExceptions, told apart only by their text, which is not an
// interface. Our own clock decides instead. Every Gloo wait of an operation is given the
// operation's timeout, so a wait that ran out began at least that long ago: an
// IoException raised while less time than the timeout has passed since `start` cannot be
// a deadline, and one raised later is reported as one (the operation has outlived its
// deadline, whatever the last socket said).
bool past_deadline(Clock::time_point start, milliseconds timeout) {
  return Clock::now() - start >= timeout;
}

// Gloo's rendezvous interface over a gradwire Store.
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<c10d::Store> store, milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    store_->wait(keys, timeout.count() > 0 ? timeout : timeout_);
  }

 private:
  std::shared_ptr<c10d::Store> store_;
  milliseconds timeout_;
};

// The address this rank listens on and advertises when GlooOptions::host is empty (the
// header says the order).
std::string default_host(const Store* store) {
  if (std::optional<std::string> env = env_raw("GRADWIRE_GLOO_HOST"); env && !env->empty()) {
    return *env;
  }
  if (std::optional<std::string> ifname = env_raw("GLOO_SOCKET_IFNAME");
      ifname && !ifname->empty()) {
    try {
      return net::interface_address(*ifname);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("GLOO_SOCKET_IFNAME: ") + e.what());
    }
  }
  return net::advertised_host(master_host(store));
}

// Runs each task on a thread of its own, reusing idle threads: point-to-point operations
// wait in Gloo's blocking waitSend/waitRecv, and one pending receive must never delay the
// completion of another operation.
class WaiterThreads {
 public:
  explicit WaiterThreads(std::string name) : name_(std::move(name)) {}
  ~WaiterThreads() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_)
      t.join();
  }
  WaiterThreads(const WaiterThreads&) = delete;
  WaiterThreads& operator=(const WaiterThreads&) = delete;

  void run(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    if (queue_.size() > idle_) {
      threads_.emplace_back([this] { loop(); });
    } else {
      cv_.notify_one();
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::string name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Sets a Gloo option's single output (or input) by element width, so that the reduce
// kernels receive element counts.
template <typename Options, bool kInput>
void set_buffer(Options& o, void* ptr, int64_t numel, int64_t element_size) {
  const auto n = static_cast<size_t>(numel);
  auto set = [&](auto* typed) {
    if constexpr (kInput) {
      o.setInput(typed, n);
    } else {
      o.setOutput(typed, n);
    }
  };
  switch (element_size) {
    case 1:
      set(static_cast<uint8_t*>(ptr));
      return;
    case 2:
      set(static_cast<uint16_t*>(ptr));
      return;
    case 4:
      set(static_cast<uint32_t*>(ptr));
      return;
    case 8:
      set(static_cast<uint64_t*>(ptr));
      return;
    default:
      throw Error("gloo backend: unexpected element size " + std::to_string(element_size));
  }
}

uint8_t* bytes_of(const Tensor& t) {
  return static_cast<uint8_t*>(t.data_ptr());
}

std::vector<Tensor> detached(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors)
    out.push_back(t.detach());
  return out;
}

}  // namespace

// A point-to-point operation: the Gloo buffer must outlive every use the transport makes
// of it, so it lives in the state, which the group keeps until the operation completes.
struct P2PState : WorkState {
  using WorkState::WorkState;
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
  bool is_send = false;
};

struct ProcessGroupGloo::Impl {
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  std::unique_ptr<ThreadPool> workers;
  std::unique_ptr<WaiterThreads> waiters;
  std::mutex p2p_mutex;
  // Point-to-point operations not yet completed, and failed ones whose buffers the
  // transport may still name; both are released only after the context is gone.
  std::set<std::shared_ptr<P2PState>> pending;
  std::vector<std::shared_ptr<P2PState>> failed;
};

std::shared_ptr<ProcessGroupGloo> ProcessGroupGloo::create(std::shared_ptr<Store> store, int rank,
                                                           int size, ProcessGroupOptions options,
                                                           GlooOptions gloo_options) {
  return std::shared_ptr<ProcessGroupGloo>(new ProcessGroupGloo(
      std::move(store), rank, size, std::move(options), std::move(gloo_options)));
}

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options, GlooOptions gloo_options)
    : ProcessGroup(std::move(store), rank, size, std::move(options)),
      gloo_options_(std::move(gloo_options)),
      impl_(std::make_unique<Impl>()) {
  const std::string what = "ProcessGroupGloo (group '" + name() + "', rank " +
                           std::to_string(this->rank()) + " of " + std::to_string(this->size()) +
                           ")";
  if (gloo_options_.threads < 1) {
    throw InvalidArgument(what + ": GlooOptions::threads must be at least 1, got " +
                          std::to_string(gloo_options_.threads));
  }
  if (gloo_options_.all_reduce_segment_bytes < 4096) {
    throw InvalidArgument(what +
                          ": GlooOptions::all_reduce_segment_bytes must be at least 4096, got " +
                          std::to_string(gloo_options_.all_reduce_segment_bytes));
  }
  if (gloo_options_.host.empty()) {
    try {
      gloo_options_.host = default_host(this->store().get());
    } catch (const NetworkError& e) {
      throw NetworkError(what + ": cannot choose the address to listen on: " + e.what());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(what + ": cannot choose the address to listen on: " + e.what());
    }
  }
  ignore_sigpipe();
  try {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = gloo_options_.host;
    impl_->device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw NetworkError(what + ": cannot listen on host '" + gloo_options_.host + "': " + e.what());
  }
  connect(what);
}

void ProcessGroupGloo::connect(const std::string& what) {
  impl_->context = std::make_shared<::gloo::rendezvous::Context>(rank(), size());
  impl_->context->setTimeout(timeout());
  StoreAdapter adapter(std::make_shared<PrefixStore>("gloo", store()), timeout());
  const Clock::time_point start = Clock::now();
  try {
    impl_->context->connectFullMesh(adapter, impl_->device);
  } catch (const TimeoutError&) {
    // Gloo's rendezvous writes one key per rank, named by the rank.
    PrefixStore keys("gloo", store());
    throw TimeoutError(what + ": ranks " +
                       detail::ranks_text(detail::ranks_without_key(keys, "", size())) +
                       " did not join within " + std::to_string(timeout().count()) + " ms");
  } catch (const ::gloo::IoException& e) {
    if (past_deadline(start, timeout())) {
      throw TimeoutError(what + ": connecting to the other ranks timed out: " + e.what());
    }
    throw NetworkError(what + ": connecting to the other ranks failed: " + e.what());
  } catch (const ::gloo::Exception& e) {
    throw NetworkError(what + ": connecting to the other ranks failed: " + e.what());
  }
  // connectFullMesh returns once this rank's side of every pair is connected, which can be
  // before a peer has finished its side; a rank that then destroyed its group at once
  // would fail that peer's creation ("Connection closed by peer"). So no rank returns
  // before every rank has connected.
  const std::string connected = "gloo_connected/";
  store()->set(connected + std::to_string(rank()), std::string_view("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r)
    keys.push_back(connected + std::to_string(r));
  const auto left = std::chrono::duration_cast<milliseconds>(timeout() - (Clock::now() - start));
  try {
    store()->wait(keys, std::max(left, milliseconds(1)));
  } catch (const TimeoutError&) {
    throw TimeoutError(what + ": ranks " +
                       detail::ranks_text(detail::ranks_without_key(*store(), connected, size())) +
                       " did not finish connecting within " + std::to_string(timeout().count()) +
                       " ms");
  }
  impl_->workers = std::make_unique<ThreadPool>(
      ThreadPoolOptions{.num_threads = gloo_options_.threads, .name = "gloo-" + name()});
  impl_->waiters = std::make_unique<WaiterThreads>("gloo-p2p-" + name());
  if (debug_level() != DebugLevel::kOff) {
    GRADWIRE_LOG(kInfo) << what << ": connected on " << gloo_options_.host;
  }
}

ProcessGroupGloo::~ProcessGroupGloo() {
  // Queued collectives run to completion or fail (each has a deadline, and a failed
  // group fails them at once); pending point-to-point waits are cut short.
  if (impl_->workers) impl_->workers->shutdown();
  {
    std::lock_guard<std::mutex> lock(impl_->p2p_mutex);
    for (const auto& state : impl_->pending) {
      if (state->is_send) {
        state->buffer->abortWaitSend();
      } else {
        state->buffer->abortWaitRecv();
      }
    }
  }
  impl_->waiters.reset();
  impl_->context.reset();
  impl_->pending.clear();
  impl_->failed.clear();
}

// ---- running operations

Work ProcessGroupGloo::enqueue(const OpContext& ctx, std::vector<Tensor> outputs,
                               std::function<void(WorkState&)> run) {
  auto state = std::make_shared<WorkState>(ctx.description, std::move(outputs), ctx.timeout);
  // The destructor drains the workers before anything the task uses is torn down, so the
  // task may use `this`. Collectives run only on the workers, never on a waiting caller's
  // thread: a worker woken for the same task would compete with the caller for the cores.
  impl_->workers->execute([this, ctx, state, run = std::move(run)] {
    // Gloo's waits start no earlier than this, so their timeouts are measured from later.
    const Clock::time_point start = Clock::now();
    try {
      run(*state);
      state->finish();
    } catch (const ::gloo::IoException& e) {
      fail_operation(ctx, *state, e.what(), past_deadline(start, ctx.timeout));
    } catch (const ::gloo::Exception& e) {
      fail_operation(ctx, *state, e.what(), false);
    } catch (...) {
      fail_operation(ctx, *state, std::current_exception());
    }
  });
  return Work(std::move(state));
}

namespace {

uint32_t tag_of(uint64_t seq) {
  return static_cast<uint32_t>(seq);
}

}  // namespace

Work ProcessGroupGloo::do_all_reduce(std::vector<Tensor> tensors, ReduceOp op,
                                     const OpContext& ctx) {
  std::vector<Tensor> work_outputs = tensors;
  std::vector<Tensor> work = detached(tensors);
  return enqueue(ctx, std::move(work_outputs), [this, work, op, ctx](WorkState&) mutable {
    // One transfer per dtype: tensors of a dtype are packed into one buffer.
    std::map<DType, std::vector<Tensor>> by_dtype;
    for (const Tensor& t : work)
      by_dtype[t.dtype()].push_back(t);
    for (auto& [dtype, group] : by_dtype) {
      Tensor buffer = group.size() == 1 ? group[0] : flatten_dense_tensors(group);
      if (buffer.numel() > 0 && size() > 1) {
        ::gloo::AllreduceOptions o(impl_->context);
        o.setTag(tag_of(ctx.seq));
        o.setTimeout(ctx.timeout);
        const bool power_of_two = (size() & (size() - 1)) == 0;
        o.setAlgorithm(power_of_two && buffer.nbytes() <= gloo_options_.small_all_reduce_bytes
                           ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                           : ::gloo::AllreduceOptions::Algorithm::RING);
        o.setReduceFunction(gloo_backend::reduce_kernel(dtype, op));
        o.setMaxSegmentSize(gloo_options_.all_reduce_segment_bytes);
        set_buffer<::gloo::AllreduceOptions, false>(o, buffer.data_ptr(), buffer.numel(),
                                                    buffer.element_size());
        ::gloo::allreduce(o);
      }
      if (op == ReduceOp::kAvg) buffer.div_(Scalar(static_cast<double>(size())));
      if (group.size() > 1) {
        const std::vector<Tensor> parts = unflatten_dense_tensors(buffer, group);
        for (size_t i = 0; i < group.size(); ++i)
          group[i].copy_(parts[i]);
      }
    }
  });
}

void ProcessGroupGloo::broadcast_buffer(const Tensor& t, int root, const OpContext& ctx) {
  if (t.numel() == 0) return;
  ::gloo::BroadcastOptions o(impl_->context);
  o.setTag(tag_of(ctx.seq));
  o.setTimeout(ctx.timeout);
  o.setRoot(root);
  if (rank() == root) o.setInput(bytes_of(t), t.nbytes());
  o.setOutput(bytes_of(t), t.nbytes());
  ::gloo::broadcast(o);
}

Work ProcessGroupGloo::do_broadcast(std::vector<Tensor> tensors, int root, const OpContext& ctx) {
  std::vector<Tensor> work_outputs = tensors;
  std::vector<Tensor> work = detached(tensors);
  return enqueue(ctx, std::move(work_outputs), [this, work, root, ctx](WorkState&) mutable {
    if (size() == 1) return;
    for (const Tensor& t : work)
      broadcast_buffer(t, root, ctx);
  });
}

Work ProcessGroupGloo::do_broadcast_coalesced(std::vector<Tensor> tensors,
                                              std::vector<std::vector<size_t>> buckets, int root,
                                              const OpContext& ctx) {
  std::vector<Tensor> work_outputs = tensors;
  std::vector<std::vector<Tensor>> work;
  work.reserve(buckets.size());
  for (const std::vector<size_t>& bucket : buckets) {
    std::vector<Tensor>& members = work.emplace_back();
    members.reserve(bucket.size());
    for (size_t i : bucket)
      members.push_back(tensors[i].detach());
  }
  return enqueue(ctx, std::move(work_outputs), [this, work, root, ctx](WorkState&) mutable {
    if (size() == 1) return;
    // One bucket staged at a time, on the worker: the staging memory is one bucket, and
    // the caller's thread does no copying.
    for (std::vector<Tensor>& bucket : work) {
      if (bucket.size() == 1) {
        broadcast_buffer(bucket[0], root, ctx);
        continue;
      }
      if (rank() == root) {
        broadcast_buffer(flatten_dense_tensors(bucket), root, ctx);
        continue;
      }
      int64_t numel = 0;
      for (const Tensor& t : bucket)
        numel += t.numel();
      Tensor flat = empty({numel}, bucket[0].options());
      broadcast_buffer(flat, root, ctx);
      const std::vector<Tensor> parts = unflatten_dense_tensors(flat, bucket);
      for (size_t i = 0; i < bucket.size(); ++i)
        bucket[i].copy_(parts[i]);
    }
  });
}

Work ProcessGroupGloo::do_reduce(const Tensor& tensor, int root, ReduceOp op,
                                 const OpContext& ctx) {
  std::vector<Tensor> work_outputs = std::vector<Tensor>{tensor};
  Tensor t = tensor.detach();
  return enqueue(ctx, std::move(work_outputs), [this, t, root, op, ctx](WorkState&) mutable {
    if (t.numel() > 0 && size() > 1) {
      ::gloo::ReduceOptions o(impl_->context);
      o.setTag(tag_of(ctx.seq));
      o.setTimeout(ctx.timeout);
      o.setRoot(root);
      o.setReduceFunction(gloo_backend::reduce_kernel(t.dtype(), op));
      // Gloo uses the output as scratch space on every rank; only the root's is the
      // caller's tensor, so the others keep theirs unchanged.
      Tensor out = rank() == root ? t : empty_like(t);
      if (rank() != root) {
        set_buffer<::gloo::ReduceOptions, true>(o, t.data_ptr(), t.numel(), t.element_size());
      }
      set_buffer<::gloo::ReduceOptions, false>(o, out.data_ptr(), out.numel(), out.element_size());
      ::gloo::reduce(o);
    }
    if (op == ReduceOp::kAvg && rank() == root) t.div_(Scalar(static_cast<double>(size())));
  });
}

Work ProcessGroupGloo::do_all_gather(std::vector<Tensor> outputs, const Tensor& input,
                                     const OpContext& ctx) {
  std::vector<Tensor> work_outputs = outputs;
  std::vector<Tensor> outs = detached(outputs);
  Tensor in = input.detach();
  return enqueue(ctx, std::move(work_outputs), [this, outs, in, ctx](WorkState&) mutable {
    if (size() == 1 || in.numel() == 0) {
      outs[static_cast<size_t>(rank())].view({-1}).copy_(in.view({-1}));
      return;
    }
    Tensor flat = empty({int64_t{size()} * in.numel()}, in.options());
    ::gloo::AllgatherOptions o(impl_->context);
    o.setTag(tag_of(ctx.seq));
    o.setTimeout(ctx.timeout);
    o.setInput(bytes_of(in), in.nbytes());
    o.setOutput(bytes_of(flat), flat.nbytes());
    ::gloo::allgather(o);
    for (int r = 0; r < size(); ++r) {
      outs[static_cast<size_t>(r)].view({-1}).copy_(
          flat.narrow(0, int64_t{r} * in.numel(), in.numel()));
    }
  });
}

Work ProcessGroupGloo::do_gather(std::vector<Tensor> outputs, const Tensor& input, int root,
                                 const OpContext& ctx) {
  std::vector<Tensor> work_outputs = outputs;
  std::vector<Tensor> outs = detached(outputs);
  Tensor in = input.detach();
  return enqueue(ctx, std::move(work_outputs), [this, outs, in, root, ctx](WorkState&) mutable {
    if (size() == 1 || in.numel() == 0) {
      if (rank() == root) outs[static_cast<size_t>(rank())].view({-1}).copy_(in.view({-1}));
      return;
    }
    ::gloo::GatherOptions o(impl_->context);
    o.setTag(tag_of(ctx.seq));
    o.setTimeout(ctx.timeout);
    o.setRoot(root);
    o.setInput(bytes_of(in), in.nbytes());
    Tensor flat;
    if (rank() == root) {
      flat = empty({int64_t{size()} * in.numel()}, in.options());
      o.setOutput(bytes_of(flat), flat.nbytes());
    }
    ::gloo::gather(o);
    if (rank() != root) return;
    for (int r = 0; r < size(); ++r) {
      outs[static_cast<size_t>(r)].view({-1}).copy_(
          flat.narrow(0, int64_t{r} * in.numel(), in.numel()));
    }
  });
}

Work ProcessGroupGloo::do_scatter(const Tensor& output, std::vector<Tensor> inputs, int root,
                                  const OpContext& ctx) {
  std::vector<Tensor> work_outputs = std::vector<Tensor>{output};
  Tensor out = output.detach();
  std::vector<Tensor> ins = detached(inputs);
  return enqueue(ctx, std::move(work_outputs), [this, out, ins, root, ctx](WorkState&) mutable {
    if (size() == 1 || out.numel() == 0) {
      if (rank() == root) out.view({-1}).copy_(ins[static_cast<size_t>(rank())].view({-1}));
      return;
    }
    ::gloo::ScatterOptions o(impl_->context);
    o.setTag(tag_of(ctx.seq));
    o.setTimeout(ctx.timeout);
    o.setRoot(root);
    if (rank() == root) {
      std::vector<uint8_t*> ptrs;
      ptrs.reserve(ins.size());
      for (const Tensor& t : ins)
        ptrs.push_back(bytes_of(t));
      o.setInputs(ptrs, out.nbytes());
    }
    o.setOutput(bytes_of(out), out.nbytes());
    ::gloo::scatter(o);
  });
}

Work ProcessGroupGloo::do_reduce_scatter(const Tensor& output, std::vector<Tensor> inputs,
                                         ReduceOp op, const OpContext& ctx) {
  std::vector<Tensor> work_outputs = std::vector<Tensor>{output};
  Tensor out = output.detach();
  std::vector<Tensor> ins = detached(inputs);
  return enqueue(ctx, std::move(work_outputs), [this, out, ins, op, ctx](WorkState&) mutable {
    const int n = size();
    const int me = rank();
    const int64_t count = out.numel();
    if (n == 1 || count == 0) {
      out.view({-1}).copy_(ins[static_cast<size_t>(me)].view({-1}));
      if (op == ReduceOp::kAvg) out.div_(Scalar(static_cast<double>(n)));
      return;
    }
    // Ring: in step s this rank sends its running total of chunk (me - s - 1) to the
    // right and adds the left neighbour's running total of chunk (me - s - 2) into its
    // own; after n - 1 steps it holds the full combination of chunk `me`.
    Tensor acc = flatten_dense_tensors(ins);
    Tensor incoming = empty({count}, out.options());
    const auto kernel = gloo_backend::reduce_kernel(out.dtype(), op);
    const size_t chunk_bytes = out.nbytes();
    const int right = (me + 1) % n;
    const int left = (me + n - 1) % n;
    const uint64_t slot = ::gloo::Slot::build(kReduceScatterPrefix, tag_of(ctx.seq));
    auto send_buf = impl_->context->createUnboundBuffer(acc.data_ptr(), acc.nbytes());
    auto recv_buf = impl_->context->createUnboundBuffer(incoming.data_ptr(), chunk_bytes);
    for (int s = 0; s < n - 1; ++s) {
      const int send_chunk = ((me - s - 1) % n + n) % n;
      const int recv_chunk = ((me - s - 2) % n + n) % n;
      send_buf->send(right, slot, static_cast<size_t>(send_chunk) * chunk_bytes, chunk_bytes);
      recv_buf->recv(left, slot, 0, chunk_bytes);
      recv_buf->waitRecv(ctx.timeout);
      uint8_t* target = bytes_of(acc) + static_cast<size_t>(recv_chunk) * chunk_bytes;
      kernel(target, target, incoming.data_ptr(), static_cast<size_t>(count));
      send_buf->waitSend(ctx.timeout);
    }
    out.view({-1}).copy_(acc.narrow(0, int64_t{me} * count, count));
    if (op == ReduceOp::kAvg) out.div_(Scalar(static_cast<double>(n)));
  });
}

Work ProcessGroupGloo::do_all_to_all(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                                     const OpContext& ctx) {
  std::vector<Tensor> work_outputs = outputs;
  std::vector<Tensor> outs = detached(outputs);
  std::vector<Tensor> ins = detached(inputs);
  return enqueue(ctx, std::move(work_outputs), [this, outs, ins, ctx](WorkState&) mutable {
    const auto me = static_cast<size_t>(rank());
    if (size() == 1) {
      outs[me].view({-1}).copy_(ins[me].view({-1}));
      return;
    }
    std::vector<int64_t> in_bytes;
    std::vector<int64_t> out_bytes;
    for (size_t r = 0; r < ins.size(); ++r) {
      in_bytes.push_back(static_cast<int64_t>(ins[r].nbytes()));
      out_bytes.push_back(static_cast<int64_t>(outs[r].nbytes()));
    }
    Tensor in_flat = flatten_dense_tensors(ins);
    Tensor out_flat = flatten_dense_tensors(outs);
    ::gloo::AlltoallvOptions o(impl_->context);
    o.setTag(tag_of(ctx.seq));
    o.setTimeout(ctx.timeout);
    o.setInput(bytes_of(in_flat), in_bytes);
    o.setOutput(bytes_of(out_flat), out_bytes);
    ::gloo::alltoallv(o);
    const std::vector<Tensor> parts = unflatten_dense_tensors(out_flat, outs);
    for (size_t r = 0; r < outs.size(); ++r)
      outs[r].copy_(parts[r]);
  });
}

Work ProcessGroupGloo::do_barrier(const OpContext& ctx) {
  std::vector<Tensor> work_outputs = std::vector<Tensor>{};
  return enqueue(ctx, std::move(work_outputs), [this, ctx](WorkState&) mutable {
    if (size() == 1) return;
    ::gloo::BarrierOptions o(impl_->context);
    o.setTag(tag_of(ctx.seq));
    o.setTimeout(ctx.timeout);
    ::gloo::barrier(o);
  });
}

// ---- point-to-point

namespace {

uint64_t p2p_slot(uint64_t tag, uint64_t internal_base) {
  if (tag >= internal_base) {
    return ::gloo::Slot::build(kInternalP2PPrefix, static_cast<uint32_t>(tag - internal_base));
  }
  return ::gloo::Slot::build(kUserP2PPrefix, static_cast<uint32_t>(tag));
}

}  // namespace

Work ProcessGroupGloo::start_p2p(const Tensor& tensor, int peer, uint64_t tag, bool is_send,
                                 const OpContext& ctx) {
  auto state =
      std::make_shared<P2PState>(ctx.description, std::vector<Tensor>{tensor}, ctx.timeout);
  state->is_send = is_send;
  if (tensor.numel() == 0) {
    state->set_source_rank(peer);
    state->finish();
    return Work(std::move(state));
  }
  const uint64_t slot = p2p_slot(tag, kInternalTagBase);
  {
    std::lock_guard<std::mutex> lock(impl_->p2p_mutex);
    state->buffer = impl_->context->createUnboundBuffer(tensor.data_ptr(), tensor.nbytes());
    impl_->pending.insert(state);
  }
  try {
    if (is_send) {
      state->buffer->send(peer, slot);
    } else if (peer >= 0) {
      state->buffer->recv(peer, slot);
    } else {
      std::vector<int> sources;
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) sources.push_back(r);
      }
      state->buffer->recv(sources, slot);
    }
  } catch (const ::gloo::Exception& e) {
    // Posting does not wait, so its failure is the connection's, never a deadline.
    {
      std::lock_guard<std::mutex> lock(impl_->p2p_mutex);
      impl_->pending.erase(state);
      impl_->failed.push_back(state);
    }
    fail_operation(ctx, *state, e.what(), false);
    return Work(std::move(state));
  }
  impl_->waiters->run([this, state, ctx, is_send] {
    auto fail = [&](const char* what, bool timed_out) {
      {
        std::lock_guard<std::mutex> lock(impl_->p2p_mutex);
        impl_->pending.erase(state);
        impl_->failed.push_back(state);
      }
      fail_operation(ctx, *state, what, timed_out);
    };
    bool done = false;
    const Clock::time_point start = Clock::now();
    try {
      int peer_rank = -1;
      done = is_send ? state->buffer->waitSend(&peer_rank, ctx.timeout)
                     : state->buffer->waitRecv(&peer_rank, ctx.timeout);
      if (done) state->set_source_rank(peer_rank);
    } catch (const ::gloo::IoException& e) {
      fail(e.what(), past_deadline(start, ctx.timeout));
      return;
    } catch (const ::gloo::Exception& e) {
      fail(e.what(), false);
      return;
    }
    if (done) {
      std::lock_guard<std::mutex> lock(impl_->p2p_mutex);
      impl_->pending.erase(state);
    } else {
      // Aborted by the destructor; the buffer stays with the group until the context is
      // gone.
      state->fail(std::make_exception_ptr(
          Error(ctx.description + ": the process group was destroyed before it completed")));
      return;
    }
    state->finish();
  });
  return Work(std::move(state));
}

Work ProcessGroupGloo::do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) {
  return start_p2p(tensor.detach(), dst, tag, true, ctx);
}

Work ProcessGroupGloo::do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) {
  return start_p2p(tensor.detach(), src, tag, false, ctx);
}

// ---- subgroups

std::shared_ptr<ProcessGroup> ProcessGroupGloo::make_subgroup(std::shared_ptr<Store> store,
                                                              int rank, int size,
                                                              ProcessGroupOptions options) {
  return create(std::move(store), rank, size, std::move(options), gloo_options_);
}

}  // namespace gradwire::c10d
