#include "run_options.h"

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "gradwire/core/env.h"
#include "gradwire/core/error.h"

namespace gradwire::run {

const char* const kUsage =
    "usage: gradwire-run [--nproc-per-node N|auto] [--nnodes N|MIN:MAX]\n"
    "                    [--rdzv-endpoint HOST:PORT] [--rdzv-id ID] [--standalone]\n"
    "                    [--node-rank K] [--master-addr A] [--master-port P]\n"
    "                    [--rdzv-last-call T] [--rdzv-heartbeat-timeout T] [--rdzv-timeout T]\n"
    "                    [--max-restarts R] [--restart-workers W] [--grace-ms MS]\n"
    "                    [--log-dir DIR] [--tee 0|1|2|3] [--role NAME]\n"
    "                    [--role NAME:N[:critical] ...] [--no-prefix]\n"
    "                    [--] program [args...]\n"
    "(durations T: 500ms, 3s, 2m, or milliseconds)\n";

namespace {

int parse_int(const std::string& flag, const std::string& text, int min, int max) {
  size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < min || value > max) {
    throw UsageError(flag + " takes an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + text + "'");
  }
  return static_cast<int>(value);
}

std::chrono::milliseconds parse_duration(const std::string& flag, const std::string& text) {
  try {
    return gradwire::parse_duration_ms(flag, text);
  } catch (const gradwire::Error& e) {
    throw UsageError(e.what());
  }
}

// "HOST:PORT" or "[IPv6]:PORT".
void parse_endpoint(const std::string& text, std::string& host, int& port) {
  const std::string flag = "--rdzv-endpoint";
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw UsageError(flag + " '" + text + "' has no port: expected [ADDRESS]:PORT");
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      throw UsageError(flag + " '" + text + "' has no port: expected HOST:PORT");
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (host.empty()) throw UsageError(flag + " '" + text + "' has no host: expected HOST:PORT");
  port = parse_int(flag + " port", port_text, 1, 65535);
}

std::string resolve(const std::string& program) {
  auto executable = [](const std::string& path) { return ::access(path.c_str(), X_OK) == 0; };
  if (program.find('/') != std::string::npos) {
    if (!executable(program)) {
      throw UsageError("program '" + program + "' does not exist or is not executable");
    }
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    if (executable(dir + "/" + program)) return dir + "/" + program;
    start = end + 1;
  }
  throw UsageError("program '" + program + "' was not found on PATH (" + dirs + ")");
}

bool valid_run_id(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

int auto_nproc() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    // Set: it decides, even when empty (no GPU may be used).
    const std::string text = visible;
    int n = 0;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find(',', start);
      if (end == std::string::npos) end = text.size();
      const std::string entry = text.substr(start, end - start);
      // CUDA stops at the first invalid index ("-1" hides every device).
      if (entry.empty() || entry.rfind("-", 0) == 0) break;
      ++n;
      start = end + 1;
    }
    if (n > 0) return n;
  } else {
    std::error_code ec;
    int n = 0;
    for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec), end;
         !ec && it != end; it.increment(ec))
      ++n;
    if (n > 0) return n;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    return CPU_COUNT(&set);
  }
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

namespace {

// What the flags say that only their combination decides.
struct CommandLine {
  std::optional<std::string> endpoint;
  bool nproc_given = false;
  bool plain_role_given = false;
  std::optional<int> master_port;
  bool standalone = false;
  std::string nnodes_text;
};

// --nnodes N or MIN:MAX.
void parse_nnodes(const std::string& text, Options& o) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    o.min_nodes = o.max_nodes = parse_int("--nnodes", text, 1, 65536);
    return;
  }
  o.min_nodes = parse_int("--nnodes MIN", text.substr(0, colon), 1, 65536);
  o.max_nodes = parse_int("--nnodes MAX", text.substr(colon + 1), 1, 65536);
  if (o.min_nodes > o.max_nodes) {
    throw UsageError("--nnodes " + text + ": MIN " + std::to_string(o.min_nodes) +
                     " is above MAX " + std::to_string(o.max_nodes));
  }
}

// --role NAME:N[:critical], one role of an elastic role job.
RoleSpec parse_role(const std::string& text) {
  const size_t colon = text.find(':');
  RoleSpec r;
  r.name = text.substr(0, colon);
  if (!valid_run_id(r.name)) {
    throw UsageError("--role '" + text +
                     "': the role's name must be 1 to 128 letters, digits, '-', '_' or '.'");
  }
  std::string rest = text.substr(colon + 1);
  const size_t second = rest.find(':');
  if (second != std::string::npos) {
    const std::string flag = rest.substr(second + 1);
    if (flag != "critical") {
      throw UsageError("--role '" + text + "': expected NAME:N or NAME:N:critical, got '" + flag +
                       "' after the count");
    }
    r.critical = true;
    rest = rest.substr(0, second);
  }
  r.count = parse_int("--role " + r.name + " count", rest, 1, 4096);
  return r;
}

// Reads the flags into `o` and `c` up to the program, whose index it returns. It stays
// whole: one flat branch per flag, each a few lines.
int read_flags(int argc, char** argv, Options& o, CommandLine& c) {
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    std::string inline_value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      inline_value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      has_inline = true;
    }
    // torchrun spells its flags with underscores; both spellings are accepted.
    if (arg.rfind("--", 0) == 0) {
      for (size_t k = 2; k < arg.size(); ++k)
        if (arg[k] == '_') arg[k] = '-';
    }
    auto get = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "--nproc-per-node") {
      const std::string v = get();
      o.nproc_per_node = v == "auto" ? auto_nproc() : parse_int(arg, v, 1, 4096);
      c.nproc_given = true;
    } else if (arg == "--nnodes") {
      c.nnodes_text = get();
      parse_nnodes(c.nnodes_text, o);
    } else if (arg == "--node-rank") {
      o.node_rank = parse_int(arg, get(), 0, 65535);
    } else if (arg == "--rdzv-endpoint") {
      c.endpoint = get();
    } else if (arg == "--rdzv-id") {
      o.run_id = get();
      if (!valid_run_id(o.run_id)) {
        throw UsageError("--rdzv-id '" + o.run_id +
                         "' must be 1 to 128 letters, digits, '-', '_' or '.'");
      }
    } else if (arg == "--rdzv-backend") {
      const std::string v = get();
      if (v != "c10d" && v != "static") {
        throw UsageError("--rdzv-backend '" + v +
                         "' is not supported: gradwire-run meets on its own TCPStore (c10d)");
      }
    } else if (arg == "--standalone") {
      c.standalone = true;
    } else if (arg == "--master-addr") {
      o.master_addr = get();
      if (o.master_addr->empty()) throw UsageError("--master-addr is empty");
    } else if (arg == "--master-port") {
      c.master_port = parse_int(arg, get(), 1, 65535);
    } else if (arg == "--rdzv-last-call") {
      o.last_call = parse_duration(arg, get());
    } else if (arg == "--rdzv-heartbeat-timeout") {
      o.heartbeat_timeout = parse_duration(arg, get());
      if (o.heartbeat_timeout.count() < 100) {
        throw UsageError("--rdzv-heartbeat-timeout must be at least 100ms");
      }
    } else if (arg == "--rdzv-timeout") {
      o.rdzv_timeout = parse_duration(arg, get());
      if (o.rdzv_timeout.count() <= 0) throw UsageError("--rdzv-timeout must be positive");
    } else if (arg == "--max-restarts") {
      o.max_restarts = parse_int(arg, get(), 0, 1000);
    } else if (arg == "--restart-workers") {
      o.restart_workers = parse_int(arg, get(), 0, 1000);
    } else if (arg == "--grace-ms") {
      o.grace_ms = parse_int(arg, get(), 0, 3'600'000);
    } else if (arg == "--no-prefix") {
      o.prefix = false;
    } else if (arg == "--log-dir") {
      o.log_dir = get();
      if (o.log_dir.empty()) throw UsageError("--log-dir is empty");
    } else if (arg == "--tee") {
      o.tee = parse_int(arg, get(), 0, 3);
    } else if (arg == "--role") {
      const std::string v = get();
      if (v.empty()) throw UsageError("--role is empty");
      if (v.find(':') == std::string::npos) {
        o.role = v;
        c.plain_role_given = true;
      } else {
        o.roles.push_back(parse_role(v));
      }
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg.rfind("-", 0) == 0 && arg.size() > 1) {
      throw UsageError("unknown flag '" + std::string(argv[i]) + "'");
    } else {
      break;
    }
  }
  return i;
}

// The roles of an elastic role job: distinct names, and the flags they replace or exclude.
void check_roles(const CommandLine& c, Options& o) {
  if (o.roles.empty()) return;
  if (c.plain_role_given) {
    throw UsageError("--role " + o.role + " (one role of --nproc-per-node workers) and --role " +
                     o.roles.front().name +
                     ":N (an elastic role job) exclude each other: give every role a count");
  }
  if (c.nproc_given) {
    throw UsageError(
        "--nproc-per-node and --role NAME:N exclude each other: the roles' counts are the "
        "node's workers");
  }
  if (o.max_restarts > 0) {
    throw UsageError(
        "--max-restarts restarts every node's workers in a new generation, which an elastic "
        "role job never forms: use --restart-workers W to restart a failed worker alone");
  }
  int total = 0;
  for (size_t i = 0; i < o.roles.size(); ++i) {
    for (size_t k = 0; k < i; ++k) {
      if (o.roles[k].name == o.roles[i].name) {
        throw UsageError("--role " + o.roles[i].name + " is given twice");
      }
    }
    total += o.roles[i].count;
  }
  if (total > 4096) {
    throw UsageError("the roles' counts add up to " + std::to_string(total) +
                     " workers on this node; at most 4096");
  }
  o.nproc_per_node = total;
  o.role = o.roles.front().name;
}

// The flags' combinations: refused ones, and where the rendezvous store is.
void check_combinations(const CommandLine& c, Options& o) {
  check_roles(c, o);
  if (o.node_rank) {
    if (o.min_nodes != o.max_nodes) {
      throw UsageError("--node-rank needs a fixed --nnodes N, not " + c.nnodes_text +
                       " (elastic jobs number their nodes in arrival order)");
    }
    if (*o.node_rank >= o.max_nodes) {
      throw UsageError("--node-rank " + std::to_string(*o.node_rank) + " is not below --nnodes " +
                       std::to_string(o.max_nodes));
    }
  }
  if (c.standalone) {
    if (c.endpoint) throw UsageError("--standalone and --rdzv-endpoint exclude each other");
    if (o.max_nodes > 1) {
      throw UsageError("--standalone runs one node, but --nnodes is " + c.nnodes_text);
    }
  }
  if (c.endpoint) {
    if (c.master_port) {
      throw UsageError(
          "--master-port is for the static setup; with --rdzv-endpoint the workers' port is "
          "picked by node 0 in every generation");
    }
    parse_endpoint(*c.endpoint, o.rdzv_host, o.rdzv_port);
  } else if (o.max_nodes > 1) {
    if (!c.master_port) {
      throw UsageError("--nnodes " + c.nnodes_text +
                       " needs --rdzv-endpoint HOST:PORT (or --master-addr and --master-port): "
                       "every node must name the same");
    }
    o.rdzv_host = o.master_addr.value_or("127.0.0.1");
    o.rdzv_port = *c.master_port;
  } else {
    o.worker_port = c.master_port;  // one node: the workers meet where they were told
  }
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  if (const char* id = std::getenv("GRADWIRE_RUN_ID"); id != nullptr && *id != '\0') o.run_id = id;
  CommandLine c;
  for (int i = read_flags(argc, argv, o, c); i < argc; ++i)
    o.program.emplace_back(argv[i]);
  if (o.program.empty()) throw UsageError("no program to run");
  check_combinations(c, o);
  o.program[0] = resolve(o.program[0]);
  return o;
}

}  // namespace gradwire::run
