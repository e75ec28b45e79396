// The launcher's lifecycle (tools/run_lifecycle.h) against the State | Event | Next table of
// docs/launcher.md: every row is driven through apply(), and every pair the table does not
// have is refused, leaving the state as it was.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../tools/run_lifecycle.h"

namespace gradwire::run {
namespace {

using S = Lifecycle::State;
using E = Lifecycle::Event;

// The code's table; TheDocumentedTableIsTheCodes checks it against docs/launcher.md, "The
// launcher as a state machine", row for row.
const auto& kTable = Lifecycle::kTable;

const S kStates[] = {S::kJoining,  S::kGathering, S::kLate,      S::kPlanning,  S::kRunning,
                     S::kFinished, S::kEnding,    S::kCompleted, S::kAbandoned, S::kInterrupted};
const E kEvents[] = {E::kArrived,      E::kTooLate,        E::kClosed,   E::kNextOpened,
                     E::kJoinRunning,  E::kDetailsMissing, E::kPlanned,  E::kSucceeded,
                     E::kAllSucceeded, E::kStopped,        E::kAdvanced, E::kAbandon,
                     E::kComplete,     E::kSignal};

// The events that lead from kJoining to `state` (every state is reachable from there).
std::vector<E> path_to(S state) {
  switch (state) {
    case S::kJoining:
      return {};
    case S::kGathering:
      return {E::kArrived};
    case S::kLate:
      return {E::kTooLate};
    case S::kPlanning:
      return {E::kArrived, E::kClosed};
    case S::kRunning:
      return {E::kArrived, E::kClosed, E::kPlanned};
    case S::kFinished:
      return {E::kArrived, E::kClosed, E::kPlanned, E::kSucceeded};
    case S::kEnding:
      return {E::kArrived, E::kClosed, E::kPlanned, E::kStopped};
    case S::kCompleted:
      return {E::kComplete};
    case S::kAbandoned:
      return {E::kAbandon};
    case S::kInterrupted:
      return {E::kArrived, E::kSignal};
  }
  return {};
}

Lifecycle in_state(S state) {
  Lifecycle life;
  for (E e : path_to(state))
    life.apply(e);
  EXPECT_EQ(life.state(), state) << Lifecycle::name(state);
  return life;
}

TEST(LauncherLifecycle, StartsJoining) {
  EXPECT_EQ(Lifecycle().state(), S::kJoining);
}

TEST(LauncherLifecycle, EveryRowOfTheTableMovesTheState) {
  for (const Lifecycle::Transition& row : kTable) {
    Lifecycle life = in_state(row.from);
    ASSERT_NO_THROW(life.apply(row.event))
        << Lifecycle::name(row.from) << " + " << Lifecycle::name(row.event);
    EXPECT_EQ(life.state(), row.to)
        << Lifecycle::name(row.from) << " + " << Lifecycle::name(row.event);
  }
}

TEST(LauncherLifecycle, PairsNotInTheTableAreRefused) {
  std::set<std::pair<S, E>> rows;
  for (const Lifecycle::Transition& row : kTable)
    rows.emplace(row.from, row.event);
  int refused = 0;
  for (S state : kStates) {
    for (E event : kEvents) {
      const std::optional<S> next = Lifecycle::next(state, event);
      if (rows.count({state, event}) != 0) {
        EXPECT_TRUE(next.has_value()) << Lifecycle::name(state) << " + " << Lifecycle::name(event);
        continue;
      }
      EXPECT_FALSE(next.has_value()) << Lifecycle::name(state) << " + " << Lifecycle::name(event);
      Lifecycle life = in_state(state);
      EXPECT_THROW(life.apply(event), std::logic_error)
          << Lifecycle::name(state) << " + " << Lifecycle::name(event);
      EXPECT_EQ(life.state(), state) << Lifecycle::name(state) << " + " << Lifecycle::name(event);
      ++refused;
    }
  }
  EXPECT_EQ(refused, static_cast<int>(std::size(kStates) * std::size(kEvents) - std::size(kTable)));
}

TEST(LauncherLifecycle, TheEndsAreFinal) {
  for (S end : {S::kCompleted, S::kAbandoned, S::kInterrupted}) {
    for (E event : kEvents)
      EXPECT_FALSE(Lifecycle::next(end, event).has_value())
          << Lifecycle::name(end) << " + " << Lifecycle::name(event);
  }
}

// A job's life across generations: a failure restarts the workers, a late node waits for
// the next generation, and every node's success completes the job.
TEST(LauncherLifecycle, AJobAcrossGenerations) {
  Lifecycle life;
  for (E e :
       {E::kArrived, E::kClosed, E::kPlanned, E::kStopped, E::kAdvanced, E::kTooLate,
        E::kNextOpened, E::kArrived, E::kClosed, E::kPlanned, E::kSucceeded, E::kAllSucceeded})
    life.apply(e);
  EXPECT_EQ(life.state(), S::kCompleted);
}

// A node of an elastic role job that arrives after the group formed joins it as it runs,
// and ends with the job.
TEST(LauncherLifecycle, ALateNodeOfARoleJobJoinsTheRunningGeneration) {
  Lifecycle life;
  for (E e : {E::kTooLate, E::kJoinRunning, E::kPlanned, E::kSucceeded, E::kAllSucceeded})
    life.apply(e);
  EXPECT_EQ(life.state(), S::kCompleted);
}

// This source file: __FILE__ is as the compiler was given it, absolute or relative to the
// build directory, which holds this binary's directory (tests/), whatever directory the
// test runs in.
std::filesystem::path this_file() {
  const std::filesystem::path file(__FILE__);
  if (file.is_absolute()) return file;
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / file;
}

// The table's rows as docs/launcher.md shows them: "| state | event | next | when |" under
// "## The launcher as a state machine", names as Lifecycle::name gives them.
std::set<std::tuple<std::string, std::string, std::string>> documented_rows() {
  const std::filesystem::path doc =
      this_file().parent_path() / ".." / ".." / "docs" / "launcher.md";
  std::ifstream in(doc);
  EXPECT_TRUE(in.good()) << doc;
  std::set<std::tuple<std::string, std::string, std::string>> rows;
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## The launcher as a state machine";
    if (!in_section || line.rfind("| ", 0) != 0 || line.rfind("| State", 0) == 0) continue;
    std::vector<std::string> cells;
    std::istringstream cols(line.substr(1));
    for (std::string cell; std::getline(cols, cell, '|');) {
      const size_t a = cell.find_first_not_of(' ');
      const size_t b = cell.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
    }
    if (cells.size() >= 3) rows.emplace(cells[0], cells[1], cells[2]);
  }
  return rows;
}

TEST(LauncherLifecycle, TheDocumentedTableIsTheCodes) {
  std::set<std::tuple<std::string, std::string, std::string>> code;
  for (S state : kStates) {
    for (E event : kEvents) {
      if (const std::optional<S> next = Lifecycle::next(state, event)) {
        code.emplace(Lifecycle::name(state), Lifecycle::name(event), Lifecycle::name(*next));
      }
    }
  }
  EXPECT_EQ(documented_rows(), code);
}

}  // namespace
}  // namespace gradwire::run
