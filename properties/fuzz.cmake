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
