// A string a peer controls reaches an error or a log line only escaped: RRef type names,
// function, class and method names, string arguments, and the text and worker name of a
// remote error. Each attack sends every control byte (and a terminal escape that clears the
// screen, and a newline that would start a forged log line); every error it causes, on
// either side, and every line logged meanwhile holds printable text only. Type names, which
// are printable ASCII wherever they are legitimate, are refused where they arrive. After
// each attack the attacked worker still serves legitimate calls.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/ids.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "support/agents.h"
#include "support/log_capture.h"
#include "support/proto_bytes.h"
#include "support/temp_dir.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using rpc::Registry;
using rref::RRef;
namespace proto_bytes = test::proto_bytes;

// A terminal escape (first: a description that shows a string's start shows it), every C0
// control byte, DEL, and a newline starting a forged log line.
std::string hostile() {
  std::string s = "\x1b[2Jevil";
  for (int c = 0x01; c < 0x20; ++c)
    s.push_back(static_cast<char>(c));
  s.push_back('\x7f');
  s += "\nERROR forged line";
  return s;
}

// The escaped form of the terminal escape: what an error shows in its place.
constexpr std::string_view kEscapedClear = "\\x1b[2J";

// The offset of the first raw control byte (C0 or DEL) in `text`, if any.
std::optional<size_t> raw_control_byte(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) return i;
  }
  return std::nullopt;
}

// Fails the test when `text` holds a raw control byte, naming `what` and showing the text
// around it escaped.
void expect_printable(std::string_view text, const std::string& what) {
  const std::optional<size_t> at = raw_control_byte(text);
  if (!at.has_value()) return;
  const size_t from = *at < 200 ? 0 : *at - 200;
  ADD_FAILURE() << what << ": a raw control byte at offset " << *at << " in: ..."
                << printable(text.substr(from), 400);
}

// The text of what `fn` throws; "(accepted)" when it throws nothing.
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(accepted)";
}

// Every line logged while it lives, at every level; checked for raw control bytes.
class ScannedLog {
 public:
  ScannedLog() : level_(log_level()) { set_log_level(LogLevel::kDebug); }
  ~ScannedLog() { set_log_level(level_); }
  ScannedLog(const ScannedLog&) = delete;
  ScannedLog& operator=(const ScannedLog&) = delete;

  void expect_printable_lines() {
    const std::vector<std::string> lines = capture_.lines();
    for (size_t i = 0; i < lines.size(); ++i)
      expect_printable(lines[i], "log line " + std::to_string(i));
  }

 private:
  LogLevel level_;
  test::LogCapture capture_;
};

// ---- rref's messages (rref/proto/rref.proto), encoded by hand as a forger would

using FieldValue = std::variant<uint64_t, std::string>;

// RRefMessage { <op> = { fields } }: varint fields and bytes fields, in the order given.
std::string rref_message(uint32_t op, const std::vector<std::pair<uint32_t, FieldValue>>& fields) {
  std::string body;
  for (const auto& [number, value] : fields) {
    if (const uint64_t* v = std::get_if<uint64_t>(&value)) {
      proto_bytes::tag(body, number, proto_bytes::kVarint);
      proto_bytes::varint(body, *v);
    } else {
      proto_bytes::length_delimited(body, number, std::get<std::string>(value));
    }
  }
  std::string out;
  proto_bytes::length_delimited(out, op, body);
  return out;
}
constexpr uint32_t kCreate = 1, kFetch = 2, kCallMethod = 3, kAddFork = 4;

// Ids `minter` never mints itself (its counter does not reach 2^40): forged, yet naming it.
uint64_t forged_id(int minter, uint64_t n) {
  return (uint64_t(minter) << rpc::kIdMinterShift) | (uint64_t{1} << 40) | n;
}

// Sends `payload` to rref's `handler` on `to`; returns the error text.
std::string forge(rpc::RpcAgent& from, const std::string& to, uint32_t handler,
                  const std::string& payload) {
  rpc::Request request;
  request.handler = handler;
  request.function = "forged";
  request.payload.assign(payload.begin(), payload.end());
  return error_of([&] { from.send(to, std::move(request)).get(10s); });
}

class Counter {
 public:
  explicit Counter(int64_t start) : value_(start) {}
  int64_t get() const { return value_.load(); }
  int64_t add(int64_t n) { return value_ += n; }

 private:
  std::atomic<int64_t> value_;
};

double tensor_sum(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    s += t.data<double>()[i];
  return s;
}

void define(Registry& reg) {
  reg.def("make", [](int64_t n) { return tensor(std::vector<double>{double(n), 1.0, 2.0}); });
  reg.def("sum_of", [](const RRef<Tensor>& r) { return tensor_sum(r.to_here()); });
  reg.def("add_one", [](int64_t x) { return x + 1; });
  reg.def_class<Counter>("Counter")
      .ctor<int64_t>()
      .method("get", &Counter::get)
      .method("add", &Counter::add);
  // The attacker's own functions, run on the worker that answers: each fails with text it
  // chose.
  reg.def("fail_hostile", []() -> int64_t { throw std::runtime_error(hostile()); });
  reg.def("refuse_hostile", []() -> int64_t { throw rpc::CallRejected(hostile()); });
  reg.def("relay_hostile",
          []() -> int64_t { throw RemoteError(hostile(), "Error", "relayed " + hostile()); });
  // Passes on what another worker's function threw (a chain of calls: the text crosses twice).
  reg.def("call_on", [](const rpc::CallContext& ctx, std::string to, std::string fn) {
    return ctx.agent()->rpc_sync<int64_t>(to, std::move(fn));
  });
}

// w0 and w1 still serve each other: plain calls, references and their methods.
void expect_still_serving(test::Agents& agents) {
  rpc::RpcAgent& w0 = *agents[0];
  EXPECT_EQ(w0.rpc_sync<int64_t>("w1", "add_one", int64_t{41}), 42);
  RRef<Tensor> r = rref::remote<Tensor>(w0, "w1", "make", int64_t{3});
  EXPECT_DOUBLE_EQ(tensor_sum(r.to_here()), 6.0);
  EXPECT_DOUBLE_EQ(w0.rpc_sync<double>("w1", "sum_of", r), 6.0);
  RRef<Counter> c = rref::remote<Counter>(w0, "w1", "Counter", int64_t{5});
  EXPECT_EQ(c.rpc_sync<int64_t>("add", int64_t{2}), 7);
  EXPECT_EQ(agents[1]->rpc_sync<int64_t>("w0", "add_one", int64_t{1}), 2);
}

// A type name a peer sends is refused where it arrives unless it is printable ASCII: in a
// Fetch, a CallMethod, an AddFork, a Create (of the value and of its target) and in a
// reference carried by a call's arguments. The refusal names the field and shows the name
// escaped.
TEST(PeerStrings, RRefTypeNamesAreCheckedWhereTheyArrive) {
  Registry reg;
  define(reg);
  test::Agents agents = test::start_agents(2, test::agent_options(reg));
  rpc::RpcAgent& w0 = *agents[0];
  {
    ScannedLog log;
    // References w0 holds to values w1 owns: their ids are what a forger names.
    RRef<Tensor> value = rref::remote<Tensor>(w0, "w1", "make", int64_t{1});
    RRef<Counter> counter = rref::remote<Counter>(w0, "w1", "Counter", int64_t{1});
    ASSERT_TRUE(value.creation().wait(10s));
    ASSERT_TRUE(counter.creation().wait(10s));
    const uint64_t value_id = value.core_ptr()->rref_id();
    const uint64_t counter_id = counter.core_ptr()->rref_id();
    const std::string bad = hostile();

    struct Attack {
      std::string what;
      uint32_t handler;
      std::string payload;
    };
    const std::vector<Attack> attacks = {
        {"Fetch", rref::kRRefHandler, rref_message(kFetch, {{1, value_id}, {2, bad}})},
        {"CallMethod", rref::kRRefHandler,
         rref_message(kCallMethod, {{1, counter_id}, {2, std::string("get")}, {3, bad}})},
        {"AddFork", rref::kRRefControlHandler,
         rref_message(kAddFork, {{1, value_id}, {2, forged_id(0, 1)}, {3, bad}})},
        {"Create", rref::kRRefHandler,
         rref_message(
             kCreate,
             {{1, forged_id(0, 2)}, {2, forged_id(0, 3)}, {3, bad}, {4, std::string("make")}})},
        {"Create of a method's result", rref::kRRefHandler,
         rref_message(kCreate, {{1, forged_id(0, 4)},
                                {2, forged_id(0, 5)},
                                {3, std::string("int")},
                                {4, std::string("get")},
                                {5, counter_id},
                                {6, bad}})},
    };
    for (const Attack& attack : attacks) {
      const std::string text = forge(w0, "w1", attack.handler, attack.payload);
      EXPECT_NE(text, "(accepted)") << attack.what;
      EXPECT_NE(text.find("type name"), std::string::npos) << attack.what << ": " << text;
      EXPECT_NE(text.find(kEscapedClear), std::string::npos) << attack.what << ": " << text;
      expect_printable(text, attack.what);
    }

    // A reference in an ordinary call's arguments, owned by the sender itself (the receiver
    // would take it as a fork the owner counted), whose type is not a type.
    const rpc::Value forged_ref(rpc::RRefDescriptor{0, forged_id(0, 6), forged_id(0, 7), bad});
    const std::string text = error_of([&] { w0.call("w1", "sum_of", {forged_ref}).get(10s); });
    EXPECT_NE(text, "(accepted)");
    EXPECT_NE(text.find("type name"), std::string::npos) << text;
    EXPECT_NE(text.find(kEscapedClear), std::string::npos) << text;
    expect_printable(text, "a reference in a call's arguments");

    // The references named above were left as they were.
    EXPECT_DOUBLE_EQ(tensor_sum(value.to_here()), 4.0);
    EXPECT_EQ(counter.rpc_sync<int64_t>("get"), 1);
    expect_still_serving(agents);
    log.expect_printable_lines();
  }
  test::shutdown_agents(agents);
}

// Names a peer sends that name nothing here come back escaped: a function name of a plain
// call, the function a Create runs, the method a CallMethod calls, and a string argument
// where another type is expected.
TEST(PeerStrings, UnknownNamesAndStringArgumentsComeBackEscaped) {
  Registry reg;
  define(reg);
  test::Agents agents = test::start_agents(2, test::agent_options(reg));
  rpc::RpcAgent& w0 = *agents[0];
  {
    ScannedLog log;
    const std::string bad = hostile();
    RRef<Counter> counter = rref::remote<Counter>(w0, "w1", "Counter", int64_t{1});
    ASSERT_TRUE(counter.creation().wait(10s));
    const uint64_t counter_id = counter.core_ptr()->rref_id();

    std::vector<std::pair<std::string, std::string>> errors;
    errors.emplace_back("an unregistered function",
                        error_of([&] { w0.call("w1", bad, {}).get(10s); }));
    errors.emplace_back("a Create of an unregistered function",
                        forge(w0, "w1", rref::kRRefHandler,
                              rref_message(kCreate, {{1, forged_id(0, 1)},
                                                     {2, forged_id(0, 2)},
                                                     {3, std::string("Tensor")},
                                                     {4, bad}})));
    errors.emplace_back(
        "a CallMethod of an unknown method",
        forge(w0, "w1", rref::kRRefHandler,
              rref_message(kCallMethod, {{1, counter_id}, {2, bad}, {3, std::string("Counter")}})));
    errors.emplace_back("a Create calling an unknown method",
                        forge(w0, "w1", rref::kRRefHandler,
                              rref_message(kCreate, {{1, forged_id(0, 3)},
                                                     {2, forged_id(0, 4)},
                                                     {3, std::string("int")},
                                                     {4, bad},
                                                     {5, counter_id},
                                                     {6, std::string("Counter")}})));
    errors.emplace_back("a string where an int is expected",
                        error_of([&] { w0.call("w1", "add_one", {rpc::Value(bad)}).get(10s); }));
    for (const auto& [what, text] : errors) {
      EXPECT_NE(text, "(accepted)") << what;
      EXPECT_NE(text.find(kEscapedClear), std::string::npos) << what << ": " << text;
      expect_printable(text, what);
    }
    EXPECT_EQ(counter.rpc_sync<int64_t>("get"), 1);
    expect_still_serving(agents);
    log.expect_printable_lines();
  }
  test::shutdown_agents(agents);
}

// What a worker answers a call with is shown to its caller escaped: the text of what its
// function threw, a refusal's text, and the worker and text of an error it says it relays.
// Text that crosses two workers is escaped once, not twice.
TEST(PeerStrings, RemoteErrorTextIsEscapedForTheCaller) {
  Registry reg;
  define(reg);
  test::Agents agents = test::start_agents(3, test::agent_options(reg));
  rpc::RpcAgent& w0 = *agents[0];
  {
    ScannedLog log;
    // The attacker is w1, the worker called; w0 is the caller that reads its answers.
    for (const char* fn : {"fail_hostile", "relay_hostile"}) {
      try {
        w0.rpc_sync<int64_t>("w1", fn);
        ADD_FAILURE() << fn << ": expected a RemoteError";
      } catch (const RemoteError& e) {
        expect_printable(e.what(), std::string(fn) + ": what()");
        expect_printable(e.worker(), std::string(fn) + ": worker()");
        expect_printable(e.remote_message(), std::string(fn) + ": remote_message()");
        EXPECT_NE(std::string_view(e.what()).find(kEscapedClear), std::string::npos) << e.what();
      }
    }
    const std::string refused = error_of([&] { w0.rpc_sync<int64_t>("w1", "refuse_hostile"); });
    EXPECT_NE(refused.find("refused call 'refuse_hostile'"), std::string::npos) << refused;
    EXPECT_NE(refused.find(kEscapedClear), std::string::npos) << refused;
    expect_printable(refused, "a refusal");

    // Through w1 from w2: each hop passes the error on, escaped once.
    try {
      w0.rpc_sync<int64_t>("w1", "call_on", std::string("w2"), std::string("fail_hostile"));
      ADD_FAILURE() << "expected a RemoteError";
    } catch (const RemoteError& e) {
      const std::string text = e.what();
      expect_printable(text, "an error relayed through w1");
      EXPECT_EQ(e.worker(), "w2");
      EXPECT_NE(text.find(printable(hostile(), 4096)), std::string::npos) << text;
      EXPECT_EQ(text.find("\\\\x"), std::string::npos) << "escaped twice: " << text;
    }
    expect_still_serving(agents);
    log.expect_printable_lines();
  }
  test::shutdown_agents(agents);
}

// A function name a peer sends is kept in the trace of the worker that serves it (its
// rpc.queue and rpc.serve spans), cut to the trace's text limit. A name of any bytes leaves a
// trace that is written, whose serving spans hold no raw control byte; a registered name that
// the limit cuts inside a character leaves it writable too.
TEST(PeerStrings, TracedNamesLeaveTheTraceWritable) {
  Registry reg;
  define(reg);
  const std::string cut_inside = std::string(trace::kTextBytes - 2, 'n') + "\xc3\xa4";
  reg.def(cut_inside, [] { return int64_t{7}; });
  test::Agents agents = test::start_agents(2, test::agent_options(reg));
  test::TempDir dir("gradwire-peer-strings");
  trace::clear();
  {
    trace::ScopedCapture capture;
    const std::string text =
        error_of([&] { agents[0]->call("w1", "\xff\xfe\xc3" + hostile(), {}).get(10s); });
    EXPECT_NE(text.find("is registered"), std::string::npos) << printable(text, 4096);
    EXPECT_EQ(agents[0]->rpc_sync<int64_t>("w1", cut_inside), 7);
    expect_still_serving(agents);
  }
  const std::string path = (dir.path() / "w.trace.json").string();
  EXPECT_NO_THROW(trace::write(path));
  std::ifstream in(path, std::ios::binary);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The serving worker's spans (the caller's own rpc.call span holds the name it chose).
  // Events are split where each begins: the file's objects list their keys in order, "args"
  // first.
  int serving = 0;
  constexpr std::string_view kEventStart = "{\"args\":";
  for (size_t at = written.find(kEventStart); at != std::string::npos;) {
    const size_t next = written.find(kEventStart, at + 1);
    const std::string_view event = std::string_view(written).substr(at, next - at);
    if (event.find("\"name\":\"rpc.serve\"") != std::string_view::npos ||
        event.find("\"name\":\"rpc.queue\"") != std::string_view::npos) {
      ++serving;
      expect_printable(event, "a serving span");
    }
    at = next;
  }
  EXPECT_GE(serving, 4);
  trace::clear();
  test::shutdown_agents(agents);
}

}  // namespace
}  // namespace gradwire
