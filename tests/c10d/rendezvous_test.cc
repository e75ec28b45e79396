// rendezvous(url) for env://, tcp:// and file://, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "c10d_test_util.h"
#include "gradwire/c10d/rendezvous.h"
#include "gradwire/core/error.h"
#include "support/harness.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Sets environment variables for one test and restores them after. Call only while the
// process runs no other thread (setenv is not thread-safe).
class ScopedEnv {
 public:
  void set(const std::string& name, const std::optional<std::string>& value) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Expects rendezvous(url) to throw InvalidArgument whose message contains `needle`.
void expect_invalid(const std::string& url, const std::string& needle) {
  try {
    rendezvous(url, 2s);
    ADD_FAILURE() << url << ": no error";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(needle)) << url;
  }
}

TEST(RendezvousTest, TcpUrlGivesEveryRankTheSameStore) {
  const uint16_t port = test::free_port();
  constexpr int kWorld = 3;
  EXPECT_ALL_RANKS_OK(test::run_ranks_as_threads(
      kWorld,
      [&](int rank) {
        const std::string url = "tcp://127.0.0.1:" + std::to_string(port) +
                                "?rank=" + std::to_string(rank) + "&world_size=3";
        RendezvousResult r = rendezvous(url, 20s);
        EXPECT_EQ(r.rank, rank);
        EXPECT_EQ(r.world_size, kWorld);
        r.store->set("from/" + std::to_string(rank), std::to_string(rank * 10));
        barrier(*r.store, "rdzv", kWorld, 20s);
        for (int other = 0; other < kWorld; ++other) {
          EXPECT_EQ(r.store->get_string("from/" + std::to_string(other)),
                    std::to_string(other * 10));
        }
        // The master (rank 0) hosts the server: it leaves only after every other rank has
        // said it is done with the store. (A barrier would not do: the master can see it
        // complete and stop the server before a slower rank's own wait reaches it.)
        if (rank != 0) {
          r.store->set("bye/" + std::to_string(rank), std::string_view("1"));
        } else {
          r.store->wait({"bye/1", "bye/2"}, 20s);
        }
      },
      30s));
}

TEST(RendezvousTest, EnvUrlReadsTheMasterVariables) {
  ScopedEnv env;
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", std::to_string(test::free_port()));
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");
  RendezvousResult r = rendezvous("env://", 10s);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  r.store->set("k", std::string_view("v"));
  EXPECT_EQ(r.store->get_string("k"), "v");
}

TEST(RendezvousTest, EnvUrlNamesMissingOrMalformedVariables) {
  ScopedEnv env;
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "29500");
  env.set("RANK", "0");
  env.set("WORLD_SIZE", std::nullopt);
  expect_invalid("env://", "WORLD_SIZE");
  env.set("WORLD_SIZE", "two");
  expect_invalid("env://", "WORLD_SIZE");
  env.set("WORLD_SIZE", "2");
  env.set("RANK", std::nullopt);
  expect_invalid("env://", "RANK");
  env.set("RANK", "2");
  expect_invalid("env://", "rank 2");
  env.set("RANK", "1");
  env.set("MASTER_ADDR", std::nullopt);
  expect_invalid("env://", "MASTER_ADDR");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "99999");
  expect_invalid("env://", "MASTER_PORT");
  // An unset MASTER_PORT is not an error: it defaults to 29500 (launch_env_test.cc).
}

TEST(RendezvousTest, FileUrlMeetsThroughAFile) {
  test::TempDir dir;
  constexpr int kWorld = 2;
  EXPECT_ALL_RANKS_OK(test::run_ranks_as_threads(
      kWorld,
      [&](int rank) {
        RendezvousResult r = rendezvous(
            "file://" + dir.path() + "/rdzv?rank=" + std::to_string(rank) + "&world_size=2", 20s);
        EXPECT_EQ(r.rank, rank);
        barrier(*r.store, "start", kWorld, 20s);
      },
      30s));
  // Both workers finished with it, so the file is gone.
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/rdzv"));
}

TEST(RendezvousTest, MalformedUrlsAreInvalidArguments) {
  expect_invalid("nonsense", "not a URL");
  expect_invalid("udp://host:1?rank=0&world_size=1", "unknown scheme 'udp'");
  expect_invalid("tcp://127.0.0.1:29500?world_size=2", "'rank'");
  expect_invalid("tcp://127.0.0.1:29500?rank=0", "'world_size'");
  expect_invalid("tcp://127.0.0.1?rank=0&world_size=1", "tcp://host:port");
  expect_invalid("tcp://127.0.0.1:0?rank=0&world_size=1", "port");
  expect_invalid("tcp://127.0.0.1:80?rank=x&world_size=1", "rank");
  expect_invalid("tcp://127.0.0.1:80?rank=3&world_size=2", "rank 3");
  expect_invalid("file://relative?rank=0&world_size=1", "absolute");
  expect_invalid("tcp://127.0.0.1:80?rank&world_size=1", "name=value");
}

}  // namespace
}  // namespace gradwire::c10d
