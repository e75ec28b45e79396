#include "gradwire/rpc/registry.h"

#include <mutex>

#include "gradwire/core/error.h"

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

}  // namespace detail

namespace {

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
  std::unique_lock lock(mutex_);
  if (signature.name.empty()) throw InvalidArgument("rpc registry: a function name is empty");
  if (functions_.count(signature.name) != 0) {
    throw InvalidArgument("rpc registry: a function named '" + signature.name +
                          "' is already registered");
  }
  std::string name = signature.name;
  functions_.emplace(std::move(name),
                     Function{std::move(signature), std::move(invoker), execution});
}

Execution Registry::execution(std::string_view name) const {
  std::shared_lock lock(mutex_);
  auto it = functions_.find(name);
  return it == functions_.end() ? Execution::kPool : it->second.execution;
}

bool Registry::has_function(std::string_view name) const {
  std::shared_lock lock(mutex_);
  return functions_.find(name) != functions_.end();
}

Signature Registry::signature(std::string_view name) const {
  std::shared_lock lock(mutex_);
  auto it = functions_.find(name);
  if (it == functions_.end()) {
    throw CallRejected("no function '" + std::string(name) +
                       "' is registered (registered: " + known_names(functions_) + ")");
  }
  return it->second.signature;
}

std::vector<Signature> Registry::functions() const {
  std::shared_lock lock(mutex_);
  std::vector<Signature> out;
  out.reserve(functions_.size());
  for (const auto& [name, fn] : functions_)
    out.push_back(fn.signature);
  return out;
}

Future<Value> Registry::invoke(std::string_view name, const std::vector<Value>& args,
                               const std::shared_ptr<Executor>& executor) const {
  Invoker invoker;
  {
    std::shared_lock lock(mutex_);
    auto it = functions_.find(name);
    if (it == functions_.end()) {
      return make_failed_future<Value>(
          CallRejected("no function '" + std::string(name) +
                       "' is registered (registered: " + known_names(functions_) + ")"));
    }
    invoker = it->second.invoker;
  }
  try {
    return invoker(args, executor);
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
}

void Registry::add_class(std::string name, std::type_index type) {
  std::unique_lock lock(mutex_);
  if (name.empty()) throw InvalidArgument("rpc registry: a class name is empty");
  if (classes_.count(name) != 0) {
    throw InvalidArgument("rpc registry: a class named '" + name + "' is already registered");
  }
  classes_.emplace(std::move(name), Class{type, std::nullopt, {}, {}});
}

const Registry::Class& Registry::find_class(std::string_view name) const {
  auto it = classes_.find(name);
  if (it == classes_.end()) {
    throw CallRejected("no class '" + std::string(name) +
                       "' is registered (registered: " + known_names(classes_) + ")");
  }
  return it->second;
}

const Registry::Method& Registry::find_method(std::string_view class_name,
                                              std::string_view method) const {
  const Class& cls = find_class(class_name);
  auto it = cls.methods.find(method);
  if (it == cls.methods.end()) {
    throw CallRejected("class '" + std::string(class_name) + "' has no method '" +
                       std::string(method) + "' (methods: " + known_names(cls.methods) + ")");
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
  if (it->second.ctor_signature) {
    throw InvalidArgument("rpc registry: class '" + std::string(class_name) +
                          "' already has a constructor, " + it->second.ctor_signature->text());
  }
  it->second.ctor_signature = std::move(signature);
  it->second.ctor = std::move(ctor);
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
  it->second.methods.emplace(method, Method{std::move(signature), std::move(invoker)});
}

bool Registry::has_class(std::string_view name) const {
  std::shared_lock lock(mutex_);
  return classes_.find(name) != classes_.end();
}

std::shared_ptr<void> Registry::construct(std::string_view class_name,
                                          const std::vector<Value>& args) const {
  Constructor ctor;
  {
    std::shared_lock lock(mutex_);
    const Class& cls = find_class(class_name);
    if (!cls.ctor) {
      throw CallRejected("class '" + std::string(class_name) +
                         "' has no registered constructor (add .ctor<Args...>())");
    }
    ctor = cls.ctor;
  }
  return ctor(args);
}

Signature Registry::method_signature(std::string_view class_name, std::string_view method) const {
  std::shared_lock lock(mutex_);
  return find_method(class_name, method).signature;
}

Future<Value> Registry::invoke_method(std::string_view class_name, std::string_view method,
                                      const std::shared_ptr<void>& object,
                                      const std::vector<Value>& args,
                                      const std::shared_ptr<Executor>& executor) const {
  MethodInvoker invoker;
  try {
    std::shared_lock lock(mutex_);
    invoker = find_method(class_name, method).invoker;
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
  if (object == nullptr) {
    return make_failed_future<Value>(CallRejected("method '" + std::string(class_name) + "." +
                                                  std::string(method) + "' called on no object"));
  }
  try {
    return invoker(object, args, executor);
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
}

Registry& registry() {
  static Registry* const instance = new Registry();
  return *instance;
}

}  // namespace gradwire::rpc
