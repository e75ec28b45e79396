#include "run_rendezvous.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "gradwire/core/error.h"
#include "gradwire/core/fd.h"
#include "gradwire/core/net.h"
#include "gradwire/core/printable.h"

namespace gradwire::run {

namespace {

using Clock = std::chrono::steady_clock;
using State = Lifecycle::State;
using Event = Lifecycle::Event;
using namespace std::chrono_literals;
using c10d::Bytes;
using c10d::to_bytes;
using c10d::to_string;

// A TCP port nothing listens on now, on every interface.
int free_port() {
  const UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw NetworkError(std::string("gradwire-run: socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    throw NetworkError(std::string("gradwire-run: cannot find a free port: ") +
                       std::strerror(errno));
  }
  return ntohs(sa.sin_port);
}

struct NodeInfo {
  int nproc = 0;
  std::string host;
  std::string host_id;
};

// What another launcher published is checked like any peer's input: bounded as the command
// line bounds it, and quoted printably in the error.
NodeInfo parse_node(const std::string& text) {
  NodeInfo n;
  std::istringstream in(text);
  in >> n.nproc >> n.host;
  std::getline(in >> std::ws, n.host_id);
  if (n.nproc < 1 || n.nproc > 4096 || n.host.empty()) {
    throw StoreError("gradwire-run: a node published a malformed description '" +
                     printable(text, 200) + "' (expected '<nproc in 1..4096> <host> <host id>')");
  }
  return n;
}

// The generation's membership, "<nodes> <failures>", as the launcher that closed it set it.
std::pair<int, int64_t> parse_closed(const std::string& text) {
  std::istringstream in(text);
  int nodes = 0;
  int64_t failures = -1;
  in >> nodes >> failures;
  if (in.fail() || nodes < 0 || nodes > 65536 || failures < 0) {
    throw StoreError("gradwire-run: the rendezvous store holds a malformed membership '" +
                     printable(text, 200) + "' (expected '<nodes> <failures>')");
  }
  return {nodes, failures};
}

// A role job node's "<hosts the rendezvous store: 0|1> <name>:<count> ...".
struct NodeRoles {
  bool hosts_store = false;
  std::vector<std::pair<std::string, int>> counts;
};

NodeRoles parse_roles(const std::string& text) {
  std::istringstream in(text);
  NodeRoles r;
  int hosts = -1;
  in >> hosts;
  bool ok = hosts == 0 || hosts == 1;
  r.hosts_store = hosts == 1;
  for (std::string word; ok && in >> word;) {
    const size_t colon = word.find(':');
    int count = 0;
    try {
      count = colon == std::string::npos ? 0 : std::stoi(word.substr(colon + 1));
    } catch (const std::exception&) {
      count = 0;
    }
    ok = colon > 0 && colon != std::string::npos && count >= 1 && count <= 4096;
    if (ok) r.counts.emplace_back(word.substr(0, colon), count);
  }
  if (!ok || r.counts.empty()) {
    throw StoreError("gradwire-run: a node published malformed roles '" + printable(text, 200) +
                     "' (expected '<0|1> <name>:<count> ...')");
  }
  return r;
}

// A role job's g<G>/members: "<nodes in the job> <nodes that joined later> <writer>"; absent
// (empty) until a node joins or leaves after the job formed, which reads as `initial` in the
// job and none joined later.
struct Members {
  int in_job = 0;
  int joined_later = 0;
};

Members parse_members(const std::string& text, int initial) {
  if (text.empty()) return Members{initial, 0};
  std::istringstream in(text);
  Members m;
  std::string writer;
  in >> m.in_job >> m.joined_later >> writer;
  if (in.fail() || m.in_job < 0 || m.joined_later < 0 || m.joined_later > (1 << 30)) {
    throw StoreError("gradwire-run: the rendezvous store holds a malformed membership '" +
                     printable(text, 200) +
                     "' (expected '<nodes in the job> <nodes that joined later> <writer>')");
  }
  return m;
}

// g<G>/master: "<address> <port>" of the workers' store.
void read_master(const std::string& text, GroupPlan& plan) {
  std::istringstream master(text);
  master >> plan.master_addr >> plan.master_port;
  if (master.fail() || plan.master_addr.empty() || plan.master_port < 1 ||
      plan.master_port > 65535) {
    throw StoreError(
        "gradwire-run: the launcher hosting the workers' store published a "
        "malformed address '" +
        printable(text, 200) + "' (expected '<host> <port>')");
  }
}

}  // namespace

Rendezvous::Rendezvous(const Options& options, const std::string& own_secret)
    : options_(options), own_secret_(own_secret) {
  prefix_ = "/gradwire-run/" + options_.run_id + "/";
  const std::string host = options_.standalone() ? "127.0.0.1" : options_.rdzv_host;
  uint16_t port = static_cast<uint16_t>(options_.standalone() ? 0 : options_.rdzv_port);
  // Whoever can bind the endpoint hosts the store; everyone else (a launcher on another
  // host, a second one on this host, or all when gradwire-store listens there) is a client.
  std::string not_hosted;  // why this launcher does not host the store
  try {
    server_ = std::make_unique<c10d::TCPStoreServer>(
        c10d::TCPStoreServerOptions{.bind_host = host, .port = port, .secret = own_secret});
    port = server_->port();
  } catch (const NetworkError& e) {
    if (options_.standalone()) throw;
    not_hosted = e.what();
  }
  // A secret made up here guards the store hosted here; another store is reached with the
  // environment's secret (empty: resolved from the environment).
  const std::string secret = server_ != nullptr ? own_secret : std::string();
  // The first connection may wait for the launcher that hosts the store to start; once
  // connected, a store that goes away must be noticed within the heartbeat timeout.
  try {
    c10d::TCPStore first(c10d::TCPStoreOptions{.host = host,
                                               .port = port,
                                               .timeout = options_.rdzv_timeout,
                                               .connect_timeout = options_.rdzv_timeout,
                                               .secret = secret});
    first.check({key("gen")});
  } catch (const NetworkError& e) {
    // Neither host nor client: say both, since the reason it could not host (the port
    // taken by another program, say) is often the reason no store answers there either.
    if (not_hosted.empty()) throw;
    throw NetworkError("gradwire-run: the rendezvous store at " + host + ":" +
                       std::to_string(port) + " could not be hosted here (" + not_hosted +
                       ") and none answered there: " + e.what());
  }
  store_ = std::make_unique<c10d::TCPStore>(
      c10d::TCPStoreOptions{.host = host,
                            .port = port,
                            .timeout = options_.rdzv_timeout,
                            .connect_timeout = options_.heartbeat_timeout,
                            .wait_grace = std::chrono::milliseconds(2000),
                            .secret = secret});
  advertised_ = net::advertised_host(host);
  host_id_ = net::host_id();
  std::random_device rd;
  token_ = advertised_ + "/" + std::to_string(::getpid()) + "/" + std::to_string(rd());
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::endpoint() const {
  return store_->host() + ":" + std::to_string(store_->port());
}

std::string Rendezvous::key(const std::string& name) const {
  return prefix_ + name;
}

std::string Rendezvous::gkey(const std::string& name) const {
  return prefix_ + "g" + std::to_string(gen_) + "/" + name;
}

int64_t Rendezvous::counter(const std::string& name, int64_t delta) {
  return store_->add(name, delta);
}

void Rendezvous::try_close(int64_t nodes) {
  const std::string value = std::to_string(nodes) + " " + std::to_string(counter(key("failures")));
  store_->compare_set(gkey("closed"), {}, to_bytes(value));
}

void Rendezvous::beat() {
  if (Clock::now() < next_beat_) return;
  store_->set(gkey("hb" + std::to_string(node_rank_)), std::to_string(++beat_));
  next_beat_ = Clock::now() + std::max(options_.heartbeat_timeout / 5, 20ms);
}

void Rendezvous::check_signal() {
  try {
    throw_if_interrupted();
  } catch (const Interrupted&) {
    life_.apply(Event::kSignal);
    throw;
  }
}

void Rendezvous::check_deadline(const Joining& j, const std::string& waiting_for) const {
  if (Clock::now() < j.deadline) return;
  throw TimeoutError("gradwire-run: rendezvous '" + options_.run_id + "' at " + endpoint() +
                     ": no generation formed within --rdzv-timeout (" +
                     std::to_string(options_.rdzv_timeout.count()) + " ms); " + waiting_for);
}

std::optional<GroupPlan> Rendezvous::join() {
  Joining j{Clock::now() + options_.rdzv_timeout};
  for (;;) {
    switch (life_.state()) {
      case State::kJoining:
        arrive(j);
        break;
      case State::kGathering:
        gather(j);
        break;
      case State::kLate:
        if (roles() && !store_->check({gkey("stop")})) {
          if (std::optional<GroupPlan> plan = join_running(j)) return plan;
        }
        wait_next(j);
        break;
      case State::kPlanning:
        if (std::optional<GroupPlan> plan = plan_group(j)) return plan;
        break;
      case State::kCompleted:
        return std::nullopt;
      case State::kAbandoned:
        throw Error("gradwire-run: the job was abandoned: " + store_->get_string(key("abandoned")));
      default:
        throw std::logic_error(
            std::string("gradwire-run: a rendezvous cannot be joined in state '") +
            Lifecycle::name(life_.state()) + "'");
    }
  }
}

void Rendezvous::arrive(Joining& j) {
  const Options& o = options_;
  gen_ = counter(key("gen"));
  if (store_->check({key("abandoned")})) return life_.apply(Event::kAbandon);
  if (store_->check({key("complete")})) return life_.apply(Event::kComplete);
  j.index = -1;
  if (!store_->check({gkey("closed")})) {
    if (o.node_rank) {
      const std::string slot = gkey("slot" + std::to_string(*o.node_rank));
      const std::string holder = to_string(store_->compare_set(slot, {}, to_bytes(token_)));
      if (holder == token_) {
        counter(gkey("joined"), 1);
        j.index = *o.node_rank;
      } else if (!store_->check({gkey("closed")})) {
        throw InvalidArgument("gradwire-run: --node-rank " + std::to_string(*o.node_rank) +
                              " is already held by another launcher (" + holder +
                              "): every node needs its own --node-rank");
      }
    } else {
      j.index = static_cast<int>(counter(gkey("joined"), 1) - 1);
    }
  }
  if (j.index < 0) return life_.apply(Event::kTooLate);
  if (j.index < o.max_nodes) {
    node_rank_ = j.index;
    next_beat_ = {};
    beat();
    store_->set(gkey("node" + std::to_string(j.index)),
                std::to_string(o.nproc_per_node) + " " + advertised_ + " " + host_id_);
    if (roles()) publish_roles(j.index);
  }
  life_.apply(Event::kArrived);
}

void Rendezvous::gather(Joining& j) {
  const Options& o = options_;
  // An arrival number past MAX has no place in G: it only reads how G closed.
  if (j.index < o.max_nodes) {
    std::optional<Clock::time_point> min_at;
    while (!store_->check({gkey("closed")})) {
      const int64_t joined = counter(gkey("joined"));
      if (joined >= o.max_nodes) {
        try_close(o.max_nodes);
      } else if (joined >= o.min_nodes) {
        if (!min_at) min_at = Clock::now();
        if (Clock::now() - *min_at >= o.last_call) try_close(joined);
      }
      check_deadline(j, std::to_string(joined) + " of at least " + std::to_string(o.min_nodes) +
                            " nodes joined generation " + std::to_string(gen_));
      beat();
      check_signal();
      try {
        store_->wait({gkey("closed")}, 100ms);
      } catch (const TimeoutError&) {
      }
    }
  }
  std::tie(j.nodes, j.failures) = parse_closed(store_->get_string(gkey("closed")));
  life_.apply(j.index < j.nodes ? Event::kClosed : Event::kTooLate);
}

bool Rendezvous::job_ended() {
  return store_->check({key("complete")}) || store_->check({key("abandoned")});
}

void Rendezvous::wait_next(const Joining& j) {
  if (job_ended()) return life_.apply(Event::kNextOpened);
  std::fprintf(stderr,
               "gradwire-run: generation %lld of '%s' is running without this node; waiting "
               "for the next one\n",
               static_cast<long long>(gen_), options_.run_id.c_str());
  store_->set(gkey("waiting"), token_);
  const std::string next = prefix_ + "g" + std::to_string(gen_ + 1) + "/joined";
  for (;;) {
    if (job_ended()) break;
    check_deadline(j, "generation " + std::to_string(gen_) + " never ended to let this node in");
    check_signal();
    try {
      store_->wait({next}, 200ms);
      break;
    } catch (const TimeoutError&) {
    }
  }
  life_.apply(Event::kNextOpened);
}

std::vector<Bytes> Rendezvous::details(const Joining& j) {
  const Options& o = options_;
  std::vector<std::string> keys;
  for (int k = 0; k < j.nodes; ++k)
    keys.push_back(gkey("node" + std::to_string(k)));
  int store_host = 0;
  if (roles()) {
    for (int k = 0; k < j.nodes; ++k)
      keys.push_back(gkey("roles" + std::to_string(k)));
    std::vector<Bytes> values = store_->multi_get(keys, o.heartbeat_timeout);
    // The launcher that hosts the rendezvous store outlives the job anyway: it hosts the
    // workers' store too when it is in the group.
    for (int k = j.nodes - 1; k >= 0; --k) {
      if (parse_roles(to_string(values[static_cast<size_t>(j.nodes + k)])).hosts_store) {
        store_host = k;
      }
    }
  }
  if (j.index == store_host) {
    const std::string master =
        roles() ? host_worker_store()
                : o.master_addr.value_or(advertised_) + " " +
                      std::to_string(o.worker_port.value_or(0) != 0 ? *o.worker_port : free_port());
    store_->set(gkey("master"), master);
  }
  keys.push_back(gkey("master"));
  return store_->multi_get(keys, o.heartbeat_timeout);
}

std::optional<GroupPlan> Rendezvous::plan_group(const Joining& j) {
  const Options& o = options_;
  num_nodes_ = j.nodes;
  std::vector<Bytes> values;
  try {
    values = details(j);
  } catch (const TimeoutError& e) {
    // A node counted in the generation died before it said who it is: start again
    // without it.
    store_->compare_set(gkey("stop"), {},
                        to_bytes(std::string("changed a node of the generation did not "
                                             "publish its details: ") +
                                 e.what()));
    life_.apply(Event::kDetailsMissing);
    advance();
    return std::nullopt;
  }
  GroupPlan plan = roles() ? make_role_plan(j, values, false) : make_plan(j, values);
  seen_.clear();
  for (int k = 0; k < j.nodes; ++k)
    if (k != j.index) seen_[k] = {"", Clock::now()};
  if (o.max_nodes > 1 || roles()) {
    std::fprintf(stderr,
                 "gradwire-run: generation %lld of '%s': node %d of %d, ranks %d..%d of %d; "
                 "workers meet at %s:%d%s\n",
                 static_cast<long long>(gen_), o.run_id.c_str(), j.index, j.nodes, plan.rank_offset,
                 plan.rank_offset + o.nproc_per_node - 1, plan.world_size, plan.master_addr.c_str(),
                 plan.master_port, worker_store_ != nullptr ? " (hosted by this launcher)" : "");
  }
  life_.apply(Event::kPlanned);
  return plan;
}

GroupPlan Rendezvous::make_plan(const Joining& j, const std::vector<Bytes>& values) const {
  GroupPlan plan;
  plan.generation = gen_;
  plan.node_rank = j.index;
  plan.num_nodes = j.nodes;
  plan.restart_count = static_cast<int>(j.failures);
  plan.world_size = 0;
  for (int k = 0; k < j.nodes; ++k) {
    const NodeInfo n = parse_node(to_string(values[static_cast<size_t>(k)]));
    if (k < j.index) plan.rank_offset += n.nproc;
    plan.world_size += n.nproc;
  }
  read_master(to_string(values.back()), plan);
  for (int r = 0; r < options_.nproc_per_node; ++r) {
    plan.workers.push_back(WorkerSlot{.rank = plan.rank_offset + r,
                                      .role = options_.role,
                                      .role_rank = plan.rank_offset + r,
                                      .role_world_size = plan.world_size});
  }
  return plan;
}

std::optional<std::string> Rendezvous::watch() {
  beat();
  if (roles()) return watch_members();
  if (store_->check({gkey("stop")})) return stop_reason();
  auto change = [&](const std::string& why) -> std::optional<std::string> {
    store_->compare_set(gkey("stop"), {}, to_bytes("changed " + why));
    return stop_reason();
  };
  if (num_nodes_ < options_.max_nodes && store_->check({gkey("waiting")}) &&
      counter(gkey("done_count")) == 0) {
    return change("a node is waiting to join");
  }
  if (seen_.empty()) return std::nullopt;
  std::vector<std::string> keys;
  for (const auto& [k, _] : seen_)
    keys.push_back(gkey("hb" + std::to_string(k)));
  const std::vector<Bytes> values = store_->multi_get(keys, options_.heartbeat_timeout);
  size_t i = 0;
  const auto now = Clock::now();
  for (auto& [k, last] : seen_) {
    const std::string value = to_string(values[i++]);
    if (value != last.first) {
      last = {value, now};
    } else if (now - last.second > options_.heartbeat_timeout) {
      return change("node " + std::to_string(k) + " stopped answering (no heartbeat for " +
                    std::to_string(options_.heartbeat_timeout.count()) + " ms)");
    }
  }
  return std::nullopt;
}

void Rendezvous::fail(int rank, int status) {
  store_->compare_set(
      gkey("stop"), {},
      to_bytes("failed " + std::to_string(status) + " rank " + std::to_string(rank) + " on node " +
               std::to_string(node_rank_) + " (" + advertised_ + ") exited with status " +
               std::to_string(status)));
}

void Rendezvous::leave(const std::string& why) {
  life_.apply(Event::kSignal);
  if (roles()) {
    store_->set(gkey("left" + std::to_string(node_rank_)), why);
    free_place(node_rank_);
    return;
  }
  store_->compare_set(gkey("stop"), {},
                      to_bytes("changed node " + std::to_string(node_rank_) + " left: " + why));
}

void Rendezvous::mark_done() {
  life_.apply(Event::kSucceeded);
  store_->set(gkey("done" + std::to_string(node_rank_)), "1");
  counter(gkey("done_count"), 1);
}

bool Rendezvous::all_done() {
  if (!roles()) return counter(gkey("done_count")) >= num_nodes_;
  for (int k = 0, n = members(); k < n; ++k) {
    if (!store_->check({gkey("done" + std::to_string(k))}) && !has_left(k)) return false;
  }
  return true;
}

std::string Rendezvous::stop_reason() {
  return store_->get_string(gkey("stop"), options_.heartbeat_timeout);
}

int64_t Rendezvous::failures() {
  return counter(key("failures"));
}

bool Rendezvous::advance() {
  const std::string stop = stop_reason();
  if (to_string(store_->compare_set(gkey("advance"), {}, to_bytes(token_))) == token_) {
    const bool failed = stop.rfind("failed ", 0) == 0;
    const int64_t f = counter(key("failures"), failed ? 1 : 0);
    if (failed && f > options_.max_restarts) {
      store_->set(key("abandoned"), stop.substr(7));
    } else {
      store_->compare_set(key("gen"), to_bytes(std::to_string(gen_)),
                          to_bytes(std::to_string(gen_ + 1)));
    }
    store_->set(gkey("next"), "1");
  }
  store_->wait({gkey("next")}, options_.rdzv_timeout);
  const bool advanced = !store_->check({key("abandoned")});
  life_.apply(advanced ? Event::kAdvanced : Event::kAbandon);
  return advanced;
}

void Rendezvous::ended() {
  life_.apply(Event::kStopped);
}

void Rendezvous::complete() {
  life_.apply(Event::kAllSucceeded);
  store_->compare_set(key("complete"), {}, to_bytes(std::to_string(gen_)));
}

void Rendezvous::finish() {
  try {
    store_->set(gkey("exited" + std::to_string(node_rank_)), "1");
    const int nodes = roles() ? members() : num_nodes_;
    if (server_ == nullptr || nodes <= 1) return;
    // The others may still need the store to learn how the job ended.
    std::vector<std::string> keys;
    for (int k = 0; k < nodes; ++k)
      if (!roles() || !has_left(k)) keys.push_back(gkey("exited" + std::to_string(k)));
    store_->wait(keys, options_.heartbeat_timeout);
  } catch (const Error&) {
    // A node that died never says it saw the end: leave after the bounded wait anyway.
  }
}

}  // namespace gradwire::run

namespace gradwire::run {

// ---- elastic role jobs

void Rendezvous::publish_roles(int index) {
  std::string text = server_ != nullptr ? "1" : "0";
  for (const RoleSpec& r : options_.roles)
    text += " " + r.name + ":" + std::to_string(r.count);
  store_->set(gkey("roles" + std::to_string(index)), text);
}

std::string Rendezvous::host_worker_store() {
  const Options& o = options_;
  // Every interface, as a worker's own store would listen: the workers of other hosts reach
  // it at the advertised address. The job's secret guards it (made up here, else the
  // environment's, else none).
  worker_store_ = std::make_unique<c10d::TCPStoreServer>(c10d::TCPStoreServerOptions{
      .port = static_cast<uint16_t>(o.worker_port.value_or(0)), .secret = own_secret_});
  return o.master_addr.value_or(advertised_) + " " + std::to_string(worker_store_->port());
}

std::optional<GroupPlan> Rendezvous::join_running(Joining& j) {
  const Options& o = options_;
  std::tie(j.nodes, j.failures) = parse_closed(store_->get_string(gkey("closed")));
  std::vector<std::string> keys;
  for (int k = 0; k < j.nodes; ++k)
    keys.push_back(gkey("node" + std::to_string(k)));
  for (int k = 0; k < j.nodes; ++k)
    keys.push_back(gkey("roles" + std::to_string(k)));
  keys.push_back(gkey("master"));
  // The initial nodes publish these as the generation closes; a generation stopped before
  // they did lets this node in as a late one of the next.
  std::vector<Bytes> values;
  while (values.empty()) {
    try {
      values = store_->multi_get(keys, 200ms);
    } catch (const TimeoutError&) {
      if (store_->check({gkey("stop")})) return std::nullopt;
      check_deadline(j, "the running generation " + std::to_string(gen_) +
                            " never published its workers' store");
      check_signal();
    }
  }
  num_nodes_ = j.nodes;
  const std::optional<int> index = wait_for_place(j);
  if (!index) return std::nullopt;
  j.index = *index;
  node_rank_ = j.index;
  next_beat_ = {};
  beat();
  store_->set(gkey("node" + std::to_string(j.index)),
              std::to_string(o.nproc_per_node) + " " + advertised_ + " " + host_id_);
  publish_roles(j.index);
  life_.apply(Event::kJoinRunning);
  GroupPlan plan = make_role_plan(j, values, true);
  seen_.clear();
  gone_.clear();
  std::fprintf(stderr,
               "gradwire-run: joining the running generation %lld of '%s' as node %d: ranks "
               "%d..%d (past the initial WORLD_SIZE %d); workers meet at %s:%d\n",
               static_cast<long long>(gen_), o.run_id.c_str(), j.index, plan.rank_offset,
               plan.rank_offset + o.nproc_per_node - 1, plan.world_size, plan.master_addr.c_str(),
               plan.master_port);
  life_.apply(Event::kPlanned);
  return plan;
}

GroupPlan Rendezvous::make_role_plan(const Joining& j, const std::vector<Bytes>& values,
                                     bool late) {
  const Options& o = options_;
  GroupPlan plan;
  plan.generation = gen_;
  plan.node_rank = j.index;
  plan.num_nodes = j.nodes;
  plan.elastic = true;
  plan.joins_running = late;
  plan.world_size = 0;
  std::map<std::string, int> role_world, role_offset;
  for (int k = 0; k < j.nodes; ++k) {
    const NodeInfo n = parse_node(to_string(values[static_cast<size_t>(k)]));
    if (k < j.index) plan.rank_offset += n.nproc;
    plan.world_size += n.nproc;
    for (const auto& [name, count] :
         parse_roles(to_string(values[static_cast<size_t>(j.nodes + k)])).counts) {
      role_world[name] += count;
      if (k < j.index) role_offset[name] += count;
    }
  }
  read_master(to_string(values.back()), plan);
  if (late) {
    const int64_t n = o.nproc_per_node;
    plan.rank_offset = plan.world_size + static_cast<int>(counter(gkey("late_ranks"), n) - n);
    for (const RoleSpec& r : o.roles) {
      role_offset[r.name] =
          role_world[r.name] +
          static_cast<int>(counter(gkey("late_role/" + r.name), r.count) - r.count);
    }
  }
  int rank = plan.rank_offset;
  for (const RoleSpec& r : o.roles) {
    for (int i = 0; i < r.count; ++i) {
      plan.workers.push_back(WorkerSlot{.rank = rank++,
                                        .role = r.name,
                                        .role_rank = role_offset[r.name] + i,
                                        .role_world_size = role_world[r.name],
                                        .critical = r.critical});
    }
  }
  return plan;
}

std::string Rendezvous::read_members() {
  const std::string key = gkey("members");
  return store_->check({key}) ? store_->get_string(key) : std::string();
}

std::string Rendezvous::next_members(int in_job, int joined_later) {
  return std::to_string(in_job) + " " + std::to_string(joined_later) + " " + token_ + "/" +
         std::to_string(++members_writes_);
}

int Rendezvous::members() {
  return num_nodes_ + parse_members(read_members(), num_nodes_).joined_later;
}

std::optional<int> Rendezvous::take_place() {
  // One compare_set moves the value from what was read to what this launcher writes (made
  // unique by its token): of two launchers reading the same value, only one gets the place,
  // and the other reads again.
  for (;;) {
    const std::string now = read_members();
    const Members m = parse_members(now, num_nodes_);
    if (m.in_job >= options_.max_nodes) return std::nullopt;
    const std::string next = next_members(m.in_job + 1, m.joined_later + 1);
    if (to_string(store_->compare_set(gkey("members"), to_bytes(now), to_bytes(next))) == next) {
      return num_nodes_ + m.joined_later;
    }
  }
}

void Rendezvous::free_place(int k) {
  // Whoever records node k's departure first gives its place back; the others do not.
  if (counter(gkey("freed" + std::to_string(k)), 1) != 1) return;
  for (;;) {
    const std::string now = read_members();
    const Members m = parse_members(now, num_nodes_);
    const std::string next = next_members(std::max(m.in_job - 1, 0), m.joined_later);
    if (to_string(store_->compare_set(gkey("members"), to_bytes(now), to_bytes(next))) == next) {
      return;
    }
  }
}

std::string Rendezvous::nnodes_flag() const {
  const Options& o = options_;
  return "--nnodes " + (o.min_nodes == o.max_nodes
                            ? std::to_string(o.max_nodes)
                            : std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes));
}

std::optional<int> Rendezvous::wait_for_place(const Joining& j) {
  const Options& o = options_;
  for (bool said = false;; said = true) {
    if (std::optional<int> index = take_place()) return index;
    if (!said) {
      std::fprintf(stderr,
                   "gradwire-run: the job '%s' runs %d nodes already, the most that %s allows; "
                   "this node waits for one to leave (up to --rdzv-timeout, %lld ms)\n",
                   o.run_id.c_str(), o.max_nodes, nnodes_flag().c_str(),
                   static_cast<long long>(o.rdzv_timeout.count()));
    }
    if (store_->check({gkey("stop")}) || job_ended()) return std::nullopt;
    if (Clock::now() >= j.deadline) {
      throw TimeoutError("gradwire-run: the job '" + o.run_id + "' at " + endpoint() +
                         " still runs " + std::to_string(o.max_nodes) + " nodes, the most that " +
                         nnodes_flag() + " allows, after --rdzv-timeout (" +
                         std::to_string(o.rdzv_timeout.count()) +
                         " ms): no node left to free a place for this one");
    }
    check_signal();
    pollfd pfd{signal_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 100);
  }
}

bool Rendezvous::has_left(int k) {
  return store_->check({gkey("left" + std::to_string(k))});
}

std::vector<std::string> Rendezvous::heartbeats() {
  std::vector<std::string> keys;
  for (const auto& [k, _] : seen_)
    keys.push_back(gkey("hb" + std::to_string(k)));
  std::vector<std::string> beats;
  if (store_->check(keys)) {
    for (const Bytes& b : store_->multi_get(keys, options_.heartbeat_timeout))
      beats.push_back(to_string(b));
    return beats;
  }
  // A node that took its number has not beaten yet: read the others one by one.
  for (const std::string& key : keys)
    beats.push_back(store_->check({key}) ? store_->get_string(key) : std::string());
  return beats;
}

std::optional<std::string> Rendezvous::watch_members() {
  if (store_->check({gkey("stop")})) return stop_reason();
  const auto now = Clock::now();
  for (int k = 0, n = members(); k < n; ++k) {
    if (k != node_rank_ && gone_.count(k) == 0 && seen_.count(k) == 0) seen_[k] = {"", now};
  }
  if (seen_.empty()) return std::nullopt;
  const std::vector<std::string> beats = heartbeats();
  size_t i = 0;
  std::vector<int> silent;
  for (auto& [k, last] : seen_) {
    const std::string& value = beats[i++];
    if (value != last.first) {
      last = {value, now};
    } else if (now - last.second > options_.heartbeat_timeout) {
      silent.push_back(k);
    }
  }
  for (int k : silent) {
    const std::string key = gkey("left" + std::to_string(k));
    const std::string why = "stopped answering (no heartbeat for " +
                            std::to_string(options_.heartbeat_timeout.count()) + " ms)";
    store_->compare_set(key, {}, to_bytes(why));
    free_place(k);
    std::fprintf(stderr, "gradwire-run: node %d left the job: %s; the job goes on without it\n", k,
                 store_->get_string(key).c_str());
    seen_.erase(k);
    gone_.insert(k);
  }
  return std::nullopt;
}

}  // namespace gradwire::run
