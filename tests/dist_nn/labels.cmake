# Read by CTest after dist_nn_test's discovered cases: they are the remote_module tests as
# well (ctest -L remote_module runs them), so they carry both labels.
foreach(test IN LISTS dist_nn_test_TESTS)
  set_tests_properties("${test}" PROPERTIES LABELS "dist_nn;remote_module")
endforeach()
