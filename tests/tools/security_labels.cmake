# Read by CTest after tools_test's discovered cases: the launcher's secret cases are
# security tests too (ctest -L security runs them), so they carry both labels.
foreach(test IN LISTS tools_test_TESTS)
  if(test MATCHES "^tools\\.LauncherSecret\\.")
    set_tests_properties("${test}" PROPERTIES LABELS "tools;security")
  endif()
endforeach()
# The elastic role job cases (tools/elastic_test.cc, and the lifecycle's row for a late node
# of a role job) are labelled elastic as well: ctest -L elastic runs them with the other
# modules' elastic cases.
foreach(test IN LISTS tools_test_TESTS)
  if(test MATCHES "^tools\\.(LauncherElastic|RendezvousElastic)\\." OR
     test STREQUAL "tools.LauncherLifecycle.ALateNodeOfARoleJobJoinsTheRunningGeneration")
    set_tests_properties("${test}" PROPERTIES LABELS "tools;elastic")
  endif()
endforeach()
