// The group directory's member lifecycle (group.h, MemberState and next): every row of the
// State | Event | Next table in docs/rpc.md ("The group directory"), and the walk a claim of
// a newer incarnation takes through it.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "group.h"

namespace gradwire::rpc::detail {
namespace {

using S = MemberState;
using E = MemberEvent;

std::string name(S state) {
  switch (state) {
    case S::kUnjoined:
      return "kUnjoined";
    case S::kKnown:
      return "kKnown";
    case S::kRereading:
      return "kRereading";
    case S::kClosed:
      return "kClosed";
  }
  return "?";
}

std::string name(E event) {
  switch (event) {
    case E::kJoin:
      return "kJoin";
    case E::kClaimNewer:
      return "kClaimNewer";
    case E::kReread:
      return "kReread";
    case E::kClose:
      return "kClose";
  }
  return "?";
}

struct Row {
  S state;
  E event;
  S next;
};

// The table of docs/rpc.md, row for row.
const std::vector<Row> kTable = {
    {S::kUnjoined, E::kJoin, S::kKnown},      {S::kUnjoined, E::kClaimNewer, S::kUnjoined},
    {S::kUnjoined, E::kReread, S::kUnjoined}, {S::kUnjoined, E::kClose, S::kClosed},
    {S::kKnown, E::kJoin, S::kKnown},         {S::kKnown, E::kClaimNewer, S::kRereading},
    {S::kKnown, E::kReread, S::kKnown},       {S::kKnown, E::kClose, S::kClosed},
    {S::kRereading, E::kJoin, S::kRereading}, {S::kRereading, E::kClaimNewer, S::kRereading},
    {S::kRereading, E::kReread, S::kKnown},   {S::kRereading, E::kClose, S::kClosed},
    {S::kClosed, E::kJoin, S::kClosed},       {S::kClosed, E::kClaimNewer, S::kClosed},
    {S::kClosed, E::kReread, S::kClosed},     {S::kClosed, E::kClose, S::kClosed},
};

TEST(GroupLifecycle, EveryRowOfTheTableHolds) {
  for (const Row& row : kTable) {
    EXPECT_EQ(name(next(row.state, row.event)), name(row.next))
        << name(row.state) << " | " << name(row.event);
  }
}

TEST(GroupLifecycle, TheTableCoversEveryStateAndEvent) {
  const std::vector<S> states = {S::kUnjoined, S::kKnown, S::kRereading, S::kClosed};
  const std::vector<E> events = {E::kJoin, E::kClaimNewer, E::kReread, E::kClose};
  std::set<std::pair<int, int>> rows;
  for (const Row& row : kTable)
    rows.emplace(static_cast<int>(row.state), static_cast<int>(row.event));
  EXPECT_EQ(rows.size(), kTable.size()) << "a row is listed twice";
  for (S state : states) {
    for (E event : events) {
      EXPECT_TRUE(rows.count({static_cast<int>(state), static_cast<int>(event)}) != 0)
          << "no row for " << name(state) << " | " << name(event);
    }
  }
}

TEST(GroupLifecycle, AClaimOfANewerIncarnationIsReadThenKnown) {
  S state = S::kUnjoined;
  state = next(state, E::kJoin);
  EXPECT_EQ(state, S::kKnown);
  state = next(state, E::kClaimNewer);
  EXPECT_EQ(state, S::kRereading);
  // Claims that arrive during the read wait for it.
  state = next(state, E::kClaimNewer);
  EXPECT_EQ(state, S::kRereading);
  state = next(state, E::kReread);
  EXPECT_EQ(state, S::kKnown);
  state = next(state, E::kClose);
  EXPECT_EQ(state, S::kClosed);
  // Nothing leaves kClosed.
  for (E event : {E::kJoin, E::kClaimNewer, E::kReread, E::kClose})
    EXPECT_EQ(next(state, event), S::kClosed);
}

}  // namespace
}  // namespace gradwire::rpc::detail
