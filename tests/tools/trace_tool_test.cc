// gradwire-trace as users run it: merge, summary and svg on small hand-written trace files
// whose answers are worked out here by hand, every kind of bad input, and a real 3-process
// ps_train run traced with --trace DIR whose merged timeline must hold together (one
// process per worker, flows from each call to its serving, every serving inside its call
// once the clocks are aligned, spans covering at least 90 % of each trainer's step time).
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "launch.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace gradwire::testing::launcher;

struct Result {
  int status;
  std::string out, err;
};

Result trace_tool(std::vector<std::string> args) {
  Launch run(std::move(args), {}, GRADWIRE_TRACE_TOOL_PATH);
  const int status = run.wait(60s);
  return Result{status, run.out(), run.err()};
}

class TraceToolTest : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(dir_ / "in"); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / "in" / name) << text;
  }
  void write(const std::string& name, const json& j) { write(name, j.dump()); }

  // A worker's file as gradwire::trace writes it: `events` with this pid, the worker id,
  // and either a clock_offset (offset, rtt) or only the clock_sync pair.
  static json worker_file(const std::string& name, int64_t pid, int64_t id, json events,
                          std::optional<std::pair<int64_t, int64_t>> offset,
                          std::pair<int64_t, int64_t> sync = {0, 0}) {
    json all = json::array({{{"name", "process_name"},
                             {"ph", "M"},
                             {"pid", pid},
                             {"tid", 0},
                             {"args", {{"name", name}}}}});
    for (json& e : events) {
      e["pid"] = pid;
      all.push_back(e);
    }
    json other = {{"format", "gradwire-trace 1"},
                  {"process_name", name},
                  {"pid", pid},
                  {"worker_id", id},
                  {"clock_sync", {{"steady_ns", sync.first}, {"system_ns", sync.second}}}};
    if (offset) other["clock_offset"] = {{"offset_ns", offset->first}, {"rtt_ns", offset->second}};
    return {{"traceEvents", all}, {"displayTimeUnit", "ns"}, {"otherData", other}};
  }
  static json span(const std::string& name, const std::string& cat, double ts_us, double dur_us,
                   int64_t tid, json args = json::object()) {
    return {{"name", name},  {"cat", cat}, {"ph", "X"},   {"ts", ts_us},
            {"dur", dur_us}, {"tid", tid}, {"args", args}};
  }
  static json read_json(const fs::path& p) {
    std::ifstream in(p);
    return json::parse(in);
  }

  gradwire::test::TempDir tmp_{"gradwire-trace-tool"};
  fs::path dir_ = tmp_.path();
};

// Two workers whose steady clocks differ by 5 ms: trainer's call at its 10 us, ps's serving
// at its 5035 us; with the offsets both sit 25 us apart on the store's clock.
TEST_F(TraceToolTest, MergeShiftsEachFileByItsOffsetAndLinksEachCallToItsServing) {
  const int64_t base = 1'700'000'000'000'000'000;
  write("trainer.trace.json",
        worker_file("trainer", 4242, 1,
                    {span("rpc.call", "rpc", 10, 50, 7, {{"peer", 0}, {"request_id", 9}}),
                     span("rpc.call", "rpc", 70, 5, 7, {{"peer", 0}, {"request_id", 10}})},
                    std::pair<int64_t, int64_t>{base, 2000}));
  write("ps.trace.json",
        worker_file("ps", 4242, 0,
                    {span("rpc.serve", "rpc", 5035, 10, 3, {{"peer", 1}, {"request_id", 9}}),
                     span("rpc.serve", "rpc", 5040, 1, 3, {{"peer", 2}, {"request_id", 10}})},
                    std::pair<int64_t, int64_t>{base - 5'000'000, 6000}));
  const auto out = (dir_ / "job.json").string();
  const Result r = trace_tool({"merge", (dir_ / "in").string(), "-o", out});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "residual +-1.0 us")) << r.out;  // trainer: rtt 2 us
  EXPECT_TRUE(has(r.out, "residual +-3.0 us")) << r.out;  // ps: rtt 6 us
  const json job = read_json(out);
  // The earliest event (the trainer's first call, at 10 us of its clock) is time 0.
  EXPECT_EQ(job["otherData"]["origin_ns"].get<int64_t>(), base + 10'000);
  std::map<int64_t, std::string> names;
  std::map<std::string, json> by_name;
  std::vector<json> flows;
  for (const json& e : job["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      EXPECT_FALSE(names.count(e["pid"].get<int64_t>())) << "two processes share a pid";
      names[e["pid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
    }
    if (e["ph"] == "X") by_name[e["name"].get<std::string>() + "/" + e["args"].dump()] = e;
    if (e["ph"] == "s" || e["ph"] == "f") flows.push_back(e);
  }
  ASSERT_EQ(names.size(), 2u);  // the same pid in both files, remapped
  const json serve = by_name["rpc.serve/" + json({{"peer", 1}, {"request_id", 9}}).dump()];
  const json call = by_name["rpc.call/" + json({{"peer", 0}, {"request_id", 9}}).dump()];
  EXPECT_DOUBLE_EQ(call["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(serve["ts"].get<double>(), 25.0);  // 5035 - 5000 - 10
  EXPECT_EQ(names[serve["pid"].get<int64_t>()], "ps");
  // One flow: request 9 (request 10 was served for worker 2, not for this caller).
  ASSERT_EQ(flows.size(), 2u);
  const json& s = flows[0]["ph"] == "s" ? flows[0] : flows[1];
  const json& f = flows[0]["ph"] == "s" ? flows[1] : flows[0];
  EXPECT_EQ(s["id"], f["id"]);
  EXPECT_EQ(f["bp"], "e");
  EXPECT_EQ(s["pid"], call["pid"]);
  EXPECT_EQ(s["tid"], 7);
  EXPECT_DOUBLE_EQ(s["ts"].get<double>(), 0.0);
  EXPECT_EQ(f["pid"], serve["pid"]);
  EXPECT_EQ(f["tid"], 3);
  EXPECT_DOUBLE_EQ(f["ts"].get<double>(), 25.0);
  for (const json& w : job["otherData"]["workers"]) {
    EXPECT_EQ(w["residual_ns"].get<int64_t>(), w["name"] == "ps" ? 3000 : 1000);
  }
}

TEST_F(TraceToolTest, AFileWithoutAStoreOffsetIsAlignedByItsSystemClockAndSaysSo) {
  // steady 1000 us is system 2'000'000 us: the span at steady 1500 us is at system
  // 2'000'500 us.
  write("solo.trace.json", worker_file("solo", 7, 0, {span("work", "examples", 1500, 10, 1)},
                                       std::nullopt, {1'000'000, 2'000'000'000}));
  const auto out = (dir_ / "job.json").string();
  const Result r = trace_tool({"merge", (dir_ / "in").string(), "-o", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.err, "solo.trace.json: no clock_offset")) << r.err;
  EXPECT_TRUE(has(r.out, "aligned by its system clock: residual unknown")) << r.out;
  EXPECT_EQ(read_json(out)["otherData"]["origin_ns"].get<int64_t>(), 2'000'500'000);
}

// One step of 100 us: forward [10, 40), a call [30, 60) on another thread, a wait [50, 70),
// the optimizer [80, 90). Waiting 50-70 (20 us), communication 30-50 (20), compute 10-30
// and 80-90 (30), nothing at 0-10, 70-80, 90-100 (30 unaccounted). A span after the step
// counts for nothing; a second worker's step 1 lasts 150 us, all of it a forward.
TEST_F(TraceToolTest, SummarySplitsEachStepIntoComputeCommunicationWaitingAndUnaccounted) {
  write("t1.trace.json",
        worker_file("t1", 1, 1,
                    {span("step", "train", 0, 100, 1, {{"step", 1}}),
                     span("train.forward", "train", 10, 30, 1),
                     span("rpc.call", "rpc", 30, 30, 2, {{"peer", 0}, {"request_id", 1}}),
                     span("dist_autograd.wait", "dist_autograd", 50, 20, 1),
                     span("train.optimizer", "train", 80, 10, 1),
                     span("train.forward", "train", 200, 10, 1)},
                    std::pair<int64_t, int64_t>{0, 0}));
  // t3: a served call and an rref message handled here are compute, a Propagate sent and
  // an rref message sent communication, waiting for the optimizer's lock waiting:
  // [0, 10) rpc.serve, [10, 20) dist_autograd.propagate, [20, 30) rref.handle,
  // [30, 40) rref.send, [40, 50) dist_optim.wait_lock.
  write("t3.trace.json",
        worker_file(
            "t3", 3, 3,
            {span("step", "train", 0, 50, 1, {{"step", 1}}), span("rpc.serve", "rpc", 0, 10, 1),
             span("dist_autograd.propagate", "dist_autograd", 10, 10, 1),
             span("rref.handle", "rref", 20, 10, 1), span("rref.send", "rref", 30, 10, 1),
             span("dist_optim.wait_lock", "dist_optim", 40, 10, 1)},
            std::pair<int64_t, int64_t>{0, 0}));
  write("t2.trace.json", worker_file("t2", 2, 2,
                                     {span("step", "train", 0, 150, 1, {{"step", 1}}),
                                      span("train.forward", "train", 0, 150, 1)},
                                     std::pair<int64_t, int64_t>{0, 0}));
  const Result r = trace_tool({"summary", (dir_ / "in").string(), "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json s = json::parse(r.out);
  ASSERT_EQ(s["steps"].size(), 1u);
  const json& step = s["steps"][0];
  EXPECT_EQ(step["step"], 1);
  std::map<std::string, json> rows;
  for (const json& w : step["workers"])
    rows[w["worker"]] = w;
  EXPECT_EQ(rows["t1"]["step_ns"], 100'000);
  EXPECT_EQ(rows["t1"]["waiting_ns"], 20'000);
  EXPECT_EQ(rows["t1"]["communication_ns"], 20'000);
  EXPECT_EQ(rows["t1"]["compute_ns"], 30'000);
  EXPECT_EQ(rows["t1"]["unaccounted_ns"], 30'000);
  EXPECT_EQ(rows["t2"]["compute_ns"], 150'000);
  EXPECT_EQ(rows["t2"]["unaccounted_ns"], 0);
  EXPECT_EQ(rows["t3"]["compute_ns"], 20'000);
  EXPECT_EQ(rows["t3"]["communication_ns"], 20'000);
  EXPECT_EQ(rows["t3"]["waiting_ns"], 10'000);
  EXPECT_EQ(rows["t3"]["unaccounted_ns"], 0);
  EXPECT_EQ(step["slowest"]["step"], "t2");
  EXPECT_EQ(step["slowest"]["compute"], "t2");
  EXPECT_EQ(step["slowest"]["waiting"], "t1");
  EXPECT_EQ(step["slowest"]["unaccounted"], "t1");
  for (const json& w : s["workers"]) {
    EXPECT_DOUBLE_EQ(w["unaccounted_fraction"].get<double>(), w["worker"] == "t1" ? 0.3 : 0.0)
        << w.dump();
  }
  // The same numbers from a merged file, and as a table.
  const auto merged = (dir_ / "job.json").string();
  ASSERT_EQ(trace_tool({"merge", (dir_ / "in").string(), "-o", merged}).status, 0);
  const Result again = trace_tool({"summary", merged, "--json"});
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(json::parse(again.out)["steps"], s["steps"]);
  const Result table = trace_tool({"summary", merged});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_TRUE(has(table.out, "slowest: step t2 (0.150 ms)")) << table.out;
  EXPECT_TRUE(has(table.out, "30.0 % unaccounted")) << table.out;
}

TEST_F(TraceToolTest, SvgDrawsEveryWorkerSpansAndFlowArrows) {
  write("a.trace.json",
        worker_file("trainer<1>", 1, 1,
                    {span("step", "train", 0, 100, 1, {{"step", 3}}),
                     span("rpc.call", "rpc", 10, 50, 1, {{"peer", 0}, {"request_id", 4}})},
                    std::pair<int64_t, int64_t>{0, 0}));
  write("b.trace.json",
        worker_file("ps0", 2, 0,
                    {span("rpc.serve", "rpc", 20, 20, 5, {{"peer", 1}, {"request_id", 4}})},
                    std::pair<int64_t, int64_t>{0, 0}));
  const auto out = (dir_ / "t.svg").string();
  const Result r = trace_tool({"svg", (dir_ / "in").string(), "-o", out, "--step", "3"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(out);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_TRUE(has(svg, "trainer&lt;1&gt;")) << "names are escaped";
  EXPECT_TRUE(has(svg, "ps0 / 5"));
  EXPECT_EQ(count(svg, "marker-end=\"url(#arrow)\""), 1u);
  EXPECT_EQ(count(svg, "<rect x="), 3u + 2u);  // three spans, two legend swatches
  EXPECT_TRUE(has(svg, "</svg>"));
  const Result missing = trace_tool({"svg", (dir_ / "in").string(), "-o", out, "--step", "4"});
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(has(missing.err, "with step 4")) << missing.err;
  // One worker's step: its window, every worker drawn.
  const Result one = trace_tool(
      {"svg", (dir_ / "in").string(), "-o", out, "--step", "3", "--worker", "trainer<1>"});
  ASSERT_EQ(one.status, 0) << one.err;
  const Result nobody =
      trace_tool({"svg", (dir_ / "in").string(), "-o", out, "--step", "3", "--worker", "ps0"});
  EXPECT_EQ(nobody.status, 1);
  EXPECT_TRUE(has(nobody.err, "worker 'ps0' has no step span")) << nobody.err;
  EXPECT_EQ(trace_tool({"svg", (dir_ / "in").string(), "-o", out, "--worker", "ps0"}).status, 2);
}

TEST_F(TraceToolTest, EveryBadInputIsNamedWithWhatIsWrongAndFails) {
  const std::string in = (dir_ / "in").string();
  const std::string out = (dir_ / "o.json").string();
  auto expect_error = [&](std::vector<std::string> args, const std::string& part, int status) {
    const Result r = trace_tool(args);
    EXPECT_EQ(r.status, status) << r.out << r.err;
    EXPECT_TRUE(has(r.err, part)) << "expected '" << part << "' in: " << r.err;
  };
  expect_error({"merge", (dir_ / "nowhere").string(), "-o", out}, "nowhere: no such directory", 1);
  expect_error({"merge", in, "-o", out}, "no *.trace.json files in it", 1);
  expect_error({"summary", (dir_ / "nothing.json").string()}, "no such file or directory", 1);
  write("broken.trace.json", std::string("{\"traceEvents\": [1, "));
  expect_error({"merge", in, "-o", out}, "broken.trace.json: malformed JSON", 1);
  fs::remove(dir_ / "in" / "broken.trace.json");
  write("other.trace.json", json{{"hello", "world"}});
  expect_error({"merge", in, "-o", out}, "other.trace.json: not a trace file", 1);
  write("other.trace.json", json{{"traceEvents", json::array()}});
  expect_error({"merge", in, "-o", out}, "other.trace.json: not a gradwire trace", 1);
  write("other.trace.json", worker_file("w", 1, 0, {{{"name", "x"}, {"ph", "X"}, {"tid", 1}}},
                                        std::pair<int64_t, int64_t>{0, 0}));
  expect_error({"merge", in, "-o", out}, "event #1 (x): \"ts\" is missing", 1);
  write("other.trace.json",
        worker_file("w", 1, 0, {span("x", "c", 1e300, 1, 1)}, std::pair<int64_t, int64_t>{0, 0}));
  expect_error({"merge", in, "-o", out}, "event #1 (x): \"ts\" is out of range", 1);
  write("other.trace.json",
        worker_file("w", 1, 0, json::array(), std::pair<int64_t, int64_t>{INT64_MAX, 0}));
  expect_error({"merge", in, "-o", out}, "clock_offset needs integers", 1);
  json bad_offset = worker_file("w", 1, 0, json::array(), std::nullopt);
  bad_offset["otherData"]["clock_offset"] = "soon";
  write("other.trace.json", bad_offset);
  expect_error({"summary", in}, "otherData.clock_offset needs integers", 1);
  write("other.trace.json",
        worker_file("w", 1, 0, json::array(), std::pair<int64_t, int64_t>{0, 0}));
  expect_error({"merge", in, "-o", (dir_ / "no" / "such" / "dir.json").string()},
               "cannot be written", 1);
  expect_error({"merge", in}, "merge needs -o FILE", 2);
  expect_error({"summary", in, "--step", "x1"}, "--step=\"x1\" is not an integer", 2);
  expect_error({"frobnicate", in}, "unknown command 'frobnicate'", 2);
  expect_error({}, "no command given", 2);
  // What was good is still merged once the bad file is gone.
  EXPECT_EQ(trace_tool({"merge", in, "-o", out}).status, 0);
}

#ifdef GRADWIRE_PS_TRAIN_PATH
TEST_F(TraceToolTest, AThreeProcessPsTrainRunMergesIntoOneConsistentTimeline) {
  const fs::path traces = dir_ / "in";
  Launch job({"--nproc-per-node", "3", GRADWIRE_PS_TRAIN_PATH, "--epochs", "1", "--min-accuracy",
              "0", "--trace", traces.string()},
             {{"GRADWIRE_TRACE", std::nullopt}});
  ASSERT_EQ(job.wait(90s), 0) << job.out() << job.err();
  const auto merged = (dir_ / "job.json").string();
  const Result m = trace_tool({"merge", traces.string(), "-o", merged});
  ASSERT_EQ(m.status, 0) << m.out << m.err;
  const json doc = read_json(merged);

  // One process per worker, each aligned by the store, with its residual.
  std::map<int64_t, json> workers;  // pid -> otherData.workers entry
  for (const json& w : doc["otherData"]["workers"]) {
    if (w.contains("worker_id")) workers[w["pid"].get<int64_t>()] = w;
  }
  ASSERT_EQ(workers.size(), 3u) << doc["otherData"].dump();
  std::set<std::string> names;
  for (const auto& [pid, w] : workers) {
    names.insert(w["name"].get<std::string>());
    EXPECT_EQ(w["aligned_by"], "store") << w.dump();
    EXPECT_TRUE(w.contains("residual_ns")) << w.dump();
  }
  EXPECT_EQ(names, (std::set<std::string>{"ps0", "trainer1", "trainer2"}));
  std::map<int64_t, int> process_rows;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++process_rows[e["pid"].get<int64_t>()];
  }
  for (const auto& [pid, w] : workers)
    EXPECT_EQ(process_rows[pid], 1) << w["name"];

  // Flows: each start at an rpc.call's start, its end at the rpc.serve of that request,
  // and the serving inside the call once aligned (within both workers' residuals).
  std::map<std::tuple<int64_t, int64_t, double>, json> spans;  // (pid, tid, ts) -> span
  std::map<int64_t, std::vector<json>> flows;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && (e["name"] == "rpc.call" || e["name"] == "rpc.serve")) {
      spans[{e["pid"], e["tid"], e["ts"]}] = e;
    }
    if (e["ph"] == "s" || e["ph"] == "f") flows[e["id"].get<int64_t>()].push_back(e);
  }
  ASSERT_GT(flows.size(), 10u);
  for (const auto& [id, ends] : flows) {
    ASSERT_EQ(ends.size(), 2u) << id;
    const json& s = ends[0]["ph"] == "s" ? ends[0] : ends[1];
    const json& f = ends[0]["ph"] == "s" ? ends[1] : ends[0];
    ASSERT_EQ(f["ph"], "f");
    const json& call = spans[{s["pid"], s["tid"], s["ts"]}];
    const json& serve = spans[{f["pid"], f["tid"], f["ts"]}];
    ASSERT_EQ(call["name"], "rpc.call") << s.dump();
    ASSERT_EQ(serve["name"], "rpc.serve") << f.dump();
    const json& caller = workers[s["pid"].get<int64_t>()];
    const json& callee = workers[f["pid"].get<int64_t>()];
    EXPECT_EQ(call["args"]["peer"], callee["worker_id"]);
    EXPECT_EQ(serve["args"]["peer"], caller["worker_id"]);
    EXPECT_EQ(call["args"]["request_id"], serve["args"]["request_id"]);
    // Microseconds; the files' times are rounded to the ns.
    const double slack =
        (caller["residual_ns"].get<double>() + callee["residual_ns"].get<double>()) / 1e3 + 0.01;
    const double call_end = call["ts"].get<double>() + call["dur"].get<double>();
    const double serve_end = serve["ts"].get<double>() + serve["dur"].get<double>();
    EXPECT_GE(serve["ts"].get<double>(), call["ts"].get<double>() - slack)
        << call.dump() << serve.dump();
    EXPECT_LE(serve_end, call_end + slack) << call.dump() << serve.dump();
  }

  // Every trainer's steps are traced, and spans cover at least 90 % of their time.
  const Result s = trace_tool({"summary", merged, "--json"});
  ASSERT_EQ(s.status, 0) << s.err;
  const json summary = json::parse(s.out);
  std::set<std::string> traced;
  for (const json& w : summary["workers"]) {
    const std::string name = w["worker"];
    if (name.rfind("trainer", 0) != 0) continue;
    traced.insert(name);
    EXPECT_GT(w["steps"].get<int64_t>(), 0) << name;
    EXPECT_LE(w["unaccounted_fraction"].get<double>(), 0.10) << w.dump();
  }
  EXPECT_EQ(traced, (std::set<std::string>{"trainer1", "trainer2"})) << s.out;
}
#endif

}  // namespace
