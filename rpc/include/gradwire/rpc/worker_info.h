// WorkerInfo: who a worker is — its unique name and its id (the rank it joined with).
//
// Agents learn every worker's info through the store at start-up, so a WorkerInfo can be
// looked up by name or by id on any worker (RpcAgent::get_worker_info). A Destination is
// what the call functions accept: a name, an id or a WorkerInfo.
//
// Thread-safety: plain values.
//
// Example:
//   WorkerInfo ps = agent->get_worker_info("ps0");
//   Tensor c = agent->rpc_sync<Tensor>(ps, "add", a, b);   // or "ps0", or ps.id
#pragma once

#include <concepts>
#include <ostream>
#include <string>
#include <utility>
#include <variant>

namespace gradwire::rpc {

struct WorkerInfo {
  std::string name;
  int id{-1};
  bool operator==(const WorkerInfo&) const = default;
  // "'ps0' (rank 1)", as errors name a worker.
  std::string describe() const;
};

std::ostream& operator<<(std::ostream& os, const WorkerInfo& info);

// A worker named by its name, its id or its WorkerInfo (implicit from each).
class Destination {
 public:
  Destination(const char* name) : target_(std::string(name)) {}  // NOLINT: implicit by design
  Destination(std::string name) : target_(std::move(name)) {}    // NOLINT
  // A template, so that a literal 0 is an id rather than a null name.
  template <std::integral I>
  Destination(I id) : target_(static_cast<int>(id)) {}        // NOLINT
  Destination(WorkerInfo info) : target_(std::move(info)) {}  // NOLINT
  const std::variant<std::string, int, WorkerInfo>& target() const { return target_; }

 private:
  std::variant<std::string, int, WorkerInfo> target_;
};

}  // namespace gradwire::rpc
