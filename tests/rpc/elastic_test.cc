// Elastic groups (AgentOptions::elastic): workers that join a running group under new names,
// workers that leave it, the members told of both, and shutdown barriers that count the
// members of the moment. The presence table (group.h next(Presence, PresenceEvent)) is walked
// row by row.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "group.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "support/event_log.h"
#include "support/eventually.h"
#include "support/harness.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using detail::Presence;
using detail::PresenceEvent;

// Told of joined, left and lost workers, in order.
class Roster : public AgentListener {
 public:
  void on_worker_joined(const WorkerInfo& worker) override { log_.add("joined " + worker.name); }
  void on_worker_left(const WorkerInfo& worker) override { log_.add("left " + worker.name); }
  void on_worker_lost(const WorkerInfo& worker, const std::string&) override {
    log_.add("lost " + worker.name);
  }
  std::vector<std::string> wait_for(size_t n, std::chrono::milliseconds timeout) {
    return log_.wait_for(n, timeout);
  }

 private:
  test::EventLog log_;
};

class Elastic : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("add", [](int64_t a, int64_t b) { return a + b; });
    reg_.def("whoami", [](const CallContext& ctx) { return ctx.agent()->worker_info().name; });
    reg_.def("members", [](const CallContext& ctx) {
      return static_cast<int64_t>(ctx.agent()->get_worker_infos().size());
    });
    options_ = test::agent_options(reg_);
    options_.elastic = true;
    options_.max_workers = 64;
  }

  // Starts `n` elastic workers w0.. on store_, each with a Roster.
  void start(int n) {
    agents_.resize(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      rosters_.push_back(std::make_shared<Roster>());
      agents_[static_cast<size_t>(r)] =
          create_tensorpipe_agent(test::worker_name(r), r, n, store_, options_);
      agents_[static_cast<size_t>(r)]->add_listener(rosters_.back());
    }
    for (int r = 0; r < n; ++r)
      threads.emplace_back([this, r] { agents_[static_cast<size_t>(r)]->start(); });
    for (auto& t : threads)
      t.join();
  }

  std::shared_ptr<RpcAgent> join(const std::string& name, int rank) {
    AgentOptions o = options_;
    o.join_running = true;
    return make_tensorpipe_agent(name, rank, 1, store_, o);
  }

  Registry reg_;
  AgentOptions options_;
  std::shared_ptr<c10d::Store> store_ = std::make_shared<c10d::HashStore>(20s);
  test::Agents agents_;
  std::vector<std::shared_ptr<Roster>> rosters_;
};

TEST_F(Elastic, AJoinerIsMetByEveryMemberAndCallsGoBothWays) {
  start(2);
  auto late = join("late", 5);
  EXPECT_EQ(late->worker_info().id, 5);
  // It announced itself: every member has met it, and counts it.
  for (int r : {0, 1}) {
    EXPECT_EQ(rosters_[static_cast<size_t>(r)]->wait_for(1, 10s),
              std::vector<std::string>{"joined late"});
    EXPECT_EQ(agents_[static_cast<size_t>(r)]->get_worker_infos().size(), 3u);
    EXPECT_EQ(agents_[static_cast<size_t>(r)]->rpc_sync<std::string>("late", "whoami"), "late");
    EXPECT_EQ(agents_[static_cast<size_t>(r)]->rpc_sync<std::string>(5, "whoami"), "late");
    EXPECT_EQ(late->rpc_sync<int64_t>(test::worker_name(r), "add", int64_t{40}, int64_t{r}),
              40 + r);
  }
  EXPECT_EQ(late->get_worker_infos().size(), 3u);
  EXPECT_EQ(late->id_limit(), 64);
  // The shutdown barrier counts the joiner: all three leave together.
  agents_.push_back(late);
  test::shutdown_agents(agents_);
}

TEST_F(Elastic, AJoinerMeetsTheJoinersBeforeIt) {
  start(2);
  auto a = join("a", 2);
  auto b = join("b", 3);
  EXPECT_EQ(b->get_worker_infos().size(), 4u);
  EXPECT_EQ(b->rpc_sync<std::string>("a", "whoami"), "a");
  EXPECT_EQ(a->rpc_sync<std::string>("b", "whoami"), "b");
  EXPECT_EQ(a->rpc_sync<int64_t>("w0", "members"), 4);
  agents_.push_back(a);
  agents_.push_back(b);
  test::shutdown_agents(agents_);
}

TEST_F(Elastic, NamesAndRanksStayUniqueAndAJoinNeedsARunningElasticGroup) {
  start(2);
  // A name taken by a member, a rank that formed the group, a rank a joiner used.
  EXPECT_NE(test::error_text<InvalidArgument>([&] { join("w1", 7); }).find("already taken"),
            std::string::npos);
  EXPECT_NE(test::error_text<InvalidArgument>([&] { join("x", 1); }).find("formed with ranks 0..1"),
            std::string::npos);
  auto a = join("a", 2);
  EXPECT_NE(test::error_text<InvalidArgument>([&] {
              join("b", 2);
            }).find("worker 'a' joined under it already"),
            std::string::npos);
  // Beyond the capacity, and without elastic.
  EXPECT_THROW(join("c", 64), InvalidArgument);
  AgentOptions not_elastic = options_;
  not_elastic.elastic = false;
  not_elastic.join_running = true;
  EXPECT_NE(test::error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("d", 3, 1, store_, not_elastic);
            }).find("set elastic as well"),
            std::string::npos);
  agents_.push_back(a);
  test::shutdown_agents(agents_);
}

TEST(ElasticRefusals, NoRunningGroupOrAStaticOne) {
  Registry reg;
  AgentOptions o = test::agent_options(reg);
  o.elastic = true;
  o.join_running = true;
  auto empty = std::make_shared<c10d::HashStore>(2s);
  EXPECT_NE(test::error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("late", 3, 1, empty, o);
            }).find("no group has started"),
            std::string::npos);
  // A static group: joining is refused, and so is leaving.
  auto store = std::make_shared<c10d::HashStore>(20s);
  AgentOptions plain = test::agent_options(reg);
  test::Agents agents = test::start_agents(2, plain, store);
  EXPECT_NE(test::error_text<InvalidArgument>([&] {
              make_tensorpipe_agent("late", 3, 1, store, o);
            }).find("not elastic"),
            std::string::npos);
  EXPECT_NE(test::error_text<InvalidArgument>([&] { agents[1]->leave(); }).find("not elastic"),
            std::string::npos);
  test::shutdown_agents(agents);
}

TEST_F(Elastic, AWorkerThatLeavesIsToldToEveryMemberAndNothingWaitsForIt) {
  start(3);
  auto late = join("late", 3);
  for (int r = 0; r < 3; ++r)
    rosters_[static_cast<size_t>(r)]->wait_for(1, 10s);
  // A member that formed the group leaves, then the joiner.
  agents_[1]->leave();
  EXPECT_TRUE(agents_[1]->is_shut_down());
  late->leave();
  for (int r : {0, 2}) {
    EXPECT_EQ(rosters_[static_cast<size_t>(r)]->wait_for(3, 10s),
              (std::vector<std::string>{"joined late", "left w1", "left late"}));
    RpcAgent& a = *agents_[static_cast<size_t>(r)];
    EXPECT_EQ(a.get_worker_infos().size(), 2u);
    // Calls to either fail at once, saying that it left.
    for (const char* gone : {"w1", "late"}) {
      const auto begun = Clock::now();
      EXPECT_NE(test::error_text<InvalidArgument>([&] {
                  a.rpc_sync<std::string>(gone, "whoami");
                }).find("left the group"),
                std::string::npos);
      EXPECT_LT(Clock::now() - begun, 1s);
    }
  }
  // The two that remain shut down without waiting for those that left.
  const auto begun = Clock::now();
  test::shutdown_agents({agents_[0], agents_[2]});
  EXPECT_LT(Clock::now() - begun, 10s);
}

TEST_F(Elastic, AWorkerWhoseProcessDiesIsLostAndNoLongerCountedUntilReplaced) {
  options_.join_timeout = 5s;
  start(2);
  auto late = join("late", 4);
  rosters_[0]->wait_for(1, 10s);
  EXPECT_EQ(agents_[0]->rpc_sync<std::string>("late", "whoami"), "late");
  late->shutdown(false);  // as if its process died
  EXPECT_EQ(rosters_[0]->wait_for(2, 10s), (std::vector<std::string>{"joined late", "lost late"}));
  EXPECT_THROW(agents_[0]->rpc_sync<std::string>("late", "whoami"), NetworkError);
  // The store marks it lost; a replacement under its rank makes it count again.
  EXPECT_TRUE(testing::eventually([&] { return store_->check({"rpc/1/lost/4"}); }, 10s));
  AgentOptions rejoining = options_;
  rejoining.rejoin = true;
  auto again = make_tensorpipe_agent("late", 4, 2, store_, rejoining);
  EXPECT_TRUE(testing::eventually(
      [&] {
        try {
          return agents_[1]->rpc_sync<std::string>("late", "whoami") == "late";
        } catch (const std::exception&) {
          return false;
        }
      },
      10s));
  // Killed again and not replaced: the others shut down without it, at once.
  again->shutdown(false);
  EXPECT_TRUE(testing::eventually(
      [&] { return c10d::to_string(store_->get("rpc/1/lost/4")) == "1"; }, 10s));
  const auto begun = Clock::now();
  test::shutdown_agents(agents_);
  EXPECT_LT(Clock::now() - begun, 4s);
}

TEST_F(Elastic, AStaticGroupStillWaitsForALostWorkerAndNamesIt) {
  options_.elastic = false;
  options_.join_timeout = 2s;
  start(3);
  agents_[2]->shutdown(false);
  const std::vector<std::string> errors = test::shutdown_all({agents_[0], agents_[1]});
  for (const std::string& e : errors)
    EXPECT_NE(e.find("w2"), std::string::npos) << e;
}

TEST_F(Elastic, AJoinerThatLeavesBeforeAMemberMetItIsNeverAdopted) {
  start(2);
  auto late = join("late", 2);
  late->leave();
  // A worker joining afterwards reads the roster and sees it gone.
  auto later = join("later", 3);
  EXPECT_EQ(later->get_worker_infos().size(), 3u);
  EXPECT_NE(test::error_text<InvalidArgument>([&] {
              later->rpc_sync<std::string>("late", "whoami");
            }).find("left the group"),
            std::string::npos);
  agents_.push_back(later);
  test::shutdown_agents(agents_);
}

TEST_F(Elastic, WithASecretAJoinerThatKnowsItIsAdmittedAndAStrangerIsNot) {
  options_.secret = "elastic-test-secret-0123456789";
  start(2);
  auto late = join("late", 2);
  EXPECT_EQ(agents_[0]->rpc_sync<std::string>("late", "whoami"), "late");
  AgentOptions stranger = options_;
  stranger.secret = "not-the-job-secret-0123456789";
  stranger.join_running = true;
  stranger.join_timeout = 3s;
  stranger.rpc_timeout = 3s;
  auto bad = make_tensorpipe_agent("stranger", 3, 1, store_, stranger);
  // Its announcement never reached a member (refused at the handshake): nobody met it.
  EXPECT_THROW(bad->rpc_sync<std::string>("w0", "whoami"), Error);
  EXPECT_EQ(agents_[0]->get_worker_infos().size(), 3u);
  // Its leaving is marked in the store, so the others' barriers stop counting it.
  bad->leave();
  late->leave();
  test::shutdown_agents(agents_);
}

TEST_F(Elastic, ARankAJoinerHeldCanBeTakenOverByItsReplacement) {
  start(2);
  auto late = join("late", 2);
  EXPECT_EQ(agents_[0]->rpc_sync<std::string>("late", "whoami"), "late");
  late->shutdown(false);
  rosters_[0]->wait_for(2, 10s);
  AgentOptions rejoining = options_;
  rejoining.rejoin = true;
  auto again = make_tensorpipe_agent("late", 2, 2, store_, rejoining);
  EXPECT_EQ(again->incarnation(), 1);
  EXPECT_TRUE(testing::eventually(
      [&] {
        try {
          return agents_[0]->rpc_sync<std::string>("late", "whoami") == "late";
        } catch (const std::exception&) {
          return false;
        }
      },
      10s));
  agents_.push_back(again);
  test::shutdown_agents(agents_);
}

TEST_F(Elastic, AMembershipNoticeOfAnUnknownKindOrToAStaticGroupIsRefused) {
  start(2);
  // Any bytes a member puts in a notice: the kind is checked, the payload never parsed.
  EXPECT_NE(test::send_forged(*agents_[1], "w0", kMembershipHandler, std::string(4096, '\xff'))
                .find("unknown membership notice 'forged' from 'w1' (rank 1)"),
            std::string::npos);
  EXPECT_EQ(rosters_[0]->wait_for(1, std::chrono::milliseconds(100)), std::vector<std::string>{});
  test::shutdown_agents(agents_);
  // A worker of a static group serves no membership notices at all.
  AgentOptions plain = test::agent_options(reg_);
  test::Agents fixed = test::start_agents(2, plain);
  EXPECT_NE(test::send_forged(*fixed[1], "w0", kMembershipHandler, "left")
                .find("has no handler with id 6"),
            std::string::npos);
  test::shutdown_agents(fixed);
  agents_.clear();
}

TEST(ElasticPresence, EveryRowOfTheTable) {
  struct Row {
    Presence from;
    PresenceEvent event;
    Presence to;
  };
  const Row rows[] = {
      {Presence::kAbsent, PresenceEvent::kAdopt, Presence::kMember},
      {Presence::kAbsent, PresenceEvent::kLose, Presence::kAbsent},
      {Presence::kAbsent, PresenceEvent::kRejoin, Presence::kAbsent},
      {Presence::kAbsent, PresenceEvent::kLeave, Presence::kLeft},
      {Presence::kMember, PresenceEvent::kAdopt, Presence::kMember},
      {Presence::kMember, PresenceEvent::kLose, Presence::kLost},
      {Presence::kMember, PresenceEvent::kRejoin, Presence::kMember},
      {Presence::kMember, PresenceEvent::kLeave, Presence::kLeft},
      {Presence::kLost, PresenceEvent::kAdopt, Presence::kLost},
      {Presence::kLost, PresenceEvent::kLose, Presence::kLost},
      {Presence::kLost, PresenceEvent::kRejoin, Presence::kMember},
      {Presence::kLost, PresenceEvent::kLeave, Presence::kLeft},
      {Presence::kLeft, PresenceEvent::kAdopt, Presence::kLeft},
      {Presence::kLeft, PresenceEvent::kLose, Presence::kLeft},
      {Presence::kLeft, PresenceEvent::kRejoin, Presence::kLeft},
      {Presence::kLeft, PresenceEvent::kLeave, Presence::kLeft},
  };
  for (const Row& row : rows) {
    EXPECT_EQ(detail::next(row.from, row.event), row.to)
        << detail::presence_name(row.from) << " + event " << static_cast<int>(row.event);
  }
}

TEST(ElasticProcesses, AWorkerProcessJoinsTheRunningGroupAndLeavesIt) {
  Registry reg;
  reg.def("whoami", [](const CallContext& ctx) { return ctx.agent()->worker_info().name; });
  AgentOptions o = test::agent_options(reg);
  o.elastic = true;
  o.max_workers = 16;
  // Two processes form the group; then a third worker, in rank 1's process, joins it under
  // rank 9 and leaves it, while rank 0's process watches it come and go.
  const test::RankResults results = test::run_agent_processes(
      "elastic", 2, o, [&](int rank, c10d::Store& store, RpcAgent& agent) {
        auto roster = std::make_shared<Roster>();
        if (rank == 0) {
          agent.add_listener(roster);
          store.set("ready", "1");
          store.wait({"joiner-done"}, 30s);
          const auto seen = roster->wait_for(2, 10s);
          if (seen != std::vector<std::string>{"joined late", "left late"})
            throw std::runtime_error("rank 0 saw " + std::to_string(seen.size()) + " events");
          agent.shutdown();
          return;
        }
        store.wait({"ready"}, 30s);
        auto shared = std::shared_ptr<c10d::Store>(&store, [](c10d::Store*) {});
        AgentOptions j = o;
        j.join_running = true;
        auto late = make_tensorpipe_agent("late", 9, 1, shared, j);
        if (late->rpc_sync<std::string>("w0", "whoami") != "w0") throw std::runtime_error("w0?");
        late->leave();
        store.set("joiner-done", "1");
        agent.shutdown();
      });
  EXPECT_PRED_FORMAT1(test::AllRanksOk, results);
}

}  // namespace
}  // namespace gradwire::rpc
