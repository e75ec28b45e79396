# Read by CTest after the discovered cases: the LibTorch bridge's cases are labelled
# libtorch as well as torch_bridge (a CTest script cannot read a test's labels back, so the
# module's own label is restated).
foreach(test IN LISTS torch_bridge_test_TESTS)
  set_tests_properties("${test}" PROPERTIES LABELS "torch_bridge;libtorch")
endforeach()
