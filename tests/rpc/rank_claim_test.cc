// Two processes given one rank of an rpc group: the second one's wait for its group names
// the first, instead of only listing the workers that did not come.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "group.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

// The store as it is once worker "w1" (on host node-a) has joined group 1 as rank 1.
std::shared_ptr<c10d::HashStore> store_with_rank1_running() {
  auto store = std::make_shared<c10d::HashStore>(10s);
  store->add("rpc/starts/1", 1);
  store->set("rpc/1/worker/1",
             "gradwire-rpc 1\nname w1\nurl tcp://10.9.0.1:1\ndevices 0\nhost node-a\nnetns 1\n");
  return store;
}

// What a second process told it is rank 1 gets from joining.
std::string second_claimant_error(std::shared_ptr<c10d::Store> store) {
  detail::GroupDirectory group(WorkerInfo{"w1-node1", 1}, 2, std::move(store), 300ms);
  detail::GroupDirectory::Announcement me;
  me.url = "tcp://10.9.0.2:1";
  me.host_id = "node-b";
  me.netns = 1;
  me.transports = {"tcp"};
  try {
    group.join(me, /*direct_copies=*/false);
  } catch (const TimeoutError& e) {
    return e.what();
  }
  return "(joined)";
}

TEST(RankClaim, ASecondProcessOfOneRankIsToldWhoHoldsIt) {
  auto store = store_with_rank1_running();
  const std::string error = second_claimant_error(store);
  EXPECT_THAT(error, HasSubstr("Rank 1 is also held by worker 'w1' on host node-a"));
  EXPECT_THAT(error, HasSubstr("--nproc-per-node must be equal on every node"));
  EXPECT_THAT(error, HasSubstr("gradwire-run --rdzv-endpoint"));
}

TEST(RankClaim, AWorkerThatLeftItsGroupIsNoClaim) {
  // A later group on the same store after a graceful shutdown: the earlier worker left.
  auto store = store_with_rank1_running();
  store->set("rpc/1/shutdown/left/1", "1");
  const std::string error = second_claimant_error(store);
  EXPECT_THAT(error, HasSubstr("workers that did not"));
  EXPECT_THAT(error, Not(HasSubstr("also held")));
}

}  // namespace
}  // namespace gradwire::rpc
