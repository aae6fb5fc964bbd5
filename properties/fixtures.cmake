# Case files: a longer sweep of damaged files through read_case (label slow). The default cpu
# run of test_case_io_robust already does 200 damaged files with one seed.
foreach(seed 1 2 3)
  add_test(NAME case_io_damaged_bytes_seed${seed}
    COMMAND test_case_io_robust --gtest_filter=Robust.DamagedBytesNeverCrash)
  set_tests_properties(case_io_damaged_bytes_seed${seed} PROPERTIES LABELS slow TIMEOUT 1800
    ENVIRONMENT "QEDCHECK_SEED=${seed};QEDCHECK_DAMAGE_TRIALS=5000")
endforeach()
