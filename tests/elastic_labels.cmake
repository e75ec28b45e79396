# Read by CTest after every module's discovered cases: a case of rpc/ or rref/ whose suite
# name starts with "Elastic" (Elastic, ElasticRefusals, ElasticPresence, ElasticProcesses,
# ...) is an elastic-membership test as well, so `ctest -L elastic` runs them with the
# launcher's and the parameter server's. (A CTest script cannot read a test's labels back,
# so the module's own label is restated.)
foreach(module rpc rref)
  foreach(test IN LISTS ${module}_test_TESTS)
    if(test MATCHES "^${module}\\.Elastic")
      set_tests_properties("${test}" PROPERTIES LABELS "${module};elastic")
    endif()
  endforeach()
endforeach()
