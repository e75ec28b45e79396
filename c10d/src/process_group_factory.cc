#include <algorithm>
#include <string>
#include <vector>

#include "gradwire/c10d/process_group.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/config.h"
#if GRADWIRE_HAS_NCCL
#include "gradwire/c10d/process_group_nccl.h"
#endif
#include "gradwire/core/error.h"

namespace gradwire::c10d {

bool is_gloo_available() {
  return true;
}

bool is_nccl_available() {
  return GRADWIRE_HAS_NCCL != 0;
}

std::shared_ptr<ProcessGroup> make_process_group(std::string_view backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 ProcessGroupOptions options) {
  if (backend == "gloo")
    return ProcessGroupGloo::create(std::move(store), rank, size, std::move(options));
  if (backend == "shm" || backend == "cpu") {
    // Every rank reads the same records, so all make the same kind of group.
    std::vector<std::string> hosts =
        ProcessGroupShm::rank_hosts(*store, rank, size, "backend_host", options.timeout);
    const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                      [&](const std::string& h) { return h == hosts.front(); });
    if (one_host) return ProcessGroupShm::create(std::move(store), rank, size, std::move(options));
    return HierarchicalProcessGroup::create(std::move(store), rank, size, std::move(hosts),
                                            std::move(options));
  }
  if (backend == "nccl") {
#if GRADWIRE_HAS_NCCL
    return ProcessGroupNCCL::create(std::move(store), rank, size, std::move(options));
#else
    throw InvalidArgument(
        "make_process_group: this build of gradwire has no NCCL backend (it was configured "
        "without CUDA or without NCCL); use \"gloo\"");
#endif
  }
  throw InvalidArgument("make_process_group: unknown backend '" + std::string(backend) +
                        "' (expected \"cpu\", \"shm\", \"gloo\" or \"nccl\")");
}

}  // namespace gradwire::c10d
