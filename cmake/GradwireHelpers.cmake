# Helpers that give every module the same shape (docs/architecture.md, "Layout").
#
#   gradwire_add_module(<name> [STANDALONE] [DEPS gradwire::a ...] [PRIVATE_DEPS lib ...])
#     builds src/**.cc (and src/cuda/*.cu when CUDA is on) of the calling folder into the
#     library target gradwire::<name>, with include/ as its public include path. Public
#     include paths travel only along DEPS, so a module that includes a header of a module
#     it does not depend on fails to compile. A DEPS entry must name a module added
#     earlier (modules are added in layer order), so no module can reach upward.
#     STANDALONE: a module with a public third-party dependency of its own (the LibTorch
#     bridge) stays out of the umbrella target gradwire::gradwire and is exported on its
#     own, as the package component <name> (find_package(gradwire COMPONENTS <name>)).
#
#   gradwire_add_test(<module> [DEPS ...])
#     builds tests/<module>/*.cc into <module>_test, links GoogleTest and tests/support,
#     and registers each case with CTest as <module>.<Suite>.<Case>, labelled <module>.

set(GRADWIRE_MODULES "" CACHE INTERNAL "")
set(GRADWIRE_MODULES_QUALIFIED "" CACHE INTERNAL "")

set(GRADWIRE_CXX_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(GRADWIRE_WERROR)
  list(APPEND GRADWIRE_CXX_WARNINGS -Werror)
endif()
if(GRADWIRE_SANITIZE)
  list(JOIN GRADWIRE_SANITIZE "," _gw_san)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${_gw_san}>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${_gw_san})
endif()

function(gradwire_add_module name)
  cmake_parse_arguments(ARG "STANDALONE" "" "DEPS;PRIVATE_DEPS" ${ARGN})
  foreach(dep IN LISTS ARG_DEPS)
    if(NOT dep MATCHES "^gradwire::")
      message(FATAL_ERROR "module ${name}: DEPS takes gradwire modules only (got '${dep}'); "
                          "third-party libraries go in PRIVATE_DEPS")
    endif()
    string(REPLACE "gradwire::" "" dep_name "${dep}")
    if(NOT dep_name IN_LIST GRADWIRE_MODULES)
      message(FATAL_ERROR "module ${name} depends on '${dep}', which is not a module added "
                          "before it: modules may only use modules below them (docs/architecture.md, Layers)")
    endif()
  endforeach()

  set(dir "${CMAKE_CURRENT_SOURCE_DIR}")
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS "${dir}/src/*.cc")
  list(FILTER sources EXCLUDE REGEX "/src/cuda/")
  if(GRADWIRE_HAS_CUDA)
    file(GLOB cuda_sources CONFIGURE_DEPENDS "${dir}/src/cuda/*.cu" "${dir}/src/cuda/*.cc")
    list(APPEND sources ${cuda_sources})
  endif()
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS "${dir}/include/*.h")

  set(target gradwire_${name})
  add_library(${target} ${sources} ${headers})
  add_library(gradwire::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME gradwire_${name}
                                             CUDA_SEPARABLE_COMPILATION OFF)
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${dir}/include>
           $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${dir}/src)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${GRADWIRE_CXX_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall --expt-relaxed-constexpr>)
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  set(export_set gradwireTargets)
  if(ARG_STANDALONE)
    set(export_set gradwire_${name}Targets)
  endif()
  install(TARGETS ${target} EXPORT ${export_set}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY ${dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

  set(GRADWIRE_MODULES ${GRADWIRE_MODULES} ${name} CACHE INTERNAL "")
  if(ARG_STANDALONE)
    install(EXPORT ${export_set} NAMESPACE gradwire::
            DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradwire)
  else()
    set(GRADWIRE_MODULES_QUALIFIED ${GRADWIRE_MODULES_QUALIFIED} gradwire::${name} CACHE INTERNAL "")
  endif()
endfunction()

function(gradwire_add_test module)
  # PROPERTIES: more CTest properties for every case (e.g. RUN_SERIAL TRUE).
  cmake_parse_arguments(ARG "" "" "DEPS;PROPERTIES" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/${module}/*.cc")
  set(target ${module}_test)
  add_executable(${target} ${sources})
  target_compile_options(${target} PRIVATE ${GRADWIRE_CXX_WARNINGS})
  target_link_libraries(${target} PRIVATE ${ARG_DEPS} gradwire_test_support GTest::gtest
                                          GTest::gmock)
  gtest_discover_tests(${target}
    TEST_PREFIX "${module}."
    PROPERTIES LABELS ${module} TIMEOUT 120 ${ARG_PROPERTIES}
    DISCOVERY_TIMEOUT 60)
endfunction()

function(gradwire_install_package)
  include(CMakePackageConfigHelpers)
  install(FILES "${PROJECT_BINARY_DIR}/generated/gradwire/config.h"
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gradwire)
  install(EXPORT gradwireTargets NAMESPACE gradwire::
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradwire)
  configure_package_config_file(cmake/gradwireConfig.cmake.in
    "${PROJECT_BINARY_DIR}/gradwireConfig.cmake"
    INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradwire)
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/gradwireConfigVersion.cmake"
    COMPATIBILITY SameMinorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/gradwireConfig.cmake"
                "${PROJECT_BINARY_DIR}/gradwireConfigVersion.cmake"
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gradwire)
endfunction()
