#include "gradwire/rpc/registry.h"

#include <mutex>

#include "gradwire/core/error.h"
#include "gradwire/core/printable.h"

namespace gradwire::rpc {

std::string Signature::text() const {
  std::string s = name + "(";
  for (size_t i = 0; i < parameters.size(); ++i)
    s += (i > 0 ? ", " : "") + parameters[i];
  return s + ") -> " + result;
}

namespace detail {

std::string argument_list(const std::vector<Value>& args) {
  std::string s = "(";
  for (size_t i = 0; i < args.size(); ++i)
    s += (i > 0 ? ", " : "") + args[i].describe();
  return s + ")";
}

void throw_arity(const Signature& sig, const std::vector<Value>& args) {
  throw CallRejected(sig.text() + " takes " + std::to_string(sig.parameters.size()) + " argument" +
                     (sig.parameters.size() == 1 ? "" : "s") + ", got " +
                     std::to_string(args.size()) + " " + argument_list(args));
}

void render_argument(std::string& out, const void* signature, size_t index) {
  out += "argument " + std::to_string(index + 1) + " of " +
         static_cast<const Signature*>(signature)->text();
}

}  // namespace detail

Future<Value> RegisteredFunction::invoke(const CallContext& ctx, const std::vector<Value>& args,
                                         const std::shared_ptr<Executor>& executor) const {
  try {
    return invoker_(ctx, args, executor);
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
}

namespace {

// How much of a name the registry's errors show: as much as the envelope admits in a
// function name by default. A name looked up may be a peer's (the function a request or an
// RRef creation names, the method an RRef call names): it is quoted escaped.
constexpr size_t kShownNameBytes = 1024;

std::string shown(std::string_view name) {
  return printable(name, kShownNameBytes);
}

template <typename Map>
std::string known_names(const Map& map) {
  if (map.empty()) return "none";
  std::string s;
  size_t shown = 0;
  for (const auto& entry : map) {
    if (shown == 12) {
      s += ", ... (" + std::to_string(map.size()) + " in all)";
      break;
    }
    s += (shown++ > 0 ? ", " : "") + entry.first;
  }
  return s;
}

}  // namespace

void Registry::add_function(Signature signature, Invoker invoker, Execution execution) {
  if (signature.name.empty()) throw InvalidArgument("rpc registry: a function name is empty");
  std::string name = signature.name;
  // Built before taking the lock: nothing but the map insertion happens under it.
  auto entry = std::make_shared<const RegisteredFunction>(std::move(signature), std::move(invoker),
                                                          execution);
  std::unique_lock lock(mutex_);
  if (functions_.count(name) != 0) {
    throw InvalidArgument("rpc registry: a function named '" + name + "' is already registered");
  }
  functions_.emplace(std::move(name), std::move(entry));
}

std::shared_ptr<const RegisteredFunction> Registry::find(std::string_view name) const {
  std::shared_lock lock(mutex_);
  auto it = functions_.find(name);
  return it == functions_.end() ? nullptr : it->second;
}

CallRejected Registry::unknown_function_locked(std::string_view name) const {
  return CallRejected("no function '" + shown(name) +
                      "' is registered (registered: " + known_names(functions_) + ")");
}

CallRejected Registry::unknown_function(std::string_view name) const {
  std::shared_lock lock(mutex_);
  return unknown_function_locked(name);
}

Execution Registry::execution(std::string_view name) const {
  std::shared_lock lock(mutex_);
  auto it = functions_.find(name);
  return it == functions_.end() ? Execution::kPool : it->second->execution();
}

bool Registry::has_function(std::string_view name) const {
  std::shared_lock lock(mutex_);
  return functions_.find(name) != functions_.end();
}

Signature Registry::signature(std::string_view name) const {
  std::shared_lock lock(mutex_);
  auto it = functions_.find(name);
  if (it == functions_.end()) throw unknown_function_locked(name);
  return it->second->signature();
}

std::vector<Signature> Registry::functions() const {
  std::shared_lock lock(mutex_);
  std::vector<Signature> out;
  out.reserve(functions_.size());
  for (const auto& [name, fn] : functions_)
    out.push_back(fn->signature());
  return out;
}

Future<Value> Registry::invoke(const CallContext& ctx, std::string_view name,
                               const std::vector<Value>& args,
                               const std::shared_ptr<Executor>& executor) const {
  std::shared_ptr<const RegisteredFunction> fn;
  {
    std::shared_lock lock(mutex_);
    auto it = functions_.find(name);
    if (it == functions_.end()) return make_failed_future<Value>(unknown_function_locked(name));
    fn = it->second;
  }
  return fn->invoke(ctx, args, executor);
}

Future<Value> Registry::invoke(std::string_view name, const std::vector<Value>& args,
                               const std::shared_ptr<Executor>& executor) const {
  return invoke(detail::no_call_context(), name, args, executor);
}

void Registry::add_class(std::string name, std::type_index type) {
  std::unique_lock lock(mutex_);
  if (name.empty()) throw InvalidArgument("rpc registry: a class name is empty");
  if (classes_.count(name) != 0) {
    throw InvalidArgument("rpc registry: a class named '" + name + "' is already registered");
  }
  classes_.emplace(std::move(name), Class{type, nullptr, nullptr, false, {}});
}

const Registry::Class& Registry::find_class(std::string_view name) const {
  auto it = classes_.find(name);
  if (it == classes_.end()) {
    throw CallRejected("no class '" + shown(name) +
                       "' is registered (registered: " + known_names(classes_) + ")");
  }
  return it->second;
}

const Registry::Method& Registry::find_method(std::string_view class_name,
                                              std::string_view method) const {
  return *find_method_entry(class_name, method);
}

std::shared_ptr<const Registry::Method> Registry::find_method_entry(std::string_view class_name,
                                                                    std::string_view method) const {
  const Class& cls = find_class(class_name);
  auto it = cls.methods.find(method);
  if (it == cls.methods.end()) {
    throw CallRejected("class '" + shown(class_name) + "' has no method '" + shown(method) +
                       "' (methods: " + known_names(cls.methods) + ")");
  }
  return it->second;
}

void Registry::add_constructor(std::string_view class_name, Signature signature, Constructor ctor) {
  std::unique_lock lock(mutex_);
  auto it = classes_.find(class_name);
  if (it == classes_.end()) {
    throw InvalidArgument("rpc registry: class '" + std::string(class_name) +
                          "' is not registered");
  }
  if (it->second.ctor) {
    throw InvalidArgument("rpc registry: class '" + std::string(class_name) +
                          "' already has a constructor, " + it->second.ctor->signature.text());
  }
  it->second.ctor = std::make_shared<const Ctor>(Ctor{std::move(signature), std::move(ctor)});
}

void Registry::add_method(std::string_view class_name, Signature signature, MethodInvoker invoker) {
  std::unique_lock lock(mutex_);
  auto it = classes_.find(class_name);
  if (it == classes_.end()) {
    throw InvalidArgument("rpc registry: class '" + std::string(class_name) +
                          "' is not registered");
  }
  const std::string method = signature.name.substr(class_name.size() + 1);
  if (it->second.methods.count(method) != 0) {
    throw InvalidArgument("rpc registry: method '" + signature.name + "' is already registered");
  }
  it->second.methods.emplace(
      method, std::make_shared<const Method>(Method{std::move(signature), std::move(invoker)}));
}

Registry::ClassInfo Registry::class_info(std::string_view class_name) const {
  std::shared_lock lock(mutex_);
  const Class& cls = find_class(class_name);
  return ClassInfo{std::string(class_name), cls.type, cls.copier != nullptr, cls.serialised};
}

Value Registry::copy_object(const CallContext& ctx, std::string_view class_name,
                            const std::shared_ptr<void>& object) const {
  std::shared_ptr<const Copier> copier;
  {
    std::shared_lock lock(mutex_);
    copier = find_class(class_name).copier;
  }
  if (copier == nullptr) {
    throw CallRejected("objects of class '" + std::string(class_name) +
                       "' are not copyable: register the class with .copyable() (it needs a "
                       "ValueConverter) to copy them to a caller");
  }
  if (object == nullptr)
    throw CallRejected("no object of class '" + std::string(class_name) + "' to copy");
  return (*copier)(ctx, object);
}

void Registry::set_copyable(std::string_view class_name, Copier copier) {
  std::unique_lock lock(mutex_);
  auto it = classes_.find(class_name);
  if (it == classes_.end()) {
    throw InvalidArgument("rpc registry: class '" + std::string(class_name) +
                          "' is not registered");
  }
  it->second.copier = std::make_shared<const Copier>(std::move(copier));
}

void Registry::set_serialised(std::string_view class_name) {
  std::unique_lock lock(mutex_);
  auto it = classes_.find(class_name);
  if (it == classes_.end()) {
    throw InvalidArgument("rpc registry: class '" + std::string(class_name) +
                          "' is not registered");
  }
  it->second.serialised = true;
}

bool Registry::has_class(std::string_view name) const {
  std::shared_lock lock(mutex_);
  return classes_.find(name) != classes_.end();
}

std::shared_ptr<void> Registry::construct(const CallContext& ctx, std::string_view class_name,
                                          const std::vector<Value>& args) const {
  std::shared_ptr<const Ctor> ctor;
  {
    std::shared_lock lock(mutex_);
    const Class& cls = find_class(class_name);
    if (!cls.ctor) {
      throw CallRejected("class '" + std::string(class_name) +
                         "' has no registered constructor (add .ctor<Args...>())");
    }
    ctor = cls.ctor;
  }
  return ctor->construct(ctx, args);
}

std::shared_ptr<void> Registry::construct(std::string_view class_name,
                                          const std::vector<Value>& args) const {
  return construct(detail::no_call_context(), class_name, args);
}

Signature Registry::method_signature(std::string_view class_name, std::string_view method) const {
  std::shared_lock lock(mutex_);
  return find_method(class_name, method).signature;
}

Future<Value> Registry::invoke_method(const CallContext& ctx, std::string_view class_name,
                                      std::string_view method, const std::shared_ptr<void>& object,
                                      const std::vector<Value>& args,
                                      const std::shared_ptr<Executor>& executor) const {
  std::shared_ptr<const Method> entry;
  try {
    std::shared_lock lock(mutex_);
    entry = find_method_entry(class_name, method);
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
  if (object == nullptr) {
    return make_failed_future<Value>(CallRejected("method '" + shown(class_name) + "." +
                                                  shown(method) + "' called on no object"));
  }
  try {
    return entry->invoker(ctx, object, args, executor);
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
}

Future<Value> Registry::invoke_method(std::string_view class_name, std::string_view method,
                                      const std::shared_ptr<void>& object,
                                      const std::vector<Value>& args,
                                      const std::shared_ptr<Executor>& executor) const {
  return invoke_method(detail::no_call_context(), class_name, method, object, args, executor);
}

Registry& registry() {
  static Registry* const instance = new Registry();
  return *instance;
}

}  // namespace gradwire::rpc
