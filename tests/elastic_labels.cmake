# Read by CTest after every module's discovered cases: a case of rpc/ or rref/ whose suite
# name starts with "Elastic" (Elastic, ElasticRefusals, ElasticPresence, ElasticProcesses,
# ...), and the examples' PsElastic cases (ps_train as an elastic job), are elastic tests as
# well, so `ctest -L elastic` runs them with the
# launcher's and the parameter server's. (A CTest script cannot read a test's labels back,
# so the module's own label is restated.)
foreach(module rpc rref examples)
  foreach(test IN LISTS ${module}_test_TESTS)
    if(test MATCHES "^${module}\\.(Elastic|PsElastic)")
      set_tests_properties("${test}" PROPERTIES LABELS "${module};elastic")
    endif()
  endforeach()
endforeach()
