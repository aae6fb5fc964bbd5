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
