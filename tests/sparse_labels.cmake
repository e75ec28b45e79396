# Read by CTest after every module's discovered cases: a case whose suite name starts with
# "Sparse" (SparseRows, SparseGrad, SparseOptim, SparseWire, ...) is a sparse-gradient test
# as well, so `ctest -L sparse` runs them all, whichever module's binary holds them. (A
# CTest script cannot read a test's labels back, so the module's own are restated: its
# name, and remote_module for dist_nn's cases as tests/dist_nn/labels.cmake gives them.)
foreach(module tensor autograd nn optim rpc dist_autograd dist_optim ddp dist_nn)
  set(labels "${module}")
  if(module STREQUAL "dist_nn")
    set(labels "dist_nn;remote_module")
  endif()
  foreach(test IN LISTS ${module}_test_TESTS)
    if(test MATCHES "^${module}\\.Sparse")
      set_tests_properties("${test}" PROPERTIES LABELS "${labels};sparse")
    endif()
  endforeach()
endforeach()
