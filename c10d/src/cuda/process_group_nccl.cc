// ProcessGroupNCCL: the group and its operations, each built as a plan of NCCL calls and
// issued by the Impl (process_group_nccl_impl.h).
#include "gradwire/config.h"

#if GRADWIRE_HAS_NCCL

#include "gradwire/c10d/process_group_nccl.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "process_group_nccl_impl.h"

namespace gradwire::c10d {

using namespace nccl_detail;

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
