// The two lifecycles of dist_autograd on one worker, as state tables (docs/dist_autograd.md,
// "Lifecycle"): a context's (made, running a backward() of this worker, released) and a
// pass's (this worker's part in it, from its start to its report or abort).
//
// next() is each table: the state an event leads to, or nullopt when the table has no row
// for that state and event (the event is refused, and nothing changes). ContextState::apply
// is the one place that moves a context or a pass (context_state.h); everything else reads
// the state or turns what happens (a message, a part's end) into an event.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string_view>

namespace gradwire::dist_autograd::internal {

// A context as this worker holds it.
enum class ContextPhase {
  kNone,       // not held here: never made here (or released longer ago than it remembers)
  kOpen,       // in the table; no backward() of this worker runs in it
  kBackward,   // in the table; a backward() started here runs in it (one at a time)
  kReleasing,  // released here (out of the table); the workers it was told to are answering
  kReleased,   // released here and wherever it went from here (or they could not be told)
};

enum class ContextEvent {
  kMake,          // created here, or the first request in it from a participant arrives
  kBackward,      // backward() starts in it here
  kBackwardEnds,  // that backward() returns or throws
  kRelease,       // released here: its creator ends it, a Release comes, or a worker is lost
  kTold,          // every worker told of the release has answered (or could not be reached)
};

// This worker's part in one pass of a context.
enum class PassPhase {
  kNone,             // no part here: never started here, or reported before a later pass
  kDiscovering,      // the part runs; sends not yet named by a Discover are held
  kRunning,          // the part runs; discovery is over everywhere, nothing is held
  kOver,             // the part has ended (its outcome is set), not yet reported
  kReported,         // over and reported (Wait answered, or backward() returned): the
                     // context's last pass here, whose gradients an abort still takes back
  kAborting,         // aborted while its part ran: the part is failing
  kAbortedOver,      // aborted, and its part has ended; not yet reported
  kAbortedReported,  // aborted and reported: the context's last pass here
  kAborted,          // aborted, with no part here any more (or never one): refused from now on
};

enum class PassEvent {
  kStart,          // the initiator's backward(), or a Discover naming a send here
  kDiscoveryOver,  // discovery is over everywhere (the initiator's ended, or its Wait came)
  kPartEnds,       // the part's outcome is set (its task finished, or it failed)
  kReport,         // the part is reported: its Wait answered, or the initiator's backward ends
  kSuperseded,     // a later pass of the context is reported here
  kAbort,          // the pass is aborted (an Abort came, or it failed at its initiator)
};

std::optional<ContextPhase> next(ContextPhase state, ContextEvent event);
std::optional<PassPhase> next(PassPhase state, PassEvent event);

// Whether a pass in `state` holds its part's data here (task, sinks, outcome): started and
// not yet reported.
bool holds_part(PassPhase state);
// Whether a pass in `state` was aborted here.
bool aborted(PassPhase state);

// The names docs/dist_autograd.md's tables use ("open", "discovery over", ...).
std::string_view name(ContextPhase state);
std::string_view name(ContextEvent event);
std::string_view name(PassPhase state);
std::string_view name(PassEvent event);

}  // namespace gradwire::dist_autograd::internal
