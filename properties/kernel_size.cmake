# Code size of the chunked backward's gradient pass (ci/checks/kernel_size.py reads the compiled
# objects: no GPU needed). Its RAW kernels run one block per multiprocessor, where code beyond
# the instruction caches costs instruction-fetch stalls: run 15 of reports/device/chunked.md
# measured an 18% slower pass at 259 KB, run 16 a faster one at 176 KB. The limit, 192 KiB, sits
# above the measured good size with room for small changes and far below the bad one. The second
# test runs the same check with a limit every such kernel exceeds and must fail: the check bites.
if(QEDCHECK_HAVE_CUDA AND TARGET qed_kernels_more)
  set(_qed_objs "$<JOIN:$<TARGET_OBJECTS:qed_kernels_more>,$<COMMA>>")
  add_test(NAME kernel_size_grads_raw
           COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/ci/checks/kernel_size.py
                   --pattern "grads_kernelI.*ELb1ELb1E" --max-bytes 196608 ${_qed_objs})
  add_test(NAME kernel_size_grads_raw_limit_bites
           COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/ci/checks/kernel_size.py
                   --pattern "grads_kernelI.*ELb1ELb1E" --max-bytes 65536 ${_qed_objs})
  set_tests_properties(kernel_size_grads_raw kernel_size_grads_raw_limit_bites PROPERTIES LABELS cpu
                       TIMEOUT 60)
  set_tests_properties(kernel_size_grads_raw_limit_bites PROPERTIES WILL_FAIL TRUE)
endif()
