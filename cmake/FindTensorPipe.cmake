# FindTensorPipe: TensorPipe ships no CMake config, so find its header and library.
# Defines TensorPipe_FOUND and the imported target TensorPipe::TensorPipe.
find_path(TensorPipe_INCLUDE_DIR tensorpipe/tensorpipe.h)
find_library(TensorPipe_LIBRARY NAMES tensorpipe libtensorpipe.so.0)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(TensorPipe REQUIRED_VARS TensorPipe_LIBRARY TensorPipe_INCLUDE_DIR)
if(TensorPipe_FOUND AND NOT TARGET TensorPipe::TensorPipe)
  add_library(TensorPipe::TensorPipe UNKNOWN IMPORTED)
  set_target_properties(TensorPipe::TensorPipe PROPERTIES
    IMPORTED_LOCATION "${TensorPipe_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${TensorPipe_INCLUDE_DIR}")
endif()
mark_as_advanced(TensorPipe_INCLUDE_DIR TensorPipe_LIBRARY)
