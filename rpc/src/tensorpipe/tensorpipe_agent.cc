// The TensorPipe agent. See gradwire/rpc/tensorpipe_agent.h for what it does; the comments
// here say how.
//
// Threads: TensorPipe's loop threads run the read/write/accept callbacks, which only
// decode, complete futures or post work; handlers run on the agent's ThreadPool; one timer
// thread fails calls whose deadline passed. No TensorPipe function is called with mutex_
// held, because TensorPipe may run a callback inline when called from its own loop.
//
// Lifetime: the handle make_tensorpipe_agent returns owns the agent through a deleter that
// shuts it down (forced) on the user's thread when the last handle goes, so the
// TensorPipe context is never joined from one of its own threads. Callbacks hold weak
// references.
#include "gradwire/rpc/tensorpipe_agent.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <optional>
#include <shared_mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <tensorpipe/tensorpipe.h>

#include "gradwire/c10d/store.h"
#include "gradwire/core/env.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/tensor/factory.h"
#include "loans.h"
#include "wire.h"

namespace gradwire::rpc {
namespace {

namespace tp = tensorpipe;
using Clock = std::chrono::steady_clock;

constexpr int64_t kUvPriority = 0;
constexpr int64_t kShmPriority = 100;
constexpr int64_t kBasicPriority = 0;
constexpr int64_t kMptPriority = 100;
constexpr int64_t kCmaPriority = 200;
constexpr int64_t kXthPriority = 300;

// TensorPipe wants a pointer even for an empty tensor.
uint8_t empty_tensor_byte = 0;

void* buffer_of(const Tensor& t) {
  void* p = t.nbytes() == 0 ? nullptr : t.data_ptr();
  return p != nullptr ? p : &empty_tensor_byte;
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
  });
}

std::string ms_text(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

std::string unique_shm_name() {
  static std::atomic<uint64_t> counter{0};
  return "gradwire-rpc-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(Clock::now().time_since_epoch().count());
}

std::exception_ptr error_of_kind(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return std::make_exception_ptr(InvalidArgument(message));
    case ErrorKind::kTimeout:
      return std::make_exception_ptr(TimeoutError(message));
    case ErrorKind::kNetwork:
      return std::make_exception_ptr(NetworkError(message));
    case ErrorKind::kStore:
      return std::make_exception_ptr(StoreError(message));
    default:
      return std::make_exception_ptr(Error(message));
  }
}

// The agent whose handler (or reply to a request) runs on this thread: shutdown() from
// there would wait for itself.
thread_local const void* t_serving_agent = nullptr;

class ServingMark {
 public:
  explicit ServingMark(const void* agent) : previous_(t_serving_agent) { t_serving_agent = agent; }
  ~ServingMark() { t_serving_agent = previous_; }
  ServingMark(const ServingMark&) = delete;
  ServingMark& operator=(const ServingMark&) = delete;

 private:
  const void* previous_;
};

using ServeScopes = std::vector<std::shared_ptr<ServeScope>>;

// Enters every scope for a stretch of work on this thread, and exits them in reverse.
class ScopesEntered {
 public:
  explicit ScopesEntered(const ServeScopes& scopes) : scopes_(scopes) {
    for (const auto& s : scopes_)
      s->enter();
  }
  ~ScopesEntered() {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      (*it)->exit();
  }
  ScopesEntered(const ScopesEntered&) = delete;
  ScopesEntered& operator=(const ScopesEntered&) = delete;

 private:
  const ServeScopes& scopes_;
};

// Loan table slots: loans outstanding at once per agent; beyond, tensors are sent.
constexpr uint32_t kLoanSlots = 4096;

// A worker's published record: its name, its uv URL, its device maps, and where its loan
// table is (when it lends).
struct WorkerRecord {
  std::string name;
  std::string url;
  int cuda_devices{0};
  std::map<std::string, DeviceMap> device_maps;
  std::string boot_id;
  std::optional<detail::LoanTableAddress> loans;
};

std::string format_record(const WorkerRecord& r) {
  std::string out = "gradwire-rpc 1\nname " + r.name + "\nurl " + r.url + "\ndevices " +
                    std::to_string(r.cuda_devices) + "\n";
  for (const auto& [worker, pairs] : r.device_maps) {
    for (const auto& [from, to] : pairs)
      out += "map " + worker + " " + from.str() + " " + to.str() + "\n";
  }
  if (r.loans && !r.boot_id.empty()) {
    const detail::LoanTableAddress& a = *r.loans;
    out += "loans " + r.boot_id + " " + std::to_string(a.pid) + " " +
           std::to_string(a.probe_address) + " " + std::to_string(a.probe_value) + " " +
           std::to_string(a.table_address) + " " + std::to_string(a.slots) + "\n";
  }
  return out;
}

WorkerRecord parse_record(const std::string& text, int rank) {
  auto bad = [&](const std::string& why) -> InvalidArgument {
    return InvalidArgument("rpc: the store holds a bad record for rank " + std::to_string(rank) +
                           " (" + why + "); is another program using the same store?");
  };
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != "gradwire-rpc 1") throw bad("unknown header");
  WorkerRecord r;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    if (tag == "name") {
      fields >> r.name;
    } else if (tag == "url") {
      fields >> r.url;
    } else if (tag == "devices") {
      if (!(fields >> r.cuda_devices) || r.cuda_devices < 0 || r.cuda_devices > 4096) {
        throw bad("devices line '" + line + "'");
      }
    } else if (tag == "loans") {
      detail::LoanTableAddress a;
      if (!(fields >> r.boot_id >> a.pid >> a.probe_address >> a.probe_value >> a.table_address >>
            a.slots)) {
        throw bad("loans line '" + line + "'");
      }
      r.loans = a;
    } else if (tag == "map") {
      std::string worker, from, to;
      fields >> worker >> from >> to;
      try {
        r.device_maps[worker].emplace_back(parse_device(from), parse_device(to));
      } catch (const InvalidArgument&) {
        throw bad("device map line '" + line + "'");
      }
    } else {
      throw bad("line '" + line + "'");
    }
  }
  if (!valid_name(r.name) || r.url.empty()) throw bad("no name or address");
  return r;
}

class TensorPipeAgent final : public RpcAgent,
                              public std::enable_shared_from_this<TensorPipeAgent> {
 public:
  TensorPipeAgent(WorkerInfo self, int world_size, std::shared_ptr<c10d::Store> store,
                  AgentOptions options)
      : self_(std::move(self)),
        world_size_(world_size),
        store_(std::move(store)),
        options_(std::move(options)) {
    // rpc/ owns the call handler: registered functions, by name.
    handlers_[kCallHandler] = std::make_shared<const HandlerEntry>(
        HandlerEntry{"call",
                     [this](const CallContext& context, const Request& request) {
                       return registry().invoke(context, request.function, request.args, pool_);
                     },
                     Execution::kPool});
  }

  ~TensorPipeAgent() override { close(); }

  void start() override;
  void start_serving();

  const WorkerInfo& worker_info() const override { return self_; }
  WorkerInfo get_worker_info(const Destination& worker) const override;
  std::vector<WorkerInfo> get_worker_infos() const override {
    if (!joined_.load(std::memory_order_acquire)) return {};
    return workers_;
  }
  const AgentOptions& options() const override { return options_; }
  std::shared_ptr<Executor> executor() const override { return pool_; }

  void send_request(const Destination& to, Request request, CallOptions options,
                    ReplyCallback done) override;
  void register_handler(uint32_t id, std::string name, MessageHandler handler,
                        Execution execution) override;
  void add_interceptor(std::shared_ptr<Interceptor> interceptor) override;
  void shutdown(bool graceful) override;
  bool is_shut_down() const override {
    MutexLock lock(mutex_);
    return state_ != State::kRunning;
  }
  AgentMetrics metrics() const override;

  // Forced close: fails what is pending, closes TensorPipe, stops the threads. Idempotent.
  void close();

 private:
  enum class State { kStarting, kRunning, kClosing, kClosed };

  struct Connection {
    uint64_t serial{0};
    std::shared_ptr<tp::Pipe> pipe;
    WorkerInfo peer;
    bool outgoing{false};
  };
  using Deadlines = std::multimap<Clock::time_point, uint64_t>;
  using Interceptors = std::vector<std::shared_ptr<Interceptor>>;
  struct Pending {
    ReplyCallback done;
    WorkerInfo to;
    uint32_t handler{kCallHandler};
    std::string function;
    std::chrono::milliseconds timeout{0};
    uint64_t connection{0};
    std::optional<Deadlines::iterator> deadline;  // none: no timeout
    // The interceptors that saw the request, and what each kept for this call.
    std::shared_ptr<const Interceptors> interceptors;
    std::vector<std::shared_ptr<void>> states;
    uint64_t id{0};
    // "call 'add'" or "request to handler 3"; built only for messages.
    std::string what() const { return describe_call(handler, function); }
  };
  struct HandlerEntry {
    std::string name;
    MessageHandler handler;
    Execution execution{Execution::kPool};
  };
  static std::string describe_call(uint32_t handler, const std::string& function) {
    if (handler == kCallHandler) return "call '" + function + "'";
    return "request to handler " + std::to_string(handler);
  }

  void validate_options() const;
  std::string resolve_host() const;
  void register_transports_and_channels(const std::string& host);
  void join_group(const std::string& url);
  void check_device_maps() const;

  std::shared_ptr<const Interceptors> interceptors() const {
    MutexLock lock(mutex_);
    return interceptors_;
  }
  std::string describe(const Request& request) const {
    return describe_call(request.handler, request.function);
  }
  // The error a refused operation throws: the agent's first failure, else that it is not
  // running. Requires mutex_.
  [[noreturn]] void refuse_locked(const std::string& what) const GRADWIRE_REQUIRES(mutex_);
  // Removes a pending call (only if it travels on `connection`, when that is not 0).
  std::optional<Pending> take_pending_locked(uint64_t id, uint64_t connection = 0)
      GRADWIRE_REQUIRES(mutex_);
  // Ends a call: tells its interceptors how, then its callback (both guarded).
  void finish_call(Pending& call, Value value, std::exception_ptr error, CallOutcome outcome);
  void fail_call(uint64_t id, std::exception_ptr error, CallOutcome outcome,
                 uint64_t connection = 0);
  // The store key of `name` in this group's generation.
  std::string key(const std::string& name) const { return prefix_ + name; }
  // Waits for every rank's key `prefix<r>`; TimeoutError naming those missing.
  void wait_for_all(const std::string& prefix, std::chrono::milliseconds timeout,
                    const std::string& what);
  // Tensor bytes of requests from `peer` being served (max_inflight_bytes_per_peer).
  bool reserve_inflight(int peer, size_t bytes);
  void release_inflight(int peer, size_t bytes);
  DeviceMapper mapper_to(const WorkerInfo& to) const;
  DeviceMapper reply_mapper(const WorkerInfo& caller) const;

  void accept_next();
  void read_next(const std::shared_ptr<Connection>& conn);
  void on_descriptor(const std::shared_ptr<Connection>& conn, tp::Descriptor descriptor);
  void on_message(const std::shared_ptr<Connection>& conn, std::string metadata,
                  std::vector<Tensor> tensors, const std::vector<Device>& targets,
                  std::vector<detail::LoanCopy> lent, size_t tensor_bytes);
  void on_malformed(const std::shared_ptr<Connection>& conn, const std::string& metadata,
                    const std::string& why, bool close_after);
  // A message whose lent tensors could not be copied: the request is answered with a
  // NetworkError, the call of a reply fails with one.
  void on_lost_loans(const std::shared_ptr<Connection>& conn, const std::string& metadata,
                     const std::string& why);

  // Direct copies (loans.h).
  // One message's loans: to whom, over which connection, and those taken so far.
  struct Lending {
    int peer;
    uint64_t connection;
    std::vector<Loan> taken;
  };
  // Two pointers: small enough for std::function to hold without allocating per message.
  Lender lender_for(Lending& lending);
  void return_loans(const std::vector<Loan>& taken, uint64_t connection);
  std::string copy_lent(const std::shared_ptr<Connection>& conn,
                        const std::vector<detail::LoanCopy>& lent);
  void on_release(const std::shared_ptr<Connection>& conn, const Release& release);
  size_t outstanding_loans() const { return loans_ ? loans_->outstanding() : 0; }
  void on_connection_error(const std::shared_ptr<Connection>& conn, const std::string& what);
  void write(const std::shared_ptr<Connection>& conn, EncodedMessage message,
             std::function<void(const std::string& error)> on_done);

  void handle_request(const std::shared_ptr<Connection>& conn, Request request,
                      size_t tensor_bytes);
  void respond(const std::shared_ptr<Connection>& conn, const Request& request,
               const Future<Value>& result, size_t tensor_bytes);
  ErrorReply error_reply(std::exception_ptr error) const;
  void complete_call(const std::shared_ptr<Connection>& conn, Response response);
  std::exception_ptr reply_error(const ErrorReply& reply, const Pending& call) const;

  void timer_loop();
  void wait_until_idle(Clock::time_point deadline);
  void barrier(const std::string& phase, Clock::time_point deadline);
  void on_message_tensors_done(int peer, size_t bytes);

  const WorkerInfo self_;
  const int world_size_;
  const std::shared_ptr<c10d::Store> store_;
  const AgentOptions options_;

  // Set by start(), then constant.
  std::shared_ptr<ThreadPool> pool_;
  std::shared_ptr<tp::Context> context_;
  std::shared_ptr<tp::Listener> listener_;
  std::vector<WorkerInfo> workers_;
  std::map<std::string, int, std::less<>> ids_by_name_;
  std::vector<std::string> urls_;
  std::vector<DeviceMap> reply_maps_;  // per caller id: (device here, device on the caller)
  std::vector<int> cuda_devices_;      // per worker id
  std::string prefix_;                 // "rpc/<generation>/": this group's store keys
  std::thread timer_;
  // Direct copies: this worker's loan table (null when they are off), the tables of the
  // peers whose memory this worker can read, and the peers that can read this one's.
  std::unique_ptr<detail::LoanTable> loans_;
  std::vector<std::optional<detail::LoanTableAddress>> readable_;
  std::vector<bool> lend_to_;
  std::atomic<bool> joined_{false};  // workers_ and the other tables are set
  std::atomic<uint64_t> tensors_lent_{0};
  std::atomic<uint64_t> bytes_lent_{0};
  std::atomic<uint64_t> tensors_copied_in_{0};
  std::atomic<uint64_t> bytes_copied_in_{0};

  mutable Mutex mutex_;
  std::condition_variable timer_cv_;
  std::condition_variable idle_cv_;
  State state_ GRADWIRE_GUARDED_BY(mutex_) = State::kStarting;
  bool stop_timer_ GRADWIRE_GUARDED_BY(mutex_) = false;
  bool shutdown_started_ GRADWIRE_GUARDED_BY(mutex_) = false;
  uint64_t next_request_id_ GRADWIRE_GUARDED_BY(mutex_) = 1;
  uint64_t next_serial_ GRADWIRE_GUARDED_BY(mutex_) = 1;
  int active_handlers_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  std::map<int, std::shared_ptr<Connection>> clients_ GRADWIRE_GUARDED_BY(mutex_);
  std::map<uint64_t, std::shared_ptr<Connection>> servers_ GRADWIRE_GUARDED_BY(mutex_);
  std::exception_ptr failure_ GRADWIRE_GUARDED_BY(mutex_);      // the first failure, if any
  std::map<int, size_t> inflight_ GRADWIRE_GUARDED_BY(mutex_);  // per peer id
  std::unordered_map<uint64_t, Pending> pending_ GRADWIRE_GUARDED_BY(mutex_);
  Deadlines deadlines_ GRADWIRE_GUARDED_BY(mutex_);
  std::shared_ptr<const Interceptors> interceptors_ GRADWIRE_GUARDED_BY(mutex_) =
      std::make_shared<const Interceptors>();

  mutable std::shared_mutex handlers_mutex_;
  std::map<uint32_t, std::shared_ptr<const HandlerEntry>> handlers_;  // by handlers_mutex_
};

// ---- start-up

void TensorPipeAgent::validate_options() const {
  const std::string who = "rpc agent " + self_.describe() + ": ";
  if (options_.rpc_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::rpc_timeout must be > 0, got " +
                          ms_text(options_.rpc_timeout));
  }
  if (options_.join_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::join_timeout must be > 0, got " +
                          ms_text(options_.join_timeout));
  }
  if (options_.num_worker_threads < 1 || options_.num_worker_threads > 1024) {
    throw InvalidArgument(who + "AgentOptions::num_worker_threads must be in [1, 1024], got " +
                          std::to_string(options_.num_worker_threads));
  }
  if (options_.mpt_lanes < 1 || options_.mpt_lanes > 64) {
    throw InvalidArgument(who + "AgentOptions::mpt_lanes must be in [1, 64], got " +
                          std::to_string(options_.mpt_lanes));
  }
  if (options_.direct_copy_threads < 0 || options_.direct_copy_threads > 64) {
    throw InvalidArgument(who + "AgentOptions::direct_copy_threads must be in [0, 64], got " +
                          std::to_string(options_.direct_copy_threads));
  }
  for (const std::string& t : options_.transports) {
    if (t != "shm" && t != "uv") {
      throw InvalidArgument(who + "unknown transport '" + t + "' (known: shm, uv)");
    }
  }
  for (const std::string& c : options_.channels) {
    if (c != "xth" && c != "cma" && c != "mpt_uv" && c != "basic") {
      throw InvalidArgument(who + "unknown channel '" + c + "' (known: xth, cma, mpt_uv, basic)");
    }
  }
  if (options_.channels.empty()) {
    throw InvalidArgument(who + "AgentOptions::channels is empty: tensors need a channel");
  }
  if (options_.max_inflight_bytes_per_peer == 0) {
    throw InvalidArgument(who + "AgentOptions::max_inflight_bytes_per_peer must be > 0");
  }
  if (options_.close_timeout.count() < 0) {
    throw InvalidArgument(who + "AgentOptions::close_timeout must be >= 0, got " +
                          ms_text(options_.close_timeout));
  }
  for (const auto& [worker, pairs] : options_.device_maps) {
    if (!valid_name(worker)) {
      throw InvalidArgument(who + "device_maps names an invalid worker name '" + worker + "'");
    }
    for (size_t i = 0; i < pairs.size(); ++i) {
      const auto& [from, to] = pairs[i];
      if (!from.is_cuda() || !to.is_cuda()) {
        throw InvalidArgument(who + "device_maps['" + worker + "'] maps " + from.str() + " to " +
                              to.str() +
                              "; only CUDA devices are mapped (CPU tensors stay on "
                              "the CPU)");
      }
      for (size_t j = 0; j < i; ++j) {
        if (pairs[j].first == from || pairs[j].second == to) {
          throw InvalidArgument(who + "device_maps['" + worker + "'] maps " + from.str() + " to " +
                                to.str() + " but also " + pairs[j].first.str() + " to " +
                                pairs[j].second.str() + "; a map must be one-to-one");
        }
      }
    }
  }
}

std::string TensorPipeAgent::resolve_host() const {
  if (!options_.host.empty()) return options_.host;
  if (auto env = env_raw("GRADWIRE_RPC_HOST"); env && !env->empty()) return *env;
  auto [error, address] = tp::transport::uv::lookupAddrForHostname();
  if (!error && !address.empty()) return address;
  return "127.0.0.1";
}

void TensorPipeAgent::register_transports_and_channels(const std::string& host) {
  auto wants = [](const std::vector<std::string>& list, const char* name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  context_->registerTransport(kUvPriority, "uv", tp::transport::uv::create());
  if (wants(options_.transports, "shm")) {
    auto shm = tp::transport::shm::create();
    if (shm->isViable()) context_->registerTransport(kShmPriority, "shm", shm);
  }
  if (wants(options_.channels, "basic")) {
    context_->registerChannel(kBasicPriority, "basic", tp::channel::basic::create());
  }
  if (wants(options_.channels, "mpt_uv")) {
    std::vector<std::shared_ptr<tp::transport::Context>> lanes;
    std::vector<std::shared_ptr<tp::transport::Listener>> listeners;
    for (int i = 0; i < options_.mpt_lanes; ++i) {
      auto lane = tp::transport::uv::create();
      listeners.push_back(lane->listen(host));
      lanes.push_back(std::move(lane));
    }
    context_->registerChannel(kMptPriority, "mpt_uv",
                              tp::channel::mpt::create(std::move(lanes), std::move(listeners)));
  }
  if (wants(options_.channels, "cma")) {
    auto cma = tp::channel::cma::create();
    if (cma->isViable()) context_->registerChannel(kCmaPriority, "cma", cma);
  }
  if (wants(options_.channels, "xth")) {
    auto xth = tp::channel::xth::create();
    if (xth->isViable()) context_->registerChannel(kXthPriority, "xth", xth);
  }
}

void TensorPipeAgent::start() {
  {
    MutexLock lock(mutex_);
    if (state_ != State::kStarting || pool_ != nullptr) {
      throw InvalidArgument("rpc agent " + self_.describe() + ": start() was already called");
    }
  }
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
  if (options_.direct_copy_threads > 0) loans_ = std::make_unique<detail::LoanTable>(kLoanSlots);
  const std::string host = resolve_host();
  context_ = std::make_shared<tp::Context>(tp::ContextOptions().name(self_.name));
  register_transports_and_channels(host);
  std::vector<std::string> urls{"uv://" + host + ":0"};
  if (std::find(options_.transports.begin(), options_.transports.end(), "shm") !=
      options_.transports.end()) {
    auto shm = tp::transport::shm::create();
    if (shm->isViable()) urls.push_back("shm://" + unique_shm_name());
  }
  listener_ = context_->listen(urls);
  const std::string my_url = listener_->url("uv");
  timer_ = std::thread([this] { timer_loop(); });
  join_group(my_url);
  check_device_maps();
  joined_.store(true, std::memory_order_release);
  {
    MutexLock lock(mutex_);
    state_ = State::kRunning;
  }
  accept_next();
  GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << " listening on " << my_url;
}

void TensorPipeAgent::join_group(const std::string& url) {
  const std::string me = "rpc agent " + self_.describe();
  const std::string rank_text = std::to_string(self_.id);
  // A store may see several groups, one after another (init_rpc, shutdown, init_rpc): each
  // rank counts its own starts, and the n-th start of every rank forms the n-th group, whose
  // keys live under "rpc/<n>/", so no record or barrier of an earlier group is read.
  prefix_ = "rpc/" + std::to_string(store_->add("rpc/starts/" + rank_text, 1)) + "/";
  // Names are unique: the first rank to claim one keeps it.
  const c10d::Bytes owner =
      store_->compare_set(key("name/" + self_.name), {}, c10d::to_bytes(rank_text));
  if (c10d::to_string(owner) != rank_text) {
    throw InvalidArgument(me + ": the worker name '" + self_.name + "' is already taken by rank " +
                          c10d::to_string(owner));
  }
  const std::string boot = loans_ ? detail::boot_id() : std::string();
  std::optional<detail::LoanTableAddress> table;
  if (loans_ && !boot.empty()) table = loans_->address();
  store_->set(key("worker/" + rank_text),
              format_record(WorkerRecord{self_.name, url, cuda_device_count(), options_.device_maps,
                                         boot, table}));
  // Every rank's key under `prefix`, once all are there.
  auto gather = [&](const std::string& prefix, const char* step) {
    wait_for_all(prefix, options_.join_timeout, std::string("for every worker ") + step);
    std::vector<std::string> keys;
    for (int r = 0; r < world_size_; ++r)
      keys.push_back(key(prefix + std::to_string(r)));
    return store_->multi_get(keys, options_.join_timeout);
  };
  const std::vector<c10d::Bytes> values = gather("worker/", "to start");
  std::vector<WorkerRecord> records;
  for (int r = 0; r < world_size_; ++r)
    records.push_back(parse_record(c10d::to_string(values[static_cast<size_t>(r)]), r));
  for (int r = 0; r < world_size_; ++r) {
    cuda_devices_.push_back(records[static_cast<size_t>(r)].cuda_devices);
    workers_.push_back(WorkerInfo{records[static_cast<size_t>(r)].name, r});
    urls_.push_back(records[static_cast<size_t>(r)].url);
    ids_by_name_[records[static_cast<size_t>(r)].name] = r;
  }
  // What a caller maps to devices here comes back through the inverse pairs.
  reply_maps_.resize(static_cast<size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    auto it = records[static_cast<size_t>(r)].device_maps.find(self_.name);
    if (it == records[static_cast<size_t>(r)].device_maps.end()) continue;
    for (const auto& [there, here] : it->second)
      reply_maps_[static_cast<size_t>(r)].emplace_back(here, there);
  }
  // Direct copies: each worker finds whose memory it can read and says so, so that every
  // worker knows to whom it may lend.
  readable_.resize(static_cast<size_t>(world_size_));
  lend_to_.assign(static_cast<size_t>(world_size_), false);
  std::string can_read = "readable";
  for (int r = 0; loans_ && r < world_size_; ++r) {
    const WorkerRecord& rec = records[static_cast<size_t>(r)];
    if (rec.loans && !boot.empty() && rec.boot_id == boot && detail::can_read(*rec.loans)) {
      readable_[static_cast<size_t>(r)] = rec.loans;
      can_read += " " + std::to_string(r);
    }
  }
  store_->set(key("direct/" + rank_text), can_read);
  const std::vector<c10d::Bytes> readers = gather("direct/", "to check its peers");
  for (int r = 0; loans_ && r < world_size_; ++r) {
    std::istringstream in(c10d::to_string(readers[static_cast<size_t>(r)]));
    std::string word;
    in >> word;
    if (word != "readable") {
      throw InvalidArgument("rpc: the store holds a bad direct-copy record for rank " +
                            std::to_string(r) + "; is another program using the same store?");
    }
    for (int id = 0; in >> id;) {
      if (id == self_.id) lend_to_[static_cast<size_t>(r)] = true;
    }
  }
}

void TensorPipeAgent::wait_for_all(const std::string& prefix, std::chrono::milliseconds timeout,
                                   const std::string& what) {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r)
    keys.push_back(key(prefix + std::to_string(r)));
  try {
    store_->wait(keys, std::max(timeout, std::chrono::milliseconds(1)));
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < world_size_; ++r) {
      if (store_->check({keys[static_cast<size_t>(r)]})) continue;
      const bool known = static_cast<size_t>(r) < workers_.size();
      missing +=
          (missing.empty() ? "" : ", ") +
          (known ? workers_[static_cast<size_t>(r)].describe() : "rank " + std::to_string(r));
    }
    throw TimeoutError("rpc agent " + self_.describe() + " waited " +
                       ms_text(options_.join_timeout) + " " + what + "; workers that did not: [" +
                       missing + "]");
  }
}

void TensorPipeAgent::check_device_maps() const {
  // A map naming a device that one end lacks would otherwise surface as a failure to
  // receive the first tensor sent through it.
  const std::string me = "rpc agent " + self_.describe();
  const int here = cuda_devices_[static_cast<size_t>(self_.id)];
  for (const auto& [worker, pairs] : options_.device_maps) {
    auto it = ids_by_name_.find(worker);
    if (it == ids_by_name_.end()) {
      throw InvalidArgument(me + ": device_maps names worker '" + worker +
                            "', which is not in the group");
    }
    const int there = cuda_devices_[static_cast<size_t>(it->second)];
    for (const auto& [from, to] : pairs) {
      if (from.index >= here) {
        throw InvalidArgument(me + ": device_maps['" + worker + "'] maps " + from.str() +
                              ", but this worker has " + std::to_string(here) + " CUDA devices");
      }
      if (to.index >= there) {
        throw InvalidArgument(me + ": device_maps['" + worker + "'] maps " + from.str() + " to " +
                              to.str() + ", but worker " +
                              workers_[static_cast<size_t>(it->second)].describe() + " has " +
                              std::to_string(there) + " CUDA devices");
      }
    }
  }
}

// ---- lookups

WorkerInfo TensorPipeAgent::get_worker_info(const Destination& worker) const {
  if (!joined_.load(std::memory_order_acquire)) {
    throw Error("rpc agent " + self_.describe() +
                " has not been started; it knows no other worker yet");
  }
  auto known = [&] {
    std::string list;
    for (const WorkerInfo& w : workers_)
      list += (list.empty() ? "" : ", ") + w.name;
    return "known workers: [" + list + "]";
  };
  const auto& target = worker.target();
  if (const auto* name = std::get_if<std::string>(&target)) {
    auto it = ids_by_name_.find(*name);
    if (it == ids_by_name_.end()) {
      throw InvalidArgument("rpc: unknown worker '" + *name + "'; " + known());
    }
    return workers_[static_cast<size_t>(it->second)];
  }
  if (const auto* id = std::get_if<int>(&target)) {
    if (*id < 0 || *id >= world_size_) {
      throw InvalidArgument("rpc: unknown worker id " + std::to_string(*id) + "; ids are 0.." +
                            std::to_string(world_size_ - 1) + ", " + known());
    }
    return workers_[static_cast<size_t>(*id)];
  }
  const WorkerInfo& info = std::get<WorkerInfo>(target);
  if (info.id < 0 || info.id >= world_size_ || workers_[static_cast<size_t>(info.id)] != info) {
    throw InvalidArgument("rpc: unknown worker " + info.describe() + "; " + known());
  }
  return info;
}

DeviceMapper TensorPipeAgent::mapper_to(const WorkerInfo& to) const {
  auto it = options_.device_maps.find(to.name);
  const DeviceMap* map = it == options_.device_maps.end() ? nullptr : &it->second;
  return [map, to](const Device& device) {
    if (!device.is_cuda()) return Device::cpu();
    if (map != nullptr) {
      for (const auto& [from, target] : *map) {
        if (from == device) return target;
      }
    }
    throw InvalidArgument("a tensor on " + device.str() + " is sent to worker " + to.describe() +
                          ", but AgentOptions::device_maps['" + to.name + "'] has no entry for " +
                          device.str());
  };
}

DeviceMapper TensorPipeAgent::reply_mapper(const WorkerInfo& caller) const {
  const DeviceMap* map = caller.id >= 0 && caller.id < world_size_
                             ? &reply_maps_[static_cast<size_t>(caller.id)]
                             : nullptr;
  return [map, caller](const Device& device) {
    if (!device.is_cuda()) return Device::cpu();
    if (map != nullptr) {
      for (const auto& [here, there] : *map) {
        if (here == device) return there;
      }
    }
    throw InvalidArgument("a result tensor on " + device.str() + " cannot go back to worker " +
                          caller.describe() + ": its device map does not map any device to " +
                          device.str());
  };
}

// ---- handlers and interceptors

void TensorPipeAgent::register_handler(uint32_t id, std::string name, MessageHandler handler,
                                       Execution execution) {
  if (!handler)
    throw InvalidArgument("rpc: register_handler(" + std::to_string(id) + ", '" + name +
                          "') was given an empty handler");
  std::unique_lock lock(handlers_mutex_);
  auto it = handlers_.find(id);
  if (it != handlers_.end()) {
    throw InvalidArgument("rpc: handler id " + std::to_string(id) + " ('" + name +
                          "') is already taken by '" + it->second->name + "'");
  }
  handlers_.emplace(id, std::make_shared<const HandlerEntry>(
                            HandlerEntry{std::move(name), std::move(handler), execution}));
}

void TensorPipeAgent::add_interceptor(std::shared_ptr<Interceptor> interceptor) {
  if (interceptor == nullptr) throw InvalidArgument("rpc: add_interceptor(nullptr)");
  MutexLock lock(mutex_);
  auto next = std::make_shared<Interceptors>(*interceptors_);
  next->push_back(std::move(interceptor));
  interceptors_ = std::move(next);
}

// ---- sending

void TensorPipeAgent::refuse_locked(const std::string& what) const {
  if (failure_) std::rethrow_exception(failure_);
  if (state_ == State::kStarting) {
    throw Error("rpc agent " + self_.describe() + " has not been started; cannot " + what);
  }
  throw Error("rpc agent " + self_.describe() + " is shut down; cannot " + what);
}

void TensorPipeAgent::send_request(const Destination& to, Request request, CallOptions options,
                                   ReplyCallback done) {
  const WorkerInfo target = get_worker_info(to);
  if (options.timeout.count() < 0) {
    throw InvalidArgument("rpc: " + describe(request) + " to worker " + target.describe() +
                          " was given a negative timeout (" + ms_text(options.timeout) + ")");
  }
  const std::chrono::milliseconds timeout = effective_timeout(options);
  std::shared_ptr<Connection> conn;
  std::shared_ptr<const Interceptors> interceptors;
  bool fresh = false;
  {
    // connect() takes no callback, so it may be called with mutex_ held; the pipe is set
    // before any other sender can see the connection.
    MutexLock lock(mutex_);
    if (state_ != State::kRunning) {
      refuse_locked("send " + describe(request) + " to worker " + target.describe());
    }
    request.id = next_request_id_++;
    interceptors = interceptors_;
    auto it = clients_.find(target.id);
    if (it == clients_.end()) {
      auto made = std::make_shared<Connection>();
      made->serial = next_serial_++;
      made->peer = target;
      made->outgoing = true;
      made->pipe = context_->connect(urls_[static_cast<size_t>(target.id)],
                                     tp::PipeOptions().remoteName(target.name));
      it = clients_.emplace(target.id, std::move(made)).first;
      fresh = true;
    }
    conn = it->second;
  }
  if (fresh) read_next(conn);
  const uint64_t id = request.id;
  // The wire says "no timeout" with 0.
  request.timeout = timeout == kNoTimeout ? std::chrono::milliseconds(0) : timeout;
  Pending call{std::move(done),
               target,
               request.handler,
               request.function,
               timeout,
               conn->serial,
               std::nullopt,
               interceptors,
               {},
               id};
  call.states.reserve(interceptors->size());
  // Loans are tied to the connection they travel on: losing it ends them.
  Lending lending{target.id, conn->serial, {}};
  EncodedMessage message;
  try {
    for (const auto& interceptor : *interceptors)
      call.states.push_back(interceptor->on_outgoing_request(target, request));
    request.id = id;  // the agent's, whatever an interceptor did
    message = encode(Envelope{std::move(request)}, mapper_to(target), kDefaultInlineTensorBytes,
                     lender_for(lending));
  } catch (...) {
    return_loans(lending.taken, conn->serial);
    // The interceptors that saw the request learn that it never left; the caller gets the
    // error thrown, not through its callback.
    call.done = nullptr;
    finish_call(call, Value(), std::current_exception(), CallOutcome::kNotSent);
    throw;
  }
  {
    MutexLock lock(mutex_);
    if (state_ != State::kRunning) {
      lock.unlock();
      return_loans(lending.taken, conn->serial);
      call.done = nullptr;
      finish_call(call, Value(), nullptr, CallOutcome::kShutDown);
      MutexLock again(mutex_);
      refuse_locked("send " + call.what() + " to worker " + target.describe());
    }
    const Clock::time_point deadline = deadline_after(timeout);
    if (deadline != Clock::time_point::max()) {
      call.deadline = deadlines_.emplace(deadline, id);
      if (*call.deadline == deadlines_.begin()) timer_cv_.notify_one();
    }
    pending_.emplace(id, std::move(call));
  }
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  // A message that never left cannot be copied from: its loans end (the connection may
  // have been lost before they were made, so its own clean-up missed them).
  write(conn, std::move(message),
        [weak, id, target, taken = std::move(lending.taken),
         serial = conn->serial](const std::string& error) {
          if (error.empty()) return;
          auto self = weak.lock();
          if (self == nullptr) return;
          self->return_loans(taken, serial);
          std::optional<Pending> lost;
          {
            MutexLock lock(self->mutex_);
            lost = self->take_pending_locked(id, serial);
          }
          if (!lost) return;
          self->finish_call(*lost, Value(),
                            std::make_exception_ptr(NetworkError("rpc: " + lost->what() +
                                                                 " to worker " + target.describe() +
                                                                 " could not be sent: " + error)),
                            CallOutcome::kNotSent);
        });
}

void TensorPipeAgent::write(const std::shared_ptr<Connection>& conn, EncodedMessage message,
                            std::function<void(const std::string&)> on_done) {
  auto keep = std::make_shared<std::vector<Tensor>>(std::move(message.tensors));
  tp::Message out;
  out.metadata = std::move(message.payload);
  out.tensors.reserve(keep->size());
  for (const Tensor& t : *keep) {
    tp::Message::Tensor tensor;
    tensor.buffer = tp::CpuBuffer{buffer_of(t)};
    tensor.length = t.nbytes();
    out.tensors.push_back(std::move(tensor));
  }
  conn->pipe->write(std::move(out), [keep, on_done = std::move(on_done)](const tp::Error& error) {
    if (on_done) on_done(error ? error.what() : std::string());
  });
}

// ---- receiving

void TensorPipeAgent::accept_next() {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  listener_->accept([weak](const tp::Error& error, std::shared_ptr<tp::Pipe> pipe) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      if (!self->is_shut_down()) {
        GRADWIRE_LOG(kWarning) << "rpc worker " << self->self_.describe()
                               << " stopped accepting connections: " << error.what();
      }
      return;
    }
    auto conn = std::make_shared<Connection>();
    conn->pipe = std::move(pipe);
    const std::string& remote = conn->pipe->getRemoteName();
    auto it = self->ids_by_name_.find(remote);
    conn->peer = it == self->ids_by_name_.end() ? WorkerInfo{remote, -1}
                                                : self->workers_[static_cast<size_t>(it->second)];
    {
      MutexLock lock(self->mutex_);
      if (self->state_ == State::kClosed) return;
      conn->serial = self->next_serial_++;
      self->servers_.emplace(conn->serial, conn);
    }
    self->read_next(conn);
    self->accept_next();
  });
}

void TensorPipeAgent::read_next(const std::shared_ptr<Connection>& conn) {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  conn->pipe->readDescriptor([weak, conn](const tp::Error& error, tp::Descriptor descriptor) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      self->on_connection_error(conn, error.what());
      return;
    }
    self->on_descriptor(conn, std::move(descriptor));
  });
}

void TensorPipeAgent::on_descriptor(const std::shared_ptr<Connection>& conn,
                                    tp::Descriptor descriptor) {
  std::vector<IncomingTensor> announced;
  try {
    if (!descriptor.payloads.empty()) {
      throw InvalidArgument("malformed rpc envelope: a message with " +
                            std::to_string(descriptor.payloads.size()) + " payloads");
    }
    announced = peek_tensors(descriptor.metadata, options_.limits);
    const size_t sent = static_cast<size_t>(
        std::count_if(announced.begin(), announced.end(),
                      [](const IncomingTensor& t) { return !t.loan.has_value(); }));
    if (sent != descriptor.tensors.size()) {
      throw InvalidArgument("malformed rpc envelope: " + std::to_string(sent) +
                            " tensors announced, " + std::to_string(descriptor.tensors.size()) +
                            " sent");
    }
    size_t total = 0;
    for (size_t i = 0, j = 0; i < announced.size(); ++i) {
      if (!announced[i].loan && announced[i].nbytes() != descriptor.tensors[j++].length) {
        throw InvalidArgument("malformed rpc envelope: tensor " + std::to_string(i) +
                              " is announced as " + std::to_string(announced[i].nbytes()) +
                              " bytes but " + std::to_string(descriptor.tensors[j - 1].length) +
                              " are sent");
      }
      total += announced[i].nbytes();
    }
    if (total > options_.limits.max_tensor_bytes) {
      throw InvalidArgument("malformed rpc envelope: " + std::to_string(total) +
                            " tensor bytes, more than the limit of " +
                            std::to_string(options_.limits.max_tensor_bytes));
    }
  } catch (const std::exception& e) {
    on_malformed(conn, descriptor.metadata, e.what(), /*close_after=*/true);
    return;
  }
  size_t total = 0;
  for (const IncomingTensor& a : announced)
    total += a.nbytes();
  const int peer = conn->peer.id;
  if (!reserve_inflight(peer, total)) {
    on_malformed(conn, descriptor.metadata,
                 "worker " + conn->peer.describe() + " sent a message of " + std::to_string(total) +
                     " tensor bytes while its requests already being served here hold more "
                     "than max_inflight_bytes_per_peer (" +
                     std::to_string(options_.max_inflight_bytes_per_peer) + ") with it",
                 /*close_after=*/true);
    return;
  }
  tp::Allocation allocation;
  std::vector<Tensor> tensors;
  std::vector<Device> targets;
  std::vector<detail::LoanCopy> lent;
  try {
    // Runs on TensorPipe's loop thread: an allocation failure must become an error reply,
    // not an exception escaping into the loop.
    tensors.reserve(announced.size());
    for (const IncomingTensor& a : announced) {
      Tensor t = gradwire::empty(a.sizes, a.dtype);
      if (a.loan) {
        lent.push_back(
            detail::LoanCopy{*a.loan, t.nbytes() == 0 ? nullptr : t.data_ptr(), t.nbytes()});
      } else {
        tp::Allocation::Tensor slot;
        slot.buffer = tp::CpuBuffer{buffer_of(t)};
        allocation.tensors.push_back(std::move(slot));
      }
      tensors.push_back(std::move(t));
      targets.push_back(a.device);
    }
  } catch (const std::exception& e) {
    release_inflight(peer, total);
    on_malformed(
        conn, descriptor.metadata,
        "cannot allocate the " + std::to_string(total) + " tensor bytes announced: " + e.what(),
        /*close_after=*/true);
    return;
  }
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  conn->pipe->read(
      std::move(allocation),
      [weak, conn, total, metadata = std::move(descriptor.metadata), tensors = std::move(tensors),
       targets = std::move(targets), lent = std::move(lent)](const tp::Error& error) mutable {
        auto self = weak.lock();
        if (self == nullptr) return;
        if (error) {
          self->release_inflight(conn->peer.id, total);
          self->on_connection_error(conn, error.what());
          return;
        }
        self->read_next(conn);
        self->on_message(conn, std::move(metadata), std::move(tensors), targets, std::move(lent),
                         total);
      });
}

bool TensorPipeAgent::reserve_inflight(int peer, size_t bytes) {
  if (bytes == 0) return true;
  MutexLock lock(mutex_);
  size_t& held = inflight_[peer];
  if (held + bytes > options_.max_inflight_bytes_per_peer) return false;
  held += bytes;
  return true;
}

void TensorPipeAgent::release_inflight(int peer, size_t bytes) {
  if (bytes == 0) return;
  MutexLock lock(mutex_);
  auto it = inflight_.find(peer);
  if (it == inflight_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) inflight_.erase(it);
}

void TensorPipeAgent::on_message(const std::shared_ptr<Connection>& conn, std::string metadata,
                                 std::vector<Tensor> tensors, const std::vector<Device>& targets,
                                 std::vector<detail::LoanCopy> lent, size_t tensor_bytes) {
  const bool to_device =
      std::any_of(targets.begin(), targets.end(), [](const Device& d) { return d.is_cuda(); });
  const bool has_loans = !lent.empty();
  auto process = [self = shared_from_this(), conn, metadata = std::move(metadata),
                  tensors = std::move(tensors), lent = std::move(lent), tensor_bytes]() mutable {
    const int peer = conn->peer.id;
    if (!lent.empty()) {
      const std::string failure = self->copy_lent(conn, lent);
      if (!failure.empty()) {
        self->release_inflight(peer, tensor_bytes);
        self->on_lost_loans(conn, metadata, failure);
        return;
      }
    }
    Envelope envelope;
    try {
      envelope = decode(metadata, tensors, self->options_.limits);
    } catch (const std::exception& e) {
      self->release_inflight(peer, tensor_bytes);
      self->on_malformed(conn, metadata, e.what(), /*close_after=*/false);
      return;
    }
    if (Request* request = std::get_if<Request>(&envelope.body)) {
      {
        MutexLock lock(self->mutex_);
        if (self->state_ == State::kClosed) return;
        ++self->active_handlers_;
      }
      // The request's tensors are the handler's until its reply is written.
      self->handle_request(conn, std::move(*request), tensor_bytes);
      return;
    }
    self->release_inflight(peer, tensor_bytes);
    if (Response* response = std::get_if<Response>(&envelope.body)) {
      self->complete_call(conn, std::move(*response));
    } else {
      self->on_release(conn, std::get<Release>(envelope.body));
    }
  };
  // Requests always run on the pool. Replies complete their call here, on the I/O thread,
  // unless tensors must first be copied to a device or out of the sender's memory.
  if (!to_device && !has_loans) {
    process();
  } else {
    try {
      pool_->execute(std::move(process));
    } catch (const Error&) {
      // The pool is shut down: the agent is closing and the message is moot.
    }
  }
}

void TensorPipeAgent::on_malformed(const std::shared_ptr<Connection>& conn,
                                   const std::string& metadata, const std::string& why,
                                   bool close_after) {
  GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe() << ": malformed message from "
                         << conn->peer.describe() << ": " << why;
  std::optional<EnvelopeHeader> header = peek_header(metadata, options_.limits);
  if (header && header->is_request) {
    Response reply;
    reply.id = header->id;
    reply.result = ErrorReply{ErrorKind::kInvalidArgument, why, self_.name, /*rejected=*/true};
    // Unread tensor data of a bad descriptor cannot be skipped: after the reply, the
    // connection goes.
    std::shared_ptr<tp::Pipe> pipe = conn->pipe;
    write(conn, encode(Envelope{std::move(reply)}), [pipe, close_after](const std::string&) {
      if (close_after) pipe->close();
    });
    return;
  }
  if (header) {
    fail_call(header->id,
              std::make_exception_ptr(InvalidArgument("rpc: worker " + conn->peer.describe() +
                                                      " sent a malformed reply: " + why)),
              CallOutcome::kReplied, conn->serial);
  }
  if (close_after) conn->pipe->close();
}

void TensorPipeAgent::on_lost_loans(const std::shared_ptr<Connection>& conn,
                                    const std::string& metadata, const std::string& why) {
  const std::string text = "worker " + self_.describe() +
                           " could not copy the tensors lent by worker " + conn->peer.describe() +
                           ": " + why;
  GRADWIRE_LOG(kWarning) << "rpc: " << text;
  std::optional<EnvelopeHeader> header = peek_header(metadata, options_.limits);
  if (!header) return;
  if (header->is_request) {
    Response reply;
    reply.id = header->id;
    reply.result = ErrorReply{ErrorKind::kNetwork, text, self_.name, /*rejected=*/true};
    write(conn, encode(Envelope{std::move(reply)}), nullptr);
    return;
  }
  fail_call(header->id, std::make_exception_ptr(NetworkError("rpc: the reply " + text)),
            CallOutcome::kReplied, conn->serial);
}

// ---- direct copies

AgentMetrics TensorPipeAgent::metrics() const {
  AgentMetrics m;
  {
    MutexLock lock(mutex_);
    m.pending_calls = static_cast<int64_t>(pending_.size());
    m.running_handlers = active_handlers_;
  }
  m.loans_outstanding = static_cast<int64_t>(outstanding_loans());
  m.tensors_lent = tensors_lent_.load(std::memory_order_relaxed);
  m.bytes_lent = bytes_lent_.load(std::memory_order_relaxed);
  m.tensors_copied_in = tensors_copied_in_.load(std::memory_order_relaxed);
  m.bytes_copied_in = bytes_copied_in_.load(std::memory_order_relaxed);
  return m;
}

Lender TensorPipeAgent::lender_for(Lending& lending) {
  const int peer = lending.peer;
  if (!loans_ || peer < 0 || peer >= world_size_ || !lend_to_[static_cast<size_t>(peer)]) {
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
                                       const std::vector<detail::LoanCopy>& lent) {
  const int peer = conn->peer.id;
  std::string why;
  if (peer < 0 || peer >= world_size_ || !readable_[static_cast<size_t>(peer)]) {
    why = "its memory cannot be read from here (no direct copies between these workers)";
  } else {
    why = detail::read_loans(*readable_[static_cast<size_t>(peer)], self_.id, lent,
                             options_.direct_copy_threads, pool_.get());
  }
  if (why.empty()) {
    for (const detail::LoanCopy& c : lent) {
      tensors_copied_in_.fetch_add(1, std::memory_order_relaxed);
      bytes_copied_in_.fetch_add(c.nbytes, std::memory_order_relaxed);
    }
  }
  // Released in every case: the lender must not hold the memory for a copy that failed.
  Release release;
  for (const detail::LoanCopy& c : lent)
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

void TensorPipeAgent::on_connection_error(const std::shared_ptr<Connection>& conn,
                                          const std::string& what) {
  // Loans made over this connection end with it: no release can come back on it.
  if (loans_) loans_->release_connection(conn->serial);
  std::vector<Pending> lost;
  bool closing = false;
  {
    MutexLock lock(mutex_);
    closing = state_ != State::kRunning;
    if (conn->outgoing) {
      auto it = clients_.find(conn->peer.id);
      if (it != clients_.end() && it->second == conn) clients_.erase(it);
      std::vector<uint64_t> ids;
      for (const auto& [id, call] : pending_) {
        if (call.connection == conn->serial) ids.push_back(id);
      }
      for (uint64_t id : ids)
        lost.push_back(std::move(*take_pending_locked(id)));
    } else {
      servers_.erase(conn->serial);
    }
  }
  if (!closing && conn->outgoing) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": connection to "
                        << conn->peer.describe() << " lost: " << what;
  }
  for (Pending& call : lost) {
    finish_call(call, Value(),
                std::make_exception_ptr(
                    NetworkError("rpc: " + call.what() + " to worker " + call.to.describe() +
                                 " failed: the connection to it was lost (" + what + ")")),
                CallOutcome::kConnectionLost);
  }
}

// ---- serving

void TensorPipeAgent::handle_request(const std::shared_ptr<Connection>& conn, Request request,
                                     size_t tensor_bytes) {
  std::shared_ptr<const HandlerEntry> entry;
  {
    std::shared_lock lock(handlers_mutex_);
    auto it = handlers_.find(request.handler);
    if (it != handlers_.end()) entry = it->second;
  }
  // A call is looked up once: the entry says where it runs and is what runs.
  std::shared_ptr<const RegisteredFunction> function;
  if (request.handler == kCallHandler) function = registry().find(request.function);
  const bool request_runs_inline = function != nullptr
                                       ? function->execution() == Execution::kInline
                                       : entry != nullptr && entry->execution == Execution::kInline;
  auto run = [self = shared_from_this(), conn, entry, function, tensor_bytes,
              request = std::move(request)]() mutable {
    ServingMark serving(self.get());
    ServeScopes scopes;
    Future<Value> result;
    bool failed = false;
    try {
      for (const auto& interceptor : *self->interceptors()) {
        if (auto scope = interceptor->on_incoming_request(conn->peer, request))
          scopes.push_back(std::move(scope));
      }
    } catch (...) {
      result = make_failed_future<Value>(std::current_exception());
      failed = true;
    }
    {
      ScopesEntered entered(scopes);
      if (!failed) {
        try {
          if (entry == nullptr) {
            std::string known;
            {
              std::shared_lock lock(self->handlers_mutex_);
              for (const auto& [id, e] : self->handlers_)
                known += (known.empty() ? "" : ", ") + std::to_string(id) + " (" + e->name + ")";
            }
            throw CallRejected("worker " + self->self_.describe() + " has no handler with id " +
                               std::to_string(request.handler) + " (registered: " + known + ")");
          }
          const CallContext context(self.get(), conn->peer, request.id,
                                    request.timeout.count() > 0 ? deadline_after(request.timeout)
                                                                : Clock::time_point::max());
          if (request.handler == kCallHandler) {
            result = function != nullptr
                         ? function->invoke(context, request.args, self->pool_)
                         : make_failed_future<Value>(std::make_exception_ptr(
                               self->registry().unknown_function(request.function)));
          } else {
            result = entry->handler(context, request);
          }
        } catch (...) {
          result = make_failed_future<Value>(std::current_exception());
        }
      }
      if (result.completed()) {
        self->respond(conn, request, result, tensor_bytes);
        return;
      }
    }
    // The reply is written by the pool thread that sees the result, inside the same scopes.
    result.add_callback(self->pool_, [self, conn, tensor_bytes, scopes = std::move(scopes),
                                      request = std::move(request)](Future<Value> done) {
      ServingMark serving(self.get());
      ScopesEntered entered(scopes);
      self->respond(conn, request, done, tensor_bytes);
    });
  };
  // Functions and handlers that asked for it run right here, on the thread that received
  // the request (an I/O thread, or the pool when tensors had to be copied first).
  if (request_runs_inline) {
    run();
    return;
  }
  try {
    pool_->execute(std::move(run));
  } catch (const Error&) {
    release_inflight(conn->peer.id, tensor_bytes);
    MutexLock lock(mutex_);
    --active_handlers_;
    idle_cv_.notify_all();
  }
}

ErrorReply TensorPipeAgent::error_reply(std::exception_ptr error) const {
  try {
    std::rethrow_exception(std::move(error));
  } catch (const RemoteError& e) {
    // Raised further down a chain of calls (A -> B -> C): the reply names where it came
    // from and what it was there, not this worker.
    ErrorKind kind = ErrorKind::kError;
    for (ErrorKind k : {ErrorKind::kInvalidArgument, ErrorKind::kTimeout, ErrorKind::kNetwork,
                        ErrorKind::kStore}) {
      if (error_kind_name(k) == e.remote_type()) kind = k;
    }
    return ErrorReply{kind, e.remote_message(), e.worker(), false};
  } catch (const CallRejected& e) {
    return ErrorReply{ErrorKind::kInvalidArgument, e.what(), self_.name, /*rejected=*/true};
  } catch (const Error& e) {
    return ErrorReply{e.kind(), e.what(), self_.name, false};
  } catch (const std::exception& e) {
    return ErrorReply{ErrorKind::kError, e.what(), self_.name, false};
  } catch (...) {
    return ErrorReply{ErrorKind::kError, "an exception that is not a std::exception", self_.name,
                      false};
  }
}

void TensorPipeAgent::respond(const std::shared_ptr<Connection>& conn, const Request& request,
                              const Future<Value>& result, size_t tensor_bytes) {
  Response response;
  response.id = request.id;
  response.autograd_context_id = request.autograd_context_id;
  response.autograd_message_id = request.autograd_message_id;
  if (result.has_error()) {
    response.result = error_reply(result.error());
  } else {
    response.result = result.value();
  }
  EncodedMessage message;
  Lending lending{conn->peer.id, conn->serial, {}};
  try {
    for (const auto& interceptor : *interceptors())
      interceptor->on_outgoing_response(conn->peer, request, response);
    message = encode(Envelope{response}, reply_mapper(conn->peer), kDefaultInlineTensorBytes,
                     lender_for(lending));
  } catch (...) {
    return_loans(lending.taken, conn->serial);
    lending.taken.clear();
    ErrorReply reply = error_reply(std::current_exception());
    reply.message = "the reply to " + describe(request) + " could not be sent: " + reply.message;
    response.result = std::move(reply);
    message = encode(Envelope{std::move(response)});
  }
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  write(conn, std::move(message),
        [weak, taken = std::move(lending.taken), serial = conn->serial](const std::string& error) {
          if (error.empty() || taken.empty()) return;
          if (auto self = weak.lock()) self->return_loans(taken, serial);
        });
  release_inflight(conn->peer.id, tensor_bytes);
  MutexLock lock(mutex_);
  --active_handlers_;
  idle_cv_.notify_all();
}

// ---- completing calls

std::exception_ptr TensorPipeAgent::reply_error(const ErrorReply& reply,
                                                const Pending& call) const {
  if (reply.rejected) {
    return error_of_kind(reply.kind, "rpc: worker " + call.to.describe() + " refused " +
                                         call.what() + ": " + reply.message);
  }
  return std::make_exception_ptr(RemoteError(reply.worker.empty() ? call.to.name : reply.worker,
                                             std::string(error_kind_name(reply.kind)),
                                             reply.message));
}

std::optional<TensorPipeAgent::Pending> TensorPipeAgent::take_pending_locked(uint64_t id,
                                                                             uint64_t connection) {
  auto it = pending_.find(id);
  if (it == pending_.end() || (connection != 0 && it->second.connection != connection)) {
    return std::nullopt;
  }
  if (it->second.deadline) deadlines_.erase(*it->second.deadline);
  Pending call = std::move(it->second);
  pending_.erase(it);
  // Whoever removes the last pending call wakes a graceful shutdown waiting for it.
  if (pending_.empty()) idle_cv_.notify_all();
  return call;
}

void TensorPipeAgent::finish_call(Pending& call, Value value, std::exception_ptr error,
                                  CallOutcome outcome) {
  if (call.interceptors != nullptr) {
    const FinishedCall finished{call.to, call.id, call.handler, call.function, outcome, error};
    for (size_t i = 0; i < call.states.size() && i < call.interceptors->size(); ++i) {
      try {
        (*call.interceptors)[i]->on_call_finished(finished, call.states[i]);
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kError) << "rpc worker " << self_.describe()
                             << ": an interceptor's on_call_finished threw: " << e.what();
      }
    }
  }
  if (!call.done) return;
  try {
    call.done(std::move(value), std::move(error));
  } catch (const std::exception& e) {
    // The callback is the caller's; a throw from it must not unwind into an I/O thread.
    GRADWIRE_LOG(kError) << "rpc worker " << self_.describe() << ": the reply callback of "
                         << call.what() << " to worker " << call.to.describe()
                         << " threw: " << e.what();
  } catch (...) {
    GRADWIRE_LOG(kError) << "rpc worker " << self_.describe() << ": the reply callback of "
                         << call.what() << " threw a non-std::exception";
  }
}

void TensorPipeAgent::complete_call(const std::shared_ptr<Connection>& conn, Response response) {
  std::optional<Pending> call;
  {
    MutexLock lock(mutex_);
    call = take_pending_locked(response.id, conn->serial);
  }
  if (!call) {
    GRADWIRE_LOG(kDebug) << "rpc worker " << self_.describe() << ": dropped the reply "
                         << response.id << " from " << conn->peer.describe()
                         << " (its call timed out or was never made)";
    return;
  }
  try {
    for (size_t i = 0; i < call->states.size(); ++i)
      (*call->interceptors)[i]->on_incoming_response(call->to, response, call->states[i]);
  } catch (...) {
    finish_call(*call, Value(), std::current_exception(), CallOutcome::kReplied);
    return;
  }
  if (Value* value = std::get_if<Value>(&response.result)) {
    finish_call(*call, std::move(*value), nullptr, CallOutcome::kReplied);
  } else {
    finish_call(*call, Value(), reply_error(std::get<ErrorReply>(response.result), *call),
                CallOutcome::kReplied);
  }
}

void TensorPipeAgent::fail_call(uint64_t id, std::exception_ptr error, CallOutcome outcome,
                                uint64_t connection) {
  std::optional<Pending> call;
  {
    MutexLock lock(mutex_);
    call = take_pending_locked(id, connection);
  }
  if (call) finish_call(*call, Value(), std::move(error), outcome);
}

void TensorPipeAgent::timer_loop() {
  for (;;) {
    std::vector<Pending> expired;
    {
      MutexLock lock(mutex_);
      while (!stop_timer_ && (deadlines_.empty() || Clock::now() < deadlines_.begin()->first)) {
        if (deadlines_.empty()) {
          lock.wait(timer_cv_);
        } else {
          const Clock::time_point next = deadlines_.begin()->first;
          lock.wait_until(timer_cv_, next);
        }
      }
      if (stop_timer_) return;
      const Clock::time_point now = Clock::now();
      while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
        std::optional<Pending> call = take_pending_locked(deadlines_.begin()->second);
        if (call) {
          expired.push_back(std::move(*call));
        } else {
          deadlines_.erase(deadlines_.begin());
        }
      }
    }
    for (Pending& call : expired) {
      finish_call(call, Value(),
                  std::make_exception_ptr(TimeoutError("rpc: " + call.what() + " to worker " +
                                                       call.to.describe() + " timed out after " +
                                                       ms_text(call.timeout))),
                  CallOutcome::kTimedOut);
    }
  }
}

// ---- shutdown

void TensorPipeAgent::wait_until_idle(Clock::time_point deadline) {
  // Loans count too: a peer may still be copying a reply this worker lent it.
  MutexLock lock(mutex_);
  auto busy = [&]() GRADWIRE_REQUIRES(mutex_) {
    return !pending_.empty() || active_handlers_ > 0 || outstanding_loans() > 0;
  };
  while (busy()) {
    if (lock.wait_until(idle_cv_, deadline) == std::cv_status::timeout && busy()) {
      throw TimeoutError("rpc agent " + self_.describe() + ": graceful shutdown waited " +
                         ms_text(options_.join_timeout) + " for " +
                         std::to_string(pending_.size()) + " pending calls, " +
                         std::to_string(active_handlers_) + " running handlers and " +
                         std::to_string(outstanding_loans()) + " tensors lent to peers");
    }
  }
}

void TensorPipeAgent::barrier(const std::string& phase, Clock::time_point deadline) {
  const std::string prefix = "shutdown/" + phase + "/";
  store_->set(key(prefix + std::to_string(self_.id)), "1");
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  wait_for_all(prefix, left, "in graceful shutdown for every worker to agree");
}

void TensorPipeAgent::shutdown(bool graceful) {
  if (t_serving_agent == this) {
    throw InvalidArgument("rpc agent " + self_.describe() +
                          ": shutdown() was called from a request this agent is serving; it "
                          "would wait for that request itself. Shut the agent down from "
                          "outside its handlers");
  }
  {
    MutexLock lock(mutex_);
    // A second shutdown returns at once; calls may still be made while a graceful one
    // waits for the other workers.
    if (state_ != State::kRunning || shutdown_started_) return;
    shutdown_started_ = true;
  }
  if (graceful) {
    const Clock::time_point deadline = Clock::now() + options_.join_timeout;
    try {
      // Each worker first finishes its own calls; once all agree, no new call can depend
      // on a worker that has gone, and a second round lets replies still in flight land.
      wait_until_idle(deadline);
      barrier("1", deadline);
      wait_until_idle(deadline);
      barrier("2", deadline);
    } catch (...) {
      {
        // Later operations fail with this error, not a generic "shut down".
        MutexLock lock(mutex_);
        if (failure_ == nullptr) failure_ = std::current_exception();
      }
      close();
      throw;
    }
  }
  close();
}

void TensorPipeAgent::close() {
  std::vector<Pending> abandoned;
  {
    MutexLock lock(mutex_);
    if (state_ == State::kClosed || state_ == State::kClosing) return;
    state_ = State::kClosing;
    for (auto& [id, call] : pending_)
      abandoned.push_back(std::move(call));
    pending_.clear();
    deadlines_.clear();
    stop_timer_ = true;
    timer_cv_.notify_all();
    idle_cv_.notify_all();
  }
  for (Pending& call : abandoned) {
    finish_call(call, Value(),
                std::make_exception_ptr(Error("rpc agent " + self_.describe() +
                                              " was shut down before " + call.what() +
                                              " to worker " + call.to.describe() + " completed")),
                CallOutcome::kShutDown);
  }
  if (listener_) listener_->close();
  if (context_) {
    context_->close();
    context_->join();
  }
  if (timer_.joinable()) timer_.join();
  // Queued requests have lost their connections: drop them; handlers still running get
  // close_timeout to return, then are left to finish on their own.
  if (pool_) pool_->shutdown_now(options_.close_timeout);
  if (loans_) loans_->release_all();
  std::map<int, std::shared_ptr<Connection>> clients;
  std::map<uint64_t, std::shared_ptr<Connection>> servers;
  {
    MutexLock lock(mutex_);
    state_ = State::kClosed;
    clients.swap(clients_);
    servers.swap(servers_);
  }
}

}  // namespace

std::shared_ptr<RpcAgent> create_tensorpipe_agent(std::string name, int rank, int world_size,
                                                  std::shared_ptr<c10d::Store> store,
                                                  AgentOptions options) {
  if (!valid_name(name)) {
    throw InvalidArgument("rpc: invalid worker name '" + name +
                          "': use 1 to 128 characters from [A-Za-z0-9_.:-]");
  }
  if (world_size < 1) {
    throw InvalidArgument("rpc: world_size must be >= 1, got " + std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw InvalidArgument("rpc: rank " + std::to_string(rank) + " is outside [0, " +
                          std::to_string(world_size) + ")");
  }
  auto agent = std::make_shared<TensorPipeAgent>(WorkerInfo{std::move(name), rank}, world_size,
                                                 std::move(store), std::move(options));
  // The handle's deleter closes the agent on the thread that drops the last handle.
  RpcAgent* raw = agent.get();
  return std::shared_ptr<RpcAgent>(raw, [agent](RpcAgent*) mutable {
    agent->close();
    agent.reset();
  });
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
