// rendezvous(url): how a worker finds its store, its rank and the size of its job.
//
//   env://                                   the launcher's environment (below)
//   tcp://host:port?rank=R&world_size=N      a TCPStore at host:port
//   file:///path?rank=R&world_size=N         a FileStore at /path
//
// env:// reads what the launcher that started this process says (launch_env(), first match
// wins):
//
//   gradwire-run, torchrun, by hand   RANK, WORLD_SIZE (LOCAL_RANK, GROUP_RANK)
//   Open MPI's mpirun                  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                                      OMPI_COMM_WORLD_LOCAL_RANK
//   MPICH / Intel MPI (Hydra, PMI)     PMI_RANK, PMI_SIZE (MPI_LOCALRANKID)
//   Slurm's srun                       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//                                      SLURM_NODEID
//
// The MPI variables are read before Slurm's because an MPI launcher run inside a Slurm
// allocation leaves the batch script's SLURM_PROCID=0 in every process it starts. The
// master is MASTER_ADDR, else (inside a Slurm job) the first host of SLURM_STEP_NODELIST /
// SLURM_JOB_NODELIST, expanded from Slurm's compressed syntax ("node[01-03,07],gpu5" ->
// node01); its port is MASTER_PORT, else kDefaultMasterPort (29500).
//
// For env:// and tcp://, rank 0 hosts the TCPStore server (listening on every interface
// at the given port), and every worker waits until all world_size workers have connected
// and claimed their ranks (at most `timeout`). With GRADWIRE_STORE_HOSTED=1 (query
// parameter store_hosted=1; gradwire-run sets it in elastic role jobs) the server is
// hosted outside the workers (by their launcher): no worker hosts it, every one is a client,
// and the store outlives any worker. Query parameters override the environment for
// env:// ("env://?rank=1"). The file:// store is removed when all world_size workers have
// destroyed theirs.
//
// Ranks never collide silently: each worker claims its rank and the job's world size in the
// store (under "__gradwire/rendezvous/", per launch: GRADWIRE_RUN_GENERATION under
// gradwire-run, else RESTART_COUNT), and a rank
// already claimed by another process, or a world size other than the one already claimed,
// fails that worker with InvalidArgument naming both claims (rank 0, waiting for the
// others, fails with the same message). A worker restarted alone to replace a lost one
// (query parameter rejoin=1, or GRADWIRE_RPC_REJOIN=1 as gradwire-run --restart-workers
// sets) takes its rank over instead, and returns without waiting for the others. A worker
// joining a running elastic group (query parameter join=1, or GRADWIRE_RPC_JOIN=1 as
// gradwire-run sets for a node that arrives after the group formed) has a rank at or past
// world_size (the initial group's size), claims it (a rank already held is refused, to this
// worker alone), and returns without counting in or waiting.
//
// Thread-safety: safe to call concurrently (it reads the environment, see env.h).
// Errors: InvalidArgument naming the variable or parameter that is missing or malformed
// (a rank outside [0, world_size), or inside it for a joining worker, a port outside [1, 65535], an
// unknown scheme, a Slurm node list that does not parse), or naming two claims of one rank or two
// world sizes; NetworkError / TimeoutError from connecting and waiting for the other workers.
//
// Example:
//   auto [store, rank, world_size] = rendezvous("env://");
//   // under sbatch + srun: SLURM_PROCID, SLURM_NTASKS and the job's first node are used
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/store.h"

namespace gradwire::c10d {

struct RendezvousResult {
  std::shared_ptr<Store> store;
  int rank{0};
  int world_size{0};
};

RendezvousResult rendezvous(const std::string& url,
                            std::chrono::milliseconds timeout = kDefaultStoreTimeout);

// MASTER_PORT when it is not set.
inline constexpr uint16_t kDefaultMasterPort = 29500;

// Where this process sits in its job, as its launcher's environment says. A field the
// launcher did not set is -1 (numbers) or empty (master_addr).
struct LaunchEnv {
  // Which variables were read: "env" (RANK/WORLD_SIZE: gradwire-run, torchrun or by hand),
  // "open-mpi", "pmi", "slurm"; empty when none of them is set.
  std::string launcher;
  int rank{-1};
  int world_size{-1};
  int local_rank{-1};
  int node_rank{-1};
  // MASTER_ADDR, else the first host of the Slurm job's node list; empty when neither.
  std::string master_addr;
  // MASTER_PORT, else kDefaultMasterPort.
  uint16_t master_port{kDefaultMasterPort};
  // The names of the variables rank and world_size come from (for error messages).
  std::string rank_variable{"RANK"};
  std::string world_size_variable{"WORLD_SIZE"};
};

// Reads the environment as env:// does (see the file comment); it never contacts anything.
// Throws InvalidArgument naming the variable for a malformed value (a rank that is not a
// number, a bad MASTER_PORT, a node list that does not parse); a missing one is left -1.
// Programs that need their rank before calling rendezvous (to name their worker) read it
// here, so that they follow the same launcher as the rendezvous.
LaunchEnv launch_env();

// Expands a Slurm host list ("node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5):
// comma-separated entries, each a name with zero or more bracketed lists of numbers and
// ranges (leading zeros kept: "[08-10]" -> 08 09 10). Throws InvalidArgument naming the
// list for an empty one, unbalanced brackets, a range that is not "A-B" with A <= B, or
// more than 1,000,000 hosts.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

// The host of the job's rendezvous master, from which a worker chooses the address it
// announces (net::advertised_host): the host `store` connects to when it is a TCPStore
// (seen through PrefixStores), else launch_env().master_addr; empty when neither is known
// (a FileStore or HashStore without MASTER_ADDR). `store` may be null. Never throws for a
// missing variable; InvalidArgument for a malformed one (as launch_env).
std::string master_host(const Store* store);

}  // namespace gradwire::c10d
