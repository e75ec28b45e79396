// gradwire-store: a standalone TCPStore server, for jobs whose workers should not host it.
//
//   gradwire-store [--port N] [--host ADDR] [--max-key-bytes N] [--max-value-bytes N]
//                  [--max-connections N] [--max-keys N] [--max-total-bytes N]
//                  [--max-parked-waits N] [--unsent-high-water-bytes N]
//                  [--slow-client-timeout-ms N] [--journal FILE] [--journal-fsync]
//
// --journal FILE keeps an append-only record of every change, so that the store restarted
// with the same file has every key back (clients reconnect on their next call);
// --journal-fsync makes each batch of changes reach the disk (fdatasync) before its
// replies. The limits are TCPStoreServerOptions' (docs/c10d.md, docs/security.md). The job's
// secret, if any, comes from GRADWIRE_SECRET or GRADWIRE_SECRET_FILE (docs/security.md).
// Prints "gradwire-store listening on port N" once it accepts connections (so a launcher
// that passed --port 0 can read the port), and serves until SIGINT or SIGTERM.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/env.h"
#include "gradwire/core/error.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: gradwire-store [--port N] [--host ADDR] [--max-key-bytes N] "
               "[--max-value-bytes N]\n"
               "                      [--max-connections N] [--max-keys N] "
               "[--max-total-bytes N] [--max-parked-waits N]\n"
               "                      [--unsent-high-water-bytes N] "
               "[--slow-client-timeout-ms N] [--journal FILE] [--journal-fsync]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  gradwire::c10d::TCPStoreServerOptions options;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--help" || flag == "-h") return usage(), 0;
      if (flag == "--journal-fsync") {
        options.journal_fsync = true;
        continue;
      }
      if (i + 1 >= argc) return usage();
      const std::string value = argv[++i];
      if (flag == "--port") {
        options.port = static_cast<uint16_t>(gradwire::parse_int("--port", value, 0, 65535));
      } else if (flag == "--host") {
        options.bind_host = value;
      } else if (flag == "--journal") {
        options.journal = value;
      } else if (flag == "--max-key-bytes") {
        options.max_key_bytes =
            static_cast<uint32_t>(gradwire::parse_int("--max-key-bytes", value, 1, 16 << 20));
      } else if (flag == "--max-value-bytes") {
        options.max_value_bytes =
            static_cast<uint32_t>(gradwire::parse_int("--max-value-bytes", value, 1, 1 << 30));
      } else if (flag == "--max-connections") {
        options.max_connections =
            static_cast<uint32_t>(gradwire::parse_int(flag, value, 1, 1 << 24));
      } else if (flag == "--max-keys") {
        options.max_keys = static_cast<uint64_t>(gradwire::parse_int(flag, value, 1, INT64_MAX));
      } else if (flag == "--max-total-bytes") {
        options.max_total_bytes =
            static_cast<uint64_t>(gradwire::parse_int(flag, value, 1, INT64_MAX));
      } else if (flag == "--max-parked-waits") {
        options.max_parked_waits =
            static_cast<uint32_t>(gradwire::parse_int(flag, value, 1, UINT32_MAX));
      } else if (flag == "--unsent-high-water-bytes") {
        options.unsent_high_water_bytes =
            static_cast<uint64_t>(gradwire::parse_int(flag, value, 2, INT64_MAX));
      } else if (flag == "--slow-client-timeout-ms") {
        options.slow_client_timeout =
            std::chrono::milliseconds(gradwire::parse_int(flag, value, 1, INT64_MAX));
      } else {
        return usage();
      }
    }
    // Block the stop signals before the loop thread starts, so that it inherits the mask
    // and sigwait below is the only place they are received.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    gradwire::c10d::TCPStoreServer server(options);
    std::printf("gradwire-store listening on port %u\n", static_cast<unsigned>(server.port()));
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    std::fprintf(stderr, "gradwire-store: %s, stopping\n", strsignal(sig));
  } catch (const gradwire::Error& e) {
    std::fprintf(stderr, "gradwire-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
