// The free functions (RpcFreeFunctions): init_rpc, rpc_sync, rpc_async and shutdown on the
// process's default agent and registry.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "agent_fixture.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/rpc.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace agent_fixture;

TEST(RpcFreeFunctions, InitCallAndShutdownTheDefaultAgent) {
  Registry& reg = registry();  // the free functions use the process's default registry
  if (!reg.has_function("gw_test_mul")) {
    reg.def("gw_test_mul", [](int64_t a, int64_t b) { return a * b; });
  }
  EXPECT_THROW(default_agent(), Error);
  const auto dir =
      std::filesystem::temp_directory_path() / ("gradwire-rpc-init-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  AgentOptions options;
  options.init_method = "file://" + (dir / "store").string();
  options.join_timeout = 10s;
  init_rpc("solo", 0, 1, options);
  EXPECT_THROW(init_rpc("again", 0, 1, options), Error);
  EXPECT_EQ(get_worker_info().name, "solo");
  EXPECT_EQ(rpc_sync<int64_t>("solo", "gw_test_mul", int64_t{6}, int64_t{7}), 42);
  EXPECT_EQ(rpc_async<int64_t>(0, "gw_test_mul", int64_t{3}, int64_t{5}).get(10s), 15);
  EXPECT_EQ(
      rpc_sync<int64_t>("solo", "gw_test_mul", CallOptions{.timeout = 5s}, int64_t{2}, int64_t{2}),
      4);
  shutdown();
  EXPECT_THROW(rpc_sync<int64_t>("solo", "gw_test_mul", int64_t{1}, int64_t{1}), Error);
  EXPECT_THROW(shutdown(), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gradwire::rpc
