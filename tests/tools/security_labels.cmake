# Read by CTest after tools_test's discovered cases: the launcher's secret cases are
# security tests too (ctest -L security runs them), so they carry both labels.
foreach(test IN LISTS tools_test_TESTS)
  if(test MATCHES "^tools\\.LauncherSecret\\.")
    set_tests_properties("${test}" PROPERTIES LABELS "tools;security")
  endif()
endforeach()
