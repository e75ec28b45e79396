#include "gradwire/core/signals.h"

#include <signal.h>

#include <mutex>

#include "gradwire/core/logging.h"

namespace gradwire {

void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGPIPE, &ignore, nullptr);
      GRADWIRE_LOG(kDebug) << "SIGPIPE is now ignored (a lost peer is an error, not a signal)";
    }
  });
}

}  // namespace gradwire
