# FindGloo: Gloo ships no CMake config, and Debian's package has no unversioned .so link
# on every release, so look for the versioned name too.
# Defines Gloo_FOUND and the imported target Gloo::Gloo.
find_path(Gloo_INCLUDE_DIR gloo/allreduce.h)
find_library(Gloo_LIBRARY NAMES gloo libgloo.so.0 PATHS /usr/lib /usr/local/lib)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Gloo REQUIRED_VARS Gloo_LIBRARY Gloo_INCLUDE_DIR)
if(Gloo_FOUND AND NOT TARGET Gloo::Gloo)
  add_library(Gloo::Gloo UNKNOWN IMPORTED)
  set_target_properties(Gloo::Gloo PROPERTIES
    IMPORTED_LOCATION "${Gloo_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Gloo_INCLUDE_DIR}")
endif()
mark_as_advanced(Gloo_INCLUDE_DIR Gloo_LIBRARY)
