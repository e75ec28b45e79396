#include "gradwire/c10d/process_group.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "gradwire/c10d/prefix_store.h"
#include "gradwire/core/env.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/trace.h"
#include "gradwire/tensor/factory.h"
#include "rank_keys.h"

namespace gradwire::c10d {

namespace {

using std::chrono::milliseconds;

// The backend's name as a static string for a trace argument.
const char* backend_literal(std::string_view backend) {
  if (backend == "gloo") return "gloo";
  if (backend == "nccl") return "nccl";
  if (backend == "shm") return "shm";
  if (backend == "shm-hierarchical") return "shm-hierarchical";
  return "other";
}

uint64_t total_bytes(const std::vector<Tensor>& tensors) {
  uint64_t n = 0;
  for (const Tensor& t : tensors)
    n += t.nbytes();
  return n;
}

// For an operation begun with tracing on (start_ns != 0), records `span` (category c10d)
// from `start_ns` (the operation handed to the backend) to the Work's completion, on the
// thread that completes it, even if tracing stopped in between (as a Span does): the bytes
// the caller's tensors hold, the collective's sequence number (0 for point-to-point), the
// group's rank and size, the backend, and the group's name. Returns `work`.
Work traced(Work work, const char* span, const ProcessGroup& group, uint64_t seq, int64_t start_ns,
            uint64_t bytes) {
  if (start_ns == 0 || !work.valid()) return work;
  const char* backend = backend_literal(group.backend_name());
  const int rank = group.rank();
  const int size = group.size();
  gradwire::detail::on_complete_inline(
      work.state()->future(), [span, backend, rank, size, seq, start_ns, bytes,
                               name = group.name()](const Future<std::vector<Tensor>>&) {
        trace::Event e;
        e.name = span;
        e.category = "c10d";
        e.phase = 'X';
        e.ts_ns = start_ns;
        e.dur_ns = trace::now_ns() - start_ns;
        const trace::Text text{"group", name};
        trace::detail::fill(
            e,
            {trace::Arg("bytes", bytes), trace::Arg("seq", seq), trace::Arg("rank", rank),
             trace::Arg("size", size), trace::Arg("backend", backend)},
            &text);
        trace::detail::record(e);
      });
  return work;
}

// The start of an operation's span: now when tracing is on, else 0 (no span).
int64_t trace_start() {
  return trace::enabled() ? trace::now_ns() : 0;
}

std::string ms_text(milliseconds ms) {
  return std::to_string(ms.count()) + " ms";
}

using detail::ranks_text;

// "float32[2, 3]".
std::string shape_text(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + t.shape_string();
}

std::string tensors_text(const std::vector<Tensor>& tensors) {
  std::string s;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i > 0) s += ", ";
    s += shape_text(tensors[i]);
  }
  return s;
}

milliseconds effective(milliseconds op_timeout, milliseconds group_timeout) {
  if (op_timeout.count() < 0) {
    throw InvalidArgument("process group operation timeout must not be negative, got " +
                          ms_text(op_timeout));
  }
  return op_timeout.count() == 0 ? group_timeout : op_timeout;
}

}  // namespace

namespace detail {

std::vector<int> ranks_without_key(Store& store, const std::string& prefix, int size, int skip) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (r != skip && !store.check({prefix + std::to_string(r)})) missing.push_back(r);
  }
  return missing;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

}  // namespace detail

DebugLevel parse_debug_level(std::string_view text) {
  if (text == "OFF" || text == "off") return DebugLevel::kOff;
  if (text == "INFO" || text == "info") return DebugLevel::kInfo;
  if (text == "DETAIL" || text == "detail") return DebugLevel::kDetail;
  throw InvalidArgument("GRADWIRE_DISTRIBUTED_DEBUG: expected OFF, INFO or DETAIL, got '" +
                        std::string(text) + "'");
}

DebugLevel debug_level_from_env() {
  const std::optional<std::string> value = env_raw("GRADWIRE_DISTRIBUTED_DEBUG");
  if (!value || value->empty()) return DebugLevel::kOff;
  return parse_debug_level(*value);
}

ProcessGroup::ProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                           ProcessGroupOptions options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {
  if (store_ == nullptr) throw InvalidArgument("ProcessGroup: the store is null");
  // A group's ranks are fixed when it is created, so a worker that gradwire-run started again
  // alone (--restart-workers) can never take its predecessor's place in one.
  if (env_bool("GRADWIRE_RESTARTED_ALONE", false)) {
    throw InvalidArgument(
        "ProcessGroup: this worker was restarted alone by gradwire-run --restart-workers "
        "(GRADWIRE_RESTARTED_ALONE=1), and a process group cannot take a worker restarted "
        "alone: its ranks are fixed when it is created. Jobs that use process groups must "
        "restart every worker together: use --max-restarts instead of --restart-workers");
  }
  if (size_ < 1) {
    throw InvalidArgument("ProcessGroup: size must be at least 1, got " + std::to_string(size_));
  }
  if (rank_ < 0 || rank_ >= size_) {
    throw InvalidArgument("ProcessGroup: rank " + std::to_string(rank_) + " is outside [0, " +
                          std::to_string(size_) + ")");
  }
  if (options_.timeout.count() <= 0) {
    throw InvalidArgument("ProcessGroup: timeout must be positive, got " +
                          ms_text(options_.timeout));
  }
  if (options_.name.empty()) throw InvalidArgument("ProcessGroup: the group name is empty");
  debug_level_ = options_.debug_level ? *options_.debug_level : debug_level_from_env();
  parent_ranks_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r)
    parent_ranks_[static_cast<size_t>(r)] = r;
}

ProcessGroup::~ProcessGroup() = default;

std::exception_ptr ProcessGroup::error() const {
  MutexLock lock(mutex_);
  return error_;
}

ProcessGroup::OpContext ProcessGroup::begin(std::string_view name, milliseconds timeout) {
  OpContext ctx;
  ctx.name = std::string(name);
  ctx.timeout = effective(timeout, options_.timeout);
  ctx.description =
      ctx.name + " (group '" + options_.name + "', rank " + std::to_string(rank_) + ")";
  return ctx;
}

void ProcessGroup::number(OpContext& ctx) {
  ctx.seq = next_seq_.fetch_add(1);
  ctx.description = ctx.name + " #" + std::to_string(ctx.seq) + " (group '" + options_.name +
                    "', rank " + std::to_string(rank_) + ")";
}

std::optional<Work> ProcessGroup::failed_work(const OpContext& ctx) const {
  std::exception_ptr error = this->error();
  if (error == nullptr) return std::nullopt;
  auto state = std::make_shared<WorkState>(ctx.description, std::vector<Tensor>{}, ctx.timeout);
  state->fail(error);
  return Work(std::move(state));
}

void ProcessGroup::check_tensor(const OpContext& ctx, const Tensor& t,
                                std::string_view what) const {
  if (!t.defined()) {
    throw InvalidArgument(ctx.description + ": " + std::string(what) + " is an undefined tensor");
  }
  if (!supports_device(t.device())) {
    std::ostringstream os;
    os << ctx.description << ": the " << backend_name() << " backend takes "
       << supported_devices_text() << ", but " << what << " is on " << t.device();
    throw InvalidArgument(os.str());
  }
  if (!supports_dtype(t.dtype())) {
    throw InvalidArgument(ctx.description + ": the " + std::string(backend_name()) +
                          " backend does not support dtype " + std::string(dtype_name(t.dtype())) +
                          " (" + std::string(what) + ")");
  }
  if (!t.is_contiguous()) {
    throw InvalidArgument(ctx.description + ": " + std::string(what) + " (" + shape_text(t) +
                          ") is not contiguous; pass tensor.contiguous()");
  }
}

std::vector<ProcessGroup::TensorArg> ProcessGroup::named(const std::vector<Tensor>& list,
                                                         const std::string& what) {
  std::vector<TensorArg> args;
  args.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i)
    args.push_back({&list[i], what + "[" + std::to_string(i) + "]"});
  return args;
}

void ProcessGroup::check_backend_args(const OpContext&, const std::vector<TensorArg>&) const {}

void ProcessGroup::check_args(const OpContext& ctx, const std::vector<TensorArg>& args) const {
  for (const TensorArg& arg : args)
    check_tensor(ctx, *arg.tensor, arg.what);
  check_backend_args(ctx, args);
}

void ProcessGroup::check_root(const OpContext& ctx, int root) const {
  if (root < 0 || root >= size_) {
    throw InvalidArgument(ctx.description + ": root " + std::to_string(root) +
                          " is outside the group's ranks [0, " + std::to_string(size_) + ")");
  }
}

void ProcessGroup::check_peer(const OpContext& ctx, int peer, std::string_view what) const {
  if (peer < 0 || peer >= size_) {
    throw InvalidArgument(ctx.description + ": " + std::string(what) + " rank " +
                          std::to_string(peer) + " is outside the group's ranks [0, " +
                          std::to_string(size_) + ")");
  }
  if (peer == rank_) {
    throw InvalidArgument(ctx.description + ": " + std::string(what) + " rank " +
                          std::to_string(peer) + " is this rank itself");
  }
}

void ProcessGroup::check_tag(const OpContext& ctx, int tag) const {
  if (tag < 0) {
    throw InvalidArgument(ctx.description + ": tag must be in [0, 2^31), got " +
                          std::to_string(tag));
  }
}

namespace {

void check_avg(const std::string& description, ReduceOp op, const Tensor& t) {
  if (op == ReduceOp::kAvg && !t.is_floating_point()) {
    throw InvalidArgument(description + ": ReduceOp avg needs floating-point tensors, got " +
                          shape_text(t) + " (use sum and divide as you see fit)");
  }
}

void check_like(const std::string& description, const Tensor& t, const Tensor& like,
                const std::string& what, const std::string& like_what) {
  if (t.dtype() != like.dtype() || t.numel() != like.numel()) {
    throw InvalidArgument(description + ": " + what + " is " + shape_text(t) + ", expected " +
                          std::to_string(like.numel()) + " elements of " +
                          std::string(dtype_name(like.dtype())) + " like " + like_what + " (" +
                          shape_text(like) + ")");
  }
}

void check_count(const std::string& description, const std::vector<Tensor>& list,
                 const std::string& what, size_t expected) {
  if (list.size() != expected) {
    throw InvalidArgument(description + ": " + what + " holds " + std::to_string(list.size()) +
                          " tensors, expected " + std::to_string(expected) +
                          " (one per rank of the group)");
  }
}

template <typename T>
void append(std::vector<T>& to, std::vector<T> more) {
  for (T& item : more)
    to.push_back(std::move(item));
}

// Consecutive tensors of one dtype and device share a bucket until it would pass
// `bucket_bytes`; the order within a dtype and device is the caller's. Every rank derives
// the same buckets from the same shapes, so no bucket layout is exchanged.
std::vector<std::vector<size_t>> coalesce(const std::vector<Tensor>& tensors, size_t bucket_bytes) {
  struct Open {
    DType dtype;
    Device device;
    size_t bucket;
    size_t bytes;
  };
  std::vector<std::vector<size_t>> buckets;
  std::vector<Open> open;  // one per dtype and device seen: few, so a linear search
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) {
      return o.dtype == t.dtype() && o.device == t.device();
    });
    if (it == open.end()) {
      open.push_back({t.dtype(), t.device(), buckets.size(), 0});
      it = open.end() - 1;
      buckets.emplace_back();
    } else if (it->bytes + t.nbytes() > bucket_bytes && it->bytes > 0) {
      it->bucket = buckets.size();
      it->bytes = 0;
      buckets.emplace_back();
    }
    it->bytes += t.nbytes();
    buckets[it->bucket].push_back(i);
  }
  return buckets;
}

}  // namespace

// ---- the debug check

void ProcessGroup::debug_check(const OpContext& ctx, const std::string& signature) {
  const std::string base = "debug/" + std::to_string(ctx.seq) + "/";
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r)
    keys.push_back(base + std::to_string(r));
  store_->set(keys[static_cast<size_t>(rank_)], std::string_view(signature));
  try {
    store_->wait(keys, ctx.timeout);
  } catch (const TimeoutError&) {
    const std::vector<int> missing = detail::ranks_without_key(*store_, base, size_);
    throw TimeoutError(ctx.description + ": debug check: ranks " + ranks_text(missing) +
                       " did not reach this collective within " + ms_text(ctx.timeout));
  }
  const std::vector<Bytes> values = store_->multi_get(keys, ctx.timeout);
  std::map<std::string, std::vector<int>> by_signature;
  for (int r = 0; r < size_; ++r)
    by_signature[to_string(values[static_cast<size_t>(r)])].push_back(r);
  if (store_->add(base + "read", 1) == size_) {
    for (const std::string& key : keys)
      store_->delete_key(key);
    store_->delete_key(base + "read");
  }
  if (by_signature.size() > 1) {
    std::string message = ctx.description + ": the ranks called different collectives:";
    for (const auto& [sig, ranks] : by_signature)
      message += " ranks " + ranks_text(ranks) + " called " + sig + ";";
    message.pop_back();
    GRADWIRE_LOG(kError) << message;
    throw InvalidArgument(message);
  }
}

// ---- failure reports

std::string ProcessGroup::missing_ranks(const OpContext& ctx) {
  try {
    const std::string base = "reached/" + std::to_string(ctx.seq) + "/";
    store_->set(base + std::to_string(rank_), std::string_view("1"));
    std::vector<std::string> others;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) others.push_back(base + std::to_string(r));
    }
    if (others.empty()) return "";
    try {
      store_->wait(others, std::min(ctx.timeout, kFailureReportGrace));
      return "every rank reached it";
    } catch (const TimeoutError&) {
    }
    return "ranks that did not reach it: " +
           ranks_text(detail::ranks_without_key(*store_, base, size_, rank_));
  } catch (const std::exception& e) {
    return std::string("could not ask the store which ranks reached it: ") + e.what();
  }
}

void ProcessGroup::fail_operation(const OpContext& ctx, WorkState& state, const std::string& what,
                                  bool timed_out) {
  std::string message = ctx.description + (timed_out ? " timed out after " + ms_text(ctx.timeout)
                                                     : std::string(" failed"));
  message += ": " + what;
  // Only the first failure asks which ranks came, and its error becomes the group's:
  // after it the transport is unusable, and operations already running fail with errors
  // of their own (a pair closed by the first failure) that would hide the cause.
  bool first = false;
  {
    MutexLock lock(mutex_);
    first = !failure_claimed_;
    failure_claimed_ = true;
  }
  if (first && ctx.seq != 0) {
    const std::string missing = missing_ranks(ctx);
    if (!missing.empty()) message += "; " + missing;
  }
  if (!first) message += " (after an earlier operation of the group failed)";
  std::exception_ptr error = timed_out ? std::make_exception_ptr(TimeoutError(message))
                                       : std::make_exception_ptr(NetworkError(message));
  if (first) {
    {
      MutexLock lock(mutex_);
      error_ = error;
    }
    GRADWIRE_LOG(kWarning) << message;
  }
  state.fail(error);
}

void ProcessGroup::fail_operation(const OpContext& ctx, WorkState& state,
                                  std::exception_ptr error) {
  {
    MutexLock lock(mutex_);
    if (!failure_claimed_) error_ = error;
    failure_claimed_ = true;
  }
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kError) << ctx.description << " failed: " << e.what();
  } catch (...) {
    GRADWIRE_LOG(kError) << ctx.description << " failed with a non-standard exception";
  }
  state.fail(std::move(error));
}

// ---- collectives

Work ProcessGroup::all_reduce(std::vector<Tensor> tensors, const AllReduceOptions& options) {
  OpContext ctx = begin("all_reduce", options.timeout);
  if (tensors.empty()) throw InvalidArgument(ctx.description + ": no tensors given");
  check_args(ctx, named(tensors, "tensors"));
  for (const Tensor& t : tensors)
    check_avg(ctx.description, options.op, t);
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(ctx, "all_reduce(op=" + std::string(reduce_op_name(options.op)) + "; " +
                         tensors_text(tensors) + ")");
  }
  const int64_t start_ns = trace_start();
  const uint64_t bytes = start_ns != 0 ? total_bytes(tensors) : 0;
  return traced(do_all_reduce(std::move(tensors), options.op, ctx), "c10d.all_reduce", *this,
                ctx.seq, start_ns, bytes);
}

Work ProcessGroup::all_reduce(const Tensor& tensor, const AllReduceOptions& options) {
  return all_reduce(std::vector<Tensor>{tensor}, options);
}

Work ProcessGroup::broadcast(std::vector<Tensor> tensors, const BroadcastOptions& options) {
  OpContext ctx = begin("broadcast", options.timeout);
  if (tensors.empty()) throw InvalidArgument(ctx.description + ": no tensors given");
  check_root(ctx, options.root);
  check_args(ctx, named(tensors, "tensors"));
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(
        ctx, "broadcast(root=" + std::to_string(options.root) + "; " + tensors_text(tensors) + ")");
  }
  const int64_t start_ns = trace_start();
  const uint64_t bytes = start_ns != 0 ? total_bytes(tensors) : 0;
  return traced(do_broadcast(std::move(tensors), options.root, ctx), "c10d.broadcast", *this,
                ctx.seq, start_ns, bytes);
}

Work ProcessGroup::broadcast(const Tensor& tensor, const BroadcastOptions& options) {
  return broadcast(std::vector<Tensor>{tensor}, options);
}

Work ProcessGroup::broadcast_coalesced(std::vector<Tensor> tensors,
                                       const BroadcastCoalescedOptions& options) {
  OpContext ctx = begin("broadcast_coalesced", options.timeout);
  if (tensors.empty()) throw InvalidArgument(ctx.description + ": no tensors given");
  if (options.bucket_bytes == 0) {
    throw InvalidArgument(ctx.description + ": bucket_bytes must be positive");
  }
  check_root(ctx, options.root);
  check_args(ctx, named(tensors, "tensors"));
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    // The bucket size is part of the signature: ranks that bucket differently would move
    // buffers of different sizes.
    debug_check(ctx, "broadcast_coalesced(root=" + std::to_string(options.root) +
                         ", bucket_bytes=" + std::to_string(options.bucket_bytes) + "; " +
                         tensors_text(tensors) + ")");
  }
  std::vector<std::vector<size_t>> buckets = coalesce(tensors, options.bucket_bytes);
  const int64_t start_ns = trace_start();
  const uint64_t bytes = start_ns != 0 ? total_bytes(tensors) : 0;
  return traced(do_broadcast_coalesced(std::move(tensors), std::move(buckets), options.root, ctx),
                "c10d.broadcast_coalesced", *this, ctx.seq, start_ns, bytes);
}

Work ProcessGroup::reduce(const Tensor& tensor, const ReduceOptions& options) {
  OpContext ctx = begin("reduce", options.timeout);
  check_root(ctx, options.root);
  check_args(ctx, {{&tensor, "the tensor"}});
  check_avg(ctx.description, options.op, tensor);
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(ctx, "reduce(op=" + std::string(reduce_op_name(options.op)) + ", root=" +
                         std::to_string(options.root) + "; " + shape_text(tensor) + ")");
  }
  const int64_t start_ns = trace_start();
  return traced(do_reduce(tensor, options.root, options.op, ctx), "c10d.reduce", *this, ctx.seq,
                start_ns, tensor.nbytes());
}

Work ProcessGroup::all_gather(std::vector<Tensor> outputs, const Tensor& input,
                              const AllGatherOptions& options) {
  OpContext ctx = begin("all_gather", options.timeout);
  check_count(ctx.description, outputs, "outputs", static_cast<size_t>(size_));
  std::vector<TensorArg> args{{&input, "the input"}};
  append(args, named(outputs, "outputs"));
  check_args(ctx, args);
  for (size_t i = 0; i < outputs.size(); ++i)
    check_like(ctx.description, outputs[i], input, args[i + 1].what, "the input");
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(ctx, "all_gather(" + shape_text(input) + ")");
  }
  const int64_t start_ns = trace_start();
  return traced(do_all_gather(std::move(outputs), input, ctx), "c10d.all_gather", *this, ctx.seq,
                start_ns, input.nbytes());
}

Work ProcessGroup::gather(std::vector<Tensor> outputs, const Tensor& input,
                          const GatherOptions& options) {
  OpContext ctx = begin("gather", options.timeout);
  check_root(ctx, options.root);
  std::vector<TensorArg> args{{&input, "the input"}};
  if (rank_ == options.root) {
    check_count(ctx.description, outputs, "outputs (on the root)", static_cast<size_t>(size_));
    append(args, named(outputs, "outputs"));
  } else if (!outputs.empty()) {
    throw InvalidArgument(ctx.description + ": only the root (rank " +
                          std::to_string(options.root) + ") passes outputs, got " +
                          std::to_string(outputs.size()));
  }
  check_args(ctx, args);
  for (size_t i = 0; i < outputs.size(); ++i)
    check_like(ctx.description, outputs[i], input, args[i + 1].what, "the input");
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(ctx,
                "gather(root=" + std::to_string(options.root) + "; " + shape_text(input) + ")");
  }
  const int64_t start_ns = trace_start();
  return traced(do_gather(std::move(outputs), input, options.root, ctx), "c10d.gather", *this,
                ctx.seq, start_ns, input.nbytes());
}

Work ProcessGroup::scatter(const Tensor& output, std::vector<Tensor> inputs,
                           const ScatterOptions& options) {
  OpContext ctx = begin("scatter", options.timeout);
  check_root(ctx, options.root);
  std::vector<TensorArg> args{{&output, "the output"}};
  if (rank_ == options.root) {
    check_count(ctx.description, inputs, "inputs (on the root)", static_cast<size_t>(size_));
    append(args, named(inputs, "inputs"));
  } else if (!inputs.empty()) {
    throw InvalidArgument(ctx.description + ": only the root (rank " +
                          std::to_string(options.root) + ") passes inputs, got " +
                          std::to_string(inputs.size()));
  }
  check_args(ctx, args);
  for (size_t i = 0; i < inputs.size(); ++i)
    check_like(ctx.description, inputs[i], output, args[i + 1].what, "the output");
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(ctx,
                "scatter(root=" + std::to_string(options.root) + "; " + shape_text(output) + ")");
  }
  const int64_t start_ns = trace_start();
  return traced(do_scatter(output, std::move(inputs), options.root, ctx), "c10d.scatter", *this,
                ctx.seq, start_ns, output.nbytes());
}

Work ProcessGroup::reduce_scatter(const Tensor& output, std::vector<Tensor> inputs,
                                  const ReduceScatterOptions& options) {
  OpContext ctx = begin("reduce_scatter", options.timeout);
  check_count(ctx.description, inputs, "inputs", static_cast<size_t>(size_));
  std::vector<TensorArg> args{{&output, "the output"}};
  append(args, named(inputs, "inputs"));
  check_args(ctx, args);
  check_avg(ctx.description, options.op, output);
  for (size_t i = 0; i < inputs.size(); ++i)
    check_like(ctx.description, inputs[i], output, args[i + 1].what, "the output");
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(ctx, "reduce_scatter(op=" + std::string(reduce_op_name(options.op)) + "; " +
                         shape_text(output) + ")");
  }
  const int64_t start_ns = trace_start();
  const uint64_t bytes = start_ns != 0 ? total_bytes(inputs) : 0;
  return traced(do_reduce_scatter(output, std::move(inputs), options.op, ctx),
                "c10d.reduce_scatter", *this, ctx.seq, start_ns, bytes);
}

Work ProcessGroup::all_to_all(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                              const AllToAllOptions& options) {
  OpContext ctx = begin("all_to_all", options.timeout);
  check_count(ctx.description, inputs, "inputs", static_cast<size_t>(size_));
  check_count(ctx.description, outputs, "outputs", static_cast<size_t>(size_));
  std::vector<TensorArg> args = named(inputs, "inputs");
  append(args, named(outputs, "outputs"));
  check_args(ctx, args);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != inputs[0].dtype() || outputs[i].dtype() != inputs[0].dtype()) {
      throw InvalidArgument(ctx.description + ": every input and output must have one dtype; " +
                            "inputs[0] is " + shape_text(inputs[0]) + ", inputs[" +
                            std::to_string(i) + "] is " + shape_text(inputs[i]) + ", outputs[" +
                            std::to_string(i) + "] is " + shape_text(outputs[i]));
    }
  }
  const auto self = static_cast<size_t>(rank_);
  if (inputs[self].numel() != outputs[self].numel()) {
    throw InvalidArgument(ctx.description + ": inputs[" + std::to_string(rank_) + "] (" +
                          shape_text(inputs[self]) + ") stays on this rank and must fit outputs[" +
                          std::to_string(rank_) + "] (" + shape_text(outputs[self]) + ")");
  }
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) {
    debug_check(ctx, "all_to_all(" + std::string(dtype_name(inputs[0].dtype())) + ")");
  }
  const int64_t start_ns = trace_start();
  const uint64_t bytes = start_ns != 0 ? total_bytes(inputs) : 0;
  return traced(do_all_to_all(std::move(outputs), std::move(inputs), ctx), "c10d.all_to_all", *this,
                ctx.seq, start_ns, bytes);
}

Work ProcessGroup::barrier(const BarrierOptions& options) {
  OpContext ctx = begin("barrier", options.timeout);
  number(ctx);
  if (auto failed = failed_work(ctx)) return *failed;
  if (debug_level_ == DebugLevel::kDetail) debug_check(ctx, "barrier()");
  const int64_t start_ns = trace_start();
  return traced(do_barrier(ctx), "c10d.barrier", *this, ctx.seq, start_ns, 0);
}

// ---- point-to-point

Work ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  OpContext ctx =
      begin("send to rank " + std::to_string(dst) + " tag " + std::to_string(tag), milliseconds(0));
  check_peer(ctx, dst, "destination");
  check_tag(ctx, tag);
  check_args(ctx, {{&tensor, "the tensor"}});
  if (auto failed = failed_work(ctx)) return *failed;
  const int64_t start_ns = trace_start();
  return traced(do_send(tensor, dst, static_cast<uint64_t>(tag), ctx), "c10d.send", *this, 0,
                start_ns, tensor.nbytes());
}

Work ProcessGroup::recv(const Tensor& tensor, int src, int tag) {
  OpContext ctx = begin("recv from rank " + std::to_string(src) + " tag " + std::to_string(tag),
                        milliseconds(0));
  check_peer(ctx, src, "source");
  check_tag(ctx, tag);
  check_args(ctx, {{&tensor, "the tensor"}});
  if (auto failed = failed_work(ctx)) return *failed;
  const int64_t start_ns = trace_start();
  return traced(do_recv(tensor, src, static_cast<uint64_t>(tag), ctx), "c10d.recv", *this, 0,
                start_ns, tensor.nbytes());
}

Work ProcessGroup::recv_any_source(const Tensor& tensor, int tag) {
  OpContext ctx = begin("recv from any rank tag " + std::to_string(tag), milliseconds(0));
  check_tag(ctx, tag);
  check_args(ctx, {{&tensor, "the tensor"}});
  if (size_ < 2) {
    throw InvalidArgument(ctx.description + ": a group of one rank has no one to receive from");
  }
  if (auto failed = failed_work(ctx)) return *failed;
  const int64_t start_ns = trace_start();
  return traced(do_recv(tensor, -1, static_cast<uint64_t>(tag), ctx), "c10d.recv", *this, 0,
                start_ns, tensor.nbytes());
}

// ---- monitored barrier

void ProcessGroup::monitored_barrier(milliseconds timeout) {
  OpContext ctx = begin("monitored_barrier", timeout);
  if (timeout.count() <= 0) {
    throw InvalidArgument(ctx.description + ": timeout must be positive, got " + ms_text(timeout));
  }
  if (!supports_device(Device::cpu())) {
    throw InvalidArgument(ctx.description + ": the " + std::string(backend_name()) +
                          " backend cannot send CPU tensors; run monitored_barrier on a gloo "
                          "group");
  }
  if (auto failed = failed_work(ctx)) failed->wait(ctx.timeout);
  // Two internal tags per barrier: arrivals, then releases. Every rank runs the same
  // sequence of monitored barriers, so the counters agree.
  const uint64_t round = next_internal_.fetch_add(1);
  const uint64_t arrive_tag = kInternalTagBase + 2 * round;
  const uint64_t release_tag = arrive_tag + 1;
  if (size_ == 1) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto remaining = [&] {
    return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(
                                         deadline - std::chrono::steady_clock::now()));
  };
  if (rank_ != 0) {
    Tensor token = zeros({1}, kInt32);
    do_send(token, 0, arrive_tag, ctx).wait(remaining());
    Work release = do_recv(token, 0, release_tag, ctx);
    try {
      release.wait(remaining());
    } catch (const TimeoutError&) {
      throw TimeoutError(ctx.description + ": rank 0 did not release this rank within " +
                         ms_text(timeout) + " (another rank is missing, or rank 0 is)");
    }
    return;
  }
  std::vector<Work> arrivals;
  std::vector<Tensor> tokens;
  for (int r = 1; r < size_; ++r) {
    tokens.push_back(zeros({1}, kInt32));
    arrivals.push_back(do_recv(tokens.back(), r, arrive_tag, ctx));
  }
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    const Work& w = arrivals[static_cast<size_t>(r - 1)];
    if (!w.get_future().wait(remaining()) || w.exception() != nullptr) missing.push_back(r);
  }
  if (!missing.empty()) {
    throw TimeoutError(ctx.description + ": ranks " + ranks_text(missing) +
                       " did not arrive within " + ms_text(timeout));
  }
  std::vector<Work> releases;
  for (int r = 1; r < size_; ++r)
    releases.push_back(do_send(tokens[static_cast<size_t>(r - 1)], r, release_tag, ctx));
  for (const Work& w : releases)
    w.wait(remaining());
}

// ---- subgroups

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks,
                                                      std::optional<ProcessGroupOptions> options) {
  const std::string what =
      "new_group (group '" + options_.name + "', rank " + std::to_string(rank_) + ")";
  if (ranks.empty()) throw InvalidArgument(what + ": the list of ranks is empty");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_) {
      throw InvalidArgument(what + ": rank " + std::to_string(ranks[i]) +
                            " is outside the group's ranks [0, " + std::to_string(size_) + ")");
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      throw InvalidArgument(what + ": rank " + std::to_string(ranks[i]) + " is listed twice");
    }
  }
  const int id = next_subgroup_.fetch_add(1);
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  const int sub_rank = static_cast<int>(it - ranks.begin());
  const std::string prefix = "group" + std::to_string(id);
  // The first member to get here records the member list; the others compare, so that
  // members called with different lists fail at once instead of waiting for each other.
  const Bytes mine = to_bytes(ranks_text(ranks));
  const Bytes stored = store_->compare_set(prefix + "/members", Bytes{}, mine);
  if (!stored.empty() && stored != mine) {
    throw InvalidArgument(what + ": called with ranks " + ranks_text(ranks) +
                          ", but another member created subgroup " + std::to_string(id) +
                          " with ranks " + to_string(stored));
  }
  ProcessGroupOptions sub_options = options ? *options : options_;
  if (!options) sub_options.name = options_.name + "/" + prefix;
  if (!sub_options.debug_level) sub_options.debug_level = debug_level_;
  auto group = make_subgroup(std::make_shared<PrefixStore>(prefix, store_), sub_rank,
                             static_cast<int>(ranks.size()), std::move(sub_options));
  std::vector<int> parent;
  parent.reserve(ranks.size());
  for (int r : ranks)
    parent.push_back(parent_ranks_[static_cast<size_t>(r)]);
  group->set_parent_ranks(std::move(parent));
  if (debug_level_ != DebugLevel::kOff) {
    GRADWIRE_LOG(kInfo) << what << ": created subgroup '" << group->name() << "' of ranks "
                        << ranks_text(ranks) << " as its rank " << sub_rank;
  }
  return group;
}

}  // namespace gradwire::c10d
