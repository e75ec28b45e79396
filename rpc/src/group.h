// GroupDirectory: who is in an rpc group and how to reach each worker, as the workers agree
// through a c10d::Store; and DeviceRoute, where the CUDA tensors sent to one worker land.
//
// Each worker publishes a record (name, address, CUDA device count, device maps, where its
// loan table is, its host id and network namespace, its transports) under "rpc/<n>/" in the store,
// n being how many groups this rank has started on that store: the n-th start of every rank forms
// the n-th group, so a later group never reads an earlier one's records or barriers. Names are
// claimed first-come; then every worker reads every record, and the workers that lend tensors to
// each other agree on who can read whose memory. The same store carries the graceful-shutdown
// barriers.
//
// Rejoining: a worker that was lost can be replaced by a new process under the same name and
// rank (join with `rejoin`). It joins the running generation instead of starting a new one,
// counts itself a new incarnation of the rank, and replaces the rank's record; the others
// read the new record when they next connect to the rank (refresh). A rejoined worker lends
// nothing: the others learnt who can read whose memory from its predecessor.
//
// Elastic groups (AgentOptions::elastic): the group is made with a capacity, the most worker
// ids it can hold, and every per-worker table is sized to it. The workers that start it form
// it as above, and rank 0 marks the generation elastic ("elastic" holds the world size it
// formed with). A worker that joins later (Entry::kJoinRunning) claims its unused rank in the
// running generation, publishes its record, and appends its rank to the generation's
// "roster"; the members adopt its record when they first meet it (discover). A worker that
// leaves marks "left/<rank>" and tells the members (mark_left); a worker lost in its current
// incarnation is marked "lost/<rank>" by those that saw it go (mark_lost). The shutdown
// barriers wait for the members of the moment: the starting ranks and the roster, less those
// that left or were lost and not replaced.
// Each worker's presence moves through next(Presence, PresenceEvent).
//
// Nothing here knows the transport: an address is an opaque string, a loan table a
// LoanTableAddress.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/core/mutex.h"
#include "gradwire/rpc/agent.h"
#include "tensorpipe/loans.h"

namespace gradwire::c10d {
class Store;
}  // namespace gradwire::c10d

namespace gradwire::rpc::detail {

// A worker's record in the store (group.cc writes and reads it): its name, its address, its device
// maps, and where its loan table is (when it lends).
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

// Parses the record the store holds for `rank`; InvalidArgument naming the rank and what is
// wrong.
WorkerRecord parse_record(const std::string& text, int rank);

// 1 to 128 characters from [A-Za-z0-9_.:-].
bool valid_worker_name(const std::string& name);

// Where the CUDA tensors of messages to one worker land: (device here, device there)
// pairs. CPU tensors stay on the CPU; a CUDA device without a pair is an InvalidArgument
// that names the map to fix: the sender's AgentOptions::device_maps for a request, the
// caller's map (read backwards) for a reply.
//
// Thread-safety: immutable.
class DeviceRoute {
 public:
  enum class Direction { kRequest, kReply };
  DeviceRoute(WorkerInfo peer, DeviceMap pairs, Direction direction)
      : peer_(std::move(peer)), pairs_(std::move(pairs)), direction_(direction) {}

  Device operator()(const Device& device) const;

 private:
  WorkerInfo peer_;
  DeviceMap pairs_;
  Direction direction_;
};

// The encoder's mapper for `route`; null (every tensor to the CPU) when `route` is. It holds
// only the pointer, which std::function keeps without allocating: the route must outlive
// the encoding.
DeviceMapper device_mapper(const DeviceRoute* route);

// The presence of one worker id in this worker's directory (docs/elastic.md has the table).
enum class Presence {
  kAbsent,  // no record adopted: not (yet) met, or no worker has the id
  kMember,  // a member: calls go to its record's address
  kLost,    // its connection was lost; a replacement may rejoin (AgentOptions::rejoin)
  kLeft,    // it left gracefully (or its store mark says so): never a member again
};
enum class PresenceEvent {
  kAdopt,   // its record was read and adopted (at start, or when a joiner is met)
  kLose,    // a connection to or from it was lost while both ran
  kRejoin,  // a newer incarnation's record replaced the lost one's
  kLeave,   // it announced that it left, or the store marks it gone
};
// The presence `event` moves `presence` to; events that do not apply leave it as it is.
Presence next(Presence presence, PresenceEvent event);
const char* presence_name(Presence presence);

// Thread-safety: join() and check_device_maps() run once, on the starting thread, before any
// other method. What a static group holds is then immutable; what an elastic group adds or
// marks (discover, mark_left, apply) is written under mutable_mutex_, and a worker's
// WorkerInfo, routes and loan entries are written once, before its id is published. Every
// const method may be called from any thread (the owner publishes the joined directory to
// other threads itself). barrier() only talks to the store and may run on any thread.
class GroupDirectory {
 public:
  using Clock = std::chrono::steady_clock;
  // How this worker enters the group.
  enum class Entry {
    kStart,        // it forms a new group with the other world_size workers
    kRejoin,       // it replaces a lost worker of the running group (AgentOptions::rejoin)
    kJoinRunning,  // it joins a running elastic group (AgentOptions::join_running)
  };

  // What this worker tells the others.
  struct Announcement {
    std::string url;
    int cuda_devices{0};
    std::map<std::string, DeviceMap> device_maps;
    // Direct copies: this worker's loan table (none when it lends nothing) and the boot id
    // of its host (processes of one boot can read each other's memory).
    std::optional<LoanTableAddress> loans;
    std::string boot_id;
    // Where it runs (net::host_id, net::network_namespace_id; 0: unknown) and the
    // transports it registered, so that each pair knows which transports can reach.
    std::string host_id;
    uint64_t netns{0};
    std::vector<std::string> transports;
  };

  // `join_timeout` bounds every wait for the other workers (join_timeout of AgentOptions).
  // `capacity` > 0 makes the group elastic, with ids below it; 0 a static group of
  // world_size.
  GroupDirectory(WorkerInfo self, int world_size, std::shared_ptr<c10d::Store> store,
                 std::chrono::milliseconds join_timeout, int capacity = 0);

  // Throws InvalidArgument ("<who>device_maps[...] ...") for a map that names an invalid
  // worker, maps a CPU device, or is not one-to-one, so replies can always find their way.
  static void validate_device_maps(const std::string& who,
                                   const std::map<std::string, DeviceMap>& device_maps);

  // Claims this worker's name, publishes `me`, waits for every worker and reads their
  // records; with `direct_copies`, also finds whose memory this worker can read and who can
  // read its own. Throws InvalidArgument for a name already taken or a bad record,
  // TimeoutError naming the workers that did not arrive within join_timeout.
  // With `rejoin`, replaces a lost worker of the running group instead (see the file
  // comment): InvalidArgument when no group has started on the store for this rank, or
  // the name is another rank's.
  void join(const Announcement& me, bool direct_copies, bool rejoin = false) {
    join(me, direct_copies, rejoin ? Entry::kRejoin : Entry::kStart);
  }
  // With Entry::kJoinRunning: joins the running elastic group under this worker's rank
  // (InvalidArgument when no group runs on the store, when it is not elastic, or when the
  // rank was used in it already) and reads every member's record.
  void join(const Announcement& me, bool direct_copies, Entry entry);

  // Elastic groups. Reads the record of the worker that joined under `rank` (or claimed
  // `name`) and adopts it; returns it when it became a member here now, nullopt when it was
  // one already, has no record (within `timeout`), has left, or the group is static.
  std::optional<WorkerInfo> discover(int rank, std::chrono::milliseconds timeout);
  std::optional<WorkerInfo> discover(const std::string& name, std::chrono::milliseconds timeout);
  // Worker `id` left: returns true when it was a member or lost until now.
  bool mark_left(int id);
  // This worker leaves: marks it in the store, so that the others' barriers stop counting it.
  void mark_leaving() const;
  // Elastic groups: worker `rank` was lost in its current incarnation; the store says so, and
  // the shutdown barriers stop counting it until a replacement rejoins. Talks to the store:
  // never on a transport's thread.
  void mark_lost(int rank) const;
  // Moves worker `id`'s presence (kLose, kRejoin: the agent's connections); returns it.
  Presence apply(int id, PresenceEvent event);
  Presence presence(int id) const;
  bool elastic() const { return capacity_ > 0; }
  // Told of every joiner this worker meets (discover), outside the lock; set before join().
  void set_on_met(std::function<void(const WorkerInfo&)> on_met) { on_met_ = std::move(on_met); }
  // The number of ids the tables hold: the capacity, or the world size.
  int slots() const { return slots_; }
  // Re-reads worker `id`'s record: its address and incarnation now. Returns the incarnation;
  // keeps what it knew when the store cannot be read within `timeout`.
  int refresh(int id, std::chrono::milliseconds timeout);
  // Checks this worker's device maps against the devices of both ends (after join):
  // InvalidArgument for a worker not in the group or a device one end lacks.
  void check_device_maps() const;
  // Waits until every worker has reached `phase` of a graceful shutdown, until `deadline`;
  // TimeoutError naming those that did not.
  void barrier(const std::string& phase, Clock::time_point deadline) const;
  // The last step of a graceful shutdown, after the last barrier: every worker marks that it
  // has passed it, and the worker whose process hosts the store (a TCPStore master, through
  // any PrefixStores) waits, at most until `deadline`, for every mark before it returns,
  // so that its process does not take the store away while another worker still waits
  // for the barrier's answer from it. Never throws: a late worker is logged.
  void depart(Clock::time_point deadline) const;
  // Whether this process hosts the store's server (a TCPStore master, through any
  // PrefixStores): it goes away with this worker.
  bool hosts_store() const;

  // After join. world_size: the workers the group formed with.
  int world_size() const { return world_size_; }
  // The members now (every worker of a static group), by id.
  std::vector<WorkerInfo> workers() const;
  // The worker `destination` names; InvalidArgument listing the known workers if none, or
  // saying that it left. An elastic group looks a name or id it has not met up in the store
  // (discover) before it refuses.
  WorkerInfo find(const Destination& destination) const;
  // The worker named `name` if it is a member (or lost), or -1.
  int id_of(const std::string& name) const;
  // Any id below slots() that has had a record (a member, lost or left).
  const WorkerInfo& worker(int id) const { return workers_[static_cast<size_t>(id)]; }
  std::string url(int id) const {
    MutexLock lock(mutable_mutex_);
    return urls_[static_cast<size_t>(id)];
  }
  // How many times worker `id`'s rank had been taken over before its current record (0:
  // the worker that started with the group); this worker's own.
  int incarnation(int id) const {
    MutexLock lock(mutable_mutex_);
    return incarnations_[static_cast<size_t>(id)];
  }
  int incarnation() const { return incarnation_; }
  // Routes of requests to, and replies back to, worker `id`: null when this worker has no
  // CUDA device (so no tensor needs mapping) or for an id outside the group.
  const DeviceRoute* route_to(int id) const;
  const DeviceRoute* route_back(int id) const;
  bool maps_devices() const { return cuda_devices_here_ > 0; }
  // Whether worker `id` runs on this worker's host (equal host ids) and in its network
  // namespace (equal, known namespace inodes): only then can transports that exist per
  // namespace (abstract Unix sockets: local, unix, shm) reach it. False for a record that
  // does not say (an older worker) and for an id outside the group; true for this worker.
  bool same_namespace(int id) const;
  // The transports worker `id` registered; {"tcp"} for a record that does not say.
  std::vector<std::string> transports_of(int id) const;
  // Direct copies: the loan table of a peer whose memory this worker can read, and whether
  // peer `id` can read this worker's (so it may be lent to).
  const std::optional<LoanTableAddress>& readable(int id) const;
  bool lends_to(int id) const;

 private:
  // join()'s steps. The generation this worker joins (prefix_; a rejoining worker's
  // incarnation_).
  void enter_generation(bool rejoin);
  // Entry::kJoinRunning's: the running generation, checked elastic, and this rank claimed.
  void enter_running_generation();
  // The size the running elastic group formed with (its "elastic" mark); InvalidArgument
  // when the group is not elastic or the mark is not a size.
  int formed_size() const;
  // Claims this worker's name (names are unique: the first rank to claim one keeps it) and
  // publishes its record.
  void claim_name_and_publish(const Announcement& me, bool rejoin);
  // Every starting worker's record, by rank, once all are published.
  std::vector<WorkerRecord> read_records(bool rejoin) const;
  // This worker's own view of itself, and every starting worker's record.
  void adopt_records(const Announcement& me, const std::vector<WorkerRecord>& records);
  // Adopts `record` as the member of rank `rank` (its name, address, transports, routes);
  // false when the rank was met before or has left.
  bool adopt(int rank, const WorkerRecord& record) GRADWIRE_REQUIRES(mutable_mutex_);
  // An elastic group's joiners and leavers, from the store: ranks in the roster, and of those
  // and the starting ranks the ones marked left.
  std::vector<int> roster() const;
  std::vector<int> members_in_store() const;
  // Whether the store marks `rank` gone: it left, or was lost in the incarnation holding it.
  bool gone_in_store(int rank) const;
  // Reads and adopts the records of the joiners in the roster (Entry::kJoinRunning, and a
  // starting worker of an elastic group before its barriers); marks those that left.
  void adopt_roster();
  // The member at `destination` (or lost), without asking the store; `left` gets the
  // description of a worker that left.
  std::optional<int> lookup(const Destination& destination, std::string* left) const;
  // "name (rank r)" of a worker met, else "rank r".
  std::string describe_rank(int rank) const;
  // Waits until every member of the moment has set `<prefix><rank>`, re-reading who the
  // members are between short waits (elastic groups; static ones wait_for_all).
  void wait_for_members(const std::string& prefix, Clock::time_point deadline,
                        const std::string& what) const;
  // Whose memory this worker can read (readable_); returns the direct-copy record saying so.
  std::string find_readable(const Announcement& me, const std::vector<WorkerRecord>& records,
                            bool direct_copies);
  // Publishes `can_read` and learns from the others' to whom this worker may lend.
  void agree_on_lenders(const std::string& can_read, bool direct_copies);
  // The store key of `name` in this group's generation.
  std::string key(const std::string& name) const { return prefix_ + name; }
  // Waits, at most `timeout`, for every rank's key `<prefix><rank>`; TimeoutError naming
  // the workers whose key is missing. `what`: what they did not do.
  void wait_for_all(const std::string& prefix, std::chrono::milliseconds timeout,
                    const std::string& what) const;
  // When this worker's group is not the first its rank started on the store and the
  // previous one's worker of this rank has not left: a sentence naming that worker (two
  // processes given one rank leave the second waiting alone); else "".
  std::string earlier_claim() const;
  // wait_for_all with join_timeout, then every rank's value, by rank.
  std::vector<std::string> gather(const std::string& prefix, const std::string& step) const;

  const WorkerInfo self_;
  int world_size_;  // a joiner learns it from the running group's "elastic" mark
  const std::shared_ptr<c10d::Store> store_;
  const std::chrono::milliseconds join_timeout_;
  const int capacity_;  // 0: static
  const int slots_;     // capacity_, or world_size_
  std::function<void(const WorkerInfo&)> on_met_;

  // Set by join, then constant (an elastic group's joiners: written once, under the lock,
  // before their id is published through ids_by_name_ or presence_).
  std::string prefix_;               // "rpc/<generation>/"
  std::vector<WorkerInfo> workers_;  // per id below slots_
  int incarnation_{0};
  // What a rejoining, joining or leaving worker changes: read under the lock.
  mutable Mutex mutable_mutex_;
  std::map<std::string, int, std::less<>> ids_by_name_ GRADWIRE_GUARDED_BY(mutable_mutex_);
  std::vector<Presence> presence_ GRADWIRE_GUARDED_BY(mutable_mutex_);
  std::vector<std::string> urls_ GRADWIRE_GUARDED_BY(mutable_mutex_);
  std::vector<int> incarnations_ GRADWIRE_GUARDED_BY(mutable_mutex_);
  std::vector<int> cuda_devices_;  // per worker id
  // Per worker id, from its record (a rejoined worker's is re-read by refresh): the
  // transports it registered, and whether it shares this worker's host and namespace.
  std::vector<std::vector<std::string>> transports_ GRADWIRE_GUARDED_BY(mutable_mutex_);
  std::vector<bool> same_namespace_ GRADWIRE_GUARDED_BY(mutable_mutex_);
  std::string host_id_;  // this worker's, as its record says it
  uint64_t netns_{0};
  int cuda_devices_here_{0};
  std::map<std::string, DeviceMap> device_maps_;  // this worker's own
  std::vector<DeviceRoute> routes_to_;            // per worker id; empty without CUDA here
  std::vector<DeviceRoute> routes_back_;
  std::vector<std::optional<LoanTableAddress>> readable_;
  std::vector<bool> lend_to_;
};

// The lifecycle of one member of the group as PeerAdmission sees it: whether a claim of that
// member's identity waits, is checked against its record, or is refused (docs/rpc.md, "The
// group directory"). Every move goes through next(); claims of a name that is no member's
// follow the same lifecycle, as one more member.
enum class MemberState {
  kUnjoined,   // the directory is not joined yet: claims wait for it
  kKnown,      // its record is read: a claim is checked against it at once
  kRereading,  // a claim named an incarnation newer than the record's: the record is being
               // re-read, and newer claims that arrive meanwhile wait for that read
  kClosed,     // the agent is closing: claims are refused (a read under way still decides
               // the claims that wait for it)
};

enum class MemberEvent {
  kJoin,        // the directory is joined (PeerAdmission::open)
  kClaimNewer,  // a claim names an incarnation newer than the record's
  kReread,      // the re-read of the record ended (refreshed, kept, or not started)
  kClose,       // PeerAdmission::close
};

// The state that `event` moves `state` to. An event that does not apply to a state (a
// re-read that ends after close, a join after close) leaves it as it is.
MemberState next(MemberState state, MemberEvent event);

// Which incoming connections an agent admits. Each connection's handshake claims a worker:
// its name, rank and incarnation (with a shared secret, authenticated by the handshake's
// MAC; without one, merely claimed). A claim of a worker of this group is admitted only
// under that worker's own rank and in the incarnation the store's record holds: an older
// one has been replaced, and a newer one is checked against the store (re-read) before it
// is believed. A name that is no worker's, with no rank (-1), is admitted as an outsider,
// which speaks for nobody (what it may do is for the modules above to decide). So a
// connection that the agent treats as worker W (and whose loss tells the listeners that W
// is lost) is one that W opened, or, without a secret, one whose claim the store's record
// backs.
//
// Claims that arrive before the directory is joined wait for it (the transports listen
// before the group is complete); close() refuses those still waiting and every later one.
//
// Thread-safety: every method may be called from any thread. `done` is never called with
// the object's lock held, and may be called on the calling thread.
class PeerAdmission {
 public:
  struct Claim {
    std::string name;
    int rank{-1};
    int incarnation{0};
  };
  using Done = std::function<void(std::string why)>;

  // `group` must outlive this object; `refresh_timeout` bounds a re-read of a record.
  PeerAdmission(GroupDirectory& group, std::chrono::milliseconds refresh_timeout)
      : group_(group),
        refresh_timeout_(refresh_timeout),
        members_(static_cast<size_t>(group.slots()), MemberState::kUnjoined) {}

  // Runs a task off the caller's thread (which may be a transport's loop), keeping what the
  // task uses alive; throws when it cannot.
  using Runner = std::function<void(std::function<void()> task)>;

  // Decides about `claim`: done("") admits it, done(why) refuses it (`why` names the claim
  // with its peer-supplied bytes escaped). A newer incarnation's store read runs through
  // the runner given to open().
  void verify(Claim claim, Done done);
  // The directory is joined: decides the claims that waited for it.
  void open(Runner runner);
  // Refuses the claims waiting and every later one, with `why`.
  void close(const std::string& why);

 private:
  // What check() finds of a claim against the directory's record of the member it names.
  struct Finding {
    enum class Verdict {
      kAdmit,   // it matches the record
      kRefuse,  // it cannot be that member: `why`
      kNewer,   // it claims a newer incarnation than the record's: re-read the record
    };
    Verdict verdict{Verdict::kAdmit};
    std::string why;
  };
  Finding check(const Claim& claim) const;
  void decide(Claim claim, Done done, const Runner& runner);
  // Re-reads the record of `rank` and decides the claims that waited for it.
  void reread(int rank);
  // The state of the member `rank` claims; ranks outside the group share one.
  MemberState& member(int rank) GRADWIRE_REQUIRES(mutex_);
  // Moves every member's state by `event`.
  void apply_to_all(MemberEvent event) GRADWIRE_REQUIRES(mutex_);

  GroupDirectory& group_;
  const std::chrono::milliseconds refresh_timeout_;
  Mutex mutex_;
  // Per rank of the group; then the one of every claim outside it.
  std::vector<MemberState> members_ GRADWIRE_GUARDED_BY(mutex_);
  MemberState outsiders_ GRADWIRE_GUARDED_BY(mutex_) = MemberState::kUnjoined;
  std::string closed_why_ GRADWIRE_GUARDED_BY(mutex_);
  Runner runner_ GRADWIRE_GUARDED_BY(mutex_);
  std::vector<std::pair<Claim, Done>> waiting_ GRADWIRE_GUARDED_BY(mutex_);
  // Per rank whose record is being re-read: the claims that wait for it.
  std::map<int, std::vector<std::pair<Claim, Done>>> refreshing_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace gradwire::rpc::detail
