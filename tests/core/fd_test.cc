#include "gradwire/core/fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <utility>

namespace gradwire {
namespace {

bool is_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

TEST(UniqueFd, ClosesWhatItHoldsWhenItGoes) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[1]);
  {
    UniqueFd fd(fds[0]);
    EXPECT_TRUE(fd.valid());
    EXPECT_TRUE(static_cast<bool>(fd));
    EXPECT_EQ(fd.get(), fds[0]);
  }
  EXPECT_FALSE(is_open(fds[0]));
}

TEST(UniqueFd, MovesOwnershipAndReleaseGivesItUp) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  UniqueFd a(fds[0]);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());
  EXPECT_EQ(b.get(), fds[0]);
  UniqueFd c;
  c = std::move(b);
  EXPECT_TRUE(is_open(fds[0]));
  const int raw = c.release();
  EXPECT_FALSE(c.valid());
  EXPECT_TRUE(is_open(raw));
  ::close(raw);

  UniqueFd d(fds[1]);
  d.reset();
  EXPECT_FALSE(is_open(fds[1]));
  EXPECT_FALSE(d.valid());
}

}  // namespace
}  // namespace gradwire
