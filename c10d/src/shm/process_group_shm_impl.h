// ProcessGroupShm's state: this rank's segment, the peers' read-only mappings, and the
// worker thread's position in the step protocol. Made by process_group_shm_setup.cc,
// used by the operations in process_group_shm.cc.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/core/fd.h"
#include "gradwire/core/thread_pool.h"

namespace gradwire::c10d {

struct ProcessGroupShm::Impl {
  struct Peer {
    const uint8_t* base = nullptr;  // read-only mapping (this rank: its own, writable one)
    size_t bytes = 0;
    const ShmSegmentHeader* header = nullptr;
    pid_t pid = 0;
    UniqueFd pidfd;  // -1 where pidfd_open is not available (or for this rank)
    uint64_t token = 0;
    uint32_t last_step = 0;
  };

  ~Impl() {
    for (size_t r = 0; r < peers.size(); ++r) {
      Peer& p = peers[r];
      if (p.base != nullptr && p.base != mine) ::munmap(const_cast<uint8_t*>(p.base), p.bytes);
    }
    if (mine != nullptr) ::munmap(mine, bytes);
    if (!unlinked && !name.empty()) ::shm_unlink(name.c_str());
  }

  std::string name;
  bool unlinked = false;
  uint8_t* mine = nullptr;
  size_t bytes = 0;
  size_t area_bytes = 0;
  ShmSegmentHeader* header = nullptr;
  std::vector<Peer> peers;
  // Worker-thread state: steps published, which input and output area is next, and for
  // each area the step every peer must have reached before this rank may overwrite it
  // (the step it publishes once it has read the area's previous contents).
  uint32_t step = 0;
  int next_input = 0;
  int next_output = 0;
  uint32_t release[4] = {0, 0, 0, 0};
  std::unique_ptr<ThreadPool> worker;
  std::shared_ptr<ProcessGroupGloo> p2p;
};

}  // namespace gradwire::c10d
