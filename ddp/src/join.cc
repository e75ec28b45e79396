#include "gradwire/ddp/join.h"

#include <string>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::ddp {

Join::Join(std::vector<Joinable*> joinables) : joinables_(std::move(joinables)) {
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

int Join::exchange(bool has_data, int& root) {
  const int world = group_->size();
  Tensor present = zeros({world}, kInt32);
  if (has_data) present.data<int32_t>()[group_->rank()] = 1;
  group_->all_reduce(present).wait();
  const int32_t* p = present.data<int32_t>();
  int count = 0;
  root = -1;
  for (int r = 0; r < world; ++r) {
    if (p[r] > 0) {
      ++count;
      root = r;
    }
  }
  return count;
}

int Join::announce(int& root) {
  if (joined_) throw InvalidArgument("ddp::Join: a step after join() on this rank");
  ++steps_;
  return exchange(true, root);
}

int64_t Join::join() {
  if (joined_) throw InvalidArgument("ddp::Join: join() called twice");
  joined_ = true;
  // Who trained longest decides the final state: encode (steps, rank) as one maximum.
  int64_t shadowed = 0;
  for (;;) {
    int root = -1;
    const int participants = exchange(false, root);
    if (participants == 0) break;
    for (Joinable* j : joinables_)
      j->join_shadow_step(participants, root);
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
