// Connection set-up in the trace (TransportTrace): a span on each end, and one for a refusal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradwire/core/error.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/agents.h"
#include "support/temp_dir.h"
#include "transport_fixture.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace transport_fixture;

// With tracing on, each connection's set-up is one span on each end: rpc.connect on the
// dialling side, rpc.accept on the listening side (naming the worker the peer claimed), with
// the transport, the outcome and the time its handshake took; a refused one is traced too.
TEST(TransportTrace, ConnectionSetUpIsTracedOnBothEndsAndARefusalToo) {
  namespace fs = std::filesystem;
  const test::TempDir tmp("gradwire-transport-trace");
  const fs::path dir = tmp.path();
  trace::clear();
  {
    trace::ScopedCapture capture(dir.string());
    Registry reg;
    register_basics(reg);
    Group g = start_group(2, options_for(reg));
    expect_serving(g);
    const int fd = raw_connect(published_address(*g.store, 1));
    send_all(fd, std::string(transport::kHelloBytes, 'x'));
    EXPECT_TRUE(closed_by_peer(fd));
    ::close(fd);
    test::shutdown_agents(g.agents);
  }
  const std::string path = trace::flush();
  trace::clear();
  trace::set_directory("");
  std::ifstream in(path);
  const nlohmann::json file = nlohmann::json::parse(in);

  int opened_out = 0;
  int accepted_from_w0 = 0;
  int refused = 0;
  for (const auto& e : file.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("cat") != "rpc") continue;
    const std::string name = e.at("name");
    if (name != "rpc.connect" && name != "rpc.accept") continue;
    const auto& args = e.at("args");
    const std::string transport = args.at("transport");
    EXPECT_TRUE(transport == "tcp" || transport == "local" || transport == "unix") << e.dump();
    const std::string outcome = args.at("outcome");
    if (outcome == "open") {
      // Opened: the handshake ended within the span.
      EXPECT_GE(args.at("handshake_us").get<int64_t>(), 0) << e.dump();
      EXPECT_LE(args.at("handshake_us").get<double>(), e.at("dur").get<double>() + 1) << e.dump();
      if (name == "rpc.connect") ++opened_out;
      if (name == "rpc.accept" && args.at("peer") == "w0") ++accepted_from_w0;
    }
    if (name == "rpc.accept" && outcome == "refused") {
      ++refused;
      EXPECT_EQ(args.at("handshake_us"), -1) << e.dump();
    }
  }
  EXPECT_GE(opened_out, 1) << file.dump(1);
  EXPECT_GE(accepted_from_w0, 1) << file.dump(1);
  EXPECT_GE(refused, 1) << file.dump(1);
}

}  // namespace
}  // namespace gradwire::rpc
