# Larger sweeps of the property suite (owner: properties). Every test_prop_* / test_grad_*
# executable runs again under the `slow` label with QEDCHECK_SLOW=1: wider shapes, the T = 40,
# K = V = 8 finite-difference cases, P13 at T = 1024, K = V = 64, directional checks at T = 512,
# K = V = 32, and RapidCheck at 1000 cases per property (100 for the mpfr finite-difference
# property, whose cases cost ~0.1-0.5 s each). Run them with `ctest -L slow`.
set(QED_PROPERTIES_SLOW_TARGETS
  test_prop_forward test_prop_structure test_prop_arms test_prop_mutants test_prop_projector
  test_prop_norms test_grad_fd test_grad_identities test_grad_reductions)
foreach(target IN LISTS QED_PROPERTIES_SLOW_TARGETS)
  if(TARGET ${target})
    set(cases 1000)
    if(target STREQUAL "test_grad_fd")
      set(cases 100)
    endif()
    add_test(NAME slow.${target} COMMAND ${target})
    set_tests_properties(slow.${target} PROPERTIES
      LABELS slow
      TIMEOUT 3600
      ENVIRONMENT "QEDCHECK_SLOW=1;RC_PARAMS=max_success=${cases}")
  endif()
endforeach()
