// The shared Store suite: every kind (HashStore, TCPStore, FileStore, PrefixStore over a
// TCPStore), with ranks as threads and, for the kinds that span processes, as forked
// processes. Every rank opens its own store object, as the workers of a job would.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "c10d_test_util.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/error.h"
#include "support/harness.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using test::RankResults;
using ::testing::HasSubstr;
using ::testing::Not;

enum class Mode { kThreads, kProcesses };

// One job's worth of stores of one kind. Built in the test's thread before any rank
// starts (so before any thread, for processes); open() is called once per rank, in it.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::shared_ptr<Store> open(int rank) = 0;
  // Called by every rank when it is done with its store. The TCP master must outlive
  // the other ranks' last calls, so it waits for them here.
  virtual void finish(int rank, Store& store) {}
};

class HashBackend : public Backend {
 public:
  std::shared_ptr<Store> open(int) override { return store_; }

 private:
  std::shared_ptr<HashStore> store_ = std::make_shared<HashStore>();
};

// Rank 0 hosts the server on a socket the test bound before the ranks started.
class TcpBackend : public Backend {
 public:
  TcpBackend(int world_size, Mode mode, bool prefixed)
      : world_size_(world_size), mode_(mode), prefixed_(prefixed) {
    listen_fd_ = test::bound_socket(port_, true);
  }
  ~TcpBackend() override {
    // With threads, rank 0's server adopted (and closed) the socket; a process's copy
    // is the parent's own.
    if (mode_ == Mode::kProcesses) ::close(listen_fd_);
  }
  std::shared_ptr<Store> open(int rank) override {
    TCPStoreOptions options;
    options.port = port_;
    options.is_master = rank == 0;
    options.listen_fd = rank == 0 ? listen_fd_ : -1;
    options.timeout = 20s;
    options.connect_timeout = 20s;
    std::shared_ptr<Store> store = std::make_shared<TCPStore>(options);
    if (prefixed_) store = std::make_shared<PrefixStore>("job", store);
    return store;
  }
  void finish(int rank, Store& store) override {
    // set is one-way: the last thing a worker sends needs no answer from the master.
    if (rank != 0) {
      store.set("__finished/" + std::to_string(rank), std::string_view("1"));
      return;
    }
    std::vector<std::string> keys;
    for (int r = 1; r < world_size_; ++r)
      keys.push_back("__finished/" + std::to_string(r));
    store.wait(keys, 20s);
  }

 private:
  int world_size_;
  Mode mode_;
  bool prefixed_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
};

class FileBackend : public Backend {
 public:
  explicit FileBackend(int world_size) : world_size_(world_size) {}
  std::shared_ptr<Store> open(int) override {
    return std::make_shared<FileStore>(FileStoreOptions{
        .path = dir_.path() + "/store", .num_workers = world_size_, .timeout = 20s});
  }

 private:
  test::TempDir dir_;
  int world_size_;
};

struct Kind {
  std::string name;
  bool spans_processes;
  std::function<std::unique_ptr<Backend>(int world_size, Mode mode)> make;
};

const std::vector<Kind>& kinds() {
  static const std::vector<Kind> all = {
      {"Hash", false, [](int, Mode) { return std::make_unique<HashBackend>(); }},
      {"TCP", true,
       [](int n, Mode m) { return std::make_unique<TcpBackend>(n, m, /*prefixed=*/false); }},
      {"File", true, [](int n, Mode) { return std::make_unique<FileBackend>(n); }},
      {"PrefixOverTCP", true,
       [](int n, Mode m) { return std::make_unique<TcpBackend>(n, m, /*prefixed=*/true); }},
  };
  return all;
}

class StoreSuite : public ::testing::TestWithParam<std::tuple<size_t, Mode>> {
 protected:
  const Kind& kind() const { return kinds()[std::get<0>(GetParam())]; }
  Mode mode() const { return std::get<1>(GetParam()); }

  // Runs fn(rank, store) as `world_size` ranks of this kind and mode.
  RankResults run(int world_size, const std::function<void(int, Store&)>& fn,
                  std::chrono::milliseconds deadline = 30s) {
    std::unique_ptr<Backend> backend = kind().make(world_size, mode());
    auto body = [&](int rank) {
      std::shared_ptr<Store> store = backend->open(rank);
      fn(rank, *store);
      backend->finish(rank, *store);
    };
    return mode() == Mode::kThreads ? test::run_ranks_as_threads(world_size, body, deadline)
                                    : test::run_ranks_as_processes(world_size, body, deadline);
  }
};

TEST_P(StoreSuite, BasicOperations) {
  EXPECT_ALL_RANKS_OK(run(1, [](int, Store& store) {
    store.set("a", std::string_view("alpha"));
    EXPECT_EQ(store.get_string("a"), "alpha");
    store.set("a", to_bytes("again"));
    EXPECT_EQ(store.get_string("a", 1s), "again");
    store.set("empty", Bytes{});
    EXPECT_TRUE(store.get("empty").empty());

    EXPECT_EQ(store.add("n", 5), 5);
    EXPECT_EQ(store.add("n", -7), -2);
    EXPECT_EQ(store.get_string("n"), "-2");
    EXPECT_THROW(store.add("a", 1), StoreError);

    EXPECT_TRUE(store.check({"a", "n"}));
    EXPECT_FALSE(store.check({"a", "missing"}));
    store.wait({"a", "n"}, 1s);

    EXPECT_TRUE(store.delete_key("a"));
    EXPECT_FALSE(store.delete_key("a"));
    EXPECT_FALSE(store.check({"a"}));

    store.multi_set({"m1", "m2", "m3"}, {to_bytes("1"), to_bytes("22"), Bytes{}});
    const std::vector<Bytes> values = store.multi_get({"m3", "m1", "m2"});
    ASSERT_EQ(values.size(), 3u);
    EXPECT_TRUE(values[0].empty());
    EXPECT_EQ(to_string(values[1]), "1");
    EXPECT_EQ(to_string(values[2]), "22");
    EXPECT_THROW(store.multi_set({"x"}, {}), InvalidArgument);

    store.append("log", std::string_view("ab"));
    store.append("log", std::string_view("cd"));
    EXPECT_EQ(store.get_string("log"), "abcd");

    std::vector<std::string> keys = store.list_keys();
    std::sort(keys.begin(), keys.end());
    EXPECT_EQ(keys, (std::vector<std::string>{"empty", "log", "m1", "m2", "m3", "n"}));
    EXPECT_EQ(store.num_keys(), 6);

    Bytes binary{0, 1, 2, 255, 0};
    store.set("bin", binary);
    EXPECT_EQ(store.get("bin"), binary);

    EXPECT_THROW(store.get("a", 0ms), InvalidArgument);
    EXPECT_THROW(store.set_timeout(-1ms), InvalidArgument);
  }));
}

TEST_P(StoreSuite, CompareSetSemantics) {
  EXPECT_ALL_RANKS_OK(run(1, [](int, Store& store) {
    // Missing key, non-empty expectation: nothing stored, nothing returned.
    EXPECT_TRUE(store.compare_set("k", to_bytes("x"), to_bytes("y")).empty());
    EXPECT_FALSE(store.check({"k"}));
    // Missing key, empty expectation: created.
    EXPECT_EQ(to_string(store.compare_set("k", {}, to_bytes("v1"))), "v1");
    // Mismatch: unchanged, current value returned.
    EXPECT_EQ(to_string(store.compare_set("k", to_bytes("zz"), to_bytes("v2"))), "v1");
    // Match: swapped.
    EXPECT_EQ(to_string(store.compare_set("k", to_bytes("v1"), to_bytes("v2"))), "v2");
    EXPECT_EQ(store.get_string("k"), "v2");
  }));
}

TEST_P(StoreSuite, TimeoutsFireOnTimeAndNameMissingKeys) {
  EXPECT_ALL_RANKS_OK(run(1, [](int, Store& store) {
    store.set("present", std::string_view("1"));
    const auto timeout = 300ms;
    auto start = std::chrono::steady_clock::now();
    try {
      store.wait({"present", "absent1", "absent2"}, timeout);
      ADD_FAILURE() << "wait returned without its keys";
    } catch (const TimeoutError& e) {
      EXPECT_THAT(e.what(), HasSubstr("'absent1'"));
      EXPECT_THAT(e.what(), HasSubstr("'absent2'"));
      EXPECT_THAT(e.what(), Not(HasSubstr("'present'")));
    }
    auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, timeout);
    EXPECT_LT(elapsed, timeout + 1500ms);

    start = std::chrono::steady_clock::now();
    try {
      store.get("nope", timeout);
      ADD_FAILURE() << "get returned a missing key";
    } catch (const TimeoutError& e) {
      EXPECT_THAT(e.what(), HasSubstr("'nope'"));
    }
    elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, timeout);
    EXPECT_LT(elapsed, timeout + 1500ms);

    EXPECT_THROW(store.multi_get({"present", "nope"}, 100ms), TimeoutError);

    // The default timeout applies where none is given.
    store.set_timeout(200ms);
    start = std::chrono::steady_clock::now();
    EXPECT_THROW(store.get("nope"), TimeoutError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 200ms + 1500ms);
  }));
}

TEST_P(StoreSuite, ConcurrentAddsAreExact) {
  constexpr int kRanks = 4;
  constexpr int kAdds = 250;
  EXPECT_ALL_RANKS_OK(run(kRanks, [](int rank, Store& store) {
    std::vector<int64_t> seen;
    seen.reserve(kAdds);
    for (int i = 0; i < kAdds; ++i)
      seen.push_back(store.add("counter", 1));
    // Every result is distinct across ranks: each rank records its own, and rank 0
    // checks the union after the barrier.
    std::string text;
    for (int64_t v : seen)
      text += std::to_string(v) + ",";
    store.set("seen/" + std::to_string(rank), text);
    barrier(store, "adds_done", kRanks, 20s);
    EXPECT_EQ(store.add("counter", 0), int64_t{kRanks} * kAdds);
    if (rank == 0) {
      std::set<int64_t> all;
      for (int r = 0; r < kRanks; ++r) {
        const std::string s = store.get_string("seen/" + std::to_string(r));
        size_t pos = 0;
        while (pos < s.size()) {
          const size_t comma = s.find(',', pos);
          all.insert(std::stoll(s.substr(pos, comma - pos)));
          pos = comma + 1;
        }
      }
      EXPECT_EQ(all.size(), size_t{kRanks} * kAdds);
      EXPECT_EQ(*all.begin(), 1);
      EXPECT_EQ(*all.rbegin(), int64_t{kRanks} * kAdds);
    }
  }));
}

TEST_P(StoreSuite, WaitWakesEveryWaiter) {
  constexpr int kRanks = 5;
  EXPECT_ALL_RANKS_OK(run(kRanks, [](int rank, Store& store) {
    if (rank == 0) {
      // Release the waiters only once all have announced themselves.
      store.wait({"all_waiting"}, 20s);
      store.set("go", std::string_view("now"));
      return;
    }
    if (store.add("waiting", 1) == kRanks - 1) store.set("all_waiting", std::string_view("1"));
    if (rank % 2 == 0) {
      EXPECT_EQ(store.get_string("go", 20s), "now");
    } else {
      store.wait({"go"}, 20s);
      EXPECT_EQ(store.get_string("go"), "now");
    }
  }));
}

TEST_P(StoreSuite, CompareSetRaceHasOneWinner) {
  constexpr int kRanks = 6;
  EXPECT_ALL_RANKS_OK(run(kRanks, [](int rank, Store& store) {
    const Bytes mine = to_bytes("rank" + std::to_string(rank));
    for (int round = 0; round < 5; ++round) {
      const std::string key = "leader/" + std::to_string(round);
      const Bytes result = store.compare_set(key, {}, mine);
      const bool won = result == mine;
      store.add("winners/" + std::to_string(round), won ? 1 : 0);
      barrier(store, "race", kRanks, 20s);
      EXPECT_EQ(store.add("winners/" + std::to_string(round), 0), 1);
      EXPECT_EQ(store.get(key), result);  // everybody saw the winner's value
    }
  }));
}

TEST_P(StoreSuite, BarrierCanBeReused) {
  constexpr int kRanks = 4;
  EXPECT_ALL_RANKS_OK(run(kRanks, [&](int rank, Store& store) {
    for (int round = 0; round < 3; ++round) {
      store.add("phase/" + std::to_string(round), 1);
      barrier(store, "b", kRanks, 20s);
      // Nobody passes round r before every rank has counted itself in round r.
      EXPECT_EQ(store.add("phase/" + std::to_string(round), 0), kRanks);
    }
  }));
}

std::string param_name(const ::testing::TestParamInfo<StoreSuite::ParamType>& info) {
  return kinds()[std::get<0>(info.param)].name +
         (std::get<1>(info.param) == Mode::kThreads ? "Threads" : "Processes");
}

// Every kind with ranks as threads; the kinds that span processes with processes too.
std::vector<StoreSuite::ParamType> all_params() {
  std::vector<StoreSuite::ParamType> params;
  for (size_t i = 0; i < kinds().size(); ++i) {
    params.emplace_back(i, Mode::kThreads);
    if (kinds()[i].spans_processes) params.emplace_back(i, Mode::kProcesses);
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, StoreSuite, ::testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace gradwire::c10d
