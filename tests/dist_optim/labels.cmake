# Read by CTest after dist_optim_test's discovered cases: a shard's background snapshots and
# their restore (ShardCheckpoint*) carry the label checkpoint as well, and a server's
# failover -- a replacement restoring its shard while trainers recover (ServerFailover*) --
# the labels elastic and checkpoint (ctest -L 'elastic|checkpoint' runs them); a trainer
# group's members lost mid-round (TrainerGroupLoss) the label elastic.
foreach(test IN LISTS dist_optim_test_TESTS)
  if(test MATCHES "^dist_optim\\.ShardCheckpoint[A-Za-z]*\\.")
    set_tests_properties("${test}" PROPERTIES LABELS "dist_optim;checkpoint")
  elseif(test MATCHES "^dist_optim\\.ServerFailover[A-Za-z]*\\.")
    set_tests_properties("${test}" PROPERTIES LABELS "dist_optim;elastic;checkpoint")
  elseif(test MATCHES "^dist_optim\\.TrainerGroupLoss\\.")
    set_tests_properties("${test}" PROPERTIES LABELS "dist_optim;elastic")
  endif()
endforeach()
