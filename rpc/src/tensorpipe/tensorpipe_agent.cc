// The TensorPipe agent: start-up, lookups, metrics and the factory functions. The class and
// the map of the files that implement it are in tensorpipe_agent_impl.h.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/auth.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/signals.h"
#include "gradwire/core/trace.h"
#include "text.h"

namespace gradwire::rpc::detail {

// Loan table slots: loans outstanding at once per agent; beyond, tensors are sent.
constexpr uint32_t kLoanSlots = 4096;

void TensorPipeAgent::start() {
  // TensorPipe's uv transport writes without MSG_NOSIGNAL: a peer that goes away mid-write
  // must fail calls with an error naming it, not kill this process.
  ignore_sigpipe();
  {
    MutexLock lock(mutex_);
    if (state_ != State::kStarting || pool_ != nullptr) {
      throw InvalidArgument("rpc agent " + self_.describe() + ": start() was already called");
    }
  }
  // Trace files of this process are named after its worker (the last agent started).
  trace::set_process_name(self_.name);
  // The worker id, which gradwire-trace merge matches calls to their serving with, and the
  // offset of this process's clock to the store's, which puts every file on one time line.
  trace::set_metadata("worker_id", std::to_string(self_.id));
  c10d::record_trace_clock_offset(store_);
  try {
    start_serving();
  } catch (...) {
    close();
    throw;
  }
}

void TensorPipeAgent::start_serving() {
  validate_options();
  if (store_ == nullptr) {
    throw InvalidArgument("rpc agent " + self_.describe() + ": no store was given");
  }
  {
    MutexLock lock(mutex_);
    if (state_ != State::kStarting || pool_ != nullptr) {
      throw InvalidArgument("rpc agent " + self_.describe() + ": start() was already called");
    }
    pool_ = std::make_shared<ThreadPool>(
        ThreadPoolOptions{.num_threads = options_.num_worker_threads, .name = "rpc"});
  }
  dispatcher_.start(pool_);
  if (options_.elastic) {
    register_membership_handler();
    // A joiner met here (its claim, its announcement, a lookup by name) is told of once.
    group_.set_on_met([weak = weak_from_this()](const WorkerInfo& worker) {
      if (auto self = weak.lock()) self->notify_worker_joined(worker);
    });
  }
  if (options_.direct_copy_threads > 0) loans_ = std::make_unique<LoanTable>(kLoanSlots);
  const std::string host = resolve_host();
  context_ = std::make_shared<tp::Context>(tp::ContextOptions().name(self_.name));
  secret_ = resolve_secret(options_.secret);
  if (secret_.empty()) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe()
                        << ": no secret is set (AgentOptions::secret, GRADWIRE_SECRET or "
                           "GRADWIRE_SECRET_FILE): anyone who can reach its port can join";
  }
  const std::vector<std::string> urls = register_transports_and_channels(host);
  listener_ = context_->listen(urls);
  for (const auto& stream : {tcp_, local_, unix_}) {
    if (stream == nullptr) continue;
    if (std::string error = stream->listen_error(); !error.empty()) {
      throw NetworkError("rpc agent " + self_.describe() + ": " + error);
    }
  }
  const std::string my_url = listener_->url(tcp_ != nullptr ? "tcp" : "uv");
  calls_.start();
  GroupDirectory::Announcement me{my_url,       cuda_device_count(), options_.device_maps,
                                  std::nullopt, std::string(),       host_id_,
                                  netns_,       transports_};
  if (loans_) me.boot_id = boot_id();
  if (loans_ && !me.boot_id.empty()) me.loans = loans_->address();
  using Entry = GroupDirectory::Entry;
  group_.join(me, /*direct_copies=*/loans_ != nullptr,
              options_.join_running ? Entry::kJoinRunning
              : options_.rejoin     ? Entry::kRejoin
                                    : Entry::kStart);
  if (options_.rejoin) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe()
                        << " rejoined its group as incarnation " << group_.incarnation();
  }
  group_.check_device_maps();
  joined_.store(true, std::memory_order_release);
  // A newer incarnation's record is re-read on the pool; the task keeps the agent alive.
  admission_.open([weak = weak_from_this()](std::function<void()> task) {
    auto self = weak.lock();
    if (self == nullptr) throw Error("the worker has closed");
    self->pool_->execute([self, task = std::move(task)] { task(); });
  });
  {
    MutexLock lock(mutex_);
    state_ = State::kRunning;
    running_.store(true, std::memory_order_release);
  }
  accept_next();
  GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << " listening on " << my_url;
  if (options_.join_running) announce_joined();
}

// ---- lookups

WorkerInfo TensorPipeAgent::get_worker_info(const Destination& worker) const {
  if (!joined_.load(std::memory_order_acquire)) {
    throw Error("rpc agent " + self_.describe() +
                " has not been started; it knows no other worker yet");
  }
  return group_.find(worker);
}

// ---- metrics

AgentMetrics TensorPipeAgent::metrics() const {
  AgentMetrics m;
  {
    MutexLock lock(mutex_);
    m.running_handlers = active_handlers_;
    m.inflight_bytes = inflight_bytes_;
    m.queued_requests = queued_requests_;
    m.shutting_down = shutdown_started_ && state_ == State::kRunning;
  }
  m.pending_calls = static_cast<int64_t>(calls_.size());
  m.loans_outstanding = static_cast<int64_t>(outstanding_loans());
  m.tensors_lent = tensors_lent_.load(std::memory_order_relaxed);
  m.bytes_lent = bytes_lent_.load(std::memory_order_relaxed);
  m.tensors_through_rings = ring_counters_->tensors.load(std::memory_order_relaxed);
  m.bytes_through_rings = ring_counters_->bytes.load(std::memory_order_relaxed);
  m.tensors_copied_in = tensors_copied_in_.load(std::memory_order_relaxed);
  m.bytes_copied_in = bytes_copied_in_.load(std::memory_order_relaxed);
  m.local_connections_accepted = local_stats_->accepted.load(std::memory_order_relaxed);
  m.connections_accepted =
      transport_stats_->accepted.load(std::memory_order_relaxed) + m.local_connections_accepted;
  m.connections_refused = transport_stats_->refused.load(std::memory_order_relaxed) +
                          local_stats_->refused.load(std::memory_order_relaxed);
  m.frames_refused = transport_stats_->bad_frames.load(std::memory_order_relaxed) +
                     local_stats_->bad_frames.load(std::memory_order_relaxed);
  m.transport_polls_backed_off =
      transport_stats_->polls_backed_off.load(std::memory_order_relaxed) +
      local_stats_->polls_backed_off.load(std::memory_order_relaxed);
  m.requests_refused_busy = busy_refusals_.load(std::memory_order_relaxed);
  m.channels_refused = channel_refusals_->count.load(std::memory_order_relaxed);
  return m;
}

}  // namespace gradwire::rpc::detail

namespace gradwire::rpc {

using detail::TensorPipeAgent;

std::shared_ptr<RpcAgent> create_tensorpipe_agent(std::string name, int rank, int world_size,
                                                  std::shared_ptr<c10d::Store> store,
                                                  AgentOptions options) {
  if (!detail::valid_worker_name(name)) {
    throw InvalidArgument("rpc: invalid worker name '" + name +
                          "': use 1 to 128 characters from [A-Za-z0-9_.:-]");
  }
  if (world_size < 1) {
    throw InvalidArgument("rpc: world_size must be >= 1, got " + std::to_string(world_size));
  }
  if (options.join_running || (options.rejoin && options.elastic)) {
    // A joiner's rank is any unused one below the group's capacity (checked at start()), and
    // so is the rank of a lost joiner's replacement.
    if (rank < 0 || rank >= options.max_workers) {
      throw InvalidArgument("rpc: rank " + std::to_string(rank) +
                            " of a worker joining a running elastic group is outside [0, "
                            "max_workers = " +
                            std::to_string(options.max_workers) + ")");
    }
  } else if (rank < 0 || rank >= world_size) {
    throw InvalidArgument("rpc: rank " + std::to_string(rank) + " is outside [0, " +
                          std::to_string(world_size) + ")");
  }
  auto agent = std::make_shared<TensorPipeAgent>(WorkerInfo{std::move(name), rank}, world_size,
                                                 std::move(store), std::move(options));
  // The handle's deleter closes the agent on the thread that drops the last handle.
  RpcAgent* raw = agent.get();
  std::shared_ptr<RpcAgent> handle(raw, [agent](RpcAgent*) mutable {
    agent->close();
    agent.reset();
  });
  install_agent_extensions(handle);
  return handle;
}

std::shared_ptr<RpcAgent> make_tensorpipe_agent(std::string name, int rank, int world_size,
                                                std::shared_ptr<c10d::Store> store,
                                                AgentOptions options) {
  std::shared_ptr<RpcAgent> agent = create_tensorpipe_agent(std::move(name), rank, world_size,
                                                            std::move(store), std::move(options));
  agent->start();
  return agent;
}

}  // namespace gradwire::rpc
