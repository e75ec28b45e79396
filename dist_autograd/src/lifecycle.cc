#include "lifecycle.h"

namespace gradwire::dist_autograd::internal {

std::optional<ContextPhase> next(ContextPhase state, ContextEvent event) {
  using S = ContextPhase;
  using E = ContextEvent;
  switch (event) {
    case E::kMake:
      if (state == S::kNone) return S::kOpen;
      break;
    case E::kBackward:
      if (state == S::kOpen) return S::kBackward;
      break;
    case E::kBackwardEnds:
      if (state == S::kBackward) return S::kOpen;
      if (state == S::kReleasing || state == S::kReleased) return state;
      break;
    case E::kRelease:
      if (state == S::kOpen || state == S::kBackward) return S::kReleasing;
      if (state == S::kNone) return S::kReleased;
      break;
    case E::kTold:
      if (state == S::kReleasing) return S::kReleased;
      break;
  }
  return std::nullopt;
}

std::optional<PassPhase> next(PassPhase state, PassEvent event) {
  using S = PassPhase;
  using E = PassEvent;
  switch (event) {
    case E::kStart:
      if (state == S::kNone) return S::kDiscovering;
      if (state == S::kDiscovering || state == S::kRunning) return state;
      break;
    case E::kDiscoveryOver:
      if (state == S::kDiscovering) return S::kRunning;
      if (state == S::kOver) return S::kOver;
      break;
    case E::kPartEnds:
      if (state == S::kDiscovering || state == S::kRunning) return S::kOver;
      if (state == S::kAborting) return S::kAbortedOver;
      break;
    case E::kReport:
      if (state == S::kDiscovering || state == S::kRunning || state == S::kOver)
        return S::kReported;
      if (state == S::kAborting || state == S::kAbortedOver) return S::kAbortedReported;
      break;
    case E::kSuperseded:
      if (state == S::kReported) return S::kNone;
      if (state == S::kAbortedReported) return S::kAborted;
      break;
    case E::kAbort:
      switch (state) {
        case S::kNone:
          return S::kAborted;
        case S::kDiscovering:
        case S::kRunning:
          return S::kAborting;
        case S::kOver:
          return S::kAbortedOver;
        case S::kReported:
          return S::kAbortedReported;
        default:
          break;
      }
      break;
  }
  return std::nullopt;
}

bool holds_part(PassPhase state) {
  switch (state) {
    case PassPhase::kDiscovering:
    case PassPhase::kRunning:
    case PassPhase::kOver:
    case PassPhase::kAborting:
    case PassPhase::kAbortedOver:
      return true;
    default:
      return false;
  }
}

bool aborted(PassPhase state) {
  switch (state) {
    case PassPhase::kAborting:
    case PassPhase::kAbortedOver:
    case PassPhase::kAbortedReported:
    case PassPhase::kAborted:
      return true;
    default:
      return false;
  }
}

std::string_view name(ContextPhase state) {
  switch (state) {
    case ContextPhase::kNone:
      return "none";
    case ContextPhase::kOpen:
      return "open";
    case ContextPhase::kBackward:
      return "backward";
    case ContextPhase::kReleasing:
      return "releasing";
    case ContextPhase::kReleased:
      return "released";
  }
  return "?";
}

std::string_view name(ContextEvent event) {
  switch (event) {
    case ContextEvent::kMake:
      return "make";
    case ContextEvent::kBackward:
      return "backward";
    case ContextEvent::kBackwardEnds:
      return "backward ends";
    case ContextEvent::kRelease:
      return "release";
    case ContextEvent::kTold:
      return "told";
  }
  return "?";
}

std::string_view name(PassPhase state) {
  switch (state) {
    case PassPhase::kNone:
      return "none";
    case PassPhase::kDiscovering:
      return "discovering";
    case PassPhase::kRunning:
      return "running";
    case PassPhase::kOver:
      return "over";
    case PassPhase::kReported:
      return "reported";
    case PassPhase::kAborting:
      return "aborting";
    case PassPhase::kAbortedOver:
      return "aborted over";
    case PassPhase::kAbortedReported:
      return "aborted reported";
    case PassPhase::kAborted:
      return "aborted";
  }
  return "?";
}

std::string_view name(PassEvent event) {
  switch (event) {
    case PassEvent::kStart:
      return "start";
    case PassEvent::kDiscoveryOver:
      return "discovery over";
    case PassEvent::kPartEnds:
      return "part ends";
    case PassEvent::kReport:
      return "report";
    case PassEvent::kSuperseded:
      return "superseded";
    case PassEvent::kAbort:
      return "abort";
  }
  return "?";
}

}  // namespace gradwire::dist_autograd::internal
