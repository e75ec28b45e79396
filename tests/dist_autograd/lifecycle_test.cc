// The lifecycles of a context and of a pass (dist_autograd/src/lifecycle.h): every row of
// each table leads to its next state, through next() and through ContextState::apply;
// every pair of state and event without a row is refused and changes nothing; and the
// tables in docs/dist_autograd.md ("Lifecycle") are these rows.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

// The module's internal headers, by their place in the source tree.
#include "../../dist_autograd/src/context_state.h"
#include "../../dist_autograd/src/lifecycle.h"

namespace gradwire::dist_autograd::internal {
namespace {

using CS = ContextPhase;
using CE = ContextEvent;
using PS = PassPhase;
using PE = PassEvent;

template <class State, class Event>
struct Row {
  State state;
  Event event;
  State next;
};
using ContextRow = Row<CS, CE>;
using PassRow = Row<PS, PE>;

const std::vector<ContextRow> kContextRows = {
    {CS::kNone, CE::kMake, CS::kOpen},
    {CS::kNone, CE::kRelease, CS::kReleased},
    {CS::kOpen, CE::kBackward, CS::kBackward},
    {CS::kBackward, CE::kBackwardEnds, CS::kOpen},
    {CS::kOpen, CE::kRelease, CS::kReleasing},
    {CS::kBackward, CE::kRelease, CS::kReleasing},
    {CS::kReleasing, CE::kBackwardEnds, CS::kReleasing},
    {CS::kReleasing, CE::kTold, CS::kReleased},
    {CS::kReleased, CE::kBackwardEnds, CS::kReleased},
};

const std::vector<PassRow> kPassRows = {
    {PS::kNone, PE::kStart, PS::kDiscovering},
    {PS::kDiscovering, PE::kStart, PS::kDiscovering},
    {PS::kRunning, PE::kStart, PS::kRunning},
    {PS::kDiscovering, PE::kDiscoveryOver, PS::kRunning},
    {PS::kOver, PE::kDiscoveryOver, PS::kOver},
    {PS::kDiscovering, PE::kPartEnds, PS::kOver},
    {PS::kRunning, PE::kPartEnds, PS::kOver},
    {PS::kAborting, PE::kPartEnds, PS::kAbortedOver},
    {PS::kDiscovering, PE::kReport, PS::kReported},
    {PS::kRunning, PE::kReport, PS::kReported},
    {PS::kOver, PE::kReport, PS::kReported},
    {PS::kAborting, PE::kReport, PS::kAbortedReported},
    {PS::kAbortedOver, PE::kReport, PS::kAbortedReported},
    {PS::kReported, PE::kSuperseded, PS::kNone},
    {PS::kAbortedReported, PE::kSuperseded, PS::kAborted},
    {PS::kNone, PE::kAbort, PS::kAborted},
    {PS::kDiscovering, PE::kAbort, PS::kAborting},
    {PS::kRunning, PE::kAbort, PS::kAborting},
    {PS::kOver, PE::kAbort, PS::kAbortedOver},
    {PS::kReported, PE::kAbort, PS::kAbortedReported},
};

const std::vector<CS> kContextStates = {CS::kNone, CS::kOpen, CS::kBackward, CS::kReleasing,
                                        CS::kReleased};
const std::vector<CE> kContextEvents = {CE::kMake, CE::kBackward, CE::kBackwardEnds, CE::kRelease,
                                        CE::kTold};
const std::vector<PS> kPassStates = {PS::kNone,        PS::kDiscovering,     PS::kRunning,
                                     PS::kOver,        PS::kReported,        PS::kAborting,
                                     PS::kAbortedOver, PS::kAbortedReported, PS::kAborted};
const std::vector<PE> kPassEvents = {PE::kStart,  PE::kDiscoveryOver, PE::kPartEnds,
                                     PE::kReport, PE::kSuperseded,    PE::kAbort};

template <class State, class Event>
std::optional<State> row_for(const std::vector<Row<State, Event>>& rows, State state, Event event) {
  for (const auto& row : rows) {
    if (row.state == state && row.event == event) return row.next;
  }
  return std::nullopt;
}

template <class Named>
std::string text(Named value) {
  return std::string(name(value));
}

// next() gives each row's next state.
template <class State, class Event>
void expect_every_row(const std::vector<Row<State, Event>>& rows) {
  for (const auto& row : rows) {
    SCOPED_TRACE(text(row.state) + " | " + text(row.event));
    EXPECT_EQ(next(row.state, row.event), row.next);
  }
}

// next() refuses every pair of `states` and `events` that has no row.
template <class State, class Event>
void expect_the_rest_refused(const std::vector<Row<State, Event>>& rows,
                             const std::vector<State>& states, const std::vector<Event>& events) {
  for (State state : states) {
    for (Event event : events) {
      if (row_for(rows, state, event)) continue;
      SCOPED_TRACE(text(state) + " | " + text(event));
      EXPECT_EQ(next(state, event), std::nullopt);
    }
  }
}

// The rows as docs/dist_autograd.md writes them.
template <class State, class Event>
std::vector<std::tuple<std::string, std::string, std::string>> as_text(
    const std::vector<Row<State, Event>>& rows) {
  std::vector<std::tuple<std::string, std::string, std::string>> named;
  for (const auto& row : rows)
    named.emplace_back(text(row.state), text(row.event), text(row.next));
  return named;
}

TEST(ContextLifecycle, EveryRowLeadsToItsNextState) {
  expect_every_row(kContextRows);
}

TEST(ContextLifecycle, EveryPairWithoutARowIsRefused) {
  expect_the_rest_refused(kContextRows, kContextStates, kContextEvents);
}

// ContextState::apply moves the context as the table says, and leaves it where it was
// when the table refuses.
TEST(ContextLifecycle, ApplyFollowsTheTable) {
  for (CS state : kContextStates) {
    for (CE event : kContextEvents) {
      SCOPED_TRACE(text(state) + " | " + text(event));
      ContextState context(1);
      MutexLock lock(context.mutex);
      context.phase = state;
      const std::optional<CS> expected = row_for(kContextRows, state, event);
      EXPECT_EQ(context.apply(event), expected.has_value());
      EXPECT_EQ(context.phase, expected.value_or(state));
    }
  }
}

TEST(ContextLifecycle, AContextIsMadeOpen) {
  ContextState context(1);
  MutexLock lock(context.mutex);
  EXPECT_EQ(context.phase, next(CS::kNone, CE::kMake));
}

TEST(PassLifecycle, EveryRowLeadsToItsNextState) {
  expect_every_row(kPassRows);
}

TEST(PassLifecycle, EveryPairWithoutARowIsRefused) {
  expect_the_rest_refused(kPassRows, kPassStates, kPassEvents);
}

// ContextState::apply(pass, event) moves the pass as the table says (a pass back in none
// has no entry), and leaves it where it was when the table refuses.
TEST(PassLifecycle, ApplyFollowsTheTable) {
  constexpr uint64_t kPass = 7;
  for (PS state : kPassStates) {
    for (PE event : kPassEvents) {
      SCOPED_TRACE(text(state) + " | " + text(event));
      ContextState context(1);
      MutexLock lock(context.mutex);
      if (state != PS::kNone) context.passes[kPass].phase = state;
      const std::optional<PS> expected = row_for(kPassRows, state, event);
      EXPECT_EQ(context.apply(kPass, event), expected.has_value());
      const PS now = expected.value_or(state);
      EXPECT_EQ(context.pass_phase(kPass), now);
      EXPECT_EQ(context.passes.count(kPass), now == PS::kNone ? 0u : 1u);
      EXPECT_EQ(context.part(kPass) != nullptr, holds_part(now));
    }
  }
}

// A report supersedes the pass reported before it: one that was aborted stays aborted, one
// that was not is forgotten; passes that hold a part are untouched.
TEST(PassLifecycle, AReportSupersedesTheLastReportedPass) {
  ContextState context(1);
  MutexLock lock(context.mutex);
  context.passes[1].phase = PS::kReported;
  context.passes[2].phase = PS::kDiscovering;
  context.passes[3].phase = PS::kOver;
  ASSERT_TRUE(context.apply(3, PE::kReport));
  EXPECT_EQ(context.pass_phase(1), PS::kNone);
  EXPECT_EQ(context.passes.count(1), 0u);
  EXPECT_EQ(context.pass_phase(2), PS::kDiscovering);
  EXPECT_EQ(context.pass_phase(3), PS::kReported);
  ASSERT_TRUE(context.apply(3, PE::kAbort));
  EXPECT_EQ(context.pass_phase(3), PS::kAbortedReported);
  ASSERT_TRUE(context.apply(2, PE::kReport));
  EXPECT_EQ(context.pass_phase(3), PS::kAborted);
  EXPECT_EQ(context.pass_phase(2), PS::kReported);
  // Aborted stays aborted: a start is refused.
  EXPECT_FALSE(context.apply(3, PE::kStart));
}

TEST(Lifecycle, HoldsPartAndAbortedNameTheStatesTheTablesSay) {
  const std::set<PS> parts = {PS::kDiscovering, PS::kRunning, PS::kOver, PS::kAborting,
                              PS::kAbortedOver};
  const std::set<PS> aborts = {PS::kAborting, PS::kAbortedOver, PS::kAbortedReported, PS::kAborted};
  for (PS state : kPassStates) {
    SCOPED_TRACE(text(state));
    EXPECT_EQ(holds_part(state), parts.count(state) != 0);
    EXPECT_EQ(aborted(state), aborts.count(state) != 0);
  }
}

// The first three cells of each row of the table under `heading` in docs/dist_autograd.md's
// "Lifecycle" section.
std::vector<std::tuple<std::string, std::string, std::string>> doc_rows(
    const std::string& heading) {
  const std::filesystem::path doc =
      std::filesystem::path(GRADWIRE_SOURCE_DIR) / "docs" / "dist_autograd.md";
  std::ifstream in(doc);
  EXPECT_TRUE(in.good()) << doc;
  std::vector<std::tuple<std::string, std::string, std::string>> rows;
  bool in_section = false;
  bool in_table = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## Lifecycle";
    if (line.rfind("### ", 0) == 0) in_table = in_section && line == "### " + heading;
    if (!in_table || line.rfind("| ", 0) != 0 || line.rfind("| State ", 0) == 0) continue;
    std::vector<std::string> cells;
    size_t at = 1;
    while (cells.size() < 3) {
      const size_t bar = line.find('|', at);
      if (bar == std::string::npos) break;
      std::string cell = line.substr(at, bar - at);
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      cells.push_back(cell);
      at = bar + 1;
    }
    if (cells.size() == 3) rows.emplace_back(cells[0], cells[1], cells[2]);
  }
  return rows;
}

TEST(Lifecycle, TheDocsTablesAreTheCodes) {
  EXPECT_EQ(doc_rows("A context"), as_text(kContextRows));
  EXPECT_EQ(doc_rows("A pass"), as_text(kPassRows));
}

}  // namespace
}  // namespace gradwire::dist_autograd::internal
