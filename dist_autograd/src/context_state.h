// What a worker holds for one context: the sends recorded in it, the workers it reached from
// here, the gradients of this worker's leaves (ContextSink), its state and each pass's
// (lifecycle.h), and its part in each pass (Pass, with the PassSink that lets a failed pass
// take back what it gave). The Container keeps one ContextState per context (contexts.cc).
//
// Locking: ContextState::mutex guards its fields; the sinks have their own (a PassSink's is
// taken before the ContextSink's, never the other way). No message is sent and no node runs
// under any of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "functions.h"
#include "gradwire/autograd/gradient_sink.h"
#include "gradwire/autograd/graph_task.h"
#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/tensor/ops.h"
#include "lifecycle.h"

namespace gradwire::dist_autograd::internal {

using rpc::Value;
using rpc::WorkerInfo;

class ContextSink;

// What one pass gives a context's leaves on this worker, so that a failed pass can take
// it back: the pass's task delivers into this sink, which forwards to the context's and
// remembers, for each leaf it touches first, what the context held for it before. Once the
// pass is over (finish) nothing more goes through; a failed pass also puts back what the
// leaves held before it (DDP's averages included: they went through here too).
//
// Thread-safety: as GradientSink; finish() may race with the pass's last deliveries, which
// are then dropped (the pass has failed, or has already delivered everything).
class PassSink : public autograd::GradientSink {
 public:
  explicit PassSink(std::shared_ptr<ContextSink> target) : target_(std::move(target)) {}
  void accumulate(const Tensor& leaf, const Tensor& grad) override;
  Tensor gradient(const Tensor& leaf) const override;
  void set_gradient(const Tensor& leaf, const Tensor& grad) override;
  // Ends the pass's deliveries; `take_back` restores what the leaves held before the pass
  // (once, even if called again).
  void finish(bool take_back);

 private:
  void remember(const Tensor& leaf) GRADWIRE_REQUIRES(mutex_);

  const std::shared_ptr<ContextSink> target_;
  mutable Mutex mutex_;
  bool open_ GRADWIRE_GUARDED_BY(mutex_) = true;
  bool taken_back_ GRADWIRE_GUARDED_BY(mutex_) = false;
  // leaf's TensorImpl -> (leaf, what the context held for it before the pass)
  std::unordered_map<const void*, std::pair<Tensor, Tensor>> before_ GRADWIRE_GUARDED_BY(mutex_);
};

// One pass as this worker knows it: its state (lifecycle.h) and, while it holds a part here,
// the part's data. Reported passes keep their sink and done (the context's last one); an
// aborted pass keeps its entry (refused from then on) but not its part's data.
struct Pass {
  PassPhase phase = PassPhase::kNone;
  std::shared_ptr<autograd::GraphTask> task;  // dropped once this worker's part is over
  std::shared_ptr<PassSink> sink;
  // This worker's part: completes with the task, or fails first (gradients it sent were
  // not delivered, the pass was aborted, the context released).
  Future<void> outcome;
  // The outcome, once the context has recorded it (what Wait answers and backward awaits).
  Future<void> done;
  std::set<const autograd::Node*> notified;  // recv functions whose sender was told
  // The sends recorded here that a Discover of this pass has named (each gets its
  // gradients in this pass). While the pass is discovering, the nodes below the sends not
  // yet named are held in the task (their counts may still grow); the rest run as
  // gradients come.
  std::set<uint64_t> named;
};

// Gradients for a send that arrived before a Discover named that send in their pass: they
// wait here (bounded) until it does, and are refused once discovery is over without it,
// or when the pass ends or the context does. The sender's Propagate is answered then.
struct EarlyGradients {
  uint64_t message_id = 0;
  std::shared_ptr<SendBackward> send;
  std::vector<Tensor> grads;  // undefined: no gradient for that input
  Future<Value> answer;
};

// The gradients of this worker's leaves in one context: in first-arrival order, indexed by
// the leaf's identity (its TensorImpl, kept alive by the entry), so that accumulating a
// gradient and looking one up cost O(1) whatever the number of leaves.
//
// It holds what it is given: a pass's gradient is the pass's own (later sums are out of
// place), and a Reducer's set_gradient hands over a copy of its averaged bucket slot
// (gradient_sink.h), so no entry aliases a bucket that a later pass of any context reuses.
class ContextSink : public autograd::GradientSink {
 public:
  void accumulate(const Tensor& leaf, const Tensor& grad) override {
    MutexLock lock(mutex_);
    auto [it, fresh] = index_.try_emplace(leaf.impl_ptr().get(), items_.size());
    if (fresh) {
      items_.emplace_back(leaf, grad);
      return;
    }
    Tensor& held = items_[it->second].second;
    held = held.defined() ? add(held, grad) : grad;
  }
  Tensor gradient(const Tensor& leaf) const override {
    MutexLock lock(mutex_);
    auto it = index_.find(leaf.impl_ptr().get());
    return it == index_.end() ? Tensor() : items_[it->second].second;
  }
  void set_gradient(const Tensor& leaf, const Tensor& grad) override {
    MutexLock lock(mutex_);
    auto [it, fresh] = index_.try_emplace(leaf.impl_ptr().get(), items_.size());
    if (fresh) {
      if (grad.defined()) {
        items_.emplace_back(leaf, grad);
      } else {
        index_.erase(it);
      }
      return;
    }
    if (grad.defined()) {
      items_[it->second].second = grad;
      return;
    }
    // Holding nothing: the last entry takes the removed one's place.
    const size_t slot = it->second;
    index_.erase(it);
    if (slot + 1 != items_.size()) {
      items_[slot] = std::move(items_.back());
      index_[items_[slot].first.impl_ptr().get()] = slot;
    }
    items_.pop_back();
  }
  std::vector<std::pair<Tensor, Tensor>> items() const {
    MutexLock lock(mutex_);
    return items_;
  }

 private:
  mutable Mutex mutex_;
  std::vector<std::pair<Tensor, Tensor>> items_ GRADWIRE_GUARDED_BY(mutex_);
  std::unordered_map<const void*, size_t> index_ GRADWIRE_GUARDED_BY(mutex_);
};

struct ContextState {
  explicit ContextState(uint64_t context_id) : id(context_id) {}
  const uint64_t id;
  const std::shared_ptr<ContextSink> sink = std::make_shared<ContextSink>();
  Mutex mutex;
  // Made: none --make--> open (lifecycle.h).
  ContextPhase phase GRADWIRE_GUARDED_BY(mutex) = ContextPhase::kOpen;
  std::map<uint64_t, std::shared_ptr<SendBackward>> sends GRADWIRE_GUARDED_BY(mutex);
  std::set<int> touched GRADWIRE_GUARDED_BY(mutex);  // workers that know this context from here
  // Every pass this worker knows in the context but those in state none: parts started and
  // not yet reported, the last reported pass, and the passes aborted here.
  std::map<uint64_t, Pass> passes GRADWIRE_GUARDED_BY(mutex);
  // Gradients that came ahead of their Discover, per pass: at most kMaxEarly for each pass
  // running here, and kMaxEarly for all the passes not started here together.
  std::map<uint64_t, std::vector<EarlyGradients>> early GRADWIRE_GUARDED_BY(mutex);
  static constexpr size_t kMaxEarly = 256;
  // Per initiator, the newest pass this worker took part in: gradients for an older pass
  // that holds no part here come too late, and are refused at once.
  std::map<int, uint64_t> newest_pass GRADWIRE_GUARDED_BY(mutex);
  // Why the last pass failed here, until one succeeds here (get_gradients throws it).
  std::optional<std::pair<uint64_t, std::string>> failure GRADWIRE_GUARDED_BY(mutex);

  // Moves the context by `event` (next(ContextPhase, ContextEvent)); false, changing
  // nothing, when the table refuses it.
  bool apply(ContextEvent event) GRADWIRE_REQUIRES(mutex);
  // Moves pass `pass_id` by `event` (next(PassPhase, PassEvent)); false, changing nothing,
  // when the table refuses it. The entry is made on start and dropped when the pass goes
  // back to none; a report supersedes the pass reported before it and drops what only a
  // running part needs (the caller has taken the task).
  bool apply(uint64_t pass_id, PassEvent event) GRADWIRE_REQUIRES(mutex);
  // The state of pass `pass_id` here.
  PassPhase pass_phase(uint64_t pass_id) const GRADWIRE_REQUIRES(mutex);
  // Pass `pass_id` while it holds a part here (holds_part), else null.
  Pass* part(uint64_t pass_id) GRADWIRE_REQUIRES(mutex);
};

}  // namespace gradwire::dist_autograd::internal
