#include "gradwire/c10d/reduce_op.h"

#include <string>

#include "gradwire/core/error.h"

namespace gradwire::c10d {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kProduct:
      return "product";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    if (name == reduce_op_name(op)) return op;
  }
  throw InvalidArgument("unknown reduce op '" + std::string(name) +
                        "' (expected sum, avg, product, min or max)");
}

std::ostream& operator<<(std::ostream& os, ReduceOp op) {
  return os << reduce_op_name(op);
}

}  // namespace gradwire::c10d
