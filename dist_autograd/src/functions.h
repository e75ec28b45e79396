// The functions a context records on each worker: SendBackward where a message carrying
// tensors that require grad left, RecvBackward where it arrived (the grad_fn of what it
// brought). Recording makes them (recording.cc); discovery walks between them across workers
// (discovery.cc); RecvBackward's apply sends its gradients on (execution.cc).
//
// Thread-safety: both are autograd nodes (run under the node's own mutex by a GraphTask);
// what they hold is immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/autograd/node.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/worker_info.h"

namespace gradwire::dist_autograd::internal {

using rpc::Value;
using rpc::WorkerInfo;

class Container;

// The tensors that require grad inside a message's values, in order.
std::vector<Tensor> grad_tensors(const std::vector<const Value*>& values);

// On the sender: the gradients that come back for the tensors a message sent, passed on to
// where those tensors came from. Only `peer`, the worker the message went to, holds the
// recv function that discovers this send and propagates into it.
class SendBackward : public autograd::Node {
 public:
  SendBackward(const std::vector<Tensor>& sent, int peer) : peer_(peer) {
    for (const Tensor& t : sent) {
      add_input_metadata(t);
      add_next_edge(autograd::gradient_edge(t));
    }
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return std::move(grads); }
  std::string name() const override { return "SendRpcBackward"; }
  int peer() const { return peer_; }

 private:
  const int peer_;
};

// On the receiver: the grad_fn of the tensors a message brought; their gradients go back to
// the sender's SendBackward.
class RecvBackward : public autograd::Node {
 public:
  RecvBackward(std::weak_ptr<Container> container, uint64_t context_id, WorkerInfo from,
               uint64_t message_id)
      : container_(std::move(container)),
        context_id_(context_id),
        from_(std::move(from)),
        message_id_(message_id) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "RecvRpcBackward"; }
  const WorkerInfo& from() const { return from_; }
  uint64_t message_id() const { return message_id_; }
  uint64_t context_id() const { return context_id_; }

 private:
  std::weak_ptr<Container> container_;
  const uint64_t context_id_;
  const WorkerInfo from_;
  const uint64_t message_id_;
};

}  // namespace gradwire::dist_autograd::internal
