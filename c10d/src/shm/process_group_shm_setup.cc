// ProcessGroupShm's creation: the host check, this rank's segment, the exchange of the
// ranks' records through the store, the peers' read-only mappings, and the unlink once
// every rank has mapped every segment.
#include "gradwire/c10d/process_group_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/c10d/prefix_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/net.h"
#include "process_group_shm_impl.h"
#include "rank_keys.h"

namespace gradwire::c10d {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

size_t page_size() {
  const long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : 4096;
}

std::string errno_text(int err) {
  return std::strerror(err);
}

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

std::string hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4)
    s[static_cast<size_t>(i)] = digits[v & 0xf];
  return s;
}

uint64_t random_token() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ uint64_t { rd() };
}

// What a rank publishes about itself in the store when the group is made.
struct RankRecord {
  std::string host;
  uint64_t netns = 0;
  std::string segment;  // shm name
  uint64_t token = 0;
  int64_t pid = 0;
  uint64_t area_bytes = 0;
};

std::string encode(const RankRecord& r) {
  std::ostringstream out;
  out << r.host << '\n'
      << r.netns << '\n'
      << r.segment << '\n'
      << r.token << '\n'
      << r.pid << '\n'
      << r.area_bytes << '\n';
  return out.str();
}

// Parses a peer's record; throws NetworkError naming the rank when it is malformed.
RankRecord decode(const Bytes& bytes, int rank, const std::string& what) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  RankRecord r;
  if (!std::getline(in, r.host) || !(in >> r.netns) || !(in >> std::ws) ||
      !std::getline(in, r.segment) || !(in >> r.token >> r.pid >> r.area_bytes)) {
    throw NetworkError(what + ": rank " + std::to_string(rank) +
                       " published a malformed shared-memory record");
  }
  // The name is ours to open: "/gradwire-shm-<16 hex>-<rank>" and nothing else.
  const std::string prefix = "/gradwire-shm-";
  // Appended, not "-" + to_string(...): g++ 12 at -O3 warns falsely (-Wrestrict) on a
  // literal prepended to a temporary string.
  std::string suffix(1, '-');
  suffix += std::to_string(rank);
  bool ok = r.segment.size() == prefix.size() + 16 + suffix.size() &&
            r.segment.compare(0, prefix.size(), prefix) == 0 &&
            r.segment.compare(prefix.size() + 16, suffix.size(), suffix) == 0;
  for (size_t i = prefix.size(); ok && i < prefix.size() + 16; ++i)
    ok = std::isxdigit(static_cast<unsigned char>(r.segment[i])) != 0;
  if (!ok || r.pid <= 0) {
    throw NetworkError(what + ": rank " + std::to_string(rank) +
                       " published an invalid segment name or pid");
  }
  return r;
}

// Creates, sizes and maps this rank's segment (exclusively, owner-only, under a random
// name) and writes its header; returns the token that names it.
uint64_t create_own_segment(ProcessGroupShm::Impl& im, size_t buffer_bytes, int rank, int size,
                            const std::string& what) {
  const size_t page = page_size();
  im.area_bytes = (buffer_bytes + page - 1) / page * page;
  im.bytes = ShmSegmentHeader::kBytes + 4 * im.area_bytes;

  const uint64_t token = random_token();
  im.name = "/gradwire-shm-" + hex(token) + "-" + std::to_string(rank);
  UniqueFd fd(::shm_open(im.name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (!fd) {
    const int err = errno;
    im.name.clear();
    throw NetworkError(what + ": cannot create a shared-memory segment: " + errno_text(err));
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(im.bytes)) != 0) {
    const int err = errno;
    throw NetworkError(what + ": cannot size the shared-memory segment to " +
                       std::to_string(im.bytes) + " bytes: " + errno_text(err));
  }
  void* base = ::mmap(nullptr, im.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  const int map_err = errno;
  fd.reset();
  if (base == MAP_FAILED) {
    throw NetworkError(what + ": cannot map the shared-memory segment: " + errno_text(map_err));
  }
  im.mine = static_cast<uint8_t*>(base);
  im.header = new (im.mine) ShmSegmentHeader{};
  im.header->magic = ShmSegmentHeader::kMagic;
  im.header->version = ShmSegmentHeader::kVersion;
  im.header->rank = rank;
  im.header->segment_bytes = im.bytes;
  im.header->area_bytes = im.area_bytes;
  im.header->token = token;
  im.header->pid = ::getpid();
  im.header->world = static_cast<uint32_t>(size);
  im.header->step.store(0, std::memory_order_release);
  return token;
}

// Publishes this rank's record through the store and reads every rank's; `wait_start` is
// when the wait for them began. Throws when a rank does not join in time or is on another
// host or network namespace.
std::vector<RankRecord> exchange_records(Store& store, const RankRecord& record, int rank, int size,
                                         milliseconds timeout, const std::string& what,
                                         Clock::time_point& wait_start) {
  const std::string info = "shm/info/";
  store.set(info + std::to_string(rank), std::string_view(encode(record)));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r)
    keys.push_back(info + std::to_string(r));
  wait_start = Clock::now();
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    throw TimeoutError(what + ": ranks " +
                       detail::ranks_text(detail::ranks_without_key(store, info, size)) +
                       " did not join within " + std::to_string(timeout.count()) + " ms");
  }
  std::vector<RankRecord> records;
  std::vector<int> elsewhere;
  for (int r = 0; r < size; ++r) {
    records.push_back(decode(store.get(keys[static_cast<size_t>(r)], timeout), r, what));
    if (records.back().host != record.host || records.back().netns != record.netns)
      elsewhere.push_back(r);
  }
  if (!elsewhere.empty()) {
    throw InvalidArgument(what + ": ranks " + detail::ranks_text(elsewhere) +
                          " are on another host or network namespace; shared memory serves only "
                          "ranks of one host (use make_process_group(\"cpu\") or \"gloo\")");
  }
  return records;
}

// Maps rank r's segment read-only into `p` and validates it: owner-only, this user's, of
// this rank's size, with the header r published, at step 0.
void map_peer(ProcessGroupShm::Impl& im, ProcessGroupShm::Impl::Peer& p, int r,
              const RankRecord& rec, int size, const std::string& what) {
  const std::string who = what + ": rank " + std::to_string(r) + "'s segment";
  if (rec.area_bytes != im.area_bytes) {
    throw InvalidArgument(who + " has areas of " + std::to_string(rec.area_bytes) +
                          " bytes, this rank's " + std::to_string(im.area_bytes) +
                          " (every rank must use the same ShmOptions::buffer_bytes)");
  }
  UniqueFd pfd(::shm_open(rec.segment.c_str(), O_RDONLY | O_CLOEXEC, 0));
  if (!pfd) {
    throw NetworkError(who + " cannot be opened: " + errno_text(errno));
  }
  struct stat st {};
  if (::fstat(pfd.get(), &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 ||
      static_cast<size_t>(st.st_size) != im.bytes) {
    throw NetworkError(who + " is not an owner-only segment of " + std::to_string(im.bytes) +
                       " bytes belonging to this user");
  }
  void* peer_base = ::mmap(nullptr, im.bytes, PROT_READ, MAP_SHARED, pfd.get(), 0);
  const int err = errno;
  pfd.reset();
  if (peer_base == MAP_FAILED) {
    throw NetworkError(who + " cannot be mapped: " + errno_text(err));
  }
  p.base = static_cast<const uint8_t*>(peer_base);
  p.bytes = im.bytes;
  p.header = reinterpret_cast<const ShmSegmentHeader*>(p.base);
  const ShmSegmentHeader& h = *p.header;
  if (h.magic != ShmSegmentHeader::kMagic || h.version != ShmSegmentHeader::kVersion ||
      h.rank != r || h.token != rec.token || h.pid != rec.pid || h.area_bytes != im.area_bytes ||
      h.segment_bytes != im.bytes || h.world != static_cast<uint32_t>(size)) {
    throw NetworkError(who + " has a header that does not match what it published");
  }
  p.last_step = h.step.load(std::memory_order_acquire);
  if (p.last_step != 0) throw NetworkError(who + " does not start at step 0");
  if (p.pid != ::getpid()) p.pidfd.reset(pidfd_open(p.pid));
}

// Once every rank has mapped every segment, the names go: nothing else can open them. The
// wait for the others gets what is left of `timeout` since `start`.
void unlink_once_mapped(ProcessGroupShm::Impl& im, Store& store, int rank, int size,
                        milliseconds timeout, Clock::time_point start, const std::string& what) {
  const std::string mapped = "shm/mapped/";
  store.set(mapped + std::to_string(rank), std::string_view("1"));
  std::vector<std::string> mapped_keys;
  for (int r = 0; r < size; ++r)
    mapped_keys.push_back(mapped + std::to_string(r));
  const auto left = std::chrono::duration_cast<milliseconds>(timeout - (Clock::now() - start));
  try {
    store.wait(mapped_keys, std::max(left, milliseconds(1)));
  } catch (const TimeoutError&) {
    throw TimeoutError(
        what + ": ranks " + detail::ranks_text(detail::ranks_without_key(store, mapped, size)) +
        " did not map the segments within " + std::to_string(timeout.count()) + " ms");
  }
  ::shm_unlink(im.name.c_str());
  im.unlinked = true;
}

}  // namespace

// ---- creation

std::vector<std::string> ProcessGroupShm::rank_hosts(Store& store, int rank, int size,
                                                     const std::string& key, milliseconds timeout) {
  const std::string mine = net::host_id() + "/" + std::to_string(net::network_namespace_id());
  store.set(key + "/" + std::to_string(rank), std::string_view(mine));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r)
    keys.push_back(key + "/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    throw TimeoutError("make_process_group: ranks " +
                       detail::ranks_text(detail::ranks_without_key(store, key + "/", size)) +
                       " did not publish their host within " + std::to_string(timeout.count()) +
                       " ms");
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) {
    const Bytes theirs = store.get(keys[static_cast<size_t>(r)], timeout);
    hosts.emplace_back(theirs.begin(), theirs.end());
  }
  return hosts;
}

bool ProcessGroupShm::ranks_share_host(Store& store, int rank, int size, const std::string& key,
                                       milliseconds timeout) {
  const std::vector<std::string> hosts = rank_hosts(store, rank, size, key, timeout);
  return std::all_of(hosts.begin(), hosts.end(),
                     [&](const std::string& h) { return h == hosts.front(); });
}

std::shared_ptr<ProcessGroupShm> ProcessGroupShm::create(std::shared_ptr<Store> store, int rank,
                                                         int size, ProcessGroupOptions options,
                                                         ShmOptions shm_options) {
  return std::shared_ptr<ProcessGroupShm>(new ProcessGroupShm(
      std::move(store), rank, size, std::move(options), std::move(shm_options)));
}

ProcessGroupShm::ProcessGroupShm(std::shared_ptr<Store> store, int rank, int size,
                                 ProcessGroupOptions options, ShmOptions shm_options)
    : ProcessGroup(std::move(store), rank, size, std::move(options)),
      shm_options_(std::move(shm_options)),
      impl_(std::make_unique<Impl>()) {
  const std::string what = "ProcessGroupShm (group '" + name() + "', rank " +
                           std::to_string(this->rank()) + " of " + std::to_string(this->size()) +
                           ")";
  if (shm_options_.buffer_bytes < 4096) {
    throw InvalidArgument(what + ": ShmOptions::buffer_bytes must be at least 4096, got " +
                          std::to_string(shm_options_.buffer_bytes));
  }
  if (shm_options_.buffer_bytes > (size_t{1} << 32)) {
    throw InvalidArgument(what + ": ShmOptions::buffer_bytes must be at most 4 GiB, got " +
                          std::to_string(shm_options_.buffer_bytes));
  }
  if (shm_options_.buffer_bytes / static_cast<size_t>(std::max(this->size(), 1)) < 64) {
    throw InvalidArgument(what +
                          ": ShmOptions::buffer_bytes must be at least 64 bytes per rank, got " +
                          std::to_string(shm_options_.buffer_bytes) + " for " +
                          std::to_string(this->size()) + " ranks");
  }
  if (shm_options_.wait_slice.count() <= 0) {
    throw InvalidArgument(what + ": ShmOptions::wait_slice must be positive, got " +
                          std::to_string(shm_options_.wait_slice.count()) + " ms");
  }
  if (shm_options_.spin.count() < 0) {
    throw InvalidArgument(what + ": ShmOptions::spin must not be negative");
  }
  connect(what);
}

void ProcessGroupShm::connect(const std::string& what) {
  Impl& im = *impl_;
  const uint64_t token = create_own_segment(im, shm_options_.buffer_bytes, rank(), size(), what);
  const RankRecord record{net::host_id(), net::network_namespace_id(), im.name, token, ::getpid(),
                          im.area_bytes};
  Clock::time_point start;
  const std::vector<RankRecord> records =
      exchange_records(*store(), record, rank(), size(), timeout(), what, start);

  // Map the peers' segments read-only, and validate them.
  im.peers.resize(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    Impl::Peer& p = im.peers[static_cast<size_t>(r)];
    const RankRecord& rec = records[static_cast<size_t>(r)];
    p.pid = static_cast<pid_t>(rec.pid);
    p.token = rec.token;
    if (r == rank()) {
      p.base = im.mine;
      p.bytes = im.bytes;
      p.header = im.header;
      continue;
    }
    map_peer(im, p, r, rec, size(), what);
  }
  unlink_once_mapped(im, *store(), rank(), size(), timeout(), start, what);

  ProcessGroupOptions p2p_options{
      .timeout = timeout(), .debug_level = DebugLevel::kOff, .name = name() + "/p2p"};
  im.p2p = ProcessGroupGloo::create(std::make_shared<PrefixStore>("shm_p2p", store()), rank(),
                                    size(), p2p_options, shm_options_.gloo);
  im.worker =
      std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "shm-" + name()});
  if (debug_level() != DebugLevel::kOff) {
    GRADWIRE_LOG(kInfo) << what << ": segments of " << im.bytes << " bytes mapped";
  }
}

ProcessGroupShm::~ProcessGroupShm() {
  if (impl_->worker) impl_->worker->shutdown();
  impl_->worker.reset();
  impl_->p2p.reset();
}

ShmSegmentHeader* ProcessGroupShm::own_header_for_testing() {
  return impl_->header;
}

}  // namespace gradwire::c10d
