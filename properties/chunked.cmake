# Chunked reference extras: the twin error-table tool (reports/chunked_twin/README.md; built, not
# run by ctest) and a sweep of the exactness properties over more seeds (label `slow`).
add_executable(chunked_twin_table ${PROJECT_SOURCE_DIR}/reports/chunked_twin/twin_table.cpp)
target_include_directories(chunked_twin_table PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(chunked_twin_table PRIVATE qed_reference qed_warnings)

if(TARGET test_chunked_exact)
  foreach(seed 101 102 103 104 105)
    add_test(NAME chunked_exact_seed_${seed} COMMAND test_chunked_exact)
    set_tests_properties(chunked_exact_seed_${seed} PROPERTIES LABELS slow
      ENVIRONMENT QEDCHECK_SEED=${seed} TIMEOUT 600)
  endforeach()
endif()
