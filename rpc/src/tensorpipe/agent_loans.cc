// The TensorPipe agent: loans (direct copies, loans.h): tensors lent to a peer and copied
// out of a lender's memory.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include "gradwire/core/logging.h"
#include "gradwire/core/trace.h"
#include "text.h"

namespace gradwire::rpc::detail {

Lender TensorPipeAgent::lender_for(Lending& lending) {
  const int peer = lending.peer;
  if (!loans_ || !group_.lends_to(peer)) {
    return nullptr;
  }
  return [this, &lending](const Tensor& t) -> std::optional<Loan> {
    if (t.nbytes() < options_.direct_copy_min_bytes || t.nbytes() == 0) return std::nullopt;
    std::optional<Loan> loan = loans_->lend(t, lending.peer, lending.connection);
    if (loan) {
      lending.taken.push_back(*loan);
      tensors_lent_.fetch_add(1, std::memory_order_relaxed);
      bytes_lent_.fetch_add(t.nbytes(), std::memory_order_relaxed);
    }
    return loan;
  };
}

void TensorPipeAgent::return_loans(const std::vector<Loan>& taken, uint64_t connection) {
  for (const Loan& loan : taken)
    loans_->release(loan, connection);
  if (taken.empty()) return;
  MutexLock lock(mutex_);
  idle_cv_.notify_all();
}

std::string TensorPipeAgent::copy_lent(const std::shared_ptr<Connection>& conn,
                                       const std::vector<LoanCopy>& lent) {
  const int peer = conn->peer.id;
  // The copy out of the lender's memory, before the message is handled.
  trace::Span span("rpc.copy_in", "rpc", trace::Arg("peer", peer),
                   trace::Arg("tensors", static_cast<uint64_t>(lent.size())));
  if (span.active()) {
    uint64_t bytes = 0;
    for (const LoanCopy& c : lent)
      bytes += c.nbytes;
    span.arg(trace::Arg("bytes", bytes));
  }
  std::string why;
  const std::optional<LoanTableAddress>& table = group_.readable(peer);
  // The lender's process: the one the kernel names at the other end of this pipe's local
  // connections (opened to the address this worker dialled, or admitted as the lender).
  const std::optional<transport::PeerProcess> process =
      conn->outgoing ? book_->process_of_dialed(conn->dialed)
                     : book_->process_of_worker(conn->peer.name, conn->peer.id);
  if (!table) {
    why = "its memory cannot be read from here (no direct copies between these workers)";
  } else if (!process) {
    why = "no local connection with it names its process, so its memory is not read";
  } else {
    LoanTableAddress verified = *table;
    verified.pid = process->pid;
    why = read_loans(verified, self_.id, lent, options_.direct_copy_threads, pool_.get());
  }
  if (why.empty()) {
    for (const LoanCopy& c : lent) {
      tensors_copied_in_.fetch_add(1, std::memory_order_relaxed);
      bytes_copied_in_.fetch_add(c.nbytes, std::memory_order_relaxed);
    }
  }
  // Released in every case: the lender must not hold the memory for a copy that failed.
  Release release;
  for (const LoanCopy& c : lent)
    release.loans.push_back(c.loan);
  write(conn, encode(Envelope{std::move(release)}), nullptr);
  return why;
}

void TensorPipeAgent::on_release(const std::shared_ptr<Connection>& conn, const Release& release) {
  for (const Loan& loan : release.loans) {
    if (!loans_ || !loans_->release(loan, conn->serial)) {
      GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe() << ": worker "
                             << conn->peer.describe() << " released loan " << loan.slot
                             << ", which it does not hold";
    }
  }
  MutexLock lock(mutex_);
  idle_cv_.notify_all();
}

}  // namespace gradwire::rpc::detail
