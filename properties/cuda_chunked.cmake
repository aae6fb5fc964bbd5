# CUDA chunked forward and backward: compute-sanitizer memcheck, racecheck and initcheck over a
# quick subset of their GPU tests, labelled
# `gpu;sanitizer` like properties/cuda.cmake's recurrent ones.
find_program(QED_COMPUTE_SANITIZER_CHUNKED compute-sanitizer HINTS /usr/local/cuda/bin)
# The forward's small packed cases (empty sequences, partial chunks) and the backward's (every
# variant) with its determinism check and the training pair (saved forward): target, then the
# gtest filter.
set(_qed_chunked_sanitized
  test_gpu_chunked_props
  "GpuChunkedProps.PoisonedOutputsFullyOverwritten:GpuChunkedProps.PackedEqualsSeparateAndDeterministic"
  test_gpu_chunked_backward
  "GpuChunkedBackward.PoisonedGradientsFullyOverwritten:GpuChunkedBackward.BitwiseDeterministicThreeRuns:GpuChunkedBackward.SavedForwardMatchesRecompute")
while(_qed_chunked_sanitized)
  list(POP_FRONT _qed_chunked_sanitized _target _filter)
  if(QED_COMPUTE_SANITIZER_CHUNKED AND TARGET ${_target})
    foreach(_tool memcheck racecheck initcheck)
      add_test(NAME ${_target}_${_tool}
               COMMAND ${QED_COMPUTE_SANITIZER_CHUNKED} --tool ${_tool} --error-exitcode 1
                       $<TARGET_FILE:${_target}> --gtest_filter=${_filter})
      set_tests_properties(${_target}_${_tool} PROPERTIES LABELS "gpu;sanitizer"
                           ENVIRONMENT "QED_GPU_QUICK=1" TIMEOUT 1200)
    endforeach()
  endif()
endwhile()
