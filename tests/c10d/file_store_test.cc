// FileStore beyond the shared suite: clean-up of the file, several objects in one
// process, damage detection and options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "c10d_test_util.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/core/error.h"
#include "support/log_capture.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(FileStoreTest, RemovesTheFileWhenTheLastUserLeaves) {
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  auto a = std::make_unique<FileStore>(FileStoreOptions{.path = path, .timeout = 5s});
  auto b = std::make_unique<FileStore>(FileStoreOptions{.path = path, .timeout = 5s});
  a->set("k", std::string_view("v"));
  EXPECT_EQ(b->get_string("k"), "v");
  a.reset();
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(b->get_string("k"), "v");
  b.reset();
  EXPECT_FALSE(std::filesystem::exists(path));

  // A store opened afterwards starts from nothing.
  FileStore c(FileStoreOptions{.path = path, .timeout = 5s});
  EXPECT_EQ(c.num_keys(), 0);
}

TEST(FileStoreTest, WithNumWorkersRemovesTheFileAfterThatManyFinished) {
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  {
    FileStore first(FileStoreOptions{.path = path, .num_workers = 2, .timeout = 5s});
    first.set("x", std::string_view("1"));
  }
  // One of two workers finished: the file stays for the second, who sees the data.
  ASSERT_TRUE(std::filesystem::exists(path));
  {
    FileStore second(FileStoreOptions{.path = path, .num_workers = 2, .timeout = 5s});
    EXPECT_EQ(second.get_string("x"), "1");
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(FileStoreTest, DamagedFileIsStoreErrorNamingThePath) {
  test::LogCapture log;  // the destructor's clean-up reports the damage too
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  FileStore store(FileStoreOptions{.path = path, .timeout = 5s});
  store.set("k", std::string_view("v"));
  {
    std::ofstream out(path, std::ios::app | std::ios::binary);
    out << "\x07garbage";
  }
  try {
    store.get("k");
    ADD_FAILURE() << "damage went unnoticed";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
  }
}

TEST(FileStoreTest, OptionsAndLimitsAreValidated) {
  EXPECT_THROW(FileStore(FileStoreOptions{}), InvalidArgument);
  test::TempDir dir;
  EXPECT_THROW(FileStore(FileStoreOptions{.path = dir.path() + "/s", .num_workers = -1}),
               InvalidArgument);
  FileStore store(
      FileStoreOptions{.path = dir.path() + "/s", .max_key_bytes = 4, .max_value_bytes = 8});
  EXPECT_THROW(store.set("12345", std::string_view("v")), InvalidArgument);
  EXPECT_THROW(store.set("k", std::string_view("123456789")), InvalidArgument);
  store.set("k", std::string_view("12345678"));
  EXPECT_THROW(store.append("k", std::string_view("9")), InvalidArgument);
  EXPECT_THROW(FileStore(FileStoreOptions{.path = dir.path() + "/no/such/dir/s"}), StoreError);
}

}  // namespace
}  // namespace gradwire::c10d
