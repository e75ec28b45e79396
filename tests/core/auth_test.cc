// The authentication primitives: random bytes and HMAC-SHA256, checked against the RFC
// 4231 vectors, and both usable in a child forked while another thread of the parent is
// inside them (a launcher or benchmark forks rank processes while its store server's
// threads answer handshakes; a lock held at the fork must not be inherited held).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradwire/core/auth.h"

namespace gradwire {
namespace {

std::string hex(const Digest256& d) {
  std::string out;
  char buf[3];
  for (uint8_t b : d) {
    std::snprintf(buf, sizeof(buf), "%02x", b);
    out += buf;
  }
  return out;
}

TEST(Auth, HmacSha256MatchesRfc4231) {
  // Test case 1: key = 20 bytes of 0x0b, data = "Hi There".
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: key = "Jefe", data = "what do ya want for nothing?".
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block (131 bytes of 0xaa) is hashed first.
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Auth, RandomBytesAreFreshAndOfTheLengthAsked) {
  EXPECT_TRUE(random_bytes(0).empty());
  EXPECT_EQ(random_bytes(1).size(), 1u);
  EXPECT_EQ(random_bytes(1000).size(), 1000u);
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i)
    seen.insert(random_bytes(32));
  EXPECT_EQ(seen.size(), 100u) << "32 random bytes repeated";
}

// Forks `forks` children while another thread calls random_bytes and hmac_sha256 without
// pause; each child calls both and exits. A child stuck on a lock the parent's thread held
// at the fork is ended by its alarm (SIGALRM) and counted.
int children_that_hung(int forks) {
  std::atomic<bool> stop{false};
  std::thread busy([&stop] {
    while (!stop.load(std::memory_order_relaxed)) {
      (void)random_bytes(32);
      (void)hmac_sha256("a key of sixteen bytes or more", "data");
    }
  });
  int hung = 0;
  for (int i = 0; i < forks; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(2);  // a hang ends the child; the parent sees the signal
      const bool ok = random_bytes(32).size() == 32 &&
                      hmac_sha256("a key of sixteen bytes or more", "data") ==
                          hmac_sha256("a key of sixteen bytes or more", "data");
      ::_exit(ok ? 0 : 1);
    }
    if (pid < 0) break;
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++hung;
  }
  stop = true;
  busy.join();
  return hung;
}

TEST(Auth, UsableInAChildForkedWhileAnotherThreadUsesThem) {
  EXPECT_EQ(children_that_hung(200), 0);
}

}  // namespace
}  // namespace gradwire
