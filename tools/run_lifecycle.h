// gradwire-run's lifecycle: the states one launcher goes through in a job, generation
// after generation (docs/launcher.md, "The launcher as a state machine"). Lifecycle::next
// is the table; apply() is the one place where the launcher's state changes, and it refuses
// an event the table does not have for the current state.
//
// The rendezvous (run_rendezvous.h) applies the events of joining a generation and of
// moving the job on; the launcher's loop (gradwire_run.cc) those of its workers' ending.
// Errors that end the launcher (a rendezvous timeout, a store gone, a --node-rank another
// node holds) leave by exception from whatever state it is in, outside the table.
//
// Thread-safety: none; one thread drives a launcher.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace gradwire::run {

class Lifecycle {
 public:
  enum class State {
    kJoining,      // reading the current generation G and taking a place in it
    kGathering,    // joined G; waiting for it to close (MAX nodes, or MIN and the last call)
    kLate,         // G runs without this node: it asked for G+1 and waits for it
    kPlanning,     // G closed with this node: learning the others' details and the workers'
                   // store
    kRunning,      // this node's workers of G run
    kFinished,     // this node's workers all exited 0; the other nodes' may still run
    kEnding,       // G ended (its stop is set): the job moves to G+1 or is abandoned
    kCompleted,    // the job is complete (every worker of a generation exited 0)
    kAbandoned,    // a failure past --max-restarts ended the job
    kInterrupted,  // SIGINT or SIGTERM reached the launcher
  };
  enum class Event {
    kArrived,         // took a place in G below MAX (an arrival number, or the --node-rank slot)
    kTooLate,         // G closed before this node arrived, or without it
    kClosed,          // G closed with this node in it
    kNextOpened,      // late: G+1 opened, or the job ended
    kJoinRunning,     // late, in an elastic role job: takes fresh ranks in the running G
    kDetailsMissing,  // a node of G did not publish its details in time: G ends
    kPlanned,         // every node's details and the workers' store are known
    kSucceeded,       // this node's workers all exited 0
    kAllSucceeded,    // every node's workers of G exited 0
    kStopped,         // G's stop is set: a worker failed, or a node came or went
    kAdvanced,        // the job moved to G+1
    kAbandon,         // the job is (or was found) abandoned
    kComplete,        // the job was found complete
    kSignal,          // SIGINT or SIGTERM reached the launcher
  };

  // One row of the table: `event` in state `from` leads to state `to`.
  struct Transition {
    State from;
    Event event;
    State to;
  };
  // The table (docs/launcher.md shows it row for row). kCompleted, kAbandoned and
  // kInterrupted are final: no row leaves them.
  static constexpr Transition kTable[] = {
      {State::kJoining, Event::kArrived, State::kGathering},
      {State::kJoining, Event::kTooLate, State::kLate},
      {State::kJoining, Event::kComplete, State::kCompleted},
      {State::kJoining, Event::kAbandon, State::kAbandoned},
      {State::kGathering, Event::kClosed, State::kPlanning},
      {State::kGathering, Event::kTooLate, State::kLate},
      {State::kGathering, Event::kSignal, State::kInterrupted},
      {State::kLate, Event::kNextOpened, State::kJoining},
      {State::kLate, Event::kJoinRunning, State::kPlanning},
      {State::kLate, Event::kSignal, State::kInterrupted},
      {State::kPlanning, Event::kPlanned, State::kRunning},
      {State::kPlanning, Event::kDetailsMissing, State::kEnding},
      {State::kRunning, Event::kSucceeded, State::kFinished},
      {State::kRunning, Event::kStopped, State::kEnding},
      {State::kRunning, Event::kSignal, State::kInterrupted},
      {State::kFinished, Event::kAllSucceeded, State::kCompleted},
      {State::kFinished, Event::kStopped, State::kEnding},
      {State::kFinished, Event::kSignal, State::kInterrupted},
      {State::kEnding, Event::kAdvanced, State::kJoining},
      {State::kEnding, Event::kAbandon, State::kAbandoned},
  };

  // The state `event` leads to from `state`; nullopt when the table has no such row.
  static constexpr std::optional<State> next(State state, Event event) {
    for (const Transition& t : kTable) {
      if (t.from == state && t.event == event) return t.to;
    }
    return std::nullopt;
  }

  static constexpr const char* name(State state) {
    switch (state) {
      case State::kJoining:
        return "joining";
      case State::kGathering:
        return "gathering";
      case State::kLate:
        return "late";
      case State::kPlanning:
        return "planning";
      case State::kRunning:
        return "running";
      case State::kFinished:
        return "finished";
      case State::kEnding:
        return "ending";
      case State::kCompleted:
        return "completed";
      case State::kAbandoned:
        return "abandoned";
      case State::kInterrupted:
        return "interrupted";
    }
    return "?";
  }
  static constexpr const char* name(Event event) {
    switch (event) {
      case Event::kArrived:
        return "arrived";
      case Event::kTooLate:
        return "too late";
      case Event::kClosed:
        return "closed";
      case Event::kNextOpened:
        return "next opened";
      case Event::kJoinRunning:
        return "join running";
      case Event::kDetailsMissing:
        return "details missing";
      case Event::kPlanned:
        return "planned";
      case Event::kSucceeded:
        return "succeeded";
      case Event::kAllSucceeded:
        return "all succeeded";
      case Event::kStopped:
        return "stopped";
      case Event::kAdvanced:
        return "advanced";
      case Event::kAbandon:
        return "abandon";
      case Event::kComplete:
        return "complete";
      case Event::kSignal:
        return "signal";
    }
    return "?";
  }

  State state() const { return state_; }

  // Moves to next(state(), event). Throws std::logic_error, leaving the state as it was,
  // when the table has no such row: the launcher's code applied an event out of order.
  void apply(Event event) {
    const std::optional<State> to = next(state_, event);
    if (!to) {
      throw std::logic_error(std::string("gradwire-run: the launcher's lifecycle has no event '") +
                             name(event) + "' in state '" + name(state_) + "'");
    }
    state_ = *to;
  }

 private:
  State state_ = State::kJoining;
};

}  // namespace gradwire::run
