#include "transport/ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>

namespace gradwire::rpc::transport {

namespace {

constexpr char kSetupMagic[4] = {'G', 'W', 'R', 'S'};
constexpr size_t kControlBytes = 4096;  // both rings' control words, one page
static_assert(2 * sizeof(RingControl) <= kControlBytes);

template <typename T>
std::atomic_ref<T> shared(T& word) {
  return std::atomic_ref<T>(word);
}

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

bool valid_capacity(size_t capacity) {
  return capacity >= kMinRingBytes && capacity <= kMaxRingBytes && std::has_single_bit(capacity);
}

}  // namespace

size_t RingSegment::segment_bytes(size_t capacity) {
  return kControlBytes + 2 * capacity;
}

RingSegment::~RingSegment() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

bool RingSegment::viable() {
  const int fd = ::memfd_create("gradwire-ring-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

std::unique_ptr<RingSegment> RingSegment::create(size_t capacity, std::string* error) {
  if (!valid_capacity(capacity)) {
    *error = "a ring's capacity must be a power of two in [" + std::to_string(kMinRingBytes) +
             ", " + std::to_string(kMaxRingBytes) + "], not " + std::to_string(capacity);
    return nullptr;
  }
  const int fd = ::memfd_create("gradwire-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = errno_text("memfd_create");
    return nullptr;
  }
  const size_t size = segment_bytes(capacity);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    *error = errno_text("ftruncate");
    ::close(fd);
    return nullptr;
  }
  // Sealed before the peer sees it: neither side can shrink it under the other's mapping.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    *error = errno_text("sealing the segment");
    ::close(fd);
    return nullptr;
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *error = errno_text("mmap");
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<RingSegment>(new RingSegment(base, size, capacity, fd));
}

std::unique_ptr<RingSegment> RingSegment::attach(int fd, size_t capacity, std::string* error) {
  auto refuse = [&](std::string why) -> std::unique_ptr<RingSegment> {
    *error = std::move(why);
    ::close(fd);
    return nullptr;
  };
  if (!valid_capacity(capacity)) {
    return refuse("the peer asked for rings of " + std::to_string(capacity) + " bytes");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return refuse("the peer's ring segment is not a sealable memfd");
  if ((seals & F_SEAL_SHRINK) == 0) {
    return refuse("the peer's ring segment is not sealed against shrinking");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return refuse(errno_text("fstat of the peer's ring segment"));
  const size_t size = segment_bytes(capacity);
  if (!S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != size) {
    return refuse("the peer's ring segment has " + std::to_string(st.st_size) +
                  " bytes where rings of " + std::to_string(capacity) + " need " +
                  std::to_string(size));
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return refuse(errno_text("mmap of the peer's ring segment"));
  ::close(fd);
  return std::unique_ptr<RingSegment>(new RingSegment(base, size, capacity, -1));
}

std::string RingSegment::setup_message() const {
  std::string out(kSetupMagic, sizeof(kSetupMagic));
  out.push_back(static_cast<char>(kRingVersion));
  out.push_back(static_cast<char>(std::countr_zero(capacity_)));
  out.push_back('\0');
  out.push_back('\0');
  return out;
}

size_t RingSegment::parse_setup(const uint8_t* data, std::string* error) {
  if (std::memcmp(data, kSetupMagic, sizeof(kSetupMagic)) != 0) {
    *error = "its ring setup message does not begin with GWRS";
    return 0;
  }
  if (data[4] != kRingVersion) {
    *error = "its ring setup has version " + std::to_string(data[4]) + ", this side speaks " +
             std::to_string(kRingVersion);
    return 0;
  }
  if (data[6] != 0 || data[7] != 0) {
    *error = "its ring setup message has non-zero reserved bytes";
    return 0;
  }
  if (data[5] >= 63) {
    *error = "its ring setup asks for rings of 2^" + std::to_string(data[5]) + " bytes";
    return 0;
  }
  const size_t capacity = size_t{1} << data[5];
  if (!valid_capacity(capacity)) {
    *error = "its ring setup asks for rings of " + std::to_string(capacity) + " bytes, outside [" +
             std::to_string(kMinRingBytes) + ", " + std::to_string(kMaxRingBytes) + "]";
    return 0;
  }
  return capacity;
}

int RingSegment::release_fd() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

RingControl* RingSegment::control(int ring) const {
  return reinterpret_cast<RingControl*>(static_cast<char*>(base_) + ring * sizeof(RingControl));
}

char* RingSegment::data(int ring) const {
  return static_cast<char*>(base_) + kControlBytes + static_cast<size_t>(ring) * capacity_;
}

// ---- RingReader

RingReader::RingReader(RingControl* control, const char* data, size_t capacity)
    : control_(control), data_(data), capacity_(capacity) {}

bool RingReader::readable(bool* corrupt) const {
  const uint64_t tail = shared(control_->tail).load(std::memory_order_acquire);
  const uint64_t avail = tail - head_;
  if (avail > capacity_) {
    *corrupt = true;
    return false;
  }
  return avail > 0;
}

size_t RingReader::read(char* into, size_t room, bool* corrupt) {
  const uint64_t tail = shared(control_->tail).load(std::memory_order_acquire);
  const uint64_t avail = tail - head_;
  if (avail > capacity_) {  // behind this side's own position, or beyond a full ring
    *corrupt = true;
    return 0;
  }
  const size_t n = static_cast<size_t>(std::min<uint64_t>(avail, room));
  size_t done = 0;
  while (done < n) {
    // Space handed back piece by piece: a writer waiting for it goes on sooner.
    const size_t at = static_cast<size_t>(head_ & (capacity_ - 1));
    const size_t chunk = std::min({n - done, capacity_ - at, kRingPublishBytes});
    std::memcpy(into + done, data_ + at, chunk);
    head_ += chunk;
    done += chunk;
    shared(control_->head).store(head_, std::memory_order_release);
  }
  return n;
}

bool RingReader::arm(bool* corrupt) {
  shared(control_->consumer_sleeping).store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return readable(corrupt);
}

void RingReader::disarm() {
  auto flag = shared(control_->consumer_sleeping);
  if (flag.load(std::memory_order_relaxed) != 0) flag.store(0, std::memory_order_relaxed);
}

bool RingReader::producer_wants_wake() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto flag = shared(control_->producer_waiting);
  if (flag.load(std::memory_order_relaxed) == 0) return false;
  return flag.exchange(0, std::memory_order_seq_cst) != 0;
}

// ---- RingWriter

RingWriter::RingWriter(RingControl* control, char* data, size_t capacity)
    : control_(control), data_(data), capacity_(capacity) {}

size_t RingWriter::free_space(bool* corrupt) const {
  const uint64_t head = shared(control_->head).load(std::memory_order_acquire);
  const uint64_t used = tail_ - head;
  if (used > capacity_) {  // the consumer claims to have read what was never written
    *corrupt = true;
    return 0;
  }
  return capacity_ - static_cast<size_t>(used);
}

bool RingWriter::writable(bool* corrupt) const {
  return free_space(corrupt) > 0;
}

size_t RingWriter::write(const iovec* iov, int count, bool* corrupt) {
  size_t room = free_space(corrupt);
  size_t taken = 0;
  for (int i = 0; i < count && room > 0; ++i) {
    const char* src = static_cast<const char*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, room);
    while (len > 0) {
      const size_t at = static_cast<size_t>(tail_ & (capacity_ - 1));
      const size_t chunk = std::min({len, capacity_ - at, kRingPublishBytes});
      std::memcpy(data_ + at, src, chunk);
      tail_ += chunk;
      src += chunk;
      len -= chunk;
      room -= chunk;
      taken += chunk;
      // Published piece by piece: a reader polling on another core copies each piece out
      // while this side copies the next one in.
      shared(control_->tail).store(tail_, std::memory_order_release);
    }
  }
  return taken;
}

bool RingWriter::consumer_wants_wake() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto flag = shared(control_->consumer_sleeping);
  if (flag.load(std::memory_order_relaxed) == 0) return false;
  return flag.exchange(0, std::memory_order_seq_cst) != 0;
}

bool RingWriter::wait_for_space(bool* corrupt) {
  shared(control_->producer_waiting).store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return writable(corrupt);
}

}  // namespace gradwire::rpc::transport
