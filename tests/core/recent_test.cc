#include "gradwire/core/recent.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

namespace gradwire {
namespace {

TEST(RecentSet, RemembersUpToItsCapacityAndForgetsTheOldestFirst) {
  RecentSet<uint64_t> seen(3);
  EXPECT_TRUE(seen.insert(1));
  EXPECT_TRUE(seen.insert(2));
  EXPECT_FALSE(seen.insert(1));  // already there: stays where it was
  EXPECT_TRUE(seen.insert(3));
  EXPECT_TRUE(seen.insert(4));  // 1 is the oldest and goes
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_FALSE(seen.contains(1));
  EXPECT_TRUE(seen.contains(2));
  EXPECT_TRUE(seen.contains(3));
  EXPECT_TRUE(seen.contains(4));
  EXPECT_TRUE(seen.insert(1));  // forgotten, so new again; 2 goes
  EXPECT_FALSE(seen.contains(2));
  EXPECT_EQ(seen.capacity(), 3u);
}

TEST(RecentSet, AnErasedKeyMakesRoomWithoutEvictingAnother) {
  RecentSet<uint64_t> seen(2);
  seen.insert(1);
  seen.insert(2);
  EXPECT_TRUE(seen.erase(1));
  EXPECT_FALSE(seen.erase(1));
  seen.insert(3);
  EXPECT_TRUE(seen.contains(2));
  EXPECT_TRUE(seen.contains(3));
  seen.clear();
  EXPECT_TRUE(seen.empty());
  EXPECT_TRUE(seen.insert(2));
}

TEST(RecentSet, CapacityZeroKeepsNothing) {
  RecentSet<int> seen(0);
  EXPECT_TRUE(seen.insert(7));
  EXPECT_FALSE(seen.contains(7));
  EXPECT_TRUE(seen.empty());
}

TEST(RecentSet, PairKeysHashWithPairHash) {
  RecentSet<std::pair<uint64_t, int>, PairHash> seen(2);
  EXPECT_TRUE(seen.insert({5, 1}));
  EXPECT_TRUE(seen.insert({5, 2}));
  EXPECT_FALSE(seen.insert({5, 1}));
  EXPECT_TRUE(seen.insert({6, 1}));
  EXPECT_FALSE(seen.contains({5, 1}));
  EXPECT_TRUE(seen.contains({5, 2}));
}

TEST(RecentMap, PutReplacesTheValueAndMakesTheKeyTheNewest) {
  RecentMap<int, std::string> map(2);
  EXPECT_TRUE(map.put(1, "a"));
  EXPECT_TRUE(map.put(2, "b"));
  EXPECT_FALSE(map.put(1, "c"));  // 1 is now the newest
  map.put(3, "d");                // so 2 goes
  ASSERT_NE(map.find(1), nullptr);
  EXPECT_EQ(*map.find(1), "c");
  EXPECT_EQ(map.find(2), nullptr);
  EXPECT_EQ(*map.find(3), "d");
  EXPECT_EQ(map.size(), 2u);
}

TEST(RecentMap, TakeAndEraseIfRemoveEntries) {
  RecentMap<int, int> map(10);
  for (int i = 0; i < 6; ++i)
    map.put(i, i * i);
  EXPECT_EQ(map.take(2), std::optional<int>(4));
  EXPECT_EQ(map.take(2), std::nullopt);
  // Left: keys 0, 1, 3, 4, 5 with values 0, 1, 9, 16, 25; the odd values go.
  EXPECT_EQ(map.erase_if([](int, int v) { return v % 2 == 1; }), 3u);
  EXPECT_EQ(map.size(), 2u);
  EXPECT_TRUE(map.contains(0));
  EXPECT_TRUE(map.contains(4));
  EXPECT_FALSE(map.contains(5));
  // Room again for eight new keys without losing 0 and 4.
  for (int i = 10; i < 18; ++i)
    map.put(i, i);
  EXPECT_TRUE(map.contains(0));
  EXPECT_TRUE(map.contains(4));
  EXPECT_EQ(map.size(), 10u);
}

TEST(RecentMap, StaysBoundedUnderManyReplacements) {
  RecentMap<int, int> map(4);
  for (int round = 0; round < 10000; ++round)
    map.put(round % 8, round);
  EXPECT_EQ(map.size(), 4u);
  // The four newest keys of the last round survive: rounds 9996..9999 put keys 4..7.
  for (int k = 4; k < 8; ++k)
    EXPECT_TRUE(map.contains(k)) << k;
  EXPECT_EQ(*map.find(7), 9999);
}

}  // namespace
}  // namespace gradwire
