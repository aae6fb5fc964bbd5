# bench/ncu_hot_lines.py --regions-from reads a kernel's regions from its section comments; this
# test pins the gradient pass's sections (staging, 1, 2, 3a-3f, 4), so that renaming or dropping
# one shows here rather than as a silently merged region in a profile on the device.
add_test(NAME ncu_regions_follow_grads_sections
         COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/bench/ncu_hot_lines.py
                 --regions-from ${PROJECT_SOURCE_DIR}/kernels/chunked_bwd_grads.cu --print-regions)
set_tests_properties(ncu_regions_follow_grads_sections PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION
  "^staging:[0-9]+-[0-9]+,1:[0-9]+-[0-9]+,2:[0-9]+-[0-9]+,3:[0-9]+-[0-9]+,3a:[0-9]+-[0-9]+,3b:[0-9]+-[0-9]+,3c:[0-9]+-[0-9]+,3d:[0-9]+-[0-9]+,3e:[0-9]+-[0-9]+,3f:[0-9]+-[0-9]+,4:[0-9]+-[0-9]+\n")

# bench/roofline.py: the chunked forward's model FLOPs and byte floor (the benchmark's TFLOP/s
# and effective bandwidth columns) against sums done by hand; dropping a term fails it.
add_test(NAME roofline_counts
         COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/bench/roofline.py --self-test)
set_tests_properties(roofline_counts PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION "roofline self-test: ok")

# bench/time_cases.py (the device reports' A/B timings): its argument checks need no GPU. The plan
# of a valid call, and a malformed case named with the rule it breaks (exit code ignored by the
# regular expressions, so the second test also fails on a traceback).
add_test(NAME time_cases_plan
         COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/bench/time_cases.py --dry-run /nonexistent
                 "2,16384,16,128" "fwd||gdn2" "fwd serial|QEDCHECK_CHUNKED_OVERLAP=0|gdn2")
set_tests_properties(time_cases_plan PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION
  "^plan 2,16384,16,128 fwd gdn2 - x2\nplan 2,16384,16,128 fwd serial gdn2 QEDCHECK_CHUNKED_OVERLAP=0 x2\n$")
add_test(NAME time_cases_bad_case
         COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/bench/time_cases.py --dry-run /nonexistent
                 "2,16384,16,128" "fwd|QEDCHECK_CHUNKED_MT|gdn2")
set_tests_properties(time_cases_bad_case PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION "^time_cases.py: case 'fwd\\|QEDCHECK_CHUNKED_MT\\|gdn2': knob 'QEDCHECK_CHUNKED_MT' is not KNOB=VALUE\n$")

# bench/ab_bits.py (the device check behind "same bits" claims): its comparison of two builds'
# digests on made-up input, where a differing tensor, a one-sided refusal and a missing case must
# each be reported; and its case list, which must keep the overlapped and four-warp passes.
add_test(NAME ab_bits_compare
         COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/bench/ab_bits.py --self-test)
set_tests_properties(ab_bits_compare PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION "^ab_bits self-test: ok\n$")
add_test(NAME ab_bits_cases
         COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/bench/ab_bits.py --dry-run --quick /a /b)
set_tests_properties(ab_bits_cases PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION
  "case qed/rand [^\n]*\n(.*\n)*case gdn2 bf16 overlapped [^\n]*QEDCHECK_CHUNKED_OVERLAP[^\n]*\n(.*\n)*case qed/rand bf16 prep 4 warps [^\n]*QEDCHECK_CHUNKED_PREP_WARPS")

# bench/cert_same.py (a "same bits" merge's certificates against the committed ones, value for
# value): the committed set must equal itself, and a changed value or a dropped cell must show.
add_test(NAME cert_same_compare
         COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/bench/cert_same.py --self-test)
set_tests_properties(cert_same_compare PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION "^cert_same self-test: ok")
