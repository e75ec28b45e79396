#include "gradwire/ddp/join.h"

#include <string>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::ddp {

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

}  // namespace

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : options_(options), joinables_(std::move(joinables)) {
  if (joinables_.empty()) throw InvalidArgument("ddp::Join: no joinables");
  for (Joinable* j : joinables_)
    if (j == nullptr) throw InvalidArgument("ddp::Join: a joinable is null");
  group_ = &joinables_.front()->join_process_group();
  for (size_t i = 0; i < joinables_.size(); ++i) {
    try {
      joinables_[i]->set_join(this);
    } catch (...) {
      for (size_t k = 0; k < i; ++k)
        joinables_[k]->set_join(nullptr);
      throw;
    }
  }
}

Join::~Join() {
  for (Joinable* j : joinables_)
    j->set_join(nullptr);
}

Join::Exchange Join::exchange(bool has_data, bool sync) {
  const int world = group_->size();
  Tensor present = zeros({world + 1}, kInt32);
  int32_t* d = present.data<int32_t>();
  if (has_data) d[group_->rank()] = 1;
  if (has_data && sync) d[world] = 1;
  group_->all_reduce(present).wait();
  const int32_t* p = present.data<int32_t>();
  Exchange e;
  for (int r = 0; r < world; ++r) {
    if (p[r] > 0) {
      ++e.step.participants;
      e.step.root = r;
    } else {
      e.out.push_back(r);
    }
  }
  e.sync = p[world] > 0;
  return e;
}

JoinStep Join::announce(bool sync) {
  if (joined_) throw InvalidArgument("ddp::Join: a step after join() on this rank");
  ++steps_;
  Exchange e = exchange(true, sync);
  if (options_.throw_on_early_termination && !e.out.empty()) {
    throw Error("ddp::Join (rank " + std::to_string(group_->rank()) + "): rank(s) " +
                rank_list(e.out) +
                " exhausted their inputs while this rank still has data "
                "(throw_on_early_termination); every rank throws at this step");
  }
  return e.step;
}

int64_t Join::join() {
  if (joined_) throw InvalidArgument("ddp::Join: join() called twice");
  joined_ = true;
  // Who trained longest decides the final state: encode (steps, rank) as one maximum.
  int64_t shadowed = 0;
  for (;;) {
    Exchange e = exchange(false, false);
    if (e.step.participants == 0) break;
    if (options_.throw_on_early_termination) {
      throw Error("ddp::Join (rank " + std::to_string(group_->rank()) + "): rank(s) " +
                  rank_list(e.out) + " exhausted their inputs while " +
                  std::to_string(e.step.participants) +
                  " rank(s) still have data (throw_on_early_termination); every rank throws "
                  "at this step");
    }
    for (Joinable* j : joinables_)
      j->join_shadow_step(e.step.participants, e.step.root, e.sync);
    ++shadowed;
  }
  Tensor key = full({1}, Scalar(steps_ * group_->size() + group_->rank()), kInt64);
  group_->all_reduce(key, {.op = c10d::ReduceOp::kMax}).wait();
  const int root = static_cast<int>(key.data<int64_t>()[0] % group_->size());
  for (Joinable* j : joinables_)
    j->join_finish(root);
  return shadowed;
}

}  // namespace gradwire::ddp
