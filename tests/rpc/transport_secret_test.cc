// A job with a secret (TransportSecret): its workers call each other, outsiders with a wrong
// secret or none are refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "gradwire/core/error.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/sync.h"
#include "transport/stream_transport.h"
#include "transport_fixture.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace transport_fixture;

// A TensorPipe context that speaks gradwire's tcp with `secret`, as an outsider would.
std::string outsider_call_error(const std::pair<std::string, int>& to, const std::string& secret) {
  auto context = std::make_shared<tp::Context>(tp::ContextOptions().name("outsider"));
  transport::StreamOptions o;
  o.secret = secret;
  context->registerTransport(0, "tcp", transport::create_stream_context(o));
  context->registerChannel(0, "basic", tp::channel::basic::create());
  auto pipe = context->connect("tcp://" + to.first + ":" + std::to_string(to.second));
  test::CountdownLatch done(1);
  std::string error;
  tp::Message message;
  message.metadata = "hello?";
  pipe->write(std::move(message), [&](const tp::Error& e) {
    if (e) error = e.what();
    done.count_down();
  });
  EXPECT_TRUE(done.wait(10s));
  context->close();
  context->join();
  return error;
}

TEST(TransportSecret, AJobWithASecretServesItsWorkersAndRefusesOutsiders) {
  Registry reg;
  register_basics(reg);
  AgentOptions options = options_for(reg);
  options.secret = "the job's secret, 16+ bytes";
  Group g = start_group(3, options);
  // Workers that share it call each other as usual, tensors included.
  EXPECT_EQ(sum(g.agents[2]->rpc_sync<Tensor>("w1", "echo", ones({1000}))).item<float>(), 1000);
  expect_serving(g);
  const auto w1 = published_address(*g.store, 1);
  const uint64_t before = g.agents[1]->metrics().connections_refused;
  const std::string wrong = outsider_call_error(w1, "a guess at the secret");
  EXPECT_NE(wrong.find("authentication failed"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find("the job's secret"), std::string::npos) << wrong;
  const std::string none = outsider_call_error(w1, "");
  EXPECT_NE(none.find("requires a shared secret and none is set here"), std::string::npos) << none;
  // A raw client with the wrong secret that ignores the server's proof is refused too.
  {
    const int fd = raw_connect(w1);
    EXPECT_FALSE(raw_handshake(fd, "another guess at the secret"));
    ::close(fd);
  }
  expect_serving(g);
  EXPECT_GE(g.agents[1]->metrics().connections_refused, before + 2);
  test::shutdown_agents(g.agents);
}

}  // namespace
}  // namespace gradwire::rpc
