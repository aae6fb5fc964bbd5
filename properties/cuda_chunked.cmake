# CUDA chunked forward: compute-sanitizer memcheck, racecheck and initcheck over a quick subset
# of its GPU tests (small packed cases with empty sequences and partial chunks), labelled
# `gpu;sanitizer` like properties/cuda.cmake's recurrent ones.
find_program(QED_COMPUTE_SANITIZER_CHUNKED compute-sanitizer HINTS /usr/local/cuda/bin)
if(QED_COMPUTE_SANITIZER_CHUNKED AND TARGET test_gpu_chunked_props)
  foreach(_tool memcheck racecheck initcheck)
    add_test(NAME test_gpu_chunked_props_${_tool}
             COMMAND ${QED_COMPUTE_SANITIZER_CHUNKED} --tool ${_tool} --error-exitcode 1
                     $<TARGET_FILE:test_gpu_chunked_props>
                     --gtest_filter=GpuChunkedProps.PoisonedOutputsFullyOverwritten:GpuChunkedProps.PackedEqualsSeparateAndDeterministic)
    set_tests_properties(test_gpu_chunked_props_${_tool} PROPERTIES LABELS "gpu;sanitizer"
                         ENVIRONMENT "QED_GPU_QUICK=1" TIMEOUT 1200)
  endforeach()
endif()
# CUDA chunked backward: the same three tools over its small packed cases (empty sequences,
# partial chunks, every variant) and the determinism check.
if(QED_COMPUTE_SANITIZER_CHUNKED AND TARGET test_gpu_chunked_backward)
  foreach(_tool memcheck racecheck initcheck)
    add_test(NAME test_gpu_chunked_backward_${_tool}
             COMMAND ${QED_COMPUTE_SANITIZER_CHUNKED} --tool ${_tool} --error-exitcode 1
                     $<TARGET_FILE:test_gpu_chunked_backward>
                     --gtest_filter=GpuChunkedBackward.PoisonedGradientsFullyOverwritten:GpuChunkedBackward.BitwiseDeterministicThreeRuns)
    set_tests_properties(test_gpu_chunked_backward_${_tool} PROPERTIES LABELS "gpu;sanitizer"
                         ENVIRONMENT "QED_GPU_QUICK=1" TIMEOUT 1200)
  endforeach()
endif()
