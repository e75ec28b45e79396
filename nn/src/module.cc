#include "gradwire/nn/module.h"

#include <map>
#include <set>
#include <sstream>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/zero_grad.h"

namespace gradwire::nn {

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {
  // Modules record graphs through Tensor's methods alone, which reference no symbol of
  // gradwire::autograd; with shared libraries and --as-needed the linker would then drop
  // it and autograd would be missing at run time. This call keeps it loaded.
  autograd::ensure_registered();
}

void Module::check_new_name(const std::string& name, const char* what) const {
  GRADWIRE_CHECK_ARG(!name.empty()) << type_name_ << ": a " << what << " name must not be empty";
  GRADWIRE_CHECK_ARG(name.find('.') == std::string::npos)
      << type_name_ << ": " << what << " name '" << name << "' must not contain '.'";
  bool taken = false;
  for (const Entry& e : parameters_)
    taken = taken || e.name == name;
  for (const Entry& e : buffers_)
    taken = taken || e.name == name;
  for (const auto& c : children_)
    taken = taken || c.first == name;
  GRADWIRE_CHECK_ARG(!taken) << type_name_ << ": " << what << " name '" << name
                             << "' is already registered";
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  GRADWIRE_CHECK_ARG(tensor.defined())
      << type_name_ << ": parameter '" << name << "' is an undefined tensor";
  if (tensor.grad_fn() != nullptr) tensor = tensor.detach();
  if (requires_grad) {
    GRADWIRE_CHECK_ARG(tensor.is_floating_point())
        << type_name_ << ": parameter '" << name << "' has dtype " << tensor.dtype()
        << "; only floating tensors can require grad";
  }
  tensor.set_requires_grad(requires_grad);
  parameters_.push_back({name, tensor});
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "buffer");
  GRADWIRE_CHECK_ARG(tensor.defined())
      << type_name_ << ": buffer '" << name << "' is an undefined tensor";
  buffers_.push_back({name, tensor});
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  GRADWIRE_CHECK_ARG(module != nullptr) << type_name_ << ": submodule '" << name << "' is null";
  GRADWIRE_CHECK_ARG(module.get() != this)
      << type_name_ << ": a module cannot be its own submodule ('" << name << "')";
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool params, bool buffers, bool recurse,
                     StateDict& out) const {
  if (params) {
    for (const Entry& e : parameters_)
      out.emplace_back(prefix + e.name, e.tensor);
  }
  if (buffers) {
    for (const Entry& e : buffers_)
      out.emplace_back(prefix + e.name, e.tensor);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) {
    child->collect(prefix + name + ".", params, buffers, true, out);
  }
}

namespace {
// Keeps the first name of each tensor (shared weights are listed once).
StateDict dedupe(StateDict all) {
  std::set<const TensorImpl*> seen;
  StateDict out;
  for (auto& entry : all) {
    if (seen.insert(entry.second.impl_ptr().get()).second) out.push_back(std::move(entry));
  }
  return out;
}

std::vector<Tensor> values(const StateDict& named) {
  std::vector<Tensor> out;
  out.reserve(named.size());
  for (const auto& entry : named)
    out.push_back(entry.second);
  return out;
}
}  // namespace

StateDict Module::named_parameters(bool recurse) const {
  StateDict all;
  collect("", true, false, recurse, all);
  return dedupe(std::move(all));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  return values(named_parameters(recurse));
}

StateDict Module::named_buffers(bool recurse) const {
  StateDict all;
  collect("", false, true, recurse, all);
  return dedupe(std::move(all));
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  return values(named_buffers(recurse));
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [name, child] : children_) {
    out.emplace_back(name, child);
    for (auto& [sub, m] : child->named_modules())
      out.emplace_back(name + "." + sub, m);
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& c : children_)
    c.second->train(on);
}

void Module::zero_grad(bool set_to_none) {
  gradwire::zero_grad(parameters(), set_to_none);
}

StateDict Module::state_dict() const {
  StateDict all;
  collect("", true, true, true, all);
  for (auto& entry : all)
    entry.second = entry.second.detach();
  return all;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  StateDict mine;
  collect("", true, true, true, mine);
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> errors;
  for (const auto& [name, t] : state) {
    if (!given.emplace(name, &t).second) errors.push_back("duplicate key '" + name + "'");
  }
  std::set<std::string> used;
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  for (const auto& [name, target] : mine) {
    auto it = given.find(name);
    if (it == given.end()) {
      if (strict) errors.push_back("missing key '" + name + "'");
      continue;
    }
    used.insert(name);
    const Tensor& src = *it->second;
    if (!src.defined()) {
      errors.push_back("'" + name + "' is an undefined tensor");
      continue;
    }
    if (src.dtype() != target.dtype()) {
      std::ostringstream os;
      os << "'" << name << "' has dtype " << src.dtype() << ", the module expects "
         << target.dtype();
      errors.push_back(os.str());
      continue;
    }
    if (src.sizes() != target.sizes()) {
      errors.push_back("'" + name + "' has shape " + src.shape_string() + ", the module expects " +
                       target.shape_string());
      continue;
    }
    copies.emplace_back(target, &src);
  }
  if (strict) {
    for (const auto& [name, t] : state) {
      if (!used.count(name) && given.count(name)) {
        errors.push_back("unexpected key '" + name + "'");
        given.erase(name);  // report a duplicated unexpected key once
      }
    }
  }
  if (!errors.empty()) {
    std::ostringstream os;
    os << type_name_ << ".load_state_dict: " << errors.size() << " problem"
       << (errors.size() == 1 ? "" : "s") << ": ";
    for (size_t i = 0; i < errors.size(); ++i)
      os << (i ? "; " : "") << errors[i];
    GRADWIRE_THROW(InvalidArgument) << os.str();
  }
  autograd::NoGradGuard no_grad;
  for (auto& [target, src] : copies)
    target.copy_(*src);
}

}  // namespace gradwire::nn
