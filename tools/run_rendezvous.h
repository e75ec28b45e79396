// gradwire-run's rendezvous: how the launchers of a job's nodes meet on a TCPStore, agree
// on generations, and learn their node ranks and global rank offsets.
//
// The launcher that can bind the endpoint address hosts the store server in-process (the
// others, or every launcher when a standalone gradwire-store already listens there, are
// clients). All keys live under "/gradwire-run/<run-id>/":
//
//   gen                 the current generation G (a counter; 0 at first)
//   failures            generations that ended because a worker failed (a counter)
//   complete            set (to G) when every worker of generation G exited 0
//   g<G>/joined         arrivals in G (a counter); without --node-rank the value add()
//                       returns, minus one, is the node's rank
//   g<G>/slot<K>        with --node-rank K: claimed by the node that has it (a duplicate is
//                       refused)
//   g<G>/node<K>        node K's "<nproc> <advertised host> <host id>"
//   g<G>/closed         "<nodes> <failures>": the generation's membership, set once (first
//                       compare_set wins) when MAX nodes joined, or MIN joined and the last
//                       call window passed since
//   g<G>/master         "<addr> <port>": the workers' store, chosen by node 0
//   g<G>/hb<K>          node K's heartbeat, a number it raises every heartbeat_timeout/5
//   g<G>/waiting        set by a node that arrived after G closed and wants in
//   g<G>/stop           why G ends, set once: "failed <status> <reason>" (counted in
//                       `failures`) or "changed <reason>" (a node joined or left: not counted)
//   g<G>/advance        set once by the launcher that ends G: it counts a failure, then
//                       either raises `gen` or, past --max-restarts, sets `abandoned`
//   g<G>/next           set once that is done (the others wait for it)
//   abandoned           the failure that used up --max-restarts: every launcher exits
//   g<G>/done<K>        node K's workers all exited 0; g<G>/done_count counts them
//   g<G>/exited<K>      node K's launcher saw the job end (the store's host waits for them)
//
// In an elastic role job (--role NAME:N) there is one generation, which never ends for a
// membership change; these keys add to it:
//
//   g<G>/roles<K>       node K's "<hosts the rendezvous store: 0|1> <name>:<count> ...": the
//                       lowest node that hosts the rendezvous store (else node 0) hosts the
//                       workers' store too, and publishes it in g<G>/master
//   g<G>/members        "<nodes in the job> <nodes that joined later> <writer>" (absent:
//                       the initial nodes, none joined later), changed only by compare_set
//                       from the value read: a node arriving after G formed joins only while
//                       fewer than MAX nodes are in the job, taking both numbers up by one
//                       (the K-th to join later is node <initial nodes> + K); a node that
//                       leaves gives its place back (the first g<G>/freed<K> add does)
//   g<G>/freed<K>       node K's place was given back (a counter; only its first add does it)
//   g<G>/late_ranks     RANKs handed to them (a counter over WORLD_SIZE)
//   g<G>/late_role/<R>  ROLE_RANKs of role R handed to them (a counter over R's initial count)
//   g<G>/left<K>        node K left the job (a signal, or a heartbeat that stopped): nobody
//                       waits for it, and nobody is stopped for it
//   g<G>/stop           only "failed ...": a worker of a critical role failed unrecovered
//
// Heartbeats carry no clock: a node is considered gone when its number has not changed for
// --rdzv-heartbeat-timeout as seen by the node watching it.
//
// Authentication: the store and its clients use the job's secret (run_secret.h). A secret
// the launcher made up for a single-node job guards the store only when this launcher hosts
// it; a store found elsewhere (a gradwire-store) is reached with the environment's secret.
//
// Thread-safety: one thread uses a Rendezvous.
// Errors: TimeoutError when a rendezvous does not complete within --rdzv-timeout (in a role
// job: when a node arriving after the job formed finds no place below MAX within it);
// NetworkError when the store cannot be reached (or goes away); InvalidArgument for a node
// rank another node already holds.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gradwire/c10d/tcp_store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "run_lifecycle.h"
#include "run_options.h"
#include "run_workers.h"

namespace gradwire::run {

class Rendezvous {
 public:
  // `own_secret`: the secret this launcher made up for a single-node job, required by the
  // store it hosts; empty: the environment's secret (GRADWIRE_SECRET, GRADWIRE_SECRET_FILE),
  // if any.
  Rendezvous(const Options& options, const std::string& own_secret);
  ~Rendezvous();

  // Whether this launcher hosts the store server.
  bool hosts_store() const { return server_ != nullptr; }
  // "host:port" of the store.
  std::string endpoint() const;

  // The launcher's lifecycle (run_lifecycle.h): join() drives it from kJoining to kRunning
  // (or kCompleted); the calls below apply the other events.
  Lifecycle::State state() const { return life_.state(); }

  // In kJoining: joins the next generation and returns what this node's workers are told
  // (kRunning); nullopt when the job completed before this node could join one
  // (kCompleted). Throws Error when the job is found abandoned (kAbandoned).
  std::optional<GroupPlan> join();

  // Called while the generation runs: raises this node's heartbeat and returns why the
  // generation must end, if it must (a stop set by anyone, a node waiting to join while
  // fewer than MAX run, a node whose heartbeat stopped).
  std::optional<std::string> watch();

  // Marks the generation failed because rank `rank` exited with `status` (in a role job: a
  // worker of a critical role, which ends the job).
  void fail(int rank, int status);
  // Marks the generation ended by a membership change (this node leaves: a signal;
  // kInterrupted). In a role job the node only records that it left: the others go on.
  void leave(const std::string& why);
  // Records that this node's workers all exited 0 (kFinished).
  void mark_done();
  // Whether every node's workers of the generation exited 0.
  bool all_done();
  // After the generation ended: the stop value ("failed <status> <why>" or "changed <why>").
  std::string stop_reason();
  // Generations ended by a failure so far.
  int64_t failures();
  // The generation's stop is set and this node's workers have ended (kEnding).
  void ended();
  // In kEnding: moves the job to the next generation (whoever is first does it for all;
  // kJoining). Returns false when the job is abandoned instead: a failure past
  // --max-restarts (kAbandoned).
  bool advance();
  // Marks the job complete (every node's workers exited 0; kCompleted).
  void complete();
  // Says this launcher is leaving; the store's host waits (bounded) for the others.
  void finish();

 private:
  std::string key(const std::string& name) const;
  std::string gkey(const std::string& name) const;
  int64_t counter(const std::string& name, int64_t delta = 0);
  void try_close(int64_t nodes);
  void beat();

  // One join() call: its deadline, and this node's place in the generation being joined.
  struct Joining {
    std::chrono::steady_clock::time_point deadline;
    int index = -1;  // -1: none (the generation closed before this node arrived)
    int nodes = 0;   // the generation's membership, once it closed
    int64_t failures = 0;
  };
  // join()'s steps, one per state: each applies the event that ends its state.
  void arrive(Joining& j);           // kJoining
  void gather(Joining& j);           // kGathering
  void wait_next(const Joining& j);  // kLate
  // Whether the job is complete or abandoned.
  bool job_ended();
  std::optional<GroupPlan> plan_group(const Joining& j);  // kPlanning
  GroupPlan make_plan(const Joining& j, const std::vector<c10d::Bytes>& values) const;
  // The details every node of G published (node<K>, in a role job roles<K> too, and
  // master), read within the heartbeat timeout; node `j.index` publishes the master.
  std::vector<c10d::Bytes> details(const Joining& j);

  // An elastic role job's steps.
  bool roles() const { return options_.elastic_roles(); }
  void publish_roles(int index);
  // Starts the workers' store here; its "<address> <port>" for g<G>/master.
  std::string host_worker_store();
  // kLate: joins the running generation with fresh numbers (kPlanning, then kRunning), once
  // it has a place below MAX (wait_for_place); nullopt when G was stopped or the job ended
  // meanwhile (the node then waits as a late one does).
  std::optional<GroupPlan> join_running(Joining& j);
  // The plan of this node's workers from every initial node's details; `late`: the ranks
  // are fresh numbers past the initial group's.
  GroupPlan make_role_plan(const Joining& j, const std::vector<c10d::Bytes>& values, bool late);
  // Nodes of the job so far: the initial ones and those that joined later (those that
  // left included: their numbers are never handed out again).
  int members();
  // g<G>/members as stored, "" while absent.
  std::string read_members();
  // A value for g<G>/members that no other write can equal (this launcher's token and count).
  std::string next_members(int in_job, int joined_later);
  // Takes a place in the running job if it has fewer than MAX nodes (one atomic step on
  // g<G>/members): this node's number, initial nodes + its order among those that joined
  // later; nullopt when MAX nodes are in the job.
  std::optional<int> take_place();
  // Gives node k's place back once it left (a signal, or a heartbeat that stopped); only the
  // first caller for k does, whoever it is.
  void free_place(int k);
  // kLate in a role job: take_place(), waiting (said once on stderr) while the job runs MAX
  // nodes; nullopt when G is stopped or the job ends meanwhile. Throws TimeoutError past
  // --rdzv-timeout, Interrupted on a signal.
  std::optional<int> wait_for_place(const Joining& j);
  // "--nnodes MIN:MAX" (or "--nnodes N") as given.
  std::string nnodes_flag() const;
  // watch() in a role job: G's stop, and nodes whose heartbeat stopped (recorded as left).
  std::optional<std::string> watch_members();
  // The heartbeats of the nodes in seen_, "" for one not published yet.
  std::vector<std::string> heartbeats();
  bool has_left(int k);
  // Throws TimeoutError naming `waiting_for` once the join's deadline passed.
  void check_deadline(const Joining& j, const std::string& waiting_for) const;
  // Throws Interrupted (kInterrupted) when a signal is pending.
  void check_signal();

  const Options& options_;
  Lifecycle life_;
  std::unique_ptr<c10d::TCPStoreServer> server_;
  // A role job's workers' store, when this launcher hosts it.
  std::unique_ptr<c10d::TCPStoreServer> worker_store_;
  std::string own_secret_;
  std::unique_ptr<c10d::TCPStore> store_;
  std::string prefix_;
  std::string advertised_;
  std::string host_id_;
  std::string token_;  // this launcher, for the keys set once

  int64_t gen_ = 0;
  int node_rank_ = 0;
  int num_nodes_ = 0;
  int64_t beat_ = 0;
  std::chrono::steady_clock::time_point next_beat_{};
  // Other nodes' last heartbeat value and when it last changed, seen from here.
  std::map<int, std::pair<std::string, std::chrono::steady_clock::time_point>> seen_;
  // In a role job: nodes known to have left.
  std::set<int> gone_;
  // Writes of g<G>/members by this launcher, to make each value unique.
  int64_t members_writes_ = 0;
};

}  // namespace gradwire::run
