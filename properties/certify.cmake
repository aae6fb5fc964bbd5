# Certification, gate and report tests: they use the verify library and the qedcheck binary
# (the CLI resume, gate and report tests run it), and the report test finds the generator and
# the committed reports in the source tree.
foreach(t test_certify test_gate test_report)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE qed_verify)
    add_dependencies(${t} qedcheck)
    target_compile_definitions(${t} PRIVATE QEDCHECK_BINARY="$<TARGET_FILE:qedcheck>")
  endif()
endforeach()

# The command-line gate on a tiny certificate: passes on the certified implementation, fails
# (exit 1) on the same implementation with bf16 operands where fp32 was certified.
set(QED_GATE_DIR ${CMAKE_BINARY_DIR}/gate-cli)
add_test(NAME gate_cli_certify_tiny
  COMMAND qedcheck certify --impl reference-chunked --dtype fp32 --out ${QED_GATE_DIR} --T 16,40
    --head-dim 8 --heads 1 --seeds 2 --family gdn2,qed.full@1 --regime std,hard --no-unstable -q)
set_tests_properties(gate_cli_certify_tiny PROPERTIES LABELS cpu FIXTURES_SETUP gate_cli TIMEOUT 300)
add_test(NAME gate_cli_passes_on_certified
  COMMAND qedcheck gate --certificate ${QED_GATE_DIR}/reference-chunked+fp32.json -q)
set_tests_properties(gate_cli_passes_on_certified PROPERTIES LABELS cpu FIXTURES_REQUIRED gate_cli
  PASS_REGULAR_EXPRESSION "gate: PASS" TIMEOUT 300)
add_test(NAME gate_cli_fails_on_bf16_operands
  COMMAND qedcheck gate --certificate ${QED_GATE_DIR}/reference-chunked+fp32.json --operands bf16
    --no-exact -q)
# Exit 1 with the diff table; PASS_REGULAR_EXPRESSION (not WILL_FAIL) so that a usage error
# (exit 2) cannot pass for a detected regression.
set_tests_properties(gate_cli_fails_on_bf16_operands PROPERTIES LABELS cpu FIXTURES_REQUIRED gate_cli
  PASS_REGULAR_EXPRESSION "gate: FAIL .*above their certified bound|above their certified bound(.|\n)*gate: FAIL"
  TIMEOUT 300)

# The committed certificates, all cells (not only the smallest T): behind `slow`.
add_test(NAME gate_committed_all_cells
  COMMAND ${CMAKE_COMMAND} -E env QEDCHECK=$<TARGET_FILE:qedcheck> bash
    ${PROJECT_SOURCE_DIR}/ci/gate.sh --all-cells
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(gate_committed_all_cells PROPERTIES LABELS slow TIMEOUT 3600)

# A CUDA kernel named with --impl on a machine without a device (or a build without CUDA): exit 2
# with one line, never an empty success. Skipped where a device answers nvidia-smi.
add_test(NAME certify_cli_unavailable_impl_is_exit_2
  COMMAND bash -c "if nvidia-smi -L >/dev/null 2>&1; then echo 'SKIP: a GPU is present'; exit 0; fi
    \"$0\" certify --impl cuda-recurrent --quick --T 64 --seeds 1 -q --out \"$1\" 2>&1; rc=$?
    echo \"exit $rc\"; test $rc = 2" $<TARGET_FILE:qedcheck> ${CMAKE_CURRENT_BINARY_DIR}/certify_unavailable)
set_tests_properties(certify_cli_unavailable_impl_is_exit_2 PROPERTIES LABELS cpu TIMEOUT 120
  SKIP_REGULAR_EXPRESSION "SKIP: a GPU is present"
  PASS_REGULAR_EXPRESSION "qedcheck: error: [^\n]*cuda-recurrent[^\n]*\\(rule: [^\n]*\\)(.|\n)*\nexit 2")
