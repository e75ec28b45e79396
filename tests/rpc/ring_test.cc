// The shared-memory rings of the local transport on their own (Ring): bytes across the
// wrap-around, frames read while they are written, a full ring, positions a peer corrupts,
// and setup messages and segments checked before mapping.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "transport/ring.h"
#include "transport_fixture.h"

namespace gradwire::rpc {
namespace {

using namespace transport_fixture;
using transport::RingReader;
using transport::RingSegment;
using transport::RingWriter;

TEST(Ring, BytesSurviveWrapAroundInEveryChunking) {
  constexpr size_t kCap = 4096;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  RingWriter writer(segment->control(0), segment->data(0), kCap);
  RingReader reader(segment->control(0), segment->data(0), kCap);
  std::mt19937 rng(11);
  // 1 MB through a 4 KiB ring, in writes of 1..3000 bytes split over two iovecs and reads
  // of 1..5000: every byte arrives, in order.
  constexpr size_t kTotal = 1 << 20;
  std::vector<char> sent(kTotal);
  for (char& c : sent)
    c = static_cast<char>(rng());
  std::vector<char> got;
  size_t written = 0;
  bool corrupt = false;
  while (got.size() < kTotal) {
    const size_t want = std::min<size_t>(1 + rng() % 3000, kTotal - written);
    const size_t split = want / 2;
    iovec iov[2] = {{sent.data() + written, split}, {sent.data() + written + split, want - split}};
    written += writer.write(iov, want == 0 ? 0 : 2, &corrupt);
    ASSERT_FALSE(corrupt);
    ASSERT_LE(written - got.size(), kCap);
    char buf[5000];
    const size_t n = reader.read(buf, 1 + rng() % sizeof(buf), &corrupt);
    ASSERT_FALSE(corrupt);
    got.insert(got.end(), buf, buf + n);
  }
  EXPECT_TRUE(std::equal(got.begin(), got.end(), sent.begin()));
  EXPECT_EQ(reader.position(), kTotal);
  EXPECT_EQ(writer.position(), kTotal);
}

// Frames larger than the piece a writer publishes at a time (kRingPublishBytes), copied
// out by a reader on another thread while they are copied in: every byte arrives, in
// order, across the ring's wrap-around.
TEST(Ring, LargeFramesReadWhileTheyAreWrittenArriveWhole) {
  constexpr size_t kCap = size_t{1} << 20;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  RingWriter writer(segment->control(0), segment->data(0), kCap);
  RingReader reader(segment->control(0), segment->data(0), kCap);
  constexpr size_t kTotal = size_t{24} << 20;
  std::vector<char> sent(kTotal);
  std::mt19937 rng(13);
  for (char& c : sent)
    c = static_cast<char>(rng());
  std::atomic<bool> reader_corrupt{false};
  std::vector<char> got;
  got.reserve(kTotal);
  std::thread consumer([&] {
    std::mt19937 sizes(17);
    std::vector<char> buf(900 << 10);
    bool corrupt = false;
    while (got.size() < kTotal && !corrupt) {
      const size_t n = reader.read(buf.data(), 1 + sizes() % buf.size(), &corrupt);
      got.insert(got.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
      if (n == 0) std::this_thread::yield();
    }
    reader_corrupt = corrupt;
  });
  size_t written = 0;
  bool corrupt = false;
  while (written < kTotal && !corrupt) {
    // Frames of up to 700 KiB in two iovecs: many pieces each, and a wrap-around in most.
    const size_t want = std::min<size_t>(1 + rng() % (700 << 10), kTotal - written);
    const size_t split = want / 3;
    iovec iov[2] = {{sent.data() + written, split}, {sent.data() + written + split, want - split}};
    const size_t n = writer.write(iov, 2, &corrupt);
    written += n;
    if (n == 0) std::this_thread::yield();
  }
  consumer.join();
  EXPECT_FALSE(corrupt);
  EXPECT_FALSE(reader_corrupt.load());
  ASSERT_EQ(got.size(), kTotal);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), sent.begin()));
  EXPECT_EQ(reader.position(), kTotal);
}

TEST(Ring, AFullRingTakesWhatFitsAndAsksForAWakeUp) {
  constexpr size_t kCap = 4096;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  RingWriter writer(segment->control(1), segment->data(1), kCap);
  RingReader reader(segment->control(1), segment->data(1), kCap);
  std::string big(kCap + 100, 'x');
  iovec iov{big.data(), big.size()};
  bool corrupt = false;
  EXPECT_EQ(writer.write(&iov, 1, &corrupt), kCap);
  EXPECT_EQ(writer.write(&iov, 1, &corrupt), 0u);
  EXPECT_FALSE(writer.wait_for_space(&corrupt));  // still full: the producer waits
  char buf[10];
  EXPECT_EQ(reader.read(buf, sizeof(buf), &corrupt), sizeof(buf));
  EXPECT_TRUE(reader.producer_wants_wake());   // once
  EXPECT_FALSE(reader.producer_wants_wake());  // the mark was cleared
  EXPECT_TRUE(writer.writable(&corrupt));
  // A sleeping consumer is woken once per sleep.
  EXPECT_FALSE(writer.consumer_wants_wake());
  while (reader.read(buf, sizeof(buf), &corrupt) > 0) {
  }
  EXPECT_FALSE(reader.arm(&corrupt));  // nothing waiting: it may sleep
  iovec one{big.data(), 1};
  EXPECT_EQ(writer.write(&one, 1, &corrupt), 1u);
  EXPECT_TRUE(writer.consumer_wants_wake());
  EXPECT_FALSE(writer.consumer_wants_wake());
  EXPECT_TRUE(reader.arm(&corrupt));  // armed again, but a byte is there: no sleep
  EXPECT_FALSE(corrupt);
}

TEST(Ring, PositionsThePeerCorruptsAreCaughtNeverFollowed) {
  constexpr size_t kCap = 4096;
  auto segment = make_segment(kCap);
  ASSERT_NE(segment, nullptr);
  transport::RingControl* control = segment->control(0);
  RingReader reader(control, segment->data(0), kCap);
  char buf[64];
  bool corrupt = false;
  // A tail more than a ring ahead of what was read.
  control->tail = kCap + 1;
  EXPECT_EQ(reader.read(buf, sizeof(buf), &corrupt), 0u);
  EXPECT_TRUE(corrupt);
  // A tail behind it.
  corrupt = false;
  control->tail = 10;
  ASSERT_EQ(reader.read(buf, sizeof(buf), &corrupt), 10u);
  control->tail = 5;
  EXPECT_EQ(reader.read(buf, sizeof(buf), &corrupt), 0u);
  EXPECT_TRUE(corrupt);
  // A consumer claiming to have read more than was written.
  RingWriter writer(segment->control(1), segment->data(1), kCap);
  segment->control(1)->head = 7;
  corrupt = false;
  iovec iov{buf, sizeof(buf)};
  EXPECT_EQ(writer.write(&iov, 1, &corrupt), 0u);
  EXPECT_TRUE(corrupt);
}

TEST(Ring, SetupMessagesAndSegmentsAreCheckedBeforeMapping) {
  auto segment = make_segment(size_t{64} << 10);
  ASSERT_NE(segment, nullptr);
  const std::string setup = segment->setup_message();
  ASSERT_EQ(setup.size(), transport::kRingSetupBytes);
  std::string error;
  EXPECT_EQ(RingSegment::parse_setup(reinterpret_cast<const uint8_t*>(setup.data()), &error),
            size_t{64} << 10);
  auto parse_error = [](std::string bytes) {
    std::string why;
    EXPECT_EQ(RingSegment::parse_setup(reinterpret_cast<const uint8_t*>(bytes.data()), &why), 0u);
    return why;
  };
  EXPECT_NE(parse_error("XXXX" + setup.substr(4)).find("GWRS"), std::string::npos);
  std::string v2 = setup;
  v2[4] = 2;
  EXPECT_NE(parse_error(v2).find("version 2"), std::string::npos);
  std::string huge = setup;
  huge[5] = 40;  // 1 TiB rings
  EXPECT_NE(parse_error(huge).find("outside"), std::string::npos);
  std::string reserved = setup;
  reserved[7] = 1;
  EXPECT_NE(parse_error(reserved).find("reserved"), std::string::npos);

  // The descriptor: a sealed memfd of exactly the right size, nothing else.
  const size_t cap = size_t{64} << 10;
  auto attach_error = [&](int fd) {
    std::string why;
    EXPECT_EQ(RingSegment::attach(fd, cap, &why), nullptr);
    return why;
  };
  const int unsealed = ::memfd_create("t", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed, static_cast<off_t>(4096 + 2 * cap)), 0);
  EXPECT_NE(attach_error(unsealed).find("sealed"), std::string::npos);
  const int small = ::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(small, 4096), 0);
  ASSERT_EQ(::fcntl(small, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  EXPECT_NE(attach_error(small).find("has 4096 bytes"), std::string::npos);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  EXPECT_NE(attach_error(pipe_fds[0]).find("not a sealable memfd"), std::string::npos);
  // The real thing maps, and both ends see each other's bytes.
  const int good = segment->release_fd();
  auto peer = RingSegment::attach(good, cap, &error);
  ASSERT_NE(peer, nullptr) << error;
  std::memcpy(segment->data(0), "ring", 4);
  EXPECT_EQ(std::memcmp(peer->data(0), "ring", 4), 0);
}

}  // namespace
}  // namespace gradwire::rpc
