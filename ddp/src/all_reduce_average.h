// Internal: the average of tensors across a group as a bucket-style future.
#pragma once

#include <memory>
#include <vector>

#include "gradwire/c10d/process_group.h"
#include "gradwire/core/future.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::ddp::detail {

// all_reduce(tensors, kAvg) on `group`; the returned future holds `value` once the average is
// in `tensors`, or the collective's error. It completes on the group's own thread: no second
// thread to wake before the backward pass may finish.
Future<Tensor> all_reduce_average(const std::shared_ptr<c10d::ProcessGroup>& group,
                                  std::vector<Tensor> tensors, Tensor value);

}  // namespace gradwire::ddp::detail
