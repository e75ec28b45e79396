// ProcessGroupShm's operations: the step protocol over the shared segments (ShmExchange)
// and each collective written against it. The segments are made in
// process_group_shm_setup.cc.
#include "gradwire/c10d/process_group_shm.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "../gloo/reduce_kernels.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "process_group_shm_impl.h"

namespace gradwire::c10d {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How many steps a peer may be ahead of this rank: within a collective a rank publishes at
// most two steps (its next input and its reduced slice) before it must wait for this rank.
constexpr int32_t kMaxLead = 2;

// Area indices in the header's lengths[].
constexpr int kInput0 = 0;
constexpr int kOutput0 = 2;

long futex(const void* addr, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, addr, op, value, timeout, nullptr, 0);
}

// Whether `pid` has exited (a zombie counts as exited: it will never write again).
bool pid_exited(pid_t pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;  // unknown: only the timeout applies
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

std::vector<Tensor> detached(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors)
    out.push_back(t.detach());
  return out;
}

uint8_t* bytes_of(const Tensor& t) {
  return static_cast<uint8_t*>(t.data_ptr());
}

// A failure found while waiting on or reading a peer's segment.
struct ShmFailure {
  std::string what;
  bool timed_out;
};

}  // namespace

// One operation's access to the segments, on the worker thread.
class ShmExchange {
 public:
  ShmExchange(ProcessGroupShm::Impl& impl, const ShmOptions& options, int rank, int size,
              milliseconds timeout)
      : impl_(impl),
        options_(options),
        rank_(rank),
        size_(size),
        start_(Clock::now()),
        deadline_(start_ + timeout) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t area_bytes() const { return impl_.area_bytes; }
  uint32_t step() const { return impl_.step; }

  // Takes the next input (or output) area and waits until every peer has finished reading
  // what it held before; returns its index.
  int acquire_input() { return acquire(kInput0 + flip(impl_.next_input)); }
  int acquire_output() { return acquire(kOutput0 + flip(impl_.next_output)); }
  uint8_t* area(int a) { return impl_.mine + ShmSegmentHeader::kBytes + offset(a); }

  // Records `length` bytes in area `a` and publishes the next step.
  void publish(int a, uint64_t length) {
    if (a >= 0) impl_.header->lengths[a].store(length, std::memory_order_relaxed);
    publish();
  }
  void publish() {
    ++impl_.step;
    impl_.header->step.store(impl_.step, std::memory_order_release);
    futex(&impl_.header->step, FUTEX_WAKE, INT32_MAX, nullptr);
  }

  // Rank r's area `a`, after checking that it holds `length` bytes.
  const uint8_t* peer_area(int r, int a, uint64_t length) {
    const ProcessGroupShm::Impl::Peer& p = impl_.peers[static_cast<size_t>(r)];
    const uint64_t held = p.header->lengths[a].load(std::memory_order_relaxed);
    if (held > impl_.area_bytes) {
      throw ShmFailure{"rank " + std::to_string(r) + "'s shared-memory segment is corrupt: area " +
                           std::to_string(a) + " claims " + std::to_string(held) +
                           " bytes, more than its " + std::to_string(impl_.area_bytes),
                       false};
    }
    if (held != length) {
      throw ShmFailure{"rank " + std::to_string(r) + " placed " + std::to_string(held) +
                           " bytes where this rank expected " + std::to_string(length) +
                           " (the ranks called the collective with different sizes, or its "
                           "segment is corrupt)",
                       false};
    }
    return p.base + ShmSegmentHeader::kBytes + offset(a);
  }

  // This rank has read area `a` of its peers; they may overwrite it once they see the
  // step this rank publishes next.
  void done_reading(int a) { impl_.release[a] = impl_.step + 1; }

  // all_to_all's round count: this rank's, and rank r's (after a round).
  void own_rounds(uint64_t rounds) {
    impl_.header->rounds.store(rounds, std::memory_order_relaxed);
  }
  uint64_t peer_rounds(int r) {
    const uint64_t v =
        impl_.peers[static_cast<size_t>(r)].header->rounds.load(std::memory_order_relaxed);
    if (v > (uint64_t{1} << 40)) {
      throw ShmFailure{"rank " + std::to_string(r) +
                           "'s shared-memory segment is corrupt: it asks for " + std::to_string(v) +
                           " rounds",
                       false};
    }
    return v;
  }

  // Waits until every rank has published `target` steps.
  void wait_all(uint32_t target) {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) wait_peer(r, target);
    }
  }

 private:
  static int flip(int& next) {
    const int a = next;
    next ^= 1;
    return a;
  }
  int acquire(int a) {
    wait_all(impl_.release[a]);
    return a;
  }
  size_t offset(int a) const { return static_cast<size_t>(a) * impl_.area_bytes; }

  void check_header(int r) {
    const ProcessGroupShm::Impl::Peer& p = impl_.peers[static_cast<size_t>(r)];
    const ShmSegmentHeader& h = *p.header;
    // The owner never writes these after creation, but a hostile one may at any time: read
    // them as atomics, so that such a write is a value we reject, not a data race.
    auto read = [](const auto& field) { return __atomic_load_n(&field, __ATOMIC_RELAXED); };
    if (read(h.magic) != ShmSegmentHeader::kMagic ||
        read(h.version) != ShmSegmentHeader::kVersion || read(h.rank) != r ||
        read(h.token) != p.token || read(h.pid) != p.pid ||
        read(h.area_bytes) != impl_.area_bytes || read(h.segment_bytes) != p.bytes ||
        read(h.world) != static_cast<uint32_t>(size_)) {
      throw ShmFailure{"rank " + std::to_string(r) +
                           "'s shared-memory segment header is corrupt (magic, version, rank, "
                           "token, pid or sizes changed)",
                       false};
    }
  }

  // Checks a step value read from rank r: never backwards, never further ahead than the
  // protocol lets a rank run. True when it has reached `target`.
  bool reached(int r, uint32_t value, uint32_t target) {
    ProcessGroupShm::Impl::Peer& p = impl_.peers[static_cast<size_t>(r)];
    const auto back = static_cast<int32_t>(value - p.last_step);
    const auto lead = static_cast<int32_t>(value - impl_.step);
    if (back < 0 || lead > kMaxLead) {
      throw ShmFailure{
          "rank " + std::to_string(r) + "'s shared-memory segment is corrupt: its step " +
              std::to_string(value) + (back < 0 ? " went back from " : " is ahead of ") +
              std::to_string(back < 0 ? p.last_step : impl_.step) +
              (back < 0 ? "" : " by more than " + std::to_string(kMaxLead)),
          false};
    }
    p.last_step = value;
    return static_cast<int32_t>(value - target) >= 0;
  }

  void wait_peer(int r, uint32_t target) {
    ProcessGroupShm::Impl::Peer& p = impl_.peers[static_cast<size_t>(r)];
    const std::atomic<uint32_t>& word = p.header->step;
    check_header(r);
    if (reached(r, word.load(std::memory_order_acquire), target)) return;
    const Clock::time_point spin_end = Clock::now() + options_.spin;
    do {
      for (int i = 0; i < 64; ++i) {
        const uint32_t v = word.load(std::memory_order_acquire);
        if (v != p.last_step) {
          if (reached(r, v, target)) return;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    } while (Clock::now() < spin_end);
    for (;;) {
      const uint32_t v = word.load(std::memory_order_acquire);
      if (reached(r, v, target)) {
        check_header(r);
        return;
      }
      check_header(r);
      if (p.pid != ::getpid() && pid_exited(p.pid, p.pidfd.get())) {
        throw ShmFailure{"rank " + std::to_string(r) + " (pid " + std::to_string(p.pid) +
                             ") exited; this rank was waiting for its step " +
                             std::to_string(target),
                         false};
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline_) {
        throw ShmFailure{"waited for rank " + std::to_string(r) + " (step " +
                             std::to_string(target) + ", it has published " + std::to_string(v) +
                             ")",
                         true};
      }
      const auto left = std::min<Clock::duration>(deadline_ - now, options_.wait_slice);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
      futex(&word, FUTEX_WAIT, v, &ts);
    }
  }

  ProcessGroupShm::Impl& impl_;
  const ShmOptions& options_;
  int rank_;
  int size_;
  Clock::time_point start_;
  Clock::time_point deadline_;
};

namespace {

// [begin, end) of slice r when `count` elements are split among n ranks.
int64_t slice_begin(int64_t count, int r, int n) {
  return count * r / n;
}

// Tensors of one dtype read and written as one buffer, in order, without packing them:
// all_reduce reads its input from them and writes its result into them directly.
class Spans {
 public:
  explicit Spans(const std::vector<Tensor>& tensors) {
    for (const Tensor& t : tensors) {
      if (t.nbytes() == 0) continue;
      ptrs_.push_back(bytes_of(t));
      starts_.push_back(total_);
      total_ += t.nbytes();
    }
  }
  size_t bytes() const { return total_; }

  // Calls f(pointer, offset from `begin`, length) for each contiguous piece of
  // [begin, begin + len).
  template <typename F>
  void pieces(size_t begin, size_t len, F&& f) const {
    if (len == 0) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) -
                                   starts_.begin()) -
               1;
    size_t done = 0;
    while (done < len) {
      const size_t at = begin + done;
      const size_t end = i + 1 < starts_.size() ? starts_[i + 1] : total_;
      const size_t n = std::min(len - done, end - at);
      f(ptrs_[i] + (at - starts_[i]), done, n);
      done += n;
      ++i;
    }
  }
  void read(size_t begin, uint8_t* dst, size_t len) const {
    pieces(begin, len, [&](uint8_t* p, size_t off, size_t n) { std::memcpy(dst + off, p, n); });
  }
  void write(size_t begin, const uint8_t* src, size_t len) const {
    pieces(begin, len, [&](uint8_t* p, size_t off, size_t n) { std::memcpy(p, src + off, n); });
  }

 private:
  std::vector<uint8_t*> ptrs_;
  std::vector<size_t> starts_;
  size_t total_ = 0;
};

// Whether any two of `tensors` share bytes (then they cannot be reduced in place one after
// the other: a result written into one would be another's input).
bool any_overlap(const std::vector<Tensor>& tensors) {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const Tensor& t : tensors) {
    if (t.nbytes() == 0) continue;
    const auto b = reinterpret_cast<uintptr_t>(t.data_ptr());
    ranges.emplace_back(b, b + t.nbytes());
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return true;
  return false;
}

// Bytes of a rank's slice combined, divided and copied back in one go (all_reduce_spans):
// small enough to stay in a core's L2 with the inputs it was made from.
constexpr size_t kFusedBlock = 64 << 10;

// kAvg's division of `count` elements at p, for float32 and float64: what
// Tensor::div_(Scalar(n)) computes for them (the divisor in the tensor's own dtype, one
// correctly rounded division per element), with no tensor made per block.
void divide_block(uint8_t* p, size_t count, DType dtype, int n) {
  if (dtype == kFloat32) {
    auto* x = reinterpret_cast<float*>(p);
    const auto d = static_cast<float>(n);
    for (size_t i = 0; i < count; ++i)
      x[i] /= d;
  } else {
    auto* x = reinterpret_cast<double*>(p);
    const auto d = static_cast<double>(n);
    for (size_t i = 0; i < count; ++i)
      x[i] /= d;
  }
}

// How a rank combines its own slice of a chunk: the kernel in rank order over every rank's
// input, kAvg's division, and whether the result goes back into the tensors block by block
// as it is made (`fused`) or after publishing.
struct SliceReduce {
  gloo_backend::RawReduceFn kernel;
  ReduceOp op;
  DType dtype;
  TensorOptions options;
  size_t es;  // element size
  int me;
  int n;
  // kAvg divides in the fused pass only where divide_block does exactly what div_ does.
  bool fused;

  // Combines bytes [begin, begin + len) of `data` (this rank's slice) with the peers' same
  // slice (`peers[r]`, this rank's entry unused) into `dst`.
  void operator()(const Spans& data, size_t begin, size_t len, uint8_t* dst,
                  const std::vector<const uint8_t*>& peers) const {
    if (len == 0) return;
    if (fused) {
      // Block by block, while each block is in this core's cache: combine, divide (kAvg),
      // and copy the result into the tensors, over the input it was just read from.
      data.pieces(begin, len, [&](uint8_t* own, size_t off, size_t piece) {
        for (size_t done = 0; done < piece; done += kFusedBlock) {
          const size_t m = std::min(kFusedBlock, piece - done);
          uint8_t* out_block = dst + off + done;
          auto source = [&](int r) -> const uint8_t* {
            return r == me ? own + done : peers[static_cast<size_t>(r)] + off + done;
          };
          kernel(out_block, source(0), source(1), m / es);
          for (int r = 2; r < n; ++r)
            kernel(out_block, out_block, source(r), m / es);
          if (op == ReduceOp::kAvg) divide_block(out_block, m / es, dtype, n);
          std::memcpy(own + done, out_block, m);
        }
      });
      return;
    }
    data.pieces(begin, len, [&](const uint8_t* own, size_t off, size_t piece) {
      auto source = [&](int r) { return r == me ? own : peers[static_cast<size_t>(r)] + off; };
      kernel(dst + off, source(0), source(1), piece / es);
      for (int r = 2; r < n; ++r)
        kernel(dst + off, dst + off, source(r), piece / es);
    });
    // kAvg: each rank divides only its own slice, before publishing it (the same division
    // of the same sums as dividing the whole result afterwards, n times less work per rank
    // and none left for the caller).
    if (op == ReduceOp::kAvg) {
      from_blob(dst, {static_cast<int64_t>(len / es)}, options)
          .div_(Scalar(static_cast<double>(n)));
    }
  }
};

// all_reduce of `tensors` (one dtype, contiguous, no two overlapping) as one buffer, in
// chunks of an area, with the fixed reduction order. Order of steps: input 0; then for each
// chunk k: input k+1, reduced slice k, copy out k, so that the next chunk's copy-in overlaps
// the peers' reduction of this one. A rank's own slice never goes through its input area
// (it reads it from the tensors) and its result goes back into the tensors block by block
// as it is made (kFusedBlock, still in cache; after publishing, for a kAvg that
// divide_block does not cover): only what the peers need is copied, and nothing is packed or
// unpacked around the exchange. kAvg's division is done here, on each rank's own slice.
void all_reduce_spans(ShmExchange& ex, const std::vector<Tensor>& tensors, ReduceOp op) {
  const int n = ex.size();
  const int me = ex.rank();
  const Spans data(tensors);
  if (data.bytes() == 0 || n == 1) return;
  const DType dtype = tensors.front().dtype();
  const auto es = static_cast<size_t>(tensors.front().element_size());
  const auto numel = static_cast<int64_t>(data.bytes() / es);
  const auto chunk = static_cast<int64_t>(ex.area_bytes() / es);
  const int64_t chunks = (numel + chunk - 1) / chunk;
  const SliceReduce reduce{gloo_backend::reduce_kernel(dtype, op),
                           op,
                           dtype,
                           tensors.front().options(),
                           es,
                           me,
                           n,
                           op != ReduceOp::kAvg || dtype == kFloat32 || dtype == kFloat64};
  int input_area[2] = {0, 0};
  uint32_t input_step[2] = {0, 0};
  auto count_of = [&](int64_t k) { return std::min(chunk, numel - k * chunk); };
  // Byte offsets of slice r of a chunk of `count` elements.
  auto slice_bytes = [&](int64_t count, int r) {
    return static_cast<size_t>(slice_begin(count, r, n)) * es;
  };
  auto copy_in = [&](int64_t k) {
    const int a = ex.acquire_input();
    const int64_t count = count_of(k);
    const size_t at = static_cast<size_t>(k * chunk) * es;
    const size_t b = slice_bytes(count, me);
    const size_t e = slice_bytes(count, me + 1);
    const size_t bytes = static_cast<size_t>(count) * es;
    data.read(at, ex.area(a), b);
    data.read(at + e, ex.area(a) + e, bytes - e);
    ex.publish(a, bytes);
    input_area[k % 2] = a;
    input_step[k % 2] = ex.step();
  };
  std::vector<const uint8_t*> peers(static_cast<size_t>(n));
  copy_in(0);
  for (int64_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) copy_in(k + 1);
    const int in = input_area[k % 2];
    const int64_t count = count_of(k);
    const size_t bytes = static_cast<size_t>(count) * es;
    const size_t at = static_cast<size_t>(k * chunk) * es;
    ex.wait_all(input_step[k % 2]);
    // This rank's slice, combined in rank order into its output area, piece by piece where
    // it spans several tensors.
    const int out = ex.acquire_output();
    const size_t b = slice_bytes(count, me);
    const size_t len = slice_bytes(count, me + 1) - b;
    for (int r = 0; r < n; ++r) {
      if (r != me) peers[static_cast<size_t>(r)] = ex.peer_area(r, in, bytes) + b;
    }
    uint8_t* dst = ex.area(out) + b;
    reduce(data, at + b, len, dst, peers);
    ex.done_reading(in);
    ex.publish(out, bytes);
    if (!reduce.fused) data.write(at + b, dst, len);
    ex.wait_all(ex.step());
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const size_t rb = slice_bytes(count, r);
      const size_t re = slice_bytes(count, r + 1);
      const uint8_t* src = ex.peer_area(r, out, bytes);
      data.write(at + rb, src + rb, re - rb);
    }
    ex.done_reading(out);
  }
}

void all_reduce_buffer(ShmExchange& ex, const Tensor& buffer, ReduceOp op) {
  all_reduce_spans(ex, {buffer}, op);
}

// One round: this rank writes `length` bytes into an input area with `write`, every rank
// publishes, and after every rank has, `read` is given the area's index.
template <typename Write, typename Read>
void exchange_round(ShmExchange& ex, uint64_t length, Write&& write, Read&& read) {
  const int a = ex.acquire_input();
  write(ex.area(a));
  ex.publish(a, length);
  ex.wait_all(ex.step());
  read(a);
  ex.done_reading(a);
}

// The root's bytes into every rank's buffer.
void broadcast_buffer(ShmExchange& ex, uint8_t* data, size_t nbytes, int root) {
  if (ex.size() == 1 || nbytes == 0) return;
  const size_t chunk = ex.area_bytes();
  for (size_t off = 0; off < nbytes; off += chunk) {
    const size_t len = std::min(chunk, nbytes - off);
    const bool is_root = ex.rank() == root;
    exchange_round(
        ex, is_root ? len : 0,
        [&](uint8_t* area) {
          if (is_root) std::memcpy(area, data + off, len);
        },
        [&](int a) {
          const uint8_t* src = ex.peer_area(root, a, len);
          if (!is_root) std::memcpy(data + off, src, len);
        });
  }
}

// Every rank's `nbytes` from `input`; `sink(r, offset, src, len)` receives rank r's bytes.
// Only ranks with `receive` read.
template <typename Sink>
void gather_bytes(ShmExchange& ex, const uint8_t* input, size_t nbytes, bool receive, Sink&& sink) {
  const size_t chunk = ex.area_bytes();
  for (size_t off = 0; off < nbytes; off += chunk) {
    const size_t len = std::min(chunk, nbytes - off);
    exchange_round(
        ex, len, [&](uint8_t* area) { std::memcpy(area, input + off, len); },
        [&](int a) {
          for (int r = 0; r < ex.size(); ++r) {
            const uint8_t* src = ex.peer_area(r, a, len);
            if (receive) sink(r, off, src, len);
          }
        });
  }
}

void divide_for_avg(Tensor t, ReduceOp op, int n) {
  if (op == ReduceOp::kAvg) t.div_(Scalar(static_cast<double>(n)));
}

}  // namespace

// ---- running operations

Work ProcessGroupShm::enqueue(const OpContext& ctx, std::vector<Tensor> outputs,
                              std::function<void(ShmExchange&)> run) {
  auto state = std::make_shared<WorkState>(ctx.description, std::move(outputs), ctx.timeout);
  impl_->worker->execute([this, ctx, state, run = std::move(run)] {
    // An operation queued before an earlier one failed: the steps are out of step now.
    if (std::exception_ptr earlier = error()) {
      state->fail(earlier);
      return;
    }
    ShmExchange ex(*impl_, shm_options_, rank(), size(), ctx.timeout);
    try {
      run(ex);
      state->finish();
    } catch (const ShmFailure& f) {
      fail_operation(ctx, *state, f.what, f.timed_out);
    } catch (...) {
      fail_operation(ctx, *state, std::current_exception());
    }
  });
  return Work(std::move(state));
}

Work ProcessGroupShm::do_all_reduce(std::vector<Tensor> tensors, ReduceOp op,
                                    const OpContext& ctx) {
  std::vector<Tensor> work_outputs = tensors;
  std::vector<Tensor> work = detached(tensors);
  return enqueue(ctx, std::move(work_outputs), [work, op](ShmExchange& ex) mutable {
    std::map<DType, std::vector<Tensor>> by_dtype;
    for (const Tensor& t : work)
      by_dtype[t.dtype()].push_back(t);
    for (auto& [dtype, group] : by_dtype) {
      if (!any_overlap(group)) {
        // Read from and written into the tensors themselves (kAvg divided there).
        all_reduce_spans(ex, group, op);
        continue;
      }
      // Tensors sharing bytes: each reduced from its own input, as if alone.
      Tensor buffer = flatten_dense_tensors(group);
      all_reduce_buffer(ex, buffer, op);
      const std::vector<Tensor> parts = unflatten_dense_tensors(buffer, group);
      for (size_t i = 0; i < group.size(); ++i)
        group[i].copy_(parts[i]);
    }
  });
}

Work ProcessGroupShm::do_broadcast(std::vector<Tensor> tensors, int root, const OpContext& ctx) {
  std::vector<Tensor> work_outputs = tensors;
  std::vector<Tensor> work = detached(tensors);
  return enqueue(ctx, std::move(work_outputs), [work, root](ShmExchange& ex) mutable {
    for (const Tensor& t : work)
      broadcast_buffer(ex, bytes_of(t), t.nbytes(), root);
  });
}

Work ProcessGroupShm::do_broadcast_coalesced(std::vector<Tensor> tensors,
                                             std::vector<std::vector<size_t>> buckets, int root,
                                             const OpContext& ctx) {
  std::vector<Tensor> work_outputs = tensors;
  std::vector<std::vector<Tensor>> work;
  work.reserve(buckets.size());
  for (const std::vector<size_t>& bucket : buckets) {
    std::vector<Tensor>& members = work.emplace_back();
    for (size_t i : bucket)
      members.push_back(tensors[i].detach());
  }
  return enqueue(ctx, std::move(work_outputs), [work, root](ShmExchange& ex) mutable {
    if (ex.size() == 1) return;
    for (std::vector<Tensor>& bucket : work) {
      if (bucket.size() == 1) {
        broadcast_buffer(ex, bytes_of(bucket[0]), bucket[0].nbytes(), root);
        continue;
      }
      // Staged in one flat buffer, one bucket at a time.
      Tensor flat;
      if (ex.rank() == root) {
        flat = flatten_dense_tensors(bucket);
      } else {
        int64_t numel = 0;
        for (const Tensor& t : bucket)
          numel += t.numel();
        flat = empty({numel}, bucket[0].options());
      }
      broadcast_buffer(ex, bytes_of(flat), flat.nbytes(), root);
      if (ex.rank() == root) continue;
      const std::vector<Tensor> parts = unflatten_dense_tensors(flat, bucket);
      for (size_t i = 0; i < bucket.size(); ++i)
        bucket[i].copy_(parts[i]);
    }
  });
}

Work ProcessGroupShm::do_reduce(const Tensor& tensor, int root, ReduceOp op, const OpContext& ctx) {
  std::vector<Tensor> work_outputs = std::vector<Tensor>{tensor};
  Tensor t = tensor.detach();
  return enqueue(ctx, std::move(work_outputs), [t, root, op](ShmExchange& ex) mutable {
    // Every rank takes part in the same steps; only the root keeps the result.
    const bool is_root = ex.rank() == root;
    Tensor buffer = is_root ? t : t.clone();
    all_reduce_buffer(ex, buffer, op);  // kAvg divided there
  });
}

Work ProcessGroupShm::do_all_gather(std::vector<Tensor> outputs, const Tensor& input,
                                    const OpContext& ctx) {
  std::vector<Tensor> work_outputs = outputs;
  std::vector<Tensor> outs = detached(outputs);
  Tensor in = input.detach();
  return enqueue(ctx, std::move(work_outputs), [outs, in](ShmExchange& ex) mutable {
    if (ex.size() == 1) {
      outs[0].view({-1}).copy_(in.view({-1}));
      return;
    }
    gather_bytes(ex, bytes_of(in), in.nbytes(), true,
                 [&](int r, size_t off, const uint8_t* src, size_t len) {
                   std::memcpy(bytes_of(outs[static_cast<size_t>(r)]) + off, src, len);
                 });
  });
}

Work ProcessGroupShm::do_gather(std::vector<Tensor> outputs, const Tensor& input, int root,
                                const OpContext& ctx) {
  std::vector<Tensor> work_outputs = outputs;
  std::vector<Tensor> outs = detached(outputs);
  Tensor in = input.detach();
  return enqueue(ctx, std::move(work_outputs), [outs, in, root](ShmExchange& ex) mutable {
    if (ex.size() == 1) {
      outs[0].view({-1}).copy_(in.view({-1}));
      return;
    }
    gather_bytes(ex, bytes_of(in), in.nbytes(), ex.rank() == root,
                 [&](int r, size_t off, const uint8_t* src, size_t len) {
                   std::memcpy(bytes_of(outs[static_cast<size_t>(r)]) + off, src, len);
                 });
  });
}

namespace {

// Rounds in which every rank places, for each rank j, up to `part` bytes of what it sends
// to j at offset j * part of its area, and each rank j reads part j of every rank's area.
// `pieces` is the number of rounds; bytes_to(j) and bytes_from(i) the sizes.
template <typename To, typename From, typename Src, typename Sink>
void exchange_parts(ShmExchange& ex, size_t part, uint64_t rounds, To&& bytes_to, From&& bytes_from,
                    Src&& source, Sink&& sink) {
  const int n = ex.size();
  const uint64_t length = part * static_cast<size_t>(n);
  for (uint64_t k = 0; k < rounds; ++k) {
    const size_t off = static_cast<size_t>(k) * part;
    exchange_round(
        ex, length,
        [&](uint8_t* area) {
          for (int j = 0; j < n; ++j) {
            const size_t total = bytes_to(j);
            if (off < total)
              std::memcpy(area + static_cast<size_t>(j) * part, source(j) + off,
                          std::min(part, total - off));
          }
        },
        [&](int a) {
          for (int i = 0; i < n; ++i) {
            const uint8_t* src = ex.peer_area(i, a, length) + static_cast<size_t>(ex.rank()) * part;
            const size_t total = bytes_from(i);
            if (off < total) sink(i, off, src, std::min(part, total - off));
          }
        });
  }
}

}  // namespace

Work ProcessGroupShm::do_scatter(const Tensor& output, std::vector<Tensor> inputs, int root,
                                 const OpContext& ctx) {
  std::vector<Tensor> work_outputs = std::vector<Tensor>{output};
  Tensor out = output.detach();
  std::vector<Tensor> ins = detached(inputs);
  return enqueue(ctx, std::move(work_outputs), [out, ins, root](ShmExchange& ex) mutable {
    const int n = ex.size();
    const bool is_root = ex.rank() == root;
    if (n == 1) {
      out.view({-1}).copy_(ins[0].view({-1}));
      return;
    }
    const size_t m = out.nbytes();
    const size_t part = ex.area_bytes() / static_cast<size_t>(n);
    const uint64_t rounds = (m + part - 1) / part;
    exchange_parts(
        ex, part, rounds, [&](int) { return is_root ? m : 0; },
        [&](int i) { return i == root ? m : 0; },
        [&](int j) { return bytes_of(ins[static_cast<size_t>(j)]); },
        [&](int, size_t off, const uint8_t* src, size_t len) {
          std::memcpy(bytes_of(out) + off, src, len);
        });
  });
}

Work ProcessGroupShm::do_reduce_scatter(const Tensor& output, std::vector<Tensor> inputs,
                                        ReduceOp op, const OpContext& ctx) {
  std::vector<Tensor> work_outputs = std::vector<Tensor>{output};
  Tensor out = output.detach();
  std::vector<Tensor> ins = detached(inputs);
  return enqueue(ctx, std::move(work_outputs), [out, ins, op](ShmExchange& ex) mutable {
    const int n = ex.size();
    const int me = ex.rank();
    if (n == 1 || out.numel() == 0) {
      out.view({-1}).copy_(ins[static_cast<size_t>(me)].view({-1}));
      divide_for_avg(out, op, n);
      return;
    }
    const auto es = static_cast<size_t>(out.element_size());
    const size_t part = ex.area_bytes() / static_cast<size_t>(n) / es * es;
    const size_t m = out.nbytes();
    const uint64_t length = part * static_cast<size_t>(n);
    const auto kernel = gloo_backend::reduce_kernel(out.dtype(), op);
    for (size_t off = 0; off < m; off += part) {
      const size_t len = std::min(part, m - off);
      const size_t mine = static_cast<size_t>(me) * part;
      exchange_round(
          ex, length,
          [&](uint8_t* area) {
            for (int j = 0; j < n; ++j)
              std::memcpy(area + static_cast<size_t>(j) * part,
                          bytes_of(ins[static_cast<size_t>(j)]) + off, len);
          },
          [&](int a) {
            uint8_t* dst = bytes_of(out) + off;
            kernel(dst, ex.peer_area(0, a, length) + mine, ex.peer_area(1, a, length) + mine,
                   len / es);
            for (int r = 2; r < n; ++r)
              kernel(dst, dst, ex.peer_area(r, a, length) + mine, len / es);
          });
    }
    divide_for_avg(out, op, n);
  });
}

Work ProcessGroupShm::do_all_to_all(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                                    const OpContext& ctx) {
  std::vector<Tensor> work_outputs = outputs;
  std::vector<Tensor> outs = detached(outputs);
  std::vector<Tensor> ins = detached(inputs);
  return enqueue(ctx, std::move(work_outputs), [outs, ins](ShmExchange& ex) mutable {
    const int n = ex.size();
    if (n == 1) {
      outs[0].view({-1}).copy_(ins[0].view({-1}));
      return;
    }
    const size_t part = ex.area_bytes() / static_cast<size_t>(n);
    // The rounds are the most any pair needs; a rank knows only its own pairs, so every
    // rank publishes its count and all take the largest.
    uint64_t rounds = 0;
    for (int j = 0; j < n; ++j) {
      const size_t most =
          std::max(ins[static_cast<size_t>(j)].nbytes(), outs[static_cast<size_t>(j)].nbytes());
      rounds = std::max<uint64_t>(rounds, (most + part - 1) / part);
    }
    uint64_t all_rounds = rounds;
    exchange_round(
        ex, 0, [&](uint8_t*) { ex.own_rounds(rounds); },
        [&](int) {
          for (int r = 0; r < n; ++r)
            all_rounds = std::max(all_rounds, ex.peer_rounds(r));
        });
    exchange_parts(
        ex, part, all_rounds, [&](int j) { return ins[static_cast<size_t>(j)].nbytes(); },
        [&](int i) { return outs[static_cast<size_t>(i)].nbytes(); },
        [&](int j) { return bytes_of(ins[static_cast<size_t>(j)]); },
        [&](int i, size_t off, const uint8_t* src, size_t len) {
          std::memcpy(bytes_of(outs[static_cast<size_t>(i)]) + off, src, len);
        });
  });
}

Work ProcessGroupShm::do_barrier(const OpContext& ctx) {
  return enqueue(ctx, {}, [](ShmExchange& ex) {
    if (ex.size() == 1) return;
    exchange_round(
        ex, 0, [](uint8_t*) {}, [](int) {});
  });
}

// ---- point-to-point, over the internal Gloo group

Work ProcessGroupShm::do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) {
  return impl_->p2p->do_send(tensor, dst, tag, ctx);
}

Work ProcessGroupShm::do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) {
  return impl_->p2p->do_recv(tensor, src, tag, ctx);
}

std::shared_ptr<ProcessGroup> ProcessGroupShm::make_subgroup(std::shared_ptr<Store> store, int rank,
                                                             int size,
                                                             ProcessGroupOptions options) {
  return create(std::move(store), rank, size, std::move(options), shm_options_);
}

}  // namespace gradwire::c10d
