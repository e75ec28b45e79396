// dist_autograd/ accepts a message only from the workers that take part in what it names:
// a member of the group that never exchanged a message in a context cannot release it,
// feed gradients into it, start discovery in it, or wait for a pass it did not start. Each
// forgery is refused with an error naming the worker, and the real pass then runs exactly.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/proto_bytes.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using gradwire::testing::eventually;
using rpc::Registry;
using test::Agents;
namespace da = dist_autograd;

// The contexts `agent` holds once they drop to none, or after 10 s: a Context's end sends its
// releases without waiting for them to arrive.
size_t released_within_10s(rpc::RpcAgent& agent) {
  eventually([&] { return da::num_contexts(agent) == 0; });  // a count: polled
  return da::num_contexts(agent);
}

// dist_autograd's messages (dist_autograd/proto), encoded by hand as a forger would.
std::string message(uint32_t op, const std::vector<std::pair<uint32_t, uint64_t>>& fields) {
  return test::proto_bytes::oneof_message(op, fields);
}
constexpr uint32_t kDiscover = 1, kPropagate = 2, kWait = 3, kRelease = 4;

// Sends `payload` to dist_autograd's handler on `to` from `from`; returns the error text.
std::string forge(rpc::RpcAgent& from, const std::string& to, const std::string& payload) {
  return test::send_forged(from, to, da::kDistAutogradHandler, payload);
}

TEST(DistAutogradForgery, NonParticipantsCannotSpeakForAContext) {
  Registry reg;
  reg.def("square", [](const Tensor& x) { return mul(x, x); });
  Agents agents = test::start_agents(3, test::agent_options(reg));
  rpc::RpcAgent& w0 = *agents[0];
  rpc::RpcAgent& w1 = *agents[1];
  rpc::RpcAgent& w2 = *agents[2];
  {
    da::Context ctx(w0);
    Tensor x = tensor(std::vector<double>{1.5, -2.0, 3.0});
    x.set_requires_grad(true);
    Tensor y = w0.rpc_sync<Tensor>("w1", "square", x);
    ASSERT_EQ(da::num_contexts(w1), 1u);
    const uint64_t id = ctx.id();

    // w2 took no part: each of its messages about the context is refused, naming it.
    for (const auto& [to, payload, what] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"w1", message(kRelease, {{1, id}}), "release"},
             {"w0", message(kRelease, {{1, id}}), "release"},
             {"w0", message(kPropagate, {{1, id}, {2, id + 1}, {3, id + 2}}), "gradient"},
             {"w1", message(kDiscover, {{1, id}, {2, id + 1}}), "discovery"}}) {
      const std::string text = forge(w2, to, payload);
      EXPECT_NE(text.find("refused a " + what + " for context"), std::string::npos) << text;
      EXPECT_NE(text.find("from worker 'w2' (rank 2), which takes no part in it"),
                std::string::npos)
          << text;
    }
    // A participant cannot wait for a pass it did not start (pass ids name their minter);
    // the initiator cannot wait for a pass that does not exist; a worker that claims a
    // pass id of its own is still no participant.
    const std::string not_theirs = forge(w1, "w0", message(kWait, {{1, id}, {2, id + 7}}));
    EXPECT_NE(not_theirs.find("from worker 'w1' (rank 1), which did not start it"),
              std::string::npos)
        << not_theirs;
    const std::string no_pass = forge(w0, "w1", message(kWait, {{1, id}, {2, id + 7}}));
    EXPECT_NE(no_pass.find("takes no part in pass"), std::string::npos) << no_pass;
    const uint64_t minted_by_w2 = (uint64_t{2} << 48) | 5;
    const std::string foreign = forge(w2, "w1", message(kWait, {{1, id}, {2, minted_by_w2}}));
    EXPECT_NE(foreign.find("refused a wait for context"), std::string::npos) << foreign;

    // Nothing was released: the real pass runs and is exact (d/dx sum(x^2) = 2x).
    EXPECT_EQ(da::num_contexts(w1), 1u);
    da::backward(w0, id, {sum(y)});
    Tensor grad = da::get_gradients(w0, id).at(x);
    ASSERT_EQ(grad.numel(), 3);
    EXPECT_EQ(grad.data<double>()[0], 3.0);
    EXPECT_EQ(grad.data<double>()[1], -4.0);
    EXPECT_EQ(grad.data<double>()[2], 6.0);
  }
  // The context's end released it everywhere it went (w1 once its Release arrives: the end
  // does not wait for the answer).
  EXPECT_EQ(da::num_contexts(w0), 0u);
  EXPECT_EQ(released_within_10s(w1), 0u);
  test::shutdown_agents(agents);
}

// A request that arrives after its context was released (late, or replayed by a member)
// does not bring the context back to life: it is refused, and nothing is held.
TEST(DistAutogradForgery, AReleasedContextIsNeverMadeAgain) {
  Registry reg;
  reg.def("square", [](const Tensor& x) { return mul(x, x); });
  Agents agents = test::start_agents(2, test::agent_options(reg));
  uint64_t id = 0;
  {
    da::Context ctx(*agents[0]);
    id = ctx.id();
    Tensor x = tensor(std::vector<double>{2.0});
    x.set_requires_grad(true);
    (void)agents[0]->rpc_sync<Tensor>("w1", "square", x);
    ASSERT_EQ(da::num_contexts(*agents[1]), 1u);
  }
  ASSERT_EQ(released_within_10s(*agents[1]), 0u);
  rpc::Request late;
  late.function = "square";
  late.args = {rpc::Value(tensor(std::vector<double>{3.0}))};
  late.autograd_context_id = id;
  try {
    agents[0]->send("w1", std::move(late)).get(10s);
    ADD_FAILURE() << "expected the late request to be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("already released context"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(da::num_contexts(*agents[1]), 0u);
  test::shutdown_agents(agents);
}

// A release for a context a worker does not hold is answered, whoever sends it, and changes
// nothing.
TEST(DistAutogradForgery, ReleasingAnUnknownContextIsHarmless) {
  Registry reg;
  Agents agents = test::start_agents(2, test::agent_options(reg));
  EXPECT_EQ(forge(*agents[0], "w1", message(kRelease, {{1, (uint64_t{1} << 48) | 99}})),
            "(accepted)");
  EXPECT_EQ(da::num_contexts(*agents[1]), 0u);
  test::shutdown_agents(agents);
}

}  // namespace
}  // namespace gradwire
