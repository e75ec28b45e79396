// Shared-memory byte rings for gradwire's same-host transport ("local"): one segment per
// connection, made by the connecting side (a sealed memfd) and passed to the accepting side
// over the Unix socket the connection was set up on. The segment holds two single-producer
// single-consumer byte rings, one per direction; each side copies frames in and out of them
// and the socket then only carries one-byte wake-ups and tells each side when the other
// has gone (its end of the socket closes with the process).
//
// The peer can write anything into the segment at any time, so nothing read from it is
// trusted: a ring position that is not consistent with this side's own copy fails the
// connection (`corrupt`), bytes are copied out before they are parsed, and the segment is
// sealed against shrinking, so that the peer cannot make a mapped page vanish (SIGBUS).
//
// Wake-ups: before its thread sleeps, a consumer sets its ring's `consumer_sleeping` and
// looks once more; a producer that finds it set after writing sends a wake byte. A producer
// that finds the ring full sets `producer_waiting` and looks once more; a consumer that
// finds it set after reading sends a wake byte the other way. Both pairs are ordered by
// sequentially consistent fences (Dekker), so a wake-up is never lost.
//
// Thread-safety: a RingReader and a RingWriter are each used by one thread at a time; the
// two ends of one ring live in different processes.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gradwire::rpc::transport {

// What the connecting side sends, with the segment's descriptor attached, once the
// handshake is done: "GWRS", the version (u8), log2 of one ring's capacity (u8), 2 zero
// bytes.
inline constexpr size_t kRingSetupBytes = 8;
inline constexpr uint8_t kRingVersion = 1;
inline constexpr size_t kMinRingBytes = size_t{4} << 10;
inline constexpr size_t kMaxRingBytes = size_t{64} << 20;
// A writer makes what it has copied in visible to the reader (and a reader hands back the
// space it has copied out) every this many bytes, so that the two copies of a large frame
// overlap instead of one following the other.
inline constexpr size_t kRingPublishBytes = size_t{64} << 10;

// One ring's control words, each on its own cache line.
struct RingControl {
  alignas(64) uint64_t tail;               // written by the producer: bytes written so far
  alignas(64) uint64_t head;               // written by the consumer: bytes read so far
  alignas(64) uint32_t consumer_sleeping;  // the consumer is about to sleep or asleep
  alignas(64) uint32_t producer_waiting;   // the producer waits for space
};

// A mapped segment: two rings of `capacity` bytes each (client to server, server to client).
class RingSegment {
 public:
  ~RingSegment();
  RingSegment(const RingSegment&) = delete;
  RingSegment& operator=(const RingSegment&) = delete;

  // The connecting side: a new sealed memfd of the right size, mapped. `capacity` a power
  // of two in [kMinRingBytes, kMaxRingBytes]. nullptr with *error set on failure.
  static std::unique_ptr<RingSegment> create(size_t capacity, std::string* error);
  // The accepting side: checks that `fd` is a memfd sealed against shrinking of exactly
  // the size that `capacity` makes, and maps it; takes `fd` (closed either way).
  static std::unique_ptr<RingSegment> attach(int fd, size_t capacity, std::string* error);

  // The setup message for this segment, and its parse (the capacity, or 0 with *error).
  std::string setup_message() const;
  static size_t parse_setup(const uint8_t* data, std::string* error);

  // Whether memfd segments can be made here at all.
  static bool viable();

  // The descriptor to pass to the peer (create() only); release_fd() hands it over.
  int release_fd();

  size_t capacity() const { return capacity_; }
  // Ring 0 carries client to server, ring 1 server to client.
  RingControl* control(int ring) const;
  char* data(int ring) const;

 private:
  RingSegment(void* base, size_t size, size_t capacity, int fd)
      : base_(base), size_(size), capacity_(capacity), fd_(fd) {}
  static size_t segment_bytes(size_t capacity);

  void* base_;
  size_t size_;
  size_t capacity_;
  int fd_;
};

class RingReader {
 public:
  RingReader() = default;
  RingReader(RingControl* control, const char* data, size_t capacity);

  // Copies up to `room` bytes out. Sets *corrupt when the peer's position is impossible.
  size_t read(char* into, size_t room, bool* corrupt);
  // Whether bytes are waiting (no copy).
  bool readable(bool* corrupt) const;
  // Before sleeping: marks the consumer asleep, then returns whether bytes arrived meanwhile.
  bool arm(bool* corrupt);
  // After waking (or while polling): clears the mark.
  void disarm();
  // After read(): whether the producer asked to be woken for space (clears its mark).
  bool producer_wants_wake();
  uint64_t position() const { return head_; }

 private:
  RingControl* control_ = nullptr;
  const char* data_ = nullptr;
  size_t capacity_ = 0;
  uint64_t head_ = 0;  // this side's own copy: what the segment says is never trusted
};

class RingWriter {
 public:
  RingWriter() = default;
  RingWriter(RingControl* control, char* data, size_t capacity);

  // Copies as much of iov[0..count) in as fits; returns the bytes taken. Sets *corrupt when
  // the peer's position is impossible.
  size_t write(const iovec* iov, int count, bool* corrupt);
  // After write(): whether the consumer is asleep and must be woken (clears its mark).
  bool consumer_wants_wake();
  // The ring was full: asks the consumer for a wake-up, then returns whether space
  // appeared meanwhile.
  bool wait_for_space(bool* corrupt);
  bool writable(bool* corrupt) const;
  uint64_t position() const { return tail_; }

 private:
  size_t free_space(bool* corrupt) const;

  RingControl* control_ = nullptr;
  char* data_ = nullptr;
  size_t capacity_ = 0;
  uint64_t tail_ = 0;
};

}  // namespace gradwire::rpc::transport
