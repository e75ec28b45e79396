// HierarchicalProcessGroup: shared memory within a host, Gloo across hosts.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "rank_keys.h"

namespace gradwire::c10d {

struct HierarchicalProcessGroup::Impl {
  std::shared_ptr<ProcessGroup> local;     // this host's ranks; null when alone
  std::shared_ptr<ProcessGroup> leaders;   // one rank per host; null unless a leader
  std::shared_ptr<ProcessGroupGloo> full;  // every rank
  std::unique_ptr<ThreadPool> worker;      // runs the staged all_reduces in order
  std::string mapping;                     // "host ranks [0, 1] are ranks [2, 5]"
};

std::shared_ptr<HierarchicalProcessGroup> HierarchicalProcessGroup::create(
    std::shared_ptr<Store> store, int rank, int size, std::vector<std::string> hosts,
    ProcessGroupOptions options, ShmOptions shm_options) {
  auto group = std::shared_ptr<HierarchicalProcessGroup>(
      new HierarchicalProcessGroup(std::move(store), rank, size, std::move(options)));
  const std::string what = "HierarchicalProcessGroup (group '" + group->name() + "', rank " +
                           std::to_string(rank) + " of " + std::to_string(size) + ")";
  if (hosts.size() != static_cast<size_t>(size)) {
    throw InvalidArgument(what + ": " + std::to_string(hosts.size()) + " hosts given for " +
                          std::to_string(size) + " ranks");
  }
  group->shm_options_ = std::move(shm_options);
  // Hosts numbered by their lowest rank; each host's leader is that rank.
  std::map<std::string, int> host_index;
  std::vector<int> leaders;
  for (int r = 0; r < size; ++r) {
    if (host_index.emplace(hosts[static_cast<size_t>(r)], static_cast<int>(leaders.size())).second)
      leaders.push_back(r);
  }
  const std::string& mine = hosts[static_cast<size_t>(rank)];
  for (int r = 0; r < size; ++r) {
    if (hosts[static_cast<size_t>(r)] == mine) group->host_ranks_.push_back(r);
  }
  std::vector<int> local_ranks(group->host_ranks_.size());
  for (size_t i = 0; i < local_ranks.size(); ++i)
    local_ranks[i] = static_cast<int>(i);
  Impl& im = *group->impl_;
  im.mapping = "this host's ranks " + detail::ranks_text(local_ranks) + " are ranks " +
               detail::ranks_text(group->host_ranks_) + " of group '" + group->name() + "'";
  const auto local_rank =
      static_cast<int>(std::find(group->host_ranks_.begin(), group->host_ranks_.end(), rank) -
                       group->host_ranks_.begin());
  const auto local_size = static_cast<int>(group->host_ranks_.size());
  const int my_host = host_index.at(mine);

  ProcessGroupOptions inner{
      .timeout = group->timeout(), .debug_level = DebugLevel::kOff, .name = group->name()};
  const GlooOptions gloo = group->shm_options_.gloo;
  inner.name = group->name() + "/all";
  im.full = ProcessGroupGloo::create(std::make_shared<PrefixStore>("hier/all", group->store()),
                                     rank, size, inner, gloo);
  if (local_size > 1) {
    inner.name = group->name() + "/host" + std::to_string(my_host);
    im.local = ProcessGroupShm::create(
        std::make_shared<PrefixStore>("hier/host" + std::to_string(my_host), group->store()),
        local_rank, local_size, inner, group->shm_options_);
  }
  if (local_rank == 0) {
    inner.name = group->name() + "/leaders";
    im.leaders =
        ProcessGroupGloo::create(std::make_shared<PrefixStore>("hier/leaders", group->store()),
                                 my_host, static_cast<int>(leaders.size()), inner, gloo);
  }
  im.worker = std::make_unique<ThreadPool>(
      ThreadPoolOptions{.num_threads = 1, .name = "hier-" + group->name()});
  if (group->debug_level() != DebugLevel::kOff) {
    GRADWIRE_LOG(kInfo) << what << ": " << leaders.size() << " hosts; " << im.mapping;
  }
  return group;
}

HierarchicalProcessGroup::HierarchicalProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                                   ProcessGroupOptions options)
    : ProcessGroup(std::move(store), rank, size, std::move(options)),
      impl_(std::make_unique<Impl>()) {}

HierarchicalProcessGroup::~HierarchicalProcessGroup() {
  if (impl_->worker) impl_->worker->shutdown();
  impl_->worker.reset();
}

std::optional<Work> HierarchicalProcessGroup::held_failure(const OpContext& ctx) const {
  std::exception_ptr error = this->error();
  for (const auto* held : {static_cast<const ProcessGroup*>(impl_->full.get()),
                           static_cast<const ProcessGroup*>(impl_->local.get()),
                           static_cast<const ProcessGroup*>(impl_->leaders.get())}) {
    if (error == nullptr && held != nullptr) error = held->error();
  }
  if (error == nullptr) return std::nullopt;
  auto state = std::make_shared<WorkState>(ctx.description, std::vector<Tensor>{}, ctx.timeout);
  state->fail(error);
  return Work(std::move(state));
}

Work HierarchicalProcessGroup::do_all_reduce(std::vector<Tensor> tensors, ReduceOp op,
                                             const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  auto state = std::make_shared<WorkState>(ctx.description, tensors, ctx.timeout);
  std::vector<Tensor> work;
  for (const Tensor& t : tensors)
    work.push_back(t.detach());
  impl_->worker->execute([this, ctx, state, work, op]() mutable {
    if (auto failed = held_failure(ctx)) {
      state->fail(failed->exception());
      return;
    }
    const ReduceOp stage_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const char* stage = "";
    try {
      std::map<DType, std::vector<Tensor>> by_dtype;
      for (const Tensor& t : work)
        by_dtype[t.dtype()].push_back(t);
      for (auto& [dtype, group] : by_dtype) {
        Tensor flat = group.size() == 1 ? group[0] : flatten_dense_tensors(group);
        if (flat.numel() > 0) {
          stage = "reducing within the host";
          if (impl_->local)
            impl_->local->reduce(flat, {.root = 0, .op = stage_op, .timeout = ctx.timeout}).wait();
          stage = "all_reduce among the hosts' leaders";
          if (impl_->leaders)
            impl_->leaders->all_reduce(flat, {.op = stage_op, .timeout = ctx.timeout}).wait();
          stage = "broadcasting within the host";
          if (impl_->local)
            impl_->local->broadcast(flat, {.root = 0, .timeout = ctx.timeout}).wait();
        }
        if (op == ReduceOp::kAvg) flat.div_(Scalar(static_cast<double>(size())));
        if (group.size() > 1) {
          const std::vector<Tensor> parts = unflatten_dense_tensors(flat, group);
          for (size_t i = 0; i < group.size(); ++i)
            group[i].copy_(parts[i]);
        }
      }
      state->finish();
    } catch (const TimeoutError& e) {
      fail_operation(ctx, *state,
                     std::make_exception_ptr(TimeoutError(ctx.description + ": " + stage + ": " +
                                                          e.what() + " (" + impl_->mapping + ")")));
    } catch (const NetworkError& e) {
      fail_operation(ctx, *state,
                     std::make_exception_ptr(NetworkError(ctx.description + ": " + stage + ": " +
                                                          e.what() + " (" + impl_->mapping + ")")));
    } catch (...) {
      fail_operation(ctx, *state, std::current_exception());
    }
  });
  return Work(std::move(state));
}

// Everything else runs on the Gloo group of every rank, under this group's numbering.

Work HierarchicalProcessGroup::do_broadcast(std::vector<Tensor> tensors, int root,
                                            const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_broadcast(std::move(tensors), root, ctx);
}

Work HierarchicalProcessGroup::do_broadcast_coalesced(std::vector<Tensor> tensors,
                                                      std::vector<std::vector<size_t>> buckets,
                                                      int root, const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_broadcast_coalesced(std::move(tensors), std::move(buckets), root, ctx);
}

Work HierarchicalProcessGroup::do_reduce(const Tensor& tensor, int root, ReduceOp op,
                                         const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_reduce(tensor, root, op, ctx);
}

Work HierarchicalProcessGroup::do_all_gather(std::vector<Tensor> outputs, const Tensor& input,
                                             const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_all_gather(std::move(outputs), input, ctx);
}

Work HierarchicalProcessGroup::do_gather(std::vector<Tensor> outputs, const Tensor& input, int root,
                                         const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_gather(std::move(outputs), input, root, ctx);
}

Work HierarchicalProcessGroup::do_scatter(const Tensor& output, std::vector<Tensor> inputs,
                                          int root, const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_scatter(output, std::move(inputs), root, ctx);
}

Work HierarchicalProcessGroup::do_reduce_scatter(const Tensor& output, std::vector<Tensor> inputs,
                                                 ReduceOp op, const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_reduce_scatter(output, std::move(inputs), op, ctx);
}

Work HierarchicalProcessGroup::do_all_to_all(std::vector<Tensor> outputs,
                                             std::vector<Tensor> inputs, const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_all_to_all(std::move(outputs), std::move(inputs), ctx);
}

Work HierarchicalProcessGroup::do_barrier(const OpContext& ctx) {
  if (auto failed = held_failure(ctx)) return *failed;
  return impl_->full->do_barrier(ctx);
}

Work HierarchicalProcessGroup::do_send(const Tensor& tensor, int dst, uint64_t tag,
                                       const OpContext& ctx) {
  return impl_->full->do_send(tensor, dst, tag, ctx);
}

Work HierarchicalProcessGroup::do_recv(const Tensor& tensor, int src, uint64_t tag,
                                       const OpContext& ctx) {
  return impl_->full->do_recv(tensor, src, tag, ctx);
}

std::shared_ptr<ProcessGroup> HierarchicalProcessGroup::make_subgroup(std::shared_ptr<Store> store,
                                                                      int rank, int size,
                                                                      ProcessGroupOptions options) {
  // The members may all be on one host now: choose again.
  return make_process_group("shm", std::move(store), rank, size, std::move(options));
}

}  // namespace gradwire::c10d
