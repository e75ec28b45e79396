#include "loans.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <thread>

namespace gradwire::rpc::detail {

static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "loan table words must be plain 64-bit words in memory");

LoanTable::LoanTable(uint32_t slots)
    : slots_(slots), words_(std::make_unique<std::atomic<uint64_t>[]>(1 + kWordsPerSlot * slots)) {
  std::random_device seed;
  MutexLock lock(mutex_);
  random_.seed((uint64_t{seed()} << 32) ^ seed() ^ static_cast<uint64_t>(::getpid()));
  words_[0].store(random_() | 1, std::memory_order_release);
  for (size_t i = 1; i < 1 + kWordsPerSlot * slots; ++i)
    words_[i].store(0, std::memory_order_relaxed);
  held_.resize(slots);
  connection_.resize(slots);
  free_.reserve(slots);
  for (uint32_t s = slots; s > 0; --s)
    free_.push_back(s - 1);
}

LoanTableAddress LoanTable::address() const {
  return LoanTableAddress{::getpid(), reinterpret_cast<uint64_t>(&words_[0]),
                          words_[0].load(std::memory_order_acquire),
                          reinterpret_cast<uint64_t>(&words_[1]), slots_};
}

std::optional<Loan> LoanTable::lend(const Tensor& tensor, int reader, uint64_t connection) {
  MutexLock lock(mutex_);
  if (free_.empty()) return std::nullopt;
  const uint32_t slot = free_.back();
  free_.pop_back();
  held_[slot] = tensor;
  connection_[slot] = connection;
  uint64_t token = 0;
  while (token == 0)
    token = random_();
  std::atomic<uint64_t>* entry = &words_[1 + kWordsPerSlot * slot];
  entry[1].store(reinterpret_cast<uint64_t>(tensor.data_ptr()), std::memory_order_relaxed);
  entry[2].store(tensor.nbytes(), std::memory_order_relaxed);
  entry[3].store(static_cast<uint64_t>(static_cast<int64_t>(reader)), std::memory_order_relaxed);
  entry[0].store(token, std::memory_order_release);
  return Loan{slot, token};
}

void LoanTable::clear(uint32_t slot, std::vector<Tensor>& dropped) {
  // The token goes first: a reader that checks it after its copy sees the loan ended
  // before the memory can be reused.
  words_[1 + kWordsPerSlot * slot].store(0, std::memory_order_seq_cst);
  dropped.push_back(std::move(held_[slot]));
  held_[slot] = Tensor();
  free_.push_back(slot);
}

bool LoanTable::release(const Loan& loan, uint64_t connection) {
  std::vector<Tensor> dropped;  // freed after the lock
  MutexLock lock(mutex_);
  if (loan.slot >= slots_ || loan.token == 0) return false;
  if (words_[1 + kWordsPerSlot * loan.slot].load(std::memory_order_relaxed) != loan.token ||
      connection_[loan.slot] != connection) {
    return false;
  }
  clear(loan.slot, dropped);
  lock.unlock();
  return true;
}

void LoanTable::release_connection(uint64_t connection) {
  std::vector<Tensor> dropped;
  MutexLock lock(mutex_);
  for (uint32_t s = 0; s < slots_; ++s) {
    if (held_[s].defined() && connection_[s] == connection) clear(s, dropped);
  }
  lock.unlock();
}

void LoanTable::release_all() {
  std::vector<Tensor> dropped;
  MutexLock lock(mutex_);
  for (uint32_t s = 0; s < slots_; ++s) {
    if (held_[s].defined()) clear(s, dropped);
  }
  lock.unlock();
}

size_t LoanTable::outstanding() const {
  MutexLock lock(mutex_);
  return slots_ - free_.size();
}

namespace {

// Reads `bytes` at `remote` in process `pid` into `local`; "" or why not.
std::string read_remote(pid_t pid, uint64_t remote, void* local, size_t bytes) {
  auto* out = static_cast<char*>(local);
  while (bytes > 0) {
    iovec here{out, bytes};
    iovec there{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = ::process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::strerror(errno);
    }
    if (n == 0) return "no progress";
    out += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return {};
}

struct Piece {
  uint64_t remote;
  char* local;
  size_t bytes;
};

// Pieces are taken from a shared counter by the calling thread and by helpers; a helper
// that starts after all are taken does nothing, so helpers that are slow to start (busy
// pool threads) never hold the copy up.
struct SharedCopy {
  pid_t pid;
  std::vector<Piece> pieces;
  std::atomic<size_t> next{0};
  Mutex mutex;
  std::condition_variable done_cv;
  size_t done GRADWIRE_GUARDED_BY(mutex) = 0;
  std::string error GRADWIRE_GUARDED_BY(mutex);

  void work() {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= pieces.size()) return;
      std::string why = read_remote(pid, pieces[i].remote, pieces[i].local, pieces[i].bytes);
      MutexLock lock(mutex);
      if (!why.empty() && error.empty()) error = std::move(why);
      if (++done == pieces.size()) done_cv.notify_all();
    }
  }
};

constexpr size_t kMinPieceBytes = 1 << 20;
constexpr size_t kPieceAlignment = 64 << 10;

}  // namespace

bool can_read_peers() {
  // A word of this process, read through the system call.
  static const uint64_t probe = 0x9e3779b97f4a7c15ull;
  uint64_t value = 0;
  if (!read_remote(::getpid(), reinterpret_cast<uint64_t>(&probe), &value, sizeof value).empty() ||
      value != probe) {
    return false;
  }
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int level = 0;
  return !(scope >> level) || level == 0;
}

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(in >> id)) return {};
  return id;
}

namespace {

uint64_t entry_address(const LoanTableAddress& peer, uint32_t slot) {
  return peer.table_address + uint64_t{LoanTable::kWordsPerSlot} * sizeof(uint64_t) * slot;
}

// The process is the lender only if the probe it published is there. Returns why not, or "".
std::string check_probe(const LoanTableAddress& peer) {
  uint64_t probe = 0;
  if (std::string why = read_remote(peer.pid, peer.probe_address, &probe, sizeof probe);
      !why.empty()) {
    return "reading the lender's probe in process " + std::to_string(peer.pid) + ": " + why;
  }
  if (probe != peer.probe_value) {
    return "process " + std::to_string(peer.pid) +
           " does not hold the lender's probe: it is not the worker that published the table";
  }
  return {};
}

// Checks every entry before anything is copied: each loan is lent to `reader` under its
// token with the size the message announced. Fills `addresses` (where each loan's bytes
// are in the lender) and `total`; returns why a loan cannot be copied, or "".
std::string check_entries(const LoanTableAddress& peer, int reader,
                          const std::vector<LoanCopy>& copies, std::vector<uint64_t>& addresses,
                          size_t& total) {
  for (const LoanCopy& c : copies) {
    const std::string which = "loan " + std::to_string(c.loan.slot);
    if (c.loan.slot >= peer.slots) {
      return which + " is outside the lender's table of " + std::to_string(peer.slots);
    }
    uint64_t entry[LoanTable::kWordsPerSlot] = {};
    std::string why = read_remote(peer.pid, entry_address(peer, c.loan.slot), entry, sizeof entry);
    if (!why.empty()) return "reading the lender's table: " + why;
    if (entry[0] != c.loan.token) return which + " is not (or no longer) lent under its token";
    if (static_cast<int64_t>(entry[3]) != reader) {
      return which + " is lent to rank " + std::to_string(static_cast<int64_t>(entry[3])) +
             ", not to rank " + std::to_string(reader);
    }
    if (entry[2] != c.nbytes) {
      return which + " holds " + std::to_string(entry[2]) + " bytes; the message announced " +
             std::to_string(c.nbytes);
    }
    addresses.push_back(entry[1]);
    total += c.nbytes;
  }
  return {};
}

// Copies the loans' bytes (at `addresses` in process `pid`) in pieces, on this thread and up
// to threads - 1 of `helpers`. Returns why the copy failed, or "".
std::string copy_pieces(pid_t pid, const std::vector<LoanCopy>& copies,
                        const std::vector<uint64_t>& addresses, size_t total, int threads,
                        Executor* helpers) {
  auto shared = std::make_shared<SharedCopy>();
  shared->pid = pid;
  // More threads than cores only queue behind each other.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int parts =
      std::clamp(static_cast<int>(total / kMinPieceBytes), 1, std::clamp(threads, 1, cores));
  const size_t piece =
      std::max(kMinPieceBytes, (total / static_cast<size_t>(parts) + kPieceAlignment - 1) /
                                   kPieceAlignment * kPieceAlignment);
  for (size_t i = 0; i < copies.size(); ++i) {
    auto* local = static_cast<char*>(copies[i].destination);
    for (size_t off = 0; off < copies[i].nbytes; off += piece) {
      shared->pieces.push_back(
          Piece{addresses[i] + off, local + off, std::min(piece, copies[i].nbytes - off)});
    }
  }
  // Nothing to copy (zero-byte loans) needs no helper either.
  const size_t threads_used = std::min<size_t>(shared->pieces.size(), size_t(parts));
  const size_t helpers_wanted = helpers == nullptr || threads_used == 0 ? 0 : threads_used - 1;
  for (size_t h = 0; h < helpers_wanted; ++h) {
    try {
      helpers->execute([shared] { shared->work(); });
    } catch (const std::exception&) {
      break;  // the executor is shutting down: this thread copies the rest
    }
  }
  shared->work();
  // Bounded: every piece not yet done is being copied by a running thread.
  MutexLock lock(shared->mutex);
  while (shared->done < shared->pieces.size())
    lock.wait(shared->done_cv);
  if (!shared->error.empty()) return "copying out of the lender's memory: " + shared->error;
  return {};
}

}  // namespace

std::string read_loans(const LoanTableAddress& peer, int reader,
                       const std::vector<LoanCopy>& copies, int threads, Executor* helpers) {
  if (peer.pid <= 0) return "the lender's process is not known";
  if (std::string why = check_probe(peer); !why.empty()) return why;
  std::vector<uint64_t> addresses;
  size_t total = 0;
  if (std::string why = check_entries(peer, reader, copies, addresses, total); !why.empty())
    return why;
  if (std::string why = copy_pieces(peer.pid, copies, addresses, total, threads, helpers);
      !why.empty())
    return why;
  // The loans must still stand: had one ended meanwhile, its memory may have been reused
  // while it was being copied.
  for (const LoanCopy& c : copies) {
    uint64_t token = 0;
    std::string why = read_remote(peer.pid, entry_address(peer, c.loan.slot), &token, sizeof token);
    if (!why.empty()) return "reading the lender's table: " + why;
    if (token != c.loan.token) {
      return "loan " + std::to_string(c.loan.slot) + " ended while it was being copied";
    }
  }
  return {};
}

}  // namespace gradwire::rpc::detail
