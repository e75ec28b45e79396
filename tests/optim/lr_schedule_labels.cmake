# Read by CTest after optim_test's and dist_optim_test's discovered cases: the learning-rate
# schedule and parameter-group cases (suites named Lr*) carry the label lr_schedule as well
# (ctest -L lr_schedule runs them).
foreach(module optim dist_optim)
  foreach(test IN LISTS ${module}_test_TESTS)
    if(test MATCHES "^${module}\\.Lr[A-Za-z]*\\.")
      set_tests_properties("${test}" PROPERTIES LABELS "${module};lr_schedule")
    endif()
  endforeach()
endforeach()
