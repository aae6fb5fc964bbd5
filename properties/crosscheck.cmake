# The oracle against an independent mpmath implementation (ci/crosscheck/): every variant and arm,
# outputs and all gradients to >= 25 significant digits.
add_test(NAME crosscheck.mpmath_every_variant
  COMMAND bash ${PROJECT_SOURCE_DIR}/ci/crosscheck/run.sh $<TARGET_FILE:qedcheck> ${QEDCHECK_PYTHON}
          ${CMAKE_CURRENT_BINARY_DIR}/crosscheck)
set_tests_properties(crosscheck.mpmath_every_variant PROPERTIES LABELS cpu TIMEOUT 600)
