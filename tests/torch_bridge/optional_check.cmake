# build.TorchBridgeOptional: the LibTorch bridge is optional. Configures this source tree
# twice in scratch folders (configure only, nothing is compiled):
#   -DGRADWIRE_WITH_TORCH=OFF: succeeds, says the bridge is skipped in one status line,
#     and generates no gradwire_torch or torch_bridge_test target;
#   -DGRADWIRE_WITH_TORCH=ON with LibTorch hidden (CMAKE_DISABLE_FIND_PACKAGE_Torch): fails,
#     saying that LibTorch was not found and how to install it.
# Arguments: SOURCE_DIR, WORK_DIR, GENERATOR, CXX_COMPILER.
foreach(arg SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${arg})
    message(FATAL_ERROR "optional_check.cmake: pass -D${arg}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
set(common -S "${SOURCE_DIR}" -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
           -DGRADWIRE_USE_CUDA=OFF -DGRADWIRE_BUILD_BENCH=OFF -DGRADWIRE_BUILD_EXAMPLES=OFF)

execute_process(COMMAND ${CMAKE_COMMAND} ${common} -B "${WORK_DIR}/off" -DGRADWIRE_WITH_TORCH=OFF
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure with GRADWIRE_WITH_TORCH=OFF failed (${rc}):\n${out}\n${err}")
endif()
string(REGEX MATCHALL "LibTorch bridge skipped \\(GRADWIRE_WITH_TORCH=OFF\\)" said "${out}")
list(LENGTH said times)
if(NOT times EQUAL 1)
  message(FATAL_ERROR "GRADWIRE_WITH_TORCH=OFF: expected one status line saying the bridge "
                      "is skipped, got ${times}:\n${out}")
endif()
if(NOT out MATCHES "TORCH=OFF")
  message(FATAL_ERROR "GRADWIRE_WITH_TORCH=OFF: the summary line does not say TORCH=OFF:\n${out}")
endif()
file(READ "${WORK_DIR}/off/build.ninja" ninja)
foreach(target gradwire_torch torch_bridge_test)
  if(ninja MATCHES "build ${target}:|/${target}[ :.]")
    message(FATAL_ERROR "GRADWIRE_WITH_TORCH=OFF still generates target ${target}")
  endif()
endforeach()

execute_process(COMMAND ${CMAKE_COMMAND} ${common} -B "${WORK_DIR}/on" -DGRADWIRE_WITH_TORCH=ON
                        -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "GRADWIRE_WITH_TORCH=ON without LibTorch: the configure succeeded:\n${out}")
endif()
string(REGEX REPLACE "[ \t\r\n]+" " " err_flat "${err}")
if(NOT err_flat MATCHES "GRADWIRE_WITH_TORCH=ON, but find_package\\(Torch\\) found no LibTorch"
   OR NOT err_flat MATCHES "libtorch-dev")
  message(FATAL_ERROR "GRADWIRE_WITH_TORCH=ON without LibTorch: unclear message:\n${err}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
message(STATUS "the LibTorch bridge is skipped with OFF and demanded with ON")
