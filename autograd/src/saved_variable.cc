#include "gradwire/autograd/saved_variable.h"

#include "gradwire/autograd/node.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/dtype.h"

namespace gradwire::autograd {

SavedVariable::SavedVariable(const Tensor& t) {
  if (t.defined()) {
    data_ = t.detach();
    saved_version_ = t.version();
  }
}

Tensor SavedVariable::unpack(const Node& owner) const {
  if (released_) {
    GRADWIRE_THROW(InvalidArgument)
        << "Trying to backward through the graph a second time (or to use saved tensors after "
           "they have been freed): the saved tensors of "
        << owner.name()
        << " were freed by an earlier backward() or grad() call. Pass retain_graph=true to the "
           "first call if you need to run backward through the graph again";
  }
  if (data_.defined() && data_.version() != saved_version_) {
    GRADWIRE_THROW(InvalidArgument)
        << "one of the variables needed for gradient computation has been modified by an "
           "inplace operation: the "
        << dtype_name(data_.dtype()) << " " << data_.shape_string() << " tensor saved by "
        << owner.name() << " is at version " << data_.version() << "; expected version "
        << saved_version_ << " instead";
  }
  return data_;
}

void SavedVariable::reset() {
  data_ = Tensor();
  released_ = true;
}

}  // namespace gradwire::autograd
