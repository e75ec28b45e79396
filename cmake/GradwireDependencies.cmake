# Finds everything gradwire builds against. Required libraries stop the configure with a
# message naming the Debian package (scripts/install-deps.sh installs them all); CUDA and
# NCCL are optional and detected automatically (GRADWIRE_USE_CUDA / GRADWIRE_USE_NCCL).
include(GNUInstallDirs)
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

option(BUILD_SHARED_LIBS "Build the modules as shared libraries" ON)
# Installed binaries find the installed libraries next to them.
set(CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND AND NOT TARGET gradwire_blas)
  add_library(gradwire_blas INTERFACE IMPORTED)
  target_include_directories(gradwire_blas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(gradwire_blas INTERFACE ${OpenBLAS_LIBRARIES})
elseif(NOT TARGET gradwire_blas)
  message(FATAL_ERROR "gradwire needs OpenBLAS (CBLAS): apt-get install libopenblas-dev, "
                      "or run scripts/install-deps.sh")
endif()

find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h)
if(NOT DLPACK_INCLUDE_DIR)
  message(FATAL_ERROR "gradwire needs the DLPack header: apt-get install libdlpack-dev, "
                      "or run scripts/install-deps.sh")
endif()

# libuv runs the TCPStore server loop (c10d/). Debian's libuv1-dev ships a pkg-config
# file; the imported target is linked PRIVATE, so no public header sees uv.h.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LIBUV QUIET IMPORTED_TARGET libuv>=1.40)
endif()
if(LIBUV_FOUND AND NOT TARGET gradwire_uv)
  add_library(gradwire_uv INTERFACE IMPORTED)
  target_link_libraries(gradwire_uv INTERFACE PkgConfig::LIBUV)
elseif(NOT TARGET gradwire_uv)
  message(FATAL_ERROR "gradwire needs libuv >= 1.40 (the TCPStore server loop): "
                      "apt-get install libuv1-dev pkg-config, or run scripts/install-deps.sh")
endif()

# TensorPipe and Gloo ship no CMake config: our own Find modules (cmake/Find*.cmake).
find_package(TensorPipe REQUIRED)
# Protobuf: the rpc envelope (rpc/proto). The lite runtime is all the generated code needs.
find_package(Protobuf REQUIRED)
find_package(Gloo REQUIRED)
# OpenSSL's libcrypto: HMAC-SHA256 and random nonces for the authenticated handshakes.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
# nlohmann-json (header only): core's trace files (core/src/trace.cc), linked PRIVATE.
find_package(nlohmann_json 3 QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "gradwire needs nlohmann-json 3 (trace files): "
                      "apt-get install nlohmann-json3-dev, or run scripts/install-deps.sh")
endif()

# ---- CUDA and NCCL: AUTO turns them on when the toolkit is found, ON insists, OFF skips.
set(GRADWIRE_HAS_CUDA OFF)
set(GRADWIRE_HAS_NCCL OFF)
if(NOT GRADWIRE_USE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper machine code plus Turing-and-later PTX that the driver compiles for others.
      set(CMAKE_CUDA_ARCHITECTURES "75-virtual;90-real")
    endif()
    enable_language(CUDA)
    # CMake before 3.26 does not know nvcc's C++20 flag (nvcc 12 and later accept it).
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(GRADWIRE_HAS_CUDA ON)
  elseif(GRADWIRE_USE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GRADWIRE_USE_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
if(GRADWIRE_HAS_CUDA AND NOT GRADWIRE_USE_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  # The NCCL backend needs 2.14 or newer (abortable non-blocking communicators,
  # ncclCommFinalize, ncclAvg, ncclBfloat16).
  set(_gw_nccl_version 0)
  if(NCCL_INCLUDE_DIR)
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _gw_nccl_code REGEX "^#define NCCL_VERSION_CODE ")
    string(REGEX REPLACE "^#define NCCL_VERSION_CODE ([0-9]+).*" "\\1" _gw_nccl_version
           "${_gw_nccl_code}")
  endif()
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND _gw_nccl_version LESS 21400)
    message(STATUS "gradwire: NCCL ${_gw_nccl_version} is older than 2.14; the NCCL backend is off")
    if(GRADWIRE_USE_NCCL STREQUAL "ON")
      message(FATAL_ERROR "GRADWIRE_USE_NCCL=ON but NCCL is older than 2.14 (${_gw_nccl_version})")
    endif()
  elseif(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(GRADWIRE_HAS_NCCL ON)
    if(NOT TARGET gradwire_nccl)
      add_library(gradwire_nccl INTERFACE IMPORTED)
      target_include_directories(gradwire_nccl INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(gradwire_nccl INTERFACE ${NCCL_LIBRARY})
    endif()
  elseif(GRADWIRE_USE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "GRADWIRE_USE_NCCL=ON but nccl.h / libnccl were not found")
  endif()
elseif(GRADWIRE_USE_NCCL STREQUAL "ON")
  message(FATAL_ERROR "GRADWIRE_USE_NCCL=ON needs CUDA, which is off or was not found")
endif()
if(GRADWIRE_HAS_CUDA)
  set(GRADWIRE_HAS_CUDA_INT 1)
else()
  set(GRADWIRE_HAS_CUDA_INT 0)
endif()
if(GRADWIRE_HAS_NCCL)
  set(GRADWIRE_HAS_NCCL_INT 1)
else()
  set(GRADWIRE_HAS_NCCL_INT 0)
endif()
