#include "gradwire/c10d/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/check.h"
#include "gradwire/core/env.h"
#include "gradwire/core/net.h"

namespace gradwire::c10d {

namespace {

struct Url {
  std::string scheme;
  std::string rest;  // between "://" and '?'
  std::map<std::string, std::string> query;
};

std::string percent_decode(std::string_view text, const std::string& url) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%') {
      GRADWIRE_CHECK_ARG(i + 2 < text.size() &&
                         std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
                         std::isxdigit(static_cast<unsigned char>(text[i + 2])))
          << "rendezvous: bad percent escape in '" << url << "'";
      out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

Url parse_url(const std::string& url) {
  Url u;
  const size_t sep = url.find("://");
  GRADWIRE_CHECK_ARG(sep != std::string::npos && sep > 0)
      << "rendezvous: '" << url << "' is not a URL (expected env://, tcp://host:port?... or "
      << "file:///path?...)";
  u.scheme = url.substr(0, sep);
  std::string tail = url.substr(sep + 3);
  const size_t q = tail.find('?');
  u.rest = percent_decode(tail.substr(0, q), url);
  if (q != std::string::npos) {
    std::string_view query(tail);
    query.remove_prefix(q + 1);
    while (!query.empty()) {
      const size_t amp = query.find('&');
      std::string_view item = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      GRADWIRE_CHECK_ARG(eq != std::string_view::npos && eq > 0)
          << "rendezvous: query parameter '" << item << "' in '" << url << "' is not name=value";
      u.query[std::string(item.substr(0, eq))] = percent_decode(item.substr(eq + 1), url);
    }
  }
  return u;
}

// A required integer from the URL's query: the parameter if present, else `fallback` (what
// the environment says, -1 when it says nothing), whose absence is reported as `missing`.
int64_t required_int(const Url& u, const std::string& param, int64_t fallback,
                     const std::string& missing, int64_t min, int64_t max, const std::string& url) {
  auto it = u.query.find(param);
  if (it != u.query.end())
    return parse_int("rendezvous parameter '" + param + "'", it->second, min, max);
  GRADWIRE_CHECK_ARG(fallback >= 0) << "rendezvous '" << url << "': " << missing;
  return fallback;
}

// A variable's value when it is set and not blank.
std::optional<std::string> env_value(const char* name) {
  std::optional<std::string> raw = env_raw(name);
  if (!raw || raw->find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  return raw;
}

int env_number(const char* name, int64_t min) {
  std::optional<std::string> raw = env_value(name);
  return raw ? static_cast<int>(parse_int(name, *raw, min, 1 << 24)) : -1;
}

// "node[01-03]" -> {"node01", "node02", "node03"}; one entry, without top-level commas.
void expand_entry(const std::string& entry, const std::string& list,
                  std::vector<std::string>& out) {
  constexpr size_t kMaxHosts = 1'000'000;
  auto bad = [&](const std::string& why) {
    GRADWIRE_THROW(InvalidArgument) << "Slurm node list '" << list << "' is malformed: " << why;
  };
  std::vector<std::string> names{""};
  size_t i = 0;
  while (i < entry.size()) {
    if (entry[i] == ']') bad("']' without '['");
    if (entry[i] != '[') {
      const size_t next = entry.find_first_of("[]", i);
      const std::string text = entry.substr(i, next == std::string::npos ? next : next - i);
      for (std::string& n : names)
        n += text;
      i = next == std::string::npos ? entry.size() : next;
      continue;
    }
    const size_t close = entry.find(']', i);
    if (close == std::string::npos) bad("'[' without ']'");
    const std::string inside = entry.substr(i + 1, close - i - 1);
    if (inside.find('[') != std::string::npos) bad("nested '['");
    if (inside.empty()) bad("empty brackets in '" + entry + "'");
    std::vector<std::string> parts;
    size_t from = 0;
    for (;;) {
      const size_t comma = inside.find(',', from);
      const std::string part =
          inside.substr(from, comma == std::string::npos ? comma : comma - from);
      if (part.empty()) bad("empty range in '[" + inside + "]'");
      const size_t dash = part.find('-');
      const std::string lo = part.substr(0, dash);
      const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
      auto digits = [](const std::string& t) {
        return !t.empty() && t.size() <= 9 &&
               t.find_first_not_of("0123456789") == std::string::npos;
      };
      if (!digits(lo) || !digits(hi)) bad("'" + part + "' is not a number or a range A-B");
      const long a = std::stol(lo);
      const long b = std::stol(hi);
      if (a > b) bad("range '" + part + "' runs backwards");
      if (static_cast<size_t>(b - a) >= kMaxHosts) bad("more than 1000000 hosts");
      // Leading zeros give every number of the range the same width ("08-10": 08 09 10).
      const size_t width = lo.size() > 1 && lo[0] == '0' ? lo.size() : 0;
      for (long v = a; v <= b; ++v) {
        std::string text = std::to_string(v);
        if (text.size() < width) text.insert(0, width - text.size(), '0');
        parts.push_back(std::move(text));
        if (parts.size() > kMaxHosts) bad("more than 1000000 hosts");
      }
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
    if (names.size() * parts.size() + out.size() > kMaxHosts) bad("more than 1000000 hosts");
    std::vector<std::string> grown;
    grown.reserve(names.size() * parts.size());
    for (const std::string& n : names) {
      for (const std::string& p : parts)
        grown.push_back(n + p);
    }
    names = std::move(grown);
    i = close + 1;
  }
  for (std::string& n : names) {
    if (n.empty()) bad("an empty host name");
    out.push_back(std::move(n));
  }
}

// The first host of the Slurm job (or step), when this process runs inside one.
std::string slurm_master() {
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (std::optional<std::string> list = env_value(name)) {
      try {
        return expand_slurm_nodelist(*list).front();
      } catch (const InvalidArgument& e) {
        GRADWIRE_THROW(InvalidArgument) << name << ": " << e.what();
      }
    }
  }
  return "";
}

// ---- claims of ranks and of the world size (see the header)

// Who this process is, as a claim stores it: a line to compare, then one to show.
struct Claimant {
  std::string identity;
  std::string description;
  std::string text() const { return identity + "\n" + description; }
};

Claimant claimant(int rank, int world_size) {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  const std::string host_id = net::host_id();
  const std::string netns = std::to_string(net::network_namespace_id());
  const std::string pid = std::to_string(::getpid());
  std::string id = host_id + " " + netns + " " + pid;
  for (char& c : id) {
    if (c == '\n') c = ' ';
  }
  return {id, "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " on host '" +
                  std::string(name) + "' (pid " + pid + ")"};
}

// Splits a stored claim into its identity and description.
std::pair<std::string, std::string> split_claim(const std::string& text) {
  const size_t nl = text.find('\n');
  if (nl == std::string::npos) return {text, text};
  return {text.substr(0, nl), text.substr(nl + 1)};
}

constexpr const char* kAdvice =
    "; --nproc-per-node must be equal on every node, or use gradwire-run --rdzv-endpoint";

// The claims of one launch: a restart (RESTART_COUNT) or a new launcher generation
// (GRADWIRE_RUN_GENERATION) may meet on the same store with new processes. gradwire-run
// starts a new generation for every restart of the whole group, and gives a worker it
// restarts alone (to rejoin the running group) its own RESTART_COUNT: under the launcher
// the generation alone names the launch.
std::string claim_prefix() {
  auto part = [](const char* name) {
    std::optional<std::string> v = env_value(name);
    return v ? *v : std::string("0");
  };
  if (env_value("GRADWIRE_RUN_GENERATION")) {
    return "__gradwire/rendezvous/" + part("GRADWIRE_RUN_GENERATION") + "/";
  }
  return "__gradwire/rendezvous/0." + part("RESTART_COUNT") + "/";
}

// Tells a worker that hosts the store and found a conflict that this one has read it, so
// that it may take the store away (see claim).
void acknowledge_error(Store& store, const std::string& prefix) {
  const int64_t seen = store.add(prefix + "error_seen", 1);
  store.set(prefix + "error_seen/" + std::to_string(seen), "1");
}

// How a worker enters its job (see the header): with the initial group, in place of a lost
// worker (rejoin), or into a running elastic group past the initial ranks (join); and
// whether the store is hosted by rank 0 or, outside the workers, by their launcher.
struct Entry {
  bool rejoin = false;
  bool join = false;
  bool store_hosted = false;
};

// Claims `rank` and the world size; throws InvalidArgument naming both claims on a
// conflict, after recording it under "error" for rank 0, which waits for everyone (a
// joining worker's conflict is its own: the running group is not told).
//
// `hosts_store`: this process hosts the store's server, which goes away with it; it then
// stays, at most `linger`, until the workers already waiting have read the conflict.
void claim(Store& store, int rank, int world_size, const Entry& entry, bool hosts_store,
           std::chrono::milliseconds linger) {
  const std::string prefix = claim_prefix();
  const Claimant me = claimant(rank, world_size);
  store.add(prefix + "arrived", 1);
  auto fail = [&](const std::string& message) {
    if (entry.join) GRADWIRE_THROW(InvalidArgument) << message;
    try {
      store.compare_set(prefix + "error", {}, to_bytes(message));
      if (!hosts_store) {
        acknowledge_error(store, prefix);
      } else {
        // Every other worker that has arrived reads the conflict (or finds its own) and
        // says so; none can finish the rendezvous without this one.
        const auto until = std::chrono::steady_clock::now() + linger;
        for (int64_t others = store.add(prefix + "arrived", 0) - 1; others > 0;) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
              until - std::chrono::steady_clock::now());
          if (left.count() <= 0) break;
          store.wait({prefix + "error_seen/" + std::to_string(others)}, left);
          const int64_t now = store.add(prefix + "arrived", 0) - 1;
          if (now == others) break;
          others = now;
        }
      }
    } catch (const std::exception&) {
      // The worker's own error is what matters; the others then time out or lose the store.
    }
    GRADWIRE_THROW(InvalidArgument) << message;
  };
  const std::string world_text = std::to_string(world_size) + "\n" + me.description;
  const std::string world_held =
      to_string(store.compare_set(prefix + "world_size", {}, to_bytes(world_text)));
  if (world_held != world_text) {
    const auto [held_size, held_by] = split_claim(world_held);
    if (held_size != std::to_string(world_size)) {
      fail("rendezvous: this worker, " + me.description +
           ", was told WORLD_SIZE=" + std::to_string(world_size) + ", but " + held_by +
           " was told WORLD_SIZE=" + held_size + kAdvice);
    }
  }
  const std::string key = prefix + "rank/" + std::to_string(rank);
  const std::string held = to_string(store.compare_set(key, {}, to_bytes(me.text())));
  if (held == me.text()) return;
  const auto [held_id, held_by] = split_claim(held);
  if (held_id == me.identity) return;  // this process, meeting again on the same store
  if (entry.rejoin) {
    store.set(key, me.text());
    return;
  }
  fail("rendezvous: rank " + std::to_string(rank) + " is claimed twice: by " + held_by +
       " and by this worker, " + me.description +
       (entry.join ? "; a worker joining a running group needs a rank nobody in the job held "
                     "(gradwire-run hands out fresh ones)"
                   : kAdvice));
}

RendezvousResult tcp_rendezvous(const std::string& host, uint16_t port, int rank, int world_size,
                                const Entry& entry, std::chrono::milliseconds timeout) {
  TCPStoreOptions options;
  options.host = host;
  options.port = port;
  // A store hosted outside the workers (GRADWIRE_STORE_HOSTED=1) outlives any of them.
  options.is_master = rank == 0 && !entry.store_hosted;
  options.world_size = world_size;
  options.timeout = timeout;
  options.connect_timeout = timeout;
  auto store = std::make_shared<TCPStore>(options);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  claim(*store, rank, world_size, entry, options.is_master,
        std::min(timeout, std::chrono::milliseconds(5000)));
  // Every worker counts itself in once its claims hold; the last one marks the job
  // complete; each waits for that mark, or for a conflict another worker found (so that
  // every worker of a misconfigured job reports it, not only the one that found it).
  // A replacement, or a worker joining a running elastic group, enters a job that has met
  // (or meets without it): it does not count in.
  if (entry.rejoin || entry.join) return {store, rank, world_size};
  const std::string prefix = claim_prefix();
  if (store->add(prefix + "joined", 1) == world_size) store->set(prefix + "ready", "1");
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      store->wait({prefix + "ready"},
                  std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(200)));
      return {store, rank, world_size};
    } catch (const TimeoutError&) {
      if (store->check({prefix + "error"})) {
        const std::string message = store->get_string(prefix + "error", timeout);
        acknowledge_error(*store, prefix);
        GRADWIRE_THROW(InvalidArgument) << message;
      }
      if (left.count() <= 200) {
        GRADWIRE_THROW(TimeoutError)
            << "rendezvous at " << host << ":" << store->port() << ": only "
            << store->add(prefix + "joined", 0) << " of " << world_size
            << " workers connected within " << timeout.count() << " ms";
      }
    }
  }
}

// The entry flags: the environment's (GRADWIRE_RPC_REJOIN, GRADWIRE_RPC_JOIN,
// GRADWIRE_STORE_HOSTED), overridden by the URL's query (rejoin, join, store_hosted).
Entry entry_of(const Url& u) {
  auto flag = [&](const char* variable, const std::string& param) {
    bool value = env_bool(variable, false);
    if (auto it = u.query.find(param); it != u.query.end()) {
      value = parse_bool("rendezvous parameter '" + param + "'", it->second);
    }
    return value;
  };
  return Entry{.rejoin = flag("GRADWIRE_RPC_REJOIN", "rejoin"),
               .join = flag("GRADWIRE_RPC_JOIN", "join"),
               .store_hosted = flag("GRADWIRE_STORE_HOSTED", "store_hosted")};
}

}  // namespace

RendezvousResult rendezvous(const std::string& url, std::chrono::milliseconds timeout) {
  GRADWIRE_CHECK_ARG(timeout.count() > 0)
      << "rendezvous: timeout must be positive, got " << timeout.count() << " ms";
  const Url u = parse_url(url);
  const bool from_env = u.scheme == "env";
  LaunchEnv launch;
  if (from_env) launch = launch_env();
  auto missing = [&](const std::string& param, const std::string& variable) {
    if (!from_env) return "missing query parameter '" + param + "'";
    if (launch.launcher.empty()) {
      return "environment variable " + variable + " is not set (nor " +
             (param == "rank" ? "OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID"
                              : "OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS") +
             ")";
    }
    return "environment variable " + variable + " is not set";
  };
  const int world_size = static_cast<int>(
      required_int(u, "world_size", launch.world_size,
                   missing("world_size", launch.world_size_variable), 1, 1 << 24, url));
  const int rank = static_cast<int>(
      required_int(u, "rank", launch.rank, missing("rank", launch.rank_variable), 0, 1 << 24, url));
  const Entry entry = entry_of(u);
  if (entry.join) {
    GRADWIRE_CHECK_ARG(rank >= world_size)
        << "rendezvous '" << url << "': a worker joining a running group (GRADWIRE_RPC_JOIN=1) "
        << "takes a rank past the initial group's, but rank " << rank << " is inside [0, "
        << world_size << ")";
  } else {
    GRADWIRE_CHECK_ARG(rank < world_size)
        << "rendezvous '" << url << "': rank " << rank << " is outside [0, " << world_size << ")";
  }

  if (from_env) {
    GRADWIRE_CHECK_ARG(u.rest.empty())
        << "rendezvous '" << url << "': env:// takes no host or path (it reads MASTER_ADDR)";
    GRADWIRE_CHECK_ARG(!launch.master_addr.empty())
        << "rendezvous '" << url << "': environment variable MASTER_ADDR is not set"
        << (launch.launcher == "open-mpi" || launch.launcher == "pmi"
                ? " (an MPI launcher does not say which host is the master: pass it, e.g. "
                  "mpirun -x MASTER_ADDR=<first host>)"
                : "");
    return tcp_rendezvous(launch.master_addr, launch.master_port, rank, world_size, entry, timeout);
  }
  if (u.scheme == "tcp") {
    // host:port, host may be a bracketed IPv6 literal.
    std::string host;
    std::string port_text;
    if (!u.rest.empty() && u.rest.front() == '[') {
      const size_t close = u.rest.find(']');
      GRADWIRE_CHECK_ARG(close != std::string::npos && close + 1 < u.rest.size() &&
                         u.rest[close + 1] == ':')
          << "rendezvous '" << url << "': expected tcp://[ipv6]:port";
      host = u.rest.substr(1, close - 1);
      port_text = u.rest.substr(close + 2);
    } else {
      const size_t colon = u.rest.rfind(':');
      GRADWIRE_CHECK_ARG(colon != std::string::npos && colon > 0)
          << "rendezvous '" << url << "': expected tcp://host:port";
      host = u.rest.substr(0, colon);
      port_text = u.rest.substr(colon + 1);
    }
    const auto port = static_cast<uint16_t>(parse_int("tcp:// port", port_text, 1, 65535));
    return tcp_rendezvous(host, port, rank, world_size, entry, timeout);
  }
  if (u.scheme == "file") {
    GRADWIRE_CHECK_ARG(!u.rest.empty() && u.rest.front() == '/')
        << "rendezvous '" << url << "': expected file:///absolute/path";
    FileStoreOptions options;
    options.path = u.rest;
    options.num_workers = world_size;
    options.timeout = timeout;
    auto store = std::make_shared<FileStore>(options);
    claim(*store, rank, world_size, entry, false, std::chrono::milliseconds(0));
    return {store, rank, world_size};
  }
  GRADWIRE_THROW(InvalidArgument) << "rendezvous: unknown scheme '" << u.scheme << "' in '" << url
                                  << "' (expected env, tcp or file)";
}

LaunchEnv launch_env() {
  LaunchEnv e;
  auto read = [&](const char* launcher, const char* rank, const char* size, const char* local) {
    e.launcher = launcher;
    e.rank_variable = rank;
    e.world_size_variable = size;
    e.rank = env_number(rank, 0);
    e.world_size = env_number(size, 1);
    if (local != nullptr) e.local_rank = env_number(local, 0);
  };
  if (env_value("RANK") || env_value("WORLD_SIZE")) {
    read("env", "RANK", "WORLD_SIZE", "LOCAL_RANK");
    e.node_rank = env_number("GROUP_RANK", 0);
  } else if (env_value("OMPI_COMM_WORLD_RANK")) {
    read("open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK");
  } else if (env_value("PMI_RANK")) {
    // Hydra (MPICH, Intel MPI) also says each process's rank on its node.
    read("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID");
  } else if (env_value("SLURM_PROCID")) {
    read("slurm", "SLURM_PROCID",
         env_value("SLURM_NTASKS") || !env_value("SLURM_NPROCS") ? "SLURM_NTASKS" : "SLURM_NPROCS",
         "SLURM_LOCALID");
    e.node_rank = env_number("SLURM_NODEID", 0);
  }
  if (std::optional<std::string> addr = env_value("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else {
    e.master_addr = slurm_master();
  }
  if (std::optional<std::string> port = env_value("MASTER_PORT")) {
    e.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", *port, 1, 65535));
  }
  return e;
}

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  std::string list = nodelist;
  const size_t begin = list.find_first_not_of(" \t\r\n");
  list = begin == std::string::npos
             ? ""
             : list.substr(begin, list.find_last_not_of(" \t\r\n") - begin + 1);
  GRADWIRE_CHECK_ARG(!list.empty()) << "Slurm node list is empty";
  std::vector<std::string> hosts;
  // Entries are separated by commas outside brackets.
  int depth = 0;
  size_t from = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (depth < 0) {
      GRADWIRE_THROW(InvalidArgument)
          << "Slurm node list '" << list << "' is malformed: ']' without '['";
    }
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      const std::string entry = list.substr(from, i - from);
      if (entry.empty()) {
        GRADWIRE_THROW(InvalidArgument)
            << "Slurm node list '" << list << "' is malformed: an empty entry";
      }
      expand_entry(entry, list, hosts);
      from = i + 1;
    }
  }
  return hosts;
}

std::string master_host(const Store* store) {
  while (const auto* prefixed = dynamic_cast<const PrefixStore*>(store))
    store = prefixed->underlying_store().get();
  if (const auto* tcp = dynamic_cast<const TCPStore*>(store); tcp != nullptr) {
    return tcp->host().empty() ? "127.0.0.1" : tcp->host();
  }
  return launch_env().master_addr;
}

}  // namespace gradwire::c10d
