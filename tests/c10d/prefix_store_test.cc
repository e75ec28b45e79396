// PrefixStore beyond the shared suite: namespacing, nesting and messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/core/error.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(PrefixStoreTest, NamespacesDoNotMeet) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  a.set("k", std::string_view("from a"));
  b.set("k", std::string_view("from b"));
  EXPECT_EQ(a.get_string("k"), "from a");
  EXPECT_EQ(b.get_string("k"), "from b");
  EXPECT_EQ(base->get_string("a/k"), "from a");
  EXPECT_EQ(a.num_keys(), 1);
  EXPECT_EQ(base->num_keys(), 2);
  EXPECT_EQ(a.list_keys(), std::vector<std::string>{"k"});
  EXPECT_TRUE(a.delete_key("k"));
  EXPECT_TRUE(b.check({"k"}));
}

TEST(PrefixStoreTest, NestedPrefixesCompose) {
  auto base = std::make_shared<HashStore>();
  auto outer = std::make_shared<PrefixStore>("job", base);
  PrefixStore inner("group1", outer);
  inner.set("x", std::string_view("1"));
  EXPECT_EQ(base->get_string("job/group1/x"), "1");
  EXPECT_EQ(inner.list_keys(), std::vector<std::string>{"x"});
  EXPECT_EQ(outer->list_keys(), std::vector<std::string>{"group1/x"});
}

TEST(PrefixStoreTest, TimeoutsNameTheCallersKeys) {
  auto base = std::make_shared<HashStore>();
  PrefixStore store("pfx", base);
  try {
    store.wait({"missing"}, 50ms);
    ADD_FAILURE() << "wait returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'missing'"));
    EXPECT_THAT(e.what(), Not(HasSubstr("pfx/")));
  }
}

TEST(PrefixStoreTest, ConstructionIsValidated) {
  EXPECT_THROW(PrefixStore("p", nullptr), InvalidArgument);
  EXPECT_THROW(PrefixStore("", std::make_shared<HashStore>()), InvalidArgument);
}

}  // namespace
}  // namespace gradwire::c10d
