# verify: the tests of `qedcheck verify` and of the golden corpus link the verify library and run
# the qedcheck binary (its path is compiled in as QEDCHECK_BIN).
foreach(t test_verify test_verify_cli test_verify_malformed test_golden)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE qed_verify)
    target_compile_definitions(${t} PRIVATE QEDCHECK_BIN="$<TARGET_FILE:qedcheck>")
    add_dependencies(${t} qedcheck)
  endif()
endforeach()

# The committed corpus equals what the generator builds now (decoded datasets and attributes).
add_test(NAME golden.corpus_matches_generator
  COMMAND $<TARGET_FILE:qedcheck> golden --check ${PROJECT_SOURCE_DIR}/fixtures/golden)
set_tests_properties(golden.corpus_matches_generator PROPERTIES LABELS cpu TIMEOUT 300)

# The PyTorch interop script's numpy-only path writes a bf16 candidate that verify accepts.
add_test(NAME verify.python_dump_dry_run
  COMMAND sh -c "'${QEDCHECK_PYTHON}' '${PROJECT_SOURCE_DIR}/examples/python/dump_fla_gdn2.py' --dry-run --T 70 --K 8 --V 8 --B 1 --seqlens 30,0,40 --out '${CMAKE_CURRENT_BINARY_DIR}/fla_dry.h5' && '$<TARGET_FILE:qedcheck>' verify '${CMAKE_CURRENT_BINARY_DIR}/fla_dry.h5' --json '${CMAKE_CURRENT_BINARY_DIR}/fla_dry.json'")
set_tests_properties(verify.python_dump_dry_run PROPERTIES LABELS cpu TIMEOUT 120)

# Zero-padding of head sizes (verify/head_padding.hpp), checked against the CPU reference.
if(TARGET test_head_padding)
  target_link_libraries(test_head_padding PRIVATE qed_verify)
endif()

# `qedcheck golden --replay` (the path ci/device.sh takes for the CUDA kernels) on a CPU reference:
# exit 0 and every case within the corpus' float budget; and with a budget file that no
# implementation meets (rtol 1e-30), exit 1 (the replay can fail).
add_test(NAME golden.replay_cli
  COMMAND $<TARGET_FILE:qedcheck> golden --replay ${PROJECT_SOURCE_DIR}/fixtures/golden
          --impl reference-chunked --precision float)
set_tests_properties(golden.replay_cli PROPERTIES LABELS cpu TIMEOUT 300
  PASS_REGULAR_EXPRESSION "replay PASS: 25 of 25 cases")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/replay_impossible.json
  "{\"schema\": \"qedcheck.tolerance/1\", \"datasets\": {\"*\": {\"rtol_frobenius\": 1e-30}}}\n")
add_test(NAME golden.replay_cli_fails_beyond_budget
  COMMAND $<TARGET_FILE:qedcheck> golden --replay ${PROJECT_SOURCE_DIR}/fixtures/golden
          --impl reference-recurrent --precision float
          --tolerance ${CMAKE_CURRENT_BINARY_DIR}/replay_impossible.json)
set_tests_properties(golden.replay_cli_fails_beyond_budget PROPERTIES LABELS cpu TIMEOUT 300
  PASS_REGULAR_EXPRESSION "replay FAIL: 0 of 25 cases")
