#include <string>

#include "gradwire/c10d/process_group.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/config.h"
#if GRADWIRE_HAS_NCCL
#include "gradwire/c10d/process_group_nccl.h"
#endif
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"

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
    // Every rank learns the same answer from the same records, so all make the same kind.
    const bool one_host =
        ProcessGroupShm::ranks_share_host(*store, rank, size, "backend_host", options.timeout);
    if (one_host) return ProcessGroupShm::create(std::move(store), rank, size, std::move(options));
    if (backend == "shm" && rank == 0) {
      GRADWIRE_LOG(kWarning) << "make_process_group(\"shm\"): the ranks of group '" << options.name
                             << "' are on more than one host or network namespace; using gloo";
    }
    return ProcessGroupGloo::create(std::move(store), rank, size, std::move(options));
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
