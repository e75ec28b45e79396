# Run by CTest (cmake -P): install, then build and run an out-of-tree consumer.
# Optional: CONSUMER_EXE (the program the consumer builds; default consumer), EXAMPLE_SOURCE
# (passed to the consumer's configure), LAUNCH_WORKERS (run the program under the installed
# gradwire-run with that many workers, with RUN_ARGS).
if(NOT CONSUMER_EXE)
  set(CONSUMER_EXE consumer)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install consumer check: ${what} failed (${rc}):\n${out}")
  endif()
endfunction()
run_step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
run_step("consumer configure" ${CMAKE_COMMAND} -S "${CONSUMER_SRC}" -B "${WORK_DIR}/build"
         -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
         -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
         -DEXAMPLE_SOURCE=${EXAMPLE_SOURCE})
run_step("consumer build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
if(LAUNCH_WORKERS)
  separate_arguments(run_args UNIX_COMMAND "${RUN_ARGS}")
  run_step("consumer run" "${prefix}/bin/gradwire-run" --nproc-per-node ${LAUNCH_WORKERS}
           "${WORK_DIR}/build/${CONSUMER_EXE}" ${run_args})
else()
  run_step("consumer run" "${WORK_DIR}/build/${CONSUMER_EXE}")
endif()
message(STATUS "install consumer check passed")
