# GPU registrations beyond the automatic test_gpu_* ones: compute-sanitizer memcheck and
# racecheck over a quick representative subset (QED_GPU_QUICK=1 trims the sweeps), labelled
# `gpu;sanitizer` so that ci/device.sh runs them with the other GPU tests.
find_program(QED_COMPUTE_SANITIZER compute-sanitizer HINTS /usr/local/cuda/bin)
if(QED_COMPUTE_SANITIZER)
  # memcheck: every variant and arm at K <= 64 (quick sweep); racecheck (slow): fewer cases.
  set(_qed_san_memcheck_test_gpu_recurrent "GpuRecurrent.AllVariantsBf16:GpuRecurrent.Fp16*")
  set(_qed_san_racecheck_test_gpu_recurrent "GpuRecurrent.Fp16*")
  set(_qed_san_memcheck_test_gpu_recurrent_decode "GpuDecode.*:GpuBackward.*")
  # racecheck does not see the bulk copies' async-proxy writes and spins slowly on their barriers:
  # the tma kernel is checked by memcheck only.
  set(_qed_san_racecheck_test_gpu_recurrent_decode "GpuDecode.*:-GpuDecode.Tma*")
  foreach(_t test_gpu_recurrent test_gpu_recurrent_decode)
    if(TARGET ${_t})
      foreach(_tool memcheck racecheck)
        add_test(NAME ${_t}_${_tool}
                 COMMAND ${QED_COMPUTE_SANITIZER} --tool ${_tool} --error-exitcode 1
                         $<TARGET_FILE:${_t}> --gtest_filter=${_qed_san_${_tool}_${_t}})
        set_tests_properties(${_t}_${_tool} PROPERTIES LABELS "gpu;sanitizer"
                             ENVIRONMENT "QED_GPU_QUICK=1" TIMEOUT 240)
      endforeach()
    endif()
  endforeach()
endif()
