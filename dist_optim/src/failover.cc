// ServerFailover (failover.h): a trainer's references and optimizer made again after a
// parameter server's loss, once its replacement answers.
#include "gradwire/dist_optim/failover.h"

#include <algorithm>
#include <sstream>
#include <thread>
#include <utility>

#include "gradwire/core/check.h"
#include "gradwire/core/error_kind_of.h"
#include "gradwire/core/logging.h"
#include "step_lock.h"

namespace gradwire::dist_optim {

using Clock = std::chrono::steady_clock;

void FailoverOptions::validate() const {
  GRADWIRE_CHECK_ARG(rejoin_timeout.count() > 0)
      << "dist_optim: FailoverOptions.rejoin_timeout must be > 0, got " << rejoin_timeout.count()
      << " ms";
  GRADWIRE_CHECK_ARG(probe_timeout.count() > 0)
      << "dist_optim: FailoverOptions.probe_timeout must be > 0, got " << probe_timeout.count()
      << " ms";
  GRADWIRE_CHECK_ARG(max_probe_interval.count() > 0)
      << "dist_optim: FailoverOptions.max_probe_interval must be > 0, got "
      << max_probe_interval.count() << " ms";
  GRADWIRE_CHECK_ARG(max_recoveries >= 1)
      << "dist_optim: FailoverOptions.max_recoveries must be >= 1, got " << max_recoveries;
}

bool is_worker_loss(const std::exception_ptr& error) {
  if (error == nullptr) return false;
  if (error_kind_of(error) == ErrorKind::kNetwork) return true;
  try {
    std::rethrow_exception(error);
  } catch (const RemoteError& e) {
    return e.remote_type() == error_kind_name(ErrorKind::kNetwork);
  } catch (...) {
    return false;
  }
}

namespace {

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// An owner that does not answer yet: it is gone, or its replacement is not up yet.
bool not_there_yet(const std::exception_ptr& error) {
  const ErrorKind kind = error_kind_of(error);
  return kind == ErrorKind::kNetwork || kind == ErrorKind::kTimeout || kind == ErrorKind::kBusy;
}

}  // namespace

ServerFailover::ServerFailover(rpc::RpcAgent& agent, Resolve resolve, MakeOptimizer make,
                               FailoverOptions options)
    : agent_(&agent), resolve_(std::move(resolve)), make_(std::move(make)), options_(options) {
  options_.validate();
  GRADWIRE_CHECK_ARG(resolve_ != nullptr)
      << "dist_optim: ServerFailover without a resolve function";
  GRADWIRE_CHECK_ARG(make_ != nullptr) << "dist_optim: ServerFailover without a make function";
  params_ = resolve_();
  optimizer_ = make_(params_);
  GRADWIRE_CHECK_ARG(optimizer_ != nullptr)
      << "dist_optim: ServerFailover's make function returned no optimizer";
  remember_owners();
}

ServerFailover::~ServerFailover() = default;

std::vector<int> ServerFailover::probe_owners(Clock::time_point deadline, const std::string& why) {
  std::vector<int> incarnations(owners_.size(), -1);
  std::chrono::milliseconds pause{10};
  for (;;) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < owners_.size(); ++i) {
      if (incarnations[i] >= 0) continue;
      try {
        incarnations[i] = static_cast<int>(
            agent_->rpc_sync<int64_t>(owners_[i].name, detail::kIncarnationFunction,
                                      rpc::CallOptions{.timeout = options_.probe_timeout}));
      } catch (...) {
        if (!not_there_yet(std::current_exception())) throw;
        missing.push_back(owners_[i].describe());
      }
    }
    if (missing.empty()) return incarnations;
    if (Clock::now() >= deadline) {
      std::ostringstream os;
      os << "dist_optim: ServerFailover: worker";
      for (const std::string& m : missing)
        os << " " << m;
      os << " did not answer within " << options_.rejoin_timeout.count()
         << " ms (no replacement rejoined); the step failed with: " << why;
      throw TimeoutError(os.str());
    }
    // The replacement is a process being started: a growing pause between tries.
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, options_.max_probe_interval);
  }
}

void ServerFailover::remember_owners() {
  owners_.clear();
  for (const auto& p : params_) {
    const rpc::WorkerInfo owner = p.owner();
    if (std::none_of(owners_.begin(), owners_.end(),
                     [&](const rpc::WorkerInfo& o) { return o.id == owner.id; })) {
      owners_.push_back(owner);
    }
  }
  incarnations_ = probe_owners(Clock::now() + options_.rejoin_timeout, "(none: asked at start)");
}

Recovery ServerFailover::recover(std::exception_ptr error) {
  if (!is_worker_loss(error)) std::rethrow_exception(error);
  const auto start = Clock::now();
  const auto deadline = start + options_.rejoin_timeout;
  for (;;) {
    const std::vector<int> now = probe_owners(deadline, message_of(error));
    Recovery recovery;
    for (size_t i = 0; i < owners_.size(); ++i) {
      if (now[i] <= incarnations_[i]) continue;
      recovery.replaced.push_back(owners_[i]);
      recovery.incarnations.push_back(now[i]);
    }
    // Every owner is the one it was: the step did not fail for a server's loss.
    if (recovery.replaced.empty()) std::rethrow_exception(error);
    try {
      std::vector<rref::RRef<Tensor>> params = resolve_();
      // Its shards on the lost incarnation are gone; on the others, the optimizer made next
      // is the same member of the same groups, so this one leaves none of them.
      if (optimizer_ != nullptr) optimizer_->left_ = true;
      optimizer_.reset();
      optimizer_ = make_(params);
      params_ = std::move(params);
      if (lr_.has_value()) optimizer_->set_lr(*lr_);
      remember_owners();
    } catch (...) {
      // Lost again while recovering: wait for the next replacement, within the deadline.
      std::exception_ptr again = std::current_exception();
      if (!is_worker_loss(again) || Clock::now() >= deadline) throw;
      error = again;
      continue;
    }
    recovery.took = Clock::now() - start;
    for (size_t i = 0; i < recovery.replaced.size(); ++i) {
      GRADWIRE_LOG(kInfo) << "dist_optim: " << agent_->worker_info().name
                          << " recovered from the loss of " << recovery.replaced[i].describe()
                          << " (now incarnation " << recovery.incarnations[i] << ") in "
                          << recovery.took.count() << " s";
    }
    recoveries_.push_back(recovery);
    return recovery;
  }
}

void ServerFailover::run(const std::function<void()>& step) {
  for (int recovered = 0;; ++recovered) {
    std::exception_ptr error;
    try {
      step();
      return;
    } catch (...) {
      error = std::current_exception();
    }
    if (!is_worker_loss(error) || recovered >= options_.max_recoveries)
      std::rethrow_exception(error);
    recover(error);
  }
}

DistributedOptimizer& ServerFailover::optimizer() {
  if (optimizer_ == nullptr) {
    throw Error("dist_optim: ServerFailover has no optimizer: its last recovery failed");
  }
  return *optimizer_;
}

double ServerFailover::group_lr(size_t group) const {
  if (group != 0) {
    throw InvalidArgument("dist_optim: no learning-rate group " + std::to_string(group) +
                          " (a ServerFailover's optimizer has one)");
  }
  if (optimizer_ == nullptr) {
    throw Error("dist_optim: ServerFailover has no optimizer: its last recovery failed");
  }
  return optimizer_->lr();
}

void ServerFailover::set_group_lrs(const std::vector<double>& lrs) {
  if (lrs.size() != 1) {
    throw InvalidArgument("dist_optim: " + std::to_string(lrs.size()) +
                          " learning rates for 1 group (a ServerFailover's optimizer has one)");
  }
  // Kept when a server's loss fails the call: the recovery sets it on the new optimizer.
  const std::optional<double> before = lr_;
  lr_ = lrs[0];
  try {
    optimizer().set_lr(lrs[0]);
  } catch (...) {
    if (!is_worker_loss(std::current_exception())) lr_ = before;
    throw;
  }
}

}  // namespace gradwire::dist_optim
