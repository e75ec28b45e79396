// What the LibTorch bridge's multi-process suites share: ranks as processes, each with a
// process group of the backend under test ("shm" or "gloo") over a FileStore in a fresh
// directory, LibTorch on one intra-op thread (the ranks share the machine's cores).
#pragma once

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "support/harness.h"
#include "support/temp_dir.h"

namespace gradwire::torch::test_util {

using GroupBody = std::function<void(const std::shared_ptr<c10d::ProcessGroup>& group, int rank)>;

// Runs `body` on `world` ranks as processes (call before the test starts a thread) and
// expects every rank to end well.
inline void run_group_ranks(const std::string& tag, const std::string& backend, int world,
                            const GroupBody& body) {
  using namespace std::chrono_literals;
  test::TempDir dir(tag);
  const std::string path = (dir.path() / "store").string();
  const test::RankResults results = test::run_ranks_as_processes(
      world,
      [&](int rank) {
        at::set_num_threads(1);
        auto store = std::make_shared<c10d::FileStore>(
            c10d::FileStoreOptions{.path = path, .num_workers = world, .timeout = 20s});
        c10d::ProcessGroupOptions options;
        options.timeout = 20s;
        options.debug_level = c10d::DebugLevel::kOff;
        std::shared_ptr<c10d::ProcessGroup> group;
        if (backend == "shm") {
          c10d::ShmOptions shm;
          shm.gloo.host = "127.0.0.1";
          group = c10d::ProcessGroupShm::create(store, rank, world, options, shm);
        } else {
          group =
              c10d::ProcessGroupGloo::create(store, rank, world, options, {.host = "127.0.0.1"});
        }
        body(group, rank);
      },
      60s);
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace gradwire::torch::test_util
