#include "group.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "text.h"

namespace gradwire::rpc::detail {

namespace {

// A host id as one word of a record (GRADWIRE_HOST_ID is free text).
std::string record_word(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    if (std::isspace(static_cast<unsigned char>(c))) c = '_';
  }
  return out;
}

std::string format_record(const WorkerRecord& r) {
  std::string out = "gradwire-rpc 1\nname " + r.name + "\nurl " + r.url + "\ndevices " +
                    std::to_string(r.cuda_devices) + "\n";
  if (r.incarnation > 0) out += "incarnation " + std::to_string(r.incarnation) + "\n";
  if (!r.host_id.empty()) {
    out += "host " + record_word(r.host_id) + "\nnetns " + std::to_string(r.netns) + "\n";
  }
  if (!r.transports.empty()) {
    out += "transports";
    for (const std::string& t : r.transports)
      out += " " + t;
    out += "\n";
  }
  for (const auto& [worker, pairs] : r.device_maps) {
    for (const auto& [from, to] : pairs)
      out += "map " + worker + " " + from.str() + " " + to.str() + "\n";
  }
  if (r.loans && !r.boot_id.empty()) {
    const LoanTableAddress& a = *r.loans;
    // No pid: a reader learns the lender's process from the kernel (SO_PEERCRED on a local
    // connection with it), never from a record.
    out += "loans " + r.boot_id + " " + std::to_string(a.probe_address) + " " +
           std::to_string(a.probe_value) + " " + std::to_string(a.table_address) + " " +
           std::to_string(a.slots) + "\n";
  }
  return out;
}

}  // namespace

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
    } else if (tag == "incarnation") {
      if (!(fields >> r.incarnation) || r.incarnation < 1 || r.incarnation > kMaxIncarnation) {
        throw bad("incarnation line '" + line + "'");
      }
    } else if (tag == "host") {
      if (!(fields >> r.host_id)) throw bad("host line '" + line + "'");
    } else if (tag == "netns") {
      if (!(fields >> r.netns)) throw bad("netns line '" + line + "'");
    } else if (tag == "transports") {
      for (std::string t; fields >> t;)
        r.transports.push_back(t);
    } else if (tag == "loans") {
      LoanTableAddress a;
      if (!(fields >> r.boot_id >> a.probe_address >> a.probe_value >> a.table_address >>
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
  if (!valid_worker_name(r.name) || r.url.empty()) throw bad("no name or address");
  return r;
}

namespace {

const std::optional<LoanTableAddress> kNotReadable;

// Whether a record's worker runs on host `host_id` in network namespace `netns`; a record
// that does not say (an older worker) does not.
bool shares_namespace(const WorkerRecord& record, const std::string& host_id, uint64_t netns) {
  return !record.host_id.empty() && !host_id.empty() && record.host_id == host_id &&
         record.netns != 0 && record.netns == netns;
}

// Whether `transports` holds one that runs over Unix sockets (the kernel names the peer).
bool over_unix_sockets(const std::vector<std::string>& transports) {
  return std::find(transports.begin(), transports.end(), "local") != transports.end() ||
         std::find(transports.begin(), transports.end(), "unix") != transports.end();
}

// The transports a record lists; a record that lists none (an older worker) announced tcp.
std::vector<std::string> transports_in(const WorkerRecord& record) {
  return record.transports.empty() ? std::vector<std::string>{"tcp"} : record.transports;
}

}  // namespace

bool valid_worker_name(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
  });
}

// ---- device routes

Device DeviceRoute::operator()(const Device& device) const {
  if (!device.is_cuda()) return Device::cpu();
  for (const auto& [here, there] : pairs_) {
    if (here == device) return there;
  }
  if (direction_ == Direction::kRequest) {
    throw InvalidArgument("a tensor on " + device.str() + " is sent to worker " + peer_.describe() +
                          ", but AgentOptions::device_maps['" + peer_.name +
                          "'] has no entry for " + device.str());
  }
  throw InvalidArgument("a result tensor on " + device.str() + " cannot go back to worker " +
                        peer_.describe() + ": its device map does not map any device to " +
                        device.str());
}

DeviceMapper device_mapper(const DeviceRoute* route) {
  if (route == nullptr) return nullptr;
  return [route](const Device& device) { return (*route)(device); };
}

// ---- the directory

GroupDirectory::GroupDirectory(WorkerInfo self, int world_size, std::shared_ptr<c10d::Store> store,
                               std::chrono::milliseconds join_timeout, int capacity)
    : self_(std::move(self)),
      world_size_(world_size),
      store_(std::move(store)),
      join_timeout_(join_timeout),
      capacity_(std::max(capacity, 0)),
      slots_(capacity > 0 ? capacity : world_size) {
  const auto n = static_cast<size_t>(slots_);
  workers_.reserve(n);
  for (int id = 0; id < slots_; ++id)
    workers_.push_back(WorkerInfo{"", id});
  cuda_devices_.assign(n, 0);
  readable_.resize(n);
  lend_to_.assign(n, false);
  MutexLock lock(mutable_mutex_);
  presence_.assign(n, Presence::kAbsent);
  urls_.resize(n);
  incarnations_.assign(n, 0);
  transports_.resize(n);
  same_namespace_.assign(n, false);
}

void GroupDirectory::validate_device_maps(const std::string& who,
                                          const std::map<std::string, DeviceMap>& device_maps) {
  for (const auto& [worker, pairs] : device_maps) {
    if (!valid_worker_name(worker)) {
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

void GroupDirectory::join(const Announcement& me, bool direct_copies, Entry entry) {
  const bool joining = entry == Entry::kJoinRunning;
  const bool rejoin = entry != Entry::kStart;  // a newcomer to a running group lends nothing
  if (joining) {
    enter_running_generation();
  } else {
    enter_generation(rejoin);
  }
  claim_name_and_publish(me, rejoin);
  if (joining) store_->append(key("roster"), std::to_string(self_.id) + " ");
  const std::vector<WorkerRecord> records = read_records(rejoin);
  adopt_records(me, records);
  if (elastic()) adopt_roster();
  // A joiner reads nobody's memory: the members agreed on who lends to whom without it.
  if (joining) return;
  const std::string can_read = find_readable(me, records, direct_copies);
  if (rejoin) return;  // lends to nobody; the others' records stand
  agree_on_lenders(can_read, direct_copies);
}

void GroupDirectory::enter_generation(bool rejoin) {
  const std::string rank_text = std::to_string(self_.id);
  if (rejoin) {
    // The running generation: the one this rank's predecessor started.
    const int64_t started = store_->add("rpc/starts/" + rank_text, 0);
    if (started < 1) {
      throw InvalidArgument("rpc agent " + self_.describe() +
                            " was asked to rejoin, but no group has started on this store for "
                            "rank " +
                            rank_text);
    }
    prefix_ = "rpc/" + std::to_string(started) + "/";
    const int64_t incarnation = store_->add(key("incarnation/" + rank_text), 1);
    if (incarnation > kMaxIncarnation) {
      throw InvalidArgument("rpc agent " + self_.describe() + ": rank " + rank_text +
                            " has been taken over " + std::to_string(kMaxIncarnation) +
                            " times already, the most a group allows");
    }
    incarnation_ = static_cast<int>(incarnation);
    if (elastic()) world_size_ = formed_size();
  } else {
    // Each rank counts its own starts on this store; see the file comment.
    prefix_ = "rpc/" + std::to_string(store_->add("rpc/starts/" + rank_text, 1)) + "/";
    // Joiners find the generation through rank 0, and learn from this mark that it is
    // elastic and how many workers formed it.
    if (elastic() && self_.id == 0) store_->set(key("elastic"), std::to_string(world_size_));
  }
}

void GroupDirectory::claim_name_and_publish(const Announcement& me, bool rejoin) {
  const std::string rank_text = std::to_string(self_.id);
  // Names are unique: the first rank to claim one keeps it.
  const c10d::Bytes owner =
      store_->compare_set(key("name/" + self_.name), {}, c10d::to_bytes(rank_text));
  if (c10d::to_string(owner) != rank_text) {
    throw InvalidArgument("rpc agent " + self_.describe() + ": the worker name '" + self_.name +
                          "' is already taken by rank " + c10d::to_string(owner));
  }
  // A rejoining worker announces no loan table: it lends nothing (see the file comment).
  store_->set(key("worker/" + rank_text),
              format_record(WorkerRecord{self_.name, me.url, me.cuda_devices, me.device_maps,
                                         me.boot_id, rejoin ? std::nullopt : me.loans, incarnation_,
                                         me.host_id, me.netns, me.transports}));
}

std::vector<WorkerRecord> GroupDirectory::read_records(bool rejoin) const {
  std::vector<std::string> values;
  try {
    values = gather("worker/", "to start");
  } catch (const TimeoutError& e) {
    if (!rejoin) {
      if (std::string other = earlier_claim(); !other.empty()) {
        throw TimeoutError(std::string(e.what()) + ". " + other);
      }
    }
    throw;
  }
  std::vector<WorkerRecord> records;
  for (int r = 0; r < world_size_; ++r)
    records.push_back(parse_record(values[static_cast<size_t>(r)], r));
  return records;
}

void GroupDirectory::adopt_records(const Announcement& me,
                                   const std::vector<WorkerRecord>& records) {
  host_id_ = record_word(me.host_id);
  netns_ = me.netns;
  cuda_devices_here_ = me.cuda_devices;
  device_maps_ = me.device_maps;
  // Without a CUDA device here every tensor is on the CPU and stays there: no routes, so
  // messages are encoded without a mapper.
  if (cuda_devices_here_ > 0) {
    for (int r = 0; r < slots_; ++r) {
      routes_to_.emplace_back(WorkerInfo{"", r}, DeviceMap{}, DeviceRoute::Direction::kRequest);
      routes_back_.emplace_back(WorkerInfo{"", r}, DeviceMap{}, DeviceRoute::Direction::kReply);
    }
  }
  MutexLock lock(mutable_mutex_);
  for (int r = 0; r < world_size_; ++r)
    adopt(r, records[static_cast<size_t>(r)]);
}

bool GroupDirectory::adopt(int rank, const WorkerRecord& rec) {
  const auto i = static_cast<size_t>(rank);
  if (presence_[i] != Presence::kAbsent) return false;
  workers_[i] = WorkerInfo{rec.name, rank};
  cuda_devices_[i] = rec.cuda_devices;
  urls_[i] = rec.url;
  incarnations_[i] = rec.incarnation;
  transports_[i] = transports_in(rec);
  same_namespace_[i] = rank == self_.id || shares_namespace(rec, host_id_, netns_);
  if (cuda_devices_here_ > 0) {
    auto mine = device_maps_.find(rec.name);
    routes_to_[i] =
        DeviceRoute(workers_[i], mine == device_maps_.end() ? DeviceMap{} : mine->second,
                    DeviceRoute::Direction::kRequest);
    // What a caller maps to devices here comes back through the inverse pairs.
    DeviceMap back;
    if (auto theirs = rec.device_maps.find(self_.name); theirs != rec.device_maps.end()) {
      for (const auto& [there, here] : theirs->second)
        back.emplace_back(here, there);
    }
    routes_back_[i] = DeviceRoute(workers_[i], std::move(back), DeviceRoute::Direction::kReply);
  }
  ids_by_name_[rec.name] = rank;
  presence_[i] = next(presence_[i], PresenceEvent::kAdopt);
  return true;
}

std::string GroupDirectory::find_readable(const Announcement& me,
                                          const std::vector<WorkerRecord>& records,
                                          bool direct_copies) {
  // Direct copies: each worker finds whose memory it can read and says so, so that every
  // worker knows to whom it may lend.
  std::string can_read = "readable";
  for (int r = 0; direct_copies && r < world_size_; ++r) {
    const WorkerRecord& rec = records[static_cast<size_t>(r)];
    // Loans are read from the process at the other end of a local connection (loans.h), so
    // only a peer that such a connection reaches is read: one of this host and namespace
    // that registered a transport over Unix sockets, as this worker did.
    if (rec.loans && !me.boot_id.empty() && rec.boot_id == me.boot_id &&
        shares_namespace(rec, me.host_id, me.netns) && over_unix_sockets(transports_in(rec)) &&
        over_unix_sockets(me.transports) && detail::can_read_peers()) {
      readable_[static_cast<size_t>(r)] = rec.loans;
      can_read += " " + std::to_string(r);
    }
  }
  return can_read;
}

void GroupDirectory::agree_on_lenders(const std::string& can_read, bool direct_copies) {
  const std::string rank_text = std::to_string(self_.id);
  store_->set(key("direct/" + rank_text), can_read);
  const std::vector<std::string> readers = gather("direct/", "to check its peers");
  for (int r = 0; direct_copies && r < world_size_; ++r) {
    std::istringstream in(readers[static_cast<size_t>(r)]);
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

std::string GroupDirectory::earlier_claim() const {
  // This rank's n-th start formed group n; a worker of the same rank whose group n-1 is
  // still running (it has not left it) means two processes were given this rank.
  const std::string rank_text = std::to_string(self_.id);
  const size_t slash = prefix_.find('/', 4);
  const int64_t generation = std::stoll(prefix_.substr(4, slash - 4));
  if (generation < 2) return "";
  const std::string earlier = "rpc/" + std::to_string(generation - 1) + "/";
  try {
    if (!store_->check({earlier + "worker/" + rank_text}) ||
        store_->check({earlier + "shutdown/left/" + rank_text})) {
      return "";
    }
    const WorkerRecord rec =
        parse_record(c10d::to_string(store_->get(earlier + "worker/" + rank_text)), self_.id);
    return "Rank " + rank_text + " is also held by worker '" + rec.name + "'" +
           (rec.host_id.empty() ? std::string() : " on host " + rec.host_id) +
           ", in the group this rank started before, which it has not left: if two processes "
           "were given rank " +
           rank_text +
           ", --nproc-per-node must be equal on every node, or use gradwire-run --rdzv-endpoint";
  } catch (const std::exception&) {
    return "";
  }
}

int GroupDirectory::refresh(int id, std::chrono::milliseconds timeout) {
  try {
    const WorkerRecord rec = parse_record(
        c10d::to_string(store_->get(key("worker/" + std::to_string(id)), timeout)), id);
    MutexLock lock(mutable_mutex_);
    // A record never goes back to an earlier incarnation, nor changes its name.
    if (rec.name == workers_[static_cast<size_t>(id)].name &&
        rec.incarnation >= incarnations_[static_cast<size_t>(id)]) {
      urls_[static_cast<size_t>(id)] = rec.url;
      incarnations_[static_cast<size_t>(id)] = rec.incarnation;
      transports_[static_cast<size_t>(id)] = transports_in(rec);
      same_namespace_[static_cast<size_t>(id)] =
          id == self_.id || shares_namespace(rec, host_id_, netns_);
    }
    return incarnations_[static_cast<size_t>(id)];
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": could not re-read the record of "
                        << workers_[static_cast<size_t>(id)].describe() << ": " << e.what();
    MutexLock lock(mutable_mutex_);
    return incarnations_[static_cast<size_t>(id)];
  }
}

std::vector<std::string> GroupDirectory::gather(const std::string& prefix,
                                                const std::string& step) const {
  wait_for_all(prefix, join_timeout_, "for every worker " + step);
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r)
    keys.push_back(key(prefix + std::to_string(r)));
  std::vector<std::string> values;
  for (const c10d::Bytes& value : store_->multi_get(keys, join_timeout_))
    values.push_back(c10d::to_string(value));
  return values;
}

void GroupDirectory::wait_for_all(const std::string& prefix, std::chrono::milliseconds timeout,
                                  const std::string& what) const {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r)
    keys.push_back(key(prefix + std::to_string(r)));
  try {
    store_->wait(keys, std::max(timeout, std::chrono::milliseconds(1)));
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < world_size_; ++r) {
      if (store_->check({keys[static_cast<size_t>(r)]})) continue;
      missing += (missing.empty() ? "" : ", ") + describe_rank(r);
    }
    throw TimeoutError("rpc agent " + self_.describe() + " waited " + ms_text(join_timeout_) + " " +
                       what + "; workers that did not: [" + missing + "]");
  }
}

void GroupDirectory::check_device_maps() const {
  // A map naming a device that one end lacks would otherwise surface as a failure to
  // receive the first tensor sent through it.
  const std::string me = "rpc agent " + self_.describe();
  const int here = cuda_devices_here_;
  for (const auto& [worker, pairs] : device_maps_) {
    MutexLock lock(mutable_mutex_);
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

void GroupDirectory::barrier(const std::string& phase, Clock::time_point deadline) const {
  const std::string prefix = "shutdown/" + phase + "/";
  store_->set(key(prefix + std::to_string(self_.id)), "1");
  if (elastic()) {
    wait_for_members(prefix, deadline, "in graceful shutdown for every member to agree");
    return;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  wait_for_all(prefix, left, "in graceful shutdown for every worker to agree");
}

std::string GroupDirectory::describe_rank(int rank) const {
  if (rank >= 0 && rank < slots_) {
    MutexLock lock(mutable_mutex_);
    if (presence_[static_cast<size_t>(rank)] != Presence::kAbsent)
      return workers_[static_cast<size_t>(rank)].describe();
  }
  return "rank " + std::to_string(rank);
}

bool GroupDirectory::hosts_store() const {
  const c10d::Store* store = store_.get();
  while (const auto* prefixed = dynamic_cast<const c10d::PrefixStore*>(store))
    store = prefixed->underlying_store().get();
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(store);
  return tcp != nullptr && tcp->is_master();
}

void GroupDirectory::depart(Clock::time_point deadline) const {
  const std::string prefix = "shutdown/left/";
  try {
    store_->set(key(prefix + std::to_string(self_.id)), "1");
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe()
                           << ": could not mark its departure in the store: " << e.what();
    return;
  }
  if (!hosts_store()) return;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  const std::string what = "to pass the end of graceful shutdown before the store's host leaves";
  try {
    if (elastic()) {
      wait_for_members(prefix, deadline, what);
    } else {
      wait_for_all(prefix, std::max(left, std::chrono::milliseconds(1)), what);
    }
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe()
                           << " (hosting the store) leaves without them: " << e.what();
  }
}

// ---- lookups

std::optional<int> GroupDirectory::lookup(const Destination& destination, std::string* left) const {
  const auto& target = destination.target();
  MutexLock lock(mutable_mutex_);
  int id = -1;
  if (const auto* name = std::get_if<std::string>(&target)) {
    auto it = ids_by_name_.find(*name);
    if (it != ids_by_name_.end()) id = it->second;
  } else if (const auto* given = std::get_if<int>(&target)) {
    id = *given;
  } else {
    const WorkerInfo& info = std::get<WorkerInfo>(target);
    if (info.id >= 0 && info.id < slots_ && workers_[static_cast<size_t>(info.id)] == info)
      id = info.id;
  }
  if (id < 0 || id >= slots_) return std::nullopt;
  const Presence p = presence_[static_cast<size_t>(id)];
  if (p == Presence::kMember || p == Presence::kLost) return id;
  if (p == Presence::kLeft && left != nullptr) *left = workers_[static_cast<size_t>(id)].describe();
  return std::nullopt;
}

WorkerInfo GroupDirectory::find(const Destination& destination) const {
  std::string left;
  std::optional<int> id = lookup(destination, &left);
  if (!id && left.empty() && elastic()) {
    // A joiner this worker has not met yet: the store knows it.
    const auto& target = destination.target();
    // Adopting a joiner's record writes its entries once, under the lock (see the class
    // comment), which a lookup may do.
    auto& self = const_cast<GroupDirectory&>(*this);
    constexpr std::chrono::milliseconds kLookup{2'000};
    if (const auto* name = std::get_if<std::string>(&target)) {
      self.discover(*name, kLookup);
    } else {
      self.discover(std::holds_alternative<int>(target) ? std::get<int>(target)
                                                        : std::get<WorkerInfo>(target).id,
                    kLookup);
    }
    id = lookup(destination, &left);
  }
  if (id) return worker(*id);
  if (!left.empty()) {
    throw InvalidArgument("rpc: worker " + left +
                          " left the group; nothing is sent to it any more");
  }
  std::string list;
  for (const WorkerInfo& w : workers())
    list += (list.empty() ? "" : ", ") + w.name;
  const auto& target = destination.target();
  std::string what;
  if (const auto* name = std::get_if<std::string>(&target)) {
    what = "'" + printable(*name) + "'";
  } else if (const auto* given = std::get_if<int>(&target)) {
    what = "id " + std::to_string(*given);
  } else {
    what = std::get<WorkerInfo>(target).describe();
  }
  throw InvalidArgument("rpc: unknown worker " + what + "; known workers: [" + list + "]");
}

int GroupDirectory::id_of(const std::string& name) const {
  return lookup(Destination(name), nullptr).value_or(-1);
}

const DeviceRoute* GroupDirectory::route_to(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= routes_to_.size()) return nullptr;
  return &routes_to_[static_cast<size_t>(id)];
}

const DeviceRoute* GroupDirectory::route_back(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= routes_back_.size()) return nullptr;
  return &routes_back_[static_cast<size_t>(id)];
}

bool GroupDirectory::same_namespace(int id) const {
  MutexLock lock(mutable_mutex_);
  return id >= 0 && static_cast<size_t>(id) < same_namespace_.size() &&
         same_namespace_[static_cast<size_t>(id)];
}

std::vector<std::string> GroupDirectory::transports_of(int id) const {
  MutexLock lock(mutable_mutex_);
  if (id < 0 || static_cast<size_t>(id) >= transports_.size()) return {"tcp"};
  return transports_[static_cast<size_t>(id)];
}

const std::optional<LoanTableAddress>& GroupDirectory::readable(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= readable_.size()) return kNotReadable;
  return readable_[static_cast<size_t>(id)];
}

bool GroupDirectory::lends_to(int id) const {
  return id >= 0 && static_cast<size_t>(id) < lend_to_.size() && lend_to_[static_cast<size_t>(id)];
}

}  // namespace gradwire::rpc::detail
