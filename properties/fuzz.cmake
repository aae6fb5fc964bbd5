# Fuzzing and robustness tests (owner: fuzz). The fuzz library comes from fuzz/ (added here when
# the top-level CMakeLists.txt has not added it before properties/).
if(NOT TARGET qed_fuzz)
  add_subdirectory(${PROJECT_SOURCE_DIR}/fuzz ${PROJECT_BINARY_DIR}/fuzz)
endif()

file(GLOB QED_FUZZ_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/test_fuzz*.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/test_robustness*.cpp)
foreach(src IN LISTS QED_FUZZ_TESTS)
  get_filename_component(name ${src} NAME_WE)
  if(TARGET ${name})
    target_link_libraries(${name} PRIVATE qed_fuzz)
    # Tests that run the binary itself (robustness table, replay commands).
    add_dependencies(${name} qedcheck)
    target_compile_definitions(${name} PRIVATE QEDCHECK_BINARY="$<TARGET_FILE:qedcheck>")
  endif()
endforeach()

# The verb end to end: a campaign against a mutant finds, shrinks and saves a counterexample
# (exit 1; the regular expression checks the saved file's name and the replay command).
add_test(NAME fuzz.cli_finds_a_mutant
  COMMAND ${CMAKE_COMMAND} -E env QEDCHECK_ENABLE_MUTANTS=1
          $<TARGET_FILE:qedcheck> fuzz --impl mutant-decay-after-erase --precision float --seed 1
          --time 60s --corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz_cli_corpus)
set_tests_properties(fuzz.cli_finds_a_mutant PROPERTIES LABELS cpu TIMEOUT 300
  PASS_REGULAR_EXPRESSION "(saved|already in the corpus:) [^\n]*mutant-decay-after-erase-[0-9a-f]+\\.h5\n  replay: QEDCHECK_ENABLE_MUTANTS=1 qedcheck fuzz --replay")

# Longer campaigns on the real CPU references (label slow): no clear failure may appear. The
# chunk size 16 differs from the twin rule's 64, so the implementation is not judged by itself.
foreach(prec float double)
  add_test(NAME fuzz.campaign_chunked_${prec}
    COMMAND $<TARGET_FILE:qedcheck> fuzz --impl reference-chunked --precision ${prec} --chunk 16
            --seed 20 --time 120s --corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz_campaign_corpus)
  set_tests_properties(fuzz.campaign_chunked_${prec} PROPERTIES LABELS slow TIMEOUT 900)
endforeach()

# The parser findings that once cost the production reader 16.8 GB for 13-16 s (a damaged
# variable-length string attribute; reports/fuzz/README.md, finding 3): each must now be refused
# (exit 2, the attribute named) within 20 s and 1 GB peak RSS of the reader's processes.
# Not in AddressSanitizer builds: there the reader sets no address-space cap (ASan reserves terabytes
# of shadow memory), which is what these files test.
set(QED_MEMORY_FINDINGS "")
if(NOT QEDCHECK_SANITIZE AND NOT CMAKE_CXX_FLAGS MATCHES "sanitize=[^ ]*address")
  file(GLOB QED_MEMORY_FINDINGS ${PROJECT_SOURCE_DIR}/reports/fuzz/findings/read_case-memory-*.h5)
endif()
foreach(f IN LISTS QED_MEMORY_FINDINGS)
  get_filename_component(fname ${f} NAME_WE)
  add_test(NAME fuzz.finding_${fname}_is_cheap
    COMMAND ${QEDCHECK_PYTHON} ${PROJECT_SOURCE_DIR}/ci/checks/bounded_run.py --max-rss-mb 1024
            --max-seconds 20 --expect-exit 2 --expect-stderr "/@arm: unreadable string"
            -- $<TARGET_FILE:qedcheck> verify ${f} --no-golden)
  set_tests_properties(fuzz.finding_${fname}_is_cheap PROPERTIES LABELS cpu TIMEOUT 120)
endforeach()
