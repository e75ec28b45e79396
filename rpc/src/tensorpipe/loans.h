// Direct copies between processes of one host: a sender lends a large tensor instead of
// sending it, and the receiver copies the bytes straight out of the sender's memory with
// process_vm_readv, split over several threads. TensorPipe's own cma channel makes one
// such copy on one thread per context and adds control messages around it; for a 64 MiB
// tensor the copy is the whole cost, so spreading it over threads roughly halves a call.
//
// Safety by construction: a message never carries an address. It names an entry of the
// sender's loan table (slot and a random 64-bit token); the receiver reads that entry out
// of the sender's memory, checks the token, that the loan is meant for it and its size,
// copies, then reads the token again. The sender clears the token before it lets go of
// the tensor, so a copy that raced with a release (a lost connection, a closing agent) is
// detected and discarded instead of delivering whatever the memory held by then.
//
// Thread-safety: LoanTable's functions may be called from any thread; read_loans is a
// pure function of its arguments.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gradwire/core/executor.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/tensor/tensor.h"
#include "wire.h"

namespace gradwire::rpc::detail {

// Where a peer's table is: published in its worker record, but for `pid`, which the reader
// fills in with the process the kernel names at the other end of a local connection with
// that worker (transport/peer_book.h), and checks with the probe before reading anything.
struct LoanTableAddress {
  pid_t pid{0};
  uint64_t probe_address{0};  // a word holding `probe_value`
  uint64_t probe_value{0};
  uint64_t table_address{0};  // kWordsPerSlot words per slot
  uint32_t slots{0};
};

class LoanTable {
 public:
  // One entry, as receivers read it: token (0 = free), address, byte count, reader rank.
  static constexpr size_t kWordsPerSlot = 4;

  explicit LoanTable(uint32_t slots);
  LoanTable(const LoanTable&) = delete;
  LoanTable& operator=(const LoanTable&) = delete;

  LoanTableAddress address() const;

  // Lends `tensor` (contiguous, on the CPU) to the worker of rank `reader`, over connection
  // `connection`; nullopt when every slot is taken (the tensor is then sent as usual).
  std::optional<Loan> lend(const Tensor& tensor, int reader, uint64_t connection);
  // Ends a loan released by its reader over `connection`; false if no such loan exists
  // there (already released, or a forged or stale release).
  bool release(const Loan& loan, uint64_t connection);
  // Ends every loan made over `connection` (it was lost), or every loan (the agent closes).
  void release_connection(uint64_t connection);
  void release_all();
  size_t outstanding() const;

 private:
  void clear(uint32_t slot, std::vector<Tensor>& dropped) GRADWIRE_REQUIRES(mutex_);

  const uint32_t slots_;
  // words_[0] is the probe word; slot i is words_[1 + 4 i .. 4 + 4 i]. Receivers in other
  // processes read these words, so they are plain 64-bit atomics in one array.
  std::unique_ptr<std::atomic<uint64_t>[]> words_;
  mutable Mutex mutex_;
  std::vector<Tensor> held_ GRADWIRE_GUARDED_BY(mutex_);
  std::vector<uint64_t> connection_ GRADWIRE_GUARDED_BY(mutex_);
  std::vector<uint32_t> free_ GRADWIRE_GUARDED_BY(mutex_);
  std::mt19937_64 random_ GRADWIRE_GUARDED_BY(mutex_);
};

// Whether this process may read another's memory at all: process_vm_readv is allowed here
// (a seccomp filter may forbid it) and ptrace's scope does not restrict it to descendants.
// Whom it reads is decided per message (read_loans).
bool can_read_peers();

// This machine's boot id, or "" when unknown: peers with another boot id are on another
// host and are not probed.
std::string boot_id();

// One lent tensor to fetch: its loan and where its bytes go.
struct LoanCopy {
  Loan loan;
  void* destination{nullptr};
  size_t nbytes{0};
};

// Copies every loan from `peer` (which lent them to rank `reader`): first its probe word is
// read and checked (the process is the one that published the table), then each entry is checked
// before and after the copy, the bytes spread over up to `threads` threads of `helpers`
// besides the calling one. Returns "" on success, else why it failed (the destinations
// then hold nothing usable).
std::string read_loans(const LoanTableAddress& peer, int reader,
                       const std::vector<LoanCopy>& copies, int threads, Executor* helpers);

}  // namespace gradwire::rpc::detail
