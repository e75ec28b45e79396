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

// A worker's published record: its name, its address, its device maps, and where its loan
// table is (when it lends).
struct WorkerRecord {
  std::string name;
  std::string url;
  int cuda_devices{0};
  std::map<std::string, DeviceMap> device_maps;
  std::string boot_id;
  std::optional<LoanTableAddress> loans;
  int incarnation{0};
  std::string host_id;  // empty: the record does not say (an older worker)
  uint64_t netns{0};
  std::vector<std::string> transports;
};

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

int GroupDirectory::formed_size() const {
  const std::string me = "rpc agent " + self_.describe();
  // Rank 0 marks the generation right after entering it.
  std::string formed;
  try {
    formed = c10d::to_string(store_->get(key("elastic"), std::chrono::milliseconds(2'000)));
  } catch (const TimeoutError&) {
    throw InvalidArgument(me +
                          " was asked to join the running group, but that group is not "
                          "elastic: start its workers with AgentOptions::elastic "
                          "(GRADWIRE_RPC_ELASTIC=1)");
  }
  int size = 0;
  try {
    size = std::stoi(formed);
  } catch (const std::exception&) {
  }
  if (size < 1 || size > capacity_) {
    throw InvalidArgument(me + ": the store's mark of the running group's size is '" +
                          printable(formed) + "', not a size in [1, " + std::to_string(capacity_) +
                          "]; is another program using the same store?");
  }
  return size;
}

void GroupDirectory::enter_running_generation() {
  const std::string me = "rpc agent " + self_.describe();
  const int64_t started = store_->add("rpc/starts/0", 0);
  if (started < 1) {
    throw InvalidArgument(me +
                          " was asked to join a running group (join_running), but no group "
                          "has started on this store");
  }
  prefix_ = "rpc/" + std::to_string(started) + "/";
  world_size_ = formed_size();
  const std::string rank_text = std::to_string(self_.id);
  if (self_.id < world_size_) {
    throw InvalidArgument(me + " cannot join the running group under rank " + rank_text +
                          ": the group formed with ranks 0.." + std::to_string(world_size_ - 1) +
                          ", and a lost one is replaced with AgentOptions::rejoin");
  }
  // Ranks are never reused: a rank that a worker joined under stays its own.
  const std::string held = c10d::to_string(
      store_->compare_set(key("joined/" + rank_text), {}, c10d::to_bytes(self_.name)));
  if (held != self_.name) {
    throw InvalidArgument(me + " cannot join the running group under rank " + rank_text +
                          ": worker '" + printable(held) + "' joined under it already");
  }
  // A later replacement of this rank (AgentOptions::rejoin) finds the generation here.
  store_->set("rpc/starts/" + rank_text, std::to_string(started));
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

// ---- elastic membership

std::vector<int> GroupDirectory::roster() const {
  std::vector<int> ranks;
  if (!store_->check({key("roster")})) return ranks;
  std::istringstream in(c10d::to_string(store_->get(key("roster"), join_timeout_)));
  for (std::string word; in >> word;) {
    int rank = -1;
    try {
      rank = std::stoi(word);
    } catch (const std::exception&) {
    }
    // Only a joiner's rank: anything else is not this group's writing.
    if (rank >= world_size_ && rank < slots_ &&
        std::find(ranks.begin(), ranks.end(), rank) == ranks.end())
      ranks.push_back(rank);
  }
  return ranks;
}

std::vector<int> GroupDirectory::members_in_store() const {
  std::vector<int> ranks;
  for (int r = 0; r < world_size_; ++r)
    ranks.push_back(r);
  if (!elastic()) return ranks;
  for (int r : roster())
    ranks.push_back(r);
  std::erase_if(ranks, [&](int r) { return r != self_.id && gone_in_store(r); });
  return ranks;
}

bool GroupDirectory::gone_in_store(int rank) const {
  const std::string rank_text = std::to_string(rank);
  if (store_->check({key("left/" + rank_text)})) return true;
  if (!store_->check({key("lost/" + rank_text)})) return false;
  // Lost in the incarnation that holds the rank now: a replacement counts again.
  const std::string lost = c10d::to_string(store_->get(key("lost/" + rank_text), join_timeout_));
  const int64_t current = store_->add(key("incarnation/" + rank_text), 0);
  try {
    return std::stoll(lost) >= current;
  } catch (const std::exception&) {
    return false;
  }
}

void GroupDirectory::mark_lost(int rank) const {
  if (!elastic() || rank < 0 || rank >= slots_) return;
  int incarnation = 0;
  {
    MutexLock lock(mutable_mutex_);
    incarnation = incarnations_[static_cast<size_t>(rank)];
  }
  const std::string lost_key = key("lost/" + std::to_string(rank));
  // The newest incarnation anyone saw lost stays: a slower worker's older news never
  // overwrites it.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const c10d::Bytes before =
        store_->check({lost_key}) ? store_->get(lost_key, join_timeout_) : c10d::Bytes{};
    if (!before.empty()) {
      try {
        if (std::stoll(c10d::to_string(before)) >= incarnation) return;
      } catch (const std::exception&) {
      }
    }
    const c10d::Bytes held =
        store_->compare_set(lost_key, before, c10d::to_bytes(std::to_string(incarnation)));
    if (c10d::to_string(held) == std::to_string(incarnation)) return;
  }
}

void GroupDirectory::adopt_roster() {
  // Workers that formed the group and have left it since, or were lost and not replaced.
  for (int r = 0; r < world_size_; ++r) {
    if (r != self_.id && gone_in_store(r)) {
      if (store_->check({key("left/" + std::to_string(r))})) {
        mark_left(r);
      } else {
        apply(r, PresenceEvent::kLose);
      }
    }
  }
  for (int r : roster()) {
    const std::string rec_key = key("worker/" + std::to_string(r));
    if (!store_->check({rec_key})) continue;  // it is publishing: met later
    const WorkerRecord rec = parse_record(c10d::to_string(store_->get(rec_key, join_timeout_)), r);
    {
      MutexLock lock(mutable_mutex_);
      adopt(r, rec);
    }
    // One that has left already is known by name, as gone; one lost, as lost.
    if (store_->check({key("left/" + std::to_string(r))})) {
      mark_left(r);
    } else if (gone_in_store(r)) {
      apply(r, PresenceEvent::kLose);
    }
  }
}

std::optional<WorkerInfo> GroupDirectory::discover(int rank, std::chrono::milliseconds timeout) {
  if (!elastic() || rank < world_size_ || rank >= slots_) return std::nullopt;
  const std::string rank_text = std::to_string(rank);
  try {
    const WorkerRecord rec =
        parse_record(c10d::to_string(store_->get(key("worker/" + rank_text), timeout)), rank);
    bool adopted = false;
    {
      MutexLock lock(mutable_mutex_);
      adopted = adopt(rank, rec);
    }
    // A joiner that has left already is known by name, as gone, and is not met.
    if (store_->check({key("left/" + rank_text)})) {
      mark_left(rank);
      return std::nullopt;
    }
    if (!adopted) return std::nullopt;
    const WorkerInfo met = workers_[static_cast<size_t>(rank)];
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": " << met.describe()
                        << " joined the group";
    if (on_met_) on_met_(met);
    return met;
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": no joiner of rank " << rank
                        << " could be read from the store: " << e.what();
    return std::nullopt;
  }
}

std::optional<WorkerInfo> GroupDirectory::discover(const std::string& name,
                                                   std::chrono::milliseconds timeout) {
  if (!elastic() || !valid_worker_name(name)) return std::nullopt;
  const std::string name_key = key("name/" + name);
  try {
    if (!store_->check({name_key})) return std::nullopt;
    const int rank = std::stoi(c10d::to_string(store_->get(name_key, timeout)));
    return discover(rank, timeout);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": worker '" << name
                        << "' could not be looked up in the store: " << e.what();
    return std::nullopt;
  }
}

bool GroupDirectory::mark_left(int id) {
  if (id < 0 || id >= slots_) return false;
  MutexLock lock(mutable_mutex_);
  Presence& p = presence_[static_cast<size_t>(id)];
  const bool was_in = p == Presence::kMember || p == Presence::kLost;
  p = next(p, PresenceEvent::kLeave);
  return was_in;
}

void GroupDirectory::mark_leaving() const {
  store_->set(key("left/" + std::to_string(self_.id)), "1");
}

Presence GroupDirectory::apply(int id, PresenceEvent event) {
  if (id < 0 || id >= slots_) return Presence::kAbsent;
  MutexLock lock(mutable_mutex_);
  Presence& p = presence_[static_cast<size_t>(id)];
  p = next(p, event);
  return p;
}

Presence GroupDirectory::presence(int id) const {
  if (id < 0 || id >= slots_) return Presence::kAbsent;
  MutexLock lock(mutable_mutex_);
  return presence_[static_cast<size_t>(id)];
}

std::vector<WorkerInfo> GroupDirectory::workers() const {
  std::vector<WorkerInfo> out;
  MutexLock lock(mutable_mutex_);
  for (int id = 0; id < slots_; ++id) {
    const Presence p = presence_[static_cast<size_t>(id)];
    if (p == Presence::kMember || p == Presence::kLost)
      out.push_back(workers_[static_cast<size_t>(id)]);
  }
  return out;
}

Presence next(Presence presence, PresenceEvent event) {
  switch (event) {
    case PresenceEvent::kAdopt:
      return presence == Presence::kAbsent ? Presence::kMember : presence;
    case PresenceEvent::kLose:
      return presence == Presence::kMember ? Presence::kLost : presence;
    case PresenceEvent::kRejoin:
      return presence == Presence::kLost ? Presence::kMember : presence;
    case PresenceEvent::kLeave:
      return Presence::kLeft;
  }
  return presence;
}

const char* presence_name(Presence presence) {
  switch (presence) {
    case Presence::kAbsent:
      return "absent";
    case Presence::kMember:
      return "member";
    case Presence::kLost:
      return "lost";
    case Presence::kLeft:
      return "left";
  }
  return "?";
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

void GroupDirectory::wait_for_members(const std::string& prefix, Clock::time_point deadline,
                                      const std::string& what) const {
  constexpr std::chrono::milliseconds kLook{200};
  for (;;) {
    // Who the members are changes while this waits: a joiner counts from when it joined, a
    // worker that left stops counting.
    const std::vector<int> members = members_in_store();
    std::vector<std::string> keys;
    for (int r : members)
      keys.push_back(key(prefix + std::to_string(r)));
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      store_->wait(keys, std::clamp(left, std::chrono::milliseconds(1), kLook));
      if (members_in_store() == members) return;
    } catch (const TimeoutError&) {
      if (left > kLook) continue;
      std::string missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!store_->check({keys[i]}))
          missing += (missing.empty() ? "" : ", ") + describe_rank(members[i]);
      }
      throw TimeoutError("rpc agent " + self_.describe() + " waited " + ms_text(join_timeout_) +
                         " " + what + "; members that did not: [" + missing + "]");
    }
  }
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

// ---- admission of incoming connections

MemberState next(MemberState state, MemberEvent event) {
  switch (event) {
    case MemberEvent::kJoin:
      return state == MemberState::kUnjoined ? MemberState::kKnown : state;
    case MemberEvent::kClaimNewer:
      return state == MemberState::kKnown ? MemberState::kRereading : state;
    case MemberEvent::kReread:
      return state == MemberState::kRereading ? MemberState::kKnown : state;
    case MemberEvent::kClose:
      return MemberState::kClosed;
  }
  return state;
}

MemberState& PeerAdmission::member(int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= members_.size()) return outsiders_;
  return members_[static_cast<size_t>(rank)];
}

void PeerAdmission::apply_to_all(MemberEvent event) {
  for (MemberState& state : members_)
    state = next(state, event);
  outsiders_ = next(outsiders_, event);
}

PeerAdmission::Finding PeerAdmission::check(const Claim& claim) const {
  using Verdict = Finding::Verdict;
  const std::string who = "worker '" + printable(claim.name) + "' of rank " +
                          std::to_string(claim.rank) + ", incarnation " +
                          std::to_string(claim.incarnation);
  const int id = group_.id_of(claim.name);
  if (id < 0) {
    // Not a worker of this group: served as an outsider (rank -1), which speaks for nobody.
    if (claim.rank == -1) return {Verdict::kAdmit, ""};
    // An elastic group's joiner that this worker has not met: its record is read first.
    if (group_.elastic() && claim.rank >= group_.world_size() && claim.rank < group_.slots() &&
        group_.presence(claim.rank) == Presence::kAbsent)
      return {Verdict::kNewer, ""};
    if (group_.presence(claim.rank) == Presence::kLeft &&
        group_.worker(claim.rank).name == claim.name)
      return {Verdict::kRefuse, "it claims to be " + who + ", which has left the group"};
    return {Verdict::kRefuse,
            "it claims to be " + who + ", but no worker of this group has that name"};
  }
  if (claim.rank != id) {
    return {Verdict::kRefuse, "it claims to be " + who + ", but worker '" + claim.name +
                                  "' has rank " + std::to_string(id)};
  }
  const int current = group_.incarnation(id);
  if (claim.incarnation == current) return {Verdict::kAdmit, ""};
  if (claim.incarnation > current) return {Verdict::kNewer, ""};
  return {Verdict::kRefuse, "it claims to be " + who + ", which incarnation " +
                                std::to_string(current) + " has replaced"};
}

void PeerAdmission::verify(Claim claim, Done done) {
  Runner runner;
  std::string refused;
  {
    MutexLock lock(mutex_);
    switch (member(claim.rank)) {
      case MemberState::kUnjoined:
        waiting_.emplace_back(std::move(claim), std::move(done));
        return;
      case MemberState::kClosed:
        refused = closed_why_;
        break;
      case MemberState::kKnown:
      case MemberState::kRereading:
        runner = runner_;
        break;
    }
  }
  if (!refused.empty()) {
    done(refused);
    return;
  }
  decide(std::move(claim), std::move(done), runner);
}

void PeerAdmission::decide(Claim claim, Done done, const Runner& runner) {
  const Finding finding = check(claim);
  if (finding.verdict != Finding::Verdict::kNewer) {
    done(finding.why);
    return;
  }
  // A rank taken over since this worker last read its record (AgentOptions::rejoin): the
  // store says which incarnation holds it now. Read off the transport's thread, once per
  // rank at a time: claims that arrive meanwhile wait for the same read, so a flood of
  // claims costs one store read per rank, not one per connection.
  const int rank = claim.rank;
  {
    MutexLock lock(mutex_);
    MemberState& state = member(rank);
    state = next(state, MemberEvent::kClaimNewer);
    auto [it, first] = refreshing_.try_emplace(rank);
    it->second.emplace_back(std::move(claim), std::move(done));
    if (!first) return;
  }
  try {
    if (!runner) throw Error("nothing runs it");
    runner([this, rank] { reread(rank); });
  } catch (const std::exception& e) {
    std::vector<std::pair<Claim, Done>> refused;
    {
      MutexLock lock(mutex_);
      refused.swap(refreshing_[rank]);
      refreshing_.erase(rank);
      MemberState& state = member(rank);
      state = next(state, MemberEvent::kReread);
    }
    for (auto& [c, d] : refused)
      d("its claim of a newer incarnation cannot be checked now: " + std::string(e.what()));
  }
}

void PeerAdmission::reread(int rank) {
  if (group_.presence(rank) == Presence::kAbsent) {
    group_.discover(rank, refresh_timeout_);
  } else {
    group_.refresh(rank, refresh_timeout_);
  }
  std::vector<std::pair<Claim, Done>> decided;
  {
    MutexLock lock(mutex_);
    decided.swap(refreshing_[rank]);
    refreshing_.erase(rank);
    MemberState& state = member(rank);
    state = next(state, MemberEvent::kReread);
  }
  for (auto& [c, d] : decided) {
    const Finding after = check(c);
    const bool unmet = group_.presence(c.rank) == Presence::kAbsent;
    d(after.verdict != Finding::Verdict::kNewer ? after.why
      : unmet ? "it claims to be worker '" + printable(c.name) + "' of rank " +
                    std::to_string(c.rank) + ", which has not joined this group"
              : "it claims to be worker '" + printable(c.name) + "' of rank " +
                    std::to_string(c.rank) + " in incarnation " + std::to_string(c.incarnation) +
                    ", but the store's record of that rank holds incarnation " +
                    std::to_string(group_.incarnation(c.rank)));
  }
}

void PeerAdmission::open(Runner runner) {
  std::vector<std::pair<Claim, Done>> waiting;
  {
    MutexLock lock(mutex_);
    if (outsiders_ != MemberState::kUnjoined) return;
    apply_to_all(MemberEvent::kJoin);
    runner_ = runner;
    waiting.swap(waiting_);
  }
  for (auto& [claim, done] : waiting)
    decide(std::move(claim), std::move(done), runner);
}

void PeerAdmission::close(const std::string& why) {
  std::vector<std::pair<Claim, Done>> waiting;
  {
    MutexLock lock(mutex_);
    apply_to_all(MemberEvent::kClose);
    closed_why_ = why;
    runner_ = nullptr;
    waiting.swap(waiting_);
  }
  for (auto& [claim, done] : waiting)
    done(why);
}

}  // namespace gradwire::rpc::detail
