// The two kinds of reference core: OwnerRRef (the value lives here) and UserRRef (a fork
// of another worker's value). See context.h.
#include "context.h"
#include "gradwire/core/error_kind_of.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "proto/rref.pb.h"

namespace gradwire::rref {

namespace {

// How much of a function or method name an error shows. The name a Create or a CallMethod
// carries is the caller's, and any bytes: it is quoted escaped (printable()).
constexpr size_t kShownNameBytes = 1024;

// "Future<Tensor>" -> "Tensor": a function replying later holds the same value.
std::string held_type(const std::string& result) {
  const std::string prefix = "Future<";
  if (result.size() > prefix.size() + 1 && result.compare(0, prefix.size(), prefix) == 0 &&
      result.back() == '>') {
    return result.substr(prefix.size(), result.size() - prefix.size() - 1);
  }
  return result;
}

// A creating call's failure as every later caller sees it: a mistake in the call stays an
// InvalidArgument (CallRejected); what the function threw becomes a RemoteError naming
// the owner, carrying the message.
std::exception_ptr as_remote(std::exception_ptr error, const WorkerInfo& self) {
  try {
    std::rethrow_exception(error);
  } catch (const CallRejected&) {
    return error;
  } catch (const RemoteError&) {
    return error;
  } catch (const Error& e) {
    return std::make_exception_ptr(
        RemoteError(self.name, std::string(error_kind_name(e.kind())), e.what()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(RemoteError(self.name, "Error", e.what()));
  } catch (...) {
    return std::make_exception_ptr(
        RemoteError(self.name, "Error", "an exception that is not a std::exception"));
  }
}

void check_agent(const CallContext& ctx, const rpc::RpcAgent& agent, const std::string& what) {
  if (ctx.agent() != nullptr && ctx.agent() != &agent) {
    throw InvalidArgument("rref: " + what + " belongs to worker " + agent.worker_info().describe() +
                          " and cannot travel in a message of " +
                          ctx.agent()->worker_info().describe());
  }
}

}  // namespace

// ---- OwnerRRef

OwnerRRef::OwnerRRef(std::shared_ptr<RRefContext> context, uint64_t rref_id, std::string type_name)
    : context_(std::move(context)), id_(rref_id), type_name_(std::move(type_name)) {}

OwnerRRef::~OwnerRRef() {
  bool placeholder = false;
  {
    MutexLock lock(mutex_);
    placeholder = !creating_;
  }
  // Calls that wait for a creation that never came (a placeholder let go when the last fork
  // that kept it went) end now instead of waiting on a value that no longer exists.
  ready_.try_set_error(std::make_exception_ptr(
      CallRejected("rref: " + describe() + " was released before its creation arrived")));
  context_->owner_destroyed(id_, placeholder);
}

rpc::RpcAgent& OwnerRRef::agent() const {
  return *context_->agent();
}

std::string OwnerRRef::describe() const {
  return "RRef " + id_text(id_) + " (" + type_name_ + ") owned by " + context_->self().describe();
}

bool OwnerRRef::creation_started() const {
  MutexLock lock(mutex_);
  return creating_;
}

bool OwnerRRef::begin_creation(const std::string& type_name) {
  MutexLock lock(mutex_);
  if (creating_) return false;
  if (type_name != type_name_) {
    throw CallRejected("rref: " + describe() + " was forked as " + type_name_ + " but created as " +
                       type_name);
  }
  creating_ = true;
  return true;
}

bool OwnerRRef::abandon(std::exception_ptr error) {
  {
    MutexLock lock(mutex_);
    if (creating_) return false;
    creating_ = true;
  }
  fail(std::move(error));
  return true;
}

CallRejected OwnerRRef::references_refused() const {
  return CallRejected("rref: " + describe() +
                      " cannot hold a value that contains references (RRefs inside a " +
                      type_name_ +
                      " are not counted as held by the owner); hold them in an object of a "
                      "registered class instead");
}

void OwnerRRef::fail(std::exception_ptr error) {
  error_ = as_remote(std::move(error), context_->self());
  ready_.try_set_error(error_);
}

void OwnerRRef::hold_object(const rpc::Registry::ClassInfo& info, std::shared_ptr<void> object) {
  {
    MutexLock lock(mutex_);
    object_ = std::move(object);
    object_type_ = info.type;
  }
  class_name_ = info.name;
  serialised_ = info.serialised;
  ready_.try_set_value();
}

void OwnerRRef::create(const CallContext& ctx, const std::string& name,
                       const std::vector<Value>& args) {
  try {
    rpc::Registry& registry = ctx.agent()->registry();
    const std::string shown = printable(name, kShownNameBytes);
    if (registry.has_class(name)) {
      const rpc::Registry::ClassInfo info = registry.class_info(name);
      if (name != type_name_) {
        throw CallRejected("rref: remote<" + type_name_ + ">('" + shown + "') on worker " +
                           context_->self().describe() + ": '" + shown + "' constructs a " + shown +
                           ", not a " + type_name_);
      }
      hold_object(info, registry.construct(ctx, name, args));
      return;
    }
    std::shared_ptr<const rpc::RegisteredFunction> fn = registry.find(name);
    if (fn == nullptr) {
      throw CallRejected("rref: remote<" + type_name_ + ">('" + shown + "'): worker " +
                         context_->self().describe() + " has no class or function named '" + shown +
                         "' (" + registry.unknown_function(name).what() + ")");
    }
    const std::string result = held_type(fn->signature().result);
    if (result != type_name_) {
      throw CallRejected("rref: remote<" + type_name_ + ">('" + shown + "'): " +
                         fn->signature().text() + " returns " + result + ", not " + type_name_);
    }
    adopt(fn->invoke(ctx, args, ctx.agent()->executor()));
  } catch (...) {
    fail(std::current_exception());
  }
}

void OwnerRRef::adopt(Future<Value> result, std::shared_ptr<void> keep) {
  std::weak_ptr<OwnerRRef> weak = weak_from_this();
  gradwire::detail::on_complete_inline(
      result, [weak, keep = std::move(keep)](const Future<Value>& done) {
        std::shared_ptr<OwnerRRef> self = weak.lock();
        if (self == nullptr) return;
        if (done.has_error()) {
          self->fail(done.error());
          return;
        }
        if (contains_references(done.value())) {
          // Its forks were minted for nobody.
          self->context_->discard({done.value()});
          self->fail(std::make_exception_ptr(self->references_refused()));
          return;
        }
        {
          MutexLock lock(self->mutex_);
          self->value_ = done.value();
        }
        self->ready_.try_set_value();
      });
}

Value OwnerRRef::serialise_now(const CallContext& ctx, const std::string& type_name) {
  if (error_ != nullptr) std::rethrow_exception(error_);
  if (type_name != type_name_) {
    throw CallRejected("rref: " + describe() + " holds " + type_name_ + ", not " + type_name);
  }
  std::shared_ptr<void> object;
  rpc::Value (*to)(const std::shared_ptr<void>&, const CallContext&) = nullptr;
  {
    MutexLock lock(mutex_);
    if (value_) return *value_;
    object = object_;
    to = to_value_;
  }
  if (to != nullptr) return to(object, ctx);
  return ctx.agent()->registry().copy_object(ctx, class_name_, object);
}

Future<Value> OwnerRRef::serialise(const CallContext& ctx, const std::string& type_name) {
  if (ready_.completed()) {
    try {
      return make_ready_future(serialise_now(ctx, type_name));
    } catch (...) {
      return make_failed_future<Value>(std::current_exception());
    }
  }
  std::weak_ptr<OwnerRRef> weak = weak_from_this();
  return ready_.then(ctx.agent()->executor(), [weak, ctx, type_name](Future<void>) -> Value {
    std::shared_ptr<OwnerRRef> self = weak.lock();
    if (self == nullptr) throw Error("rref: the value was released while it was being created");
    return self->serialise_now(ctx, type_name);
  });
}

Future<Value> OwnerRRef::invoke_now(const CallContext& ctx, const std::string& method,
                                    const std::vector<Value>& args,
                                    const std::string& expected_result) {
  if (error_ != nullptr) return make_failed_future<Value>(error_);
  if (class_name_.empty()) {
    return make_failed_future<Value>(CallRejected(
        "rref: " + describe() + " holds a value of type " + type_name_ +
        ", which has no methods (called '" + printable(method, kShownNameBytes) + "')"));
  }
  rpc::Registry& registry = ctx.agent()->registry();
  if (!expected_result.empty()) {
    try {
      const rpc::Signature sig = registry.method_signature(class_name_, method);
      const std::string result = held_type(sig.result);
      if (result != expected_result) {
        throw CallRejected("rref: remote<" + expected_result + ">('" +
                           printable(method, kShownNameBytes) + "') on " + describe() + ": " +
                           sig.text() + " returns " + result + ", not " + expected_result);
      }
    } catch (...) {
      return make_failed_future<Value>(std::current_exception());
    }
  }
  std::shared_ptr<void> object;
  {
    MutexLock lock(mutex_);
    object = object_;
  }
  if (serialised_) {
    MutexLock one_at_a_time(call_mutex_);
    return registry.invoke_method(ctx, class_name_, method, object, args, ctx.agent()->executor());
  }
  return registry.invoke_method(ctx, class_name_, method, object, args, ctx.agent()->executor());
}

Future<Value> OwnerRRef::invoke(const CallContext& ctx, const std::string& method,
                                std::vector<Value> args, const std::string& expected_result) {
  if (ready_.completed()) return invoke_now(ctx, method, args, expected_result);
  std::weak_ptr<OwnerRRef> weak = weak_from_this();
  // Runs later on a pool thread, in the thread state of the request it serves.
  rpc::CapturedState state = ctx.agent()->capture_thread_state();
  return ready_.then(
      ctx.agent()->executor(),
      [weak, ctx, method, args = std::move(args), expected_result,
       state](Future<void>) -> Future<Value> {
        std::shared_ptr<OwnerRRef> self = weak.lock();
        if (self == nullptr) {
          throw Error("rref: the object was released while it was being created");
        }
        return state.run([&] { return self->invoke_now(ctx, method, args, expected_result); });
      });
}

detail::Reply OwnerRRef::looped(Future<Value> raw) {
  auto keep = std::make_shared<std::shared_ptr<void>>();
  Future<Value> out;
  std::shared_ptr<RRefContext> context = context_;
  gradwire::detail::on_complete_inline(raw,
                                       [keep, out, context](const Future<Value>& done) mutable {
                                         if (done.has_error()) {
                                           out.try_set_error(done.error());
                                           return;
                                         }
                                         try {
                                           *keep = context->loop_back({&done.value()});
                                           out.try_set_value(done.value());
                                         } catch (...) {
                                           out.try_set_error(std::current_exception());
                                         }
                                       });
  return detail::Reply{out, keep};
}

detail::Reply OwnerRRef::fetch(rpc::CallOptions) {
  std::shared_ptr<rpc::RpcAgent> agent = context_->agent();
  return looped(serialise(detail::sending_context(*agent), type_name_));
}

detail::Reply OwnerRRef::call(std::string method, std::vector<Value> args, rpc::CallOptions) {
  std::shared_ptr<rpc::RpcAgent> agent = context_->agent();
  std::vector<const Value*> values;
  for (const Value& v : args)
    values.push_back(&v);
  std::shared_ptr<void> held = context_->loop_back(values);
  detail::Reply reply = looped(invoke(detail::sending_context(*agent), method, std::move(args)));
  // The arguments' references live until the result is converted.
  reply.keep = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
      std::move(reply.keep), std::move(held));
  return reply;
}

std::shared_ptr<detail::RRefCore> OwnerRRef::remote(std::string method, std::string result_type,
                                                    std::vector<Value> args, rpc::CallOptions) {
  std::shared_ptr<rpc::RpcAgent> agent = context_->agent();
  auto made = std::make_shared<OwnerRRef>(context_, context_->mint(), result_type);
  context_->register_owner(made);
  made->begin_creation(result_type);
  std::vector<const Value*> values;
  for (const Value& v : args)
    values.push_back(&v);
  std::shared_ptr<void> held = context_->loop_back(values);
  made->adopt(invoke(detail::sending_context(*agent), method, std::move(args), result_type),
              std::move(held));
  return made;
}

Value OwnerRRef::to_value(const CallContext& ctx) {
  check_agent(ctx, agent(), describe());
  const uint64_t fork = context_->mint();
  context_->add_owner_fork(shared_from_this(), fork, ctx);
  return Value(RRefDescriptor{context_->self().id, id_, fork, type_name_});
}

std::shared_ptr<void> OwnerRRef::local_object(const detail::LocalType& type,
                                              std::chrono::milliseconds timeout) {
  rpc::RpcAgent& agent = this->agent();
  const std::chrono::milliseconds wait =
      timeout.count() > 0 ? timeout : agent.options().rpc_timeout;
  if (!ready_.wait(wait)) {
    throw TimeoutError("rref: local_value() of " + describe() + " waited " +
                       std::to_string(wait.count()) + " ms for its creation");
  }
  ready_.value();  // the creating call's error
  MutexLock lock(mutex_);
  if (object_ != nullptr) {
    if (object_type_ != type.type) {
      throw InvalidArgument("rref: local_value() of " + describe() + " as " + type.name +
                            ": it holds " + type_name_);
    }
    return object_;
  }
  if (type.name != type_name_ || type.from == nullptr) {
    throw InvalidArgument("rref: local_value() of " + describe() + " as " + type.name +
                          ": it holds " + type_name_);
  }
  object_ = type.from(*value_, detail::sending_context(agent));
  object_type_ = type.type;
  to_value_ = type.to;
  value_.reset();
  return object_;
}

// ---- UserRRef

UserRRef::UserRRef(std::shared_ptr<RRefContext> context, WorkerInfo owner, int incarnation,
                   uint64_t rref_id, uint64_t fork_id, std::string type_name,
                   Future<void> confirmed, bool creator)
    : context_(std::move(context)),
      owner_(std::move(owner)),
      incarnation_(incarnation),
      id_(rref_id),
      fork_(fork_id),
      type_name_(std::move(type_name)),
      confirmed_(std::move(confirmed)),
      creator_(creator) {}

UserRRef::~UserRRef() {
  context_->release_user(owner_, incarnation_, id_, fork_, apply(Event::kGiveUp));
}

bool UserRRef::apply(Event event) {
  MutexLock lock(state_mutex_);
  switch (event) {
    case Event::kCounted:
      if (state_ == State::kConfirming) state_ = State::kConfirmed;
      return false;
    case Event::kUnsettled:
      if (state_ == State::kConfirming) state_ = State::kUncertain;
      return false;
    case Event::kNotCounted:
      state_ = State::kReleased;
      return false;
    case Event::kGiveUp:
      if (state_ != State::kConfirmed && state_ != State::kUncertain) return false;
      state_ = State::kReleased;
      return true;
  }
  return false;
}

UserRRef::State UserRRef::state() const {
  MutexLock lock(state_mutex_);
  return state_;
}

void UserRRef::owner_answered(const Future<Value>& reply, bool creation) {
  Future<void> confirmed = confirmed_;
  if (!reply.has_error()) {
    apply(Event::kCounted);
    confirmed.try_set_value();
    return;
  }
  const std::exception_ptr error = reply.error();
  const ErrorKind kind = error_kind_of(error);
  const bool timed_out = kind == ErrorKind::kTimeout;
  const bool lost = kind == ErrorKind::kNetwork;
  // A timeout leaves it open whether the owner counts the fork: the Delete is sent, and the
  // owner forgets the fork whether it counted it yet or not. A refused AddFork counted
  // nothing; a failed Create may have counted it. The owner's loss releases it on its own.
  apply(timed_out || (creation && !lost) ? Event::kUnsettled : Event::kNotCounted);
  confirmed.try_set_error(error);
}

rpc::RpcAgent& UserRRef::agent() const {
  return *context_->agent();
}

std::string UserRRef::describe() const {
  return "RRef " + id_text(id_) + " (" + type_name_ + ") owned by " + owner_.describe();
}

Future<Value> UserRRef::after_confirmed(std::function<Future<Value>()> send,
                                        const rpc::CallOptions& options) {
  if (std::exception_ptr lost = context_->lost_error(owner_.id, incarnation_))
    return make_failed_future<Value>(lost);
  Future<Value> result;
  // The call's deadline counts from now, the wait for the owner's confirmation included.
  const std::chrono::milliseconds timeout = agent().effective_timeout(options);
  const auto deadline = deadline_after(timeout);
  result.set_default_timeout(rpc::RpcAgent::wait_bound(timeout));
  std::shared_ptr<UserRRef> self = shared_from_this();
  // The reference stays alive until the reply: its delete never overtakes the call.
  auto run = [self, send = std::move(send), result]() mutable {
    try {
      Future<Value> sent = send();
      gradwire::detail::on_complete_inline(sent, [self, result](const Future<Value>& done) mutable {
        if (done.has_error()) {
          result.try_set_error(done.error());
        } else {
          result.try_set_value(done.value());
        }
      });
    } catch (...) {
      result.try_set_error(std::current_exception());
    }
  };
  if (confirmed_.completed()) {
    if (confirmed_.has_error()) return make_failed_future<Value>(confirmed_.error());
    run();
    return result;
  }
  if (creator_) {
    // The owner awaits this reference's creation; its reply still keeps the reference
    // alive, so a delete never overtakes it.
    run();
    return result;
  }
  // Sent later, from the thread that sees the confirmation: as if from this one (the
  // modules above keep thread state, e.g. the current dist-autograd context).
  rpc::CapturedState state = agent().capture_thread_state();
  gradwire::detail::on_complete_inline(
      confirmed_, [run = std::move(run), result, state, deadline, timeout,
                   what = describe()](const Future<void>& done) mutable {
        if (done.has_error()) {
          result.try_set_error(done.error());
        } else if (std::chrono::steady_clock::now() >= deadline) {
          // Its caller stopped waiting: the call is not sent late.
          result.try_set_error(std::make_exception_ptr(TimeoutError(
              "rref: a call on " + what + " timed out after " + std::to_string(timeout.count()) +
              " ms waiting for its owner to confirm the reference")));
        } else {
          state.run(run);
        }
      });
  return result;
}

detail::Reply UserRRef::fetch(rpc::CallOptions options) {
  std::shared_ptr<rpc::RpcAgent> agent = context_->agent();
  wire::RRefMessage message;
  message.mutable_fetch()->set_rref_id(id_);
  message.mutable_fetch()->set_type_name(type_name_);
  std::shared_ptr<RRefContext> context = context_;
  // The references in the value are held until the caller has converted it.
  auto keep = std::make_shared<std::vector<std::shared_ptr<detail::RRefCore>>>();
  return detail::Reply{
      after_confirmed(
          [context, owner = owner_, payload = message.SerializeAsString(),
           what = "to_here of " + describe(), options,
           keep] { return context->send(owner, payload, what, {}, options, kRRefHandler, keep); },
          options),
      keep};
}

detail::Reply UserRRef::call(std::string method, std::vector<Value> args,
                             rpc::CallOptions options) {
  std::shared_ptr<rpc::RpcAgent> agent = context_->agent();
  wire::RRefMessage message;
  message.mutable_call_method()->set_rref_id(id_);
  message.mutable_call_method()->set_method(method);
  message.mutable_call_method()->set_type_name(type_name_);
  std::shared_ptr<RRefContext> context = context_;
  auto shared_args = std::make_shared<std::vector<Value>>(std::move(args));
  // The references in the result are held until the caller has converted it.
  auto keep = std::make_shared<std::vector<std::shared_ptr<detail::RRefCore>>>();
  Future<Value> result = after_confirmed(
      [context, owner = owner_, payload = message.SerializeAsString(),
       what = type_name_ + "." + method + " on " + describe(), shared_args, options, keep] {
        return context->send(owner, payload, what, *shared_args, options, kRRefHandler, keep);
      },
      options);
  // References among the arguments that never left are given back.
  gradwire::detail::on_complete_inline(result, [context, shared_args](const Future<Value>& done) {
    if (done.has_error()) context->discard(*shared_args);
  });
  return detail::Reply{result, keep};
}

std::shared_ptr<detail::RRefCore> UserRRef::remote(std::string method, std::string result_type,
                                                   std::vector<Value> args,
                                                   rpc::CallOptions options) {
  std::shared_ptr<rpc::RpcAgent> agent = context_->agent();
  const uint64_t rref_id = context_->mint();
  const uint64_t fork = context_->mint();
  wire::RRefMessage message;
  wire::Create* create = message.mutable_create();
  create->set_rref_id(rref_id);
  create->set_fork_id(fork);
  create->set_type_name(result_type);
  create->set_name(method);
  create->set_target_rref_id(id_);
  create->set_target_type_name(type_name_);
  Future<void> confirmed;
  auto made = std::make_shared<UserRRef>(context_, owner_, incarnation_, rref_id, fork, result_type,
                                         confirmed,
                                         /*creator=*/true);
  context_->adopt_user(made);
  std::shared_ptr<RRefContext> context = context_;
  auto shared_args = std::make_shared<std::vector<Value>>(std::move(args));
  auto sent = std::make_shared<std::atomic<bool>>(false);
  Future<Value> reply = after_confirmed(
      [context, owner = owner_, payload = message.SerializeAsString(),
       what = "remote " + type_name_ + "." + method + " on " + describe() + " -> RRef " +
              id_text(rref_id),
       shared_args, options, sent] {
        Future<Value> f = context->send(owner, payload, what, *shared_args, options, kRRefHandler);
        sent->store(true);
        return f;
      },
      options);
  gradwire::detail::on_complete_inline(
      reply, [made, confirmed, context, shared_args, sent](const Future<Value>& done) mutable {
        if (done.has_error() && !sent->load()) {
          // A creation that never left is not counted by the owner: nothing to delete.
          made->apply(UserRRef::Event::kNotCounted);
          context->discard(*shared_args);
          confirmed.try_set_error(done.error());
          return;
        }
        made->owner_answered(done, /*creation=*/true);
      });
  return made;
}

Value UserRRef::to_value(const CallContext& ctx) {
  check_agent(ctx, agent(), describe());
  if (std::exception_ptr lost = context_->lost_error(owner_.id, incarnation_))
    std::rethrow_exception(lost);
  const uint64_t fork = context_->mint();
  context_->add_child(shared_from_this(), fork, ctx);
  return Value(RRefDescriptor{owner_.id, id_, fork, type_name_});
}

std::shared_ptr<void> UserRRef::local_object(const detail::LocalType&, std::chrono::milliseconds) {
  throw InvalidArgument("rref: local_value() on a user reference: " + describe() +
                        "; only its owner holds the value (use to_here() or a method proxy)");
}

}  // namespace gradwire::rref
