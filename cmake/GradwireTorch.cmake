# The LibTorch bridge (torch_bridge/, target gradwire::torch): whether it is built.
#
#   GRADWIRE_WITH_TORCH=AUTO  build it when find_package(Torch) finds LibTorch (Debian 12:
#                             libtorch-dev), except in sanitizer and fuzzing builds, whose
#                             instrumentation LibTorch lacks (TSan would report its OpenMP
#                             threads' work as races);
#   GRADWIRE_WITH_TORCH=ON    build it; the configure fails when LibTorch is not found;
#   GRADWIRE_WITH_TORCH=OFF   skip it.
#
# Sets GRADWIRE_HAS_TORCH (ON/OFF). When ON, TORCH_LIBRARIES and TORCH_INCLUDE_DIRS are
# LibTorch's and the imported target `torch` exists; only the bridge and its tests use them
# (TorchConfig sets no global flags: its compile options ride on the `torch` target).
set(GRADWIRE_HAS_TORCH OFF)
if(NOT GRADWIRE_WITH_TORCH MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "GRADWIRE_WITH_TORCH must be AUTO, ON or OFF (got '${GRADWIRE_WITH_TORCH}')")
endif()
if(GRADWIRE_WITH_TORCH STREQUAL "OFF")
  message(STATUS "gradwire: LibTorch bridge skipped (GRADWIRE_WITH_TORCH=OFF): no torch_bridge/, no libtorch tests")
elseif(GRADWIRE_WITH_TORCH STREQUAL "AUTO" AND (GRADWIRE_SANITIZE OR GRADWIRE_BUILD_FUZZ))
  message(STATUS "gradwire: LibTorch bridge skipped in a sanitizer or fuzzing build (GRADWIRE_WITH_TORCH=ON builds it)")
else()
  find_package(Torch QUIET)
  if(TORCH_FOUND)
    set(GRADWIRE_HAS_TORCH ON)
    message(STATUS "gradwire: LibTorch ${Torch_VERSION} found (${Torch_DIR}): building the bridge torch_bridge/")
  elseif(GRADWIRE_WITH_TORCH STREQUAL "ON")
    message(FATAL_ERROR "GRADWIRE_WITH_TORCH=ON, but find_package(Torch) found no LibTorch: "
                        "install it (Debian 12: apt-get install libtorch-dev), or point Torch_DIR "
                        "at the folder holding TorchConfig.cmake, or configure with "
                        "-DGRADWIRE_WITH_TORCH=AUTO or OFF")
  else()
    message(STATUS "gradwire: LibTorch not found: torch_bridge/ and its libtorch tests skipped (install libtorch-dev to build them)")
  endif()
endif()
