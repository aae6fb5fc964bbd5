# The kernels' source fingerprint (cmake/kernel_fingerprint.cmake), which CUDA certificates record
# and the gate compares: ci/checks/kernel_fingerprint_check.cmake runs the script on scratch files
# and fails unless the fingerprint changes with a file's bytes or name and comes back with them.
add_test(NAME kernel_fingerprint_follows_sources
         COMMAND ${CMAKE_COMMAND} -DSCRIPT=${PROJECT_SOURCE_DIR}/cmake/kernel_fingerprint.cmake
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/kernel_fingerprint_check
                 -P ${PROJECT_SOURCE_DIR}/ci/checks/kernel_fingerprint_check.cmake)
set_tests_properties(kernel_fingerprint_follows_sources PROPERTIES LABELS cpu TIMEOUT 60)

# The commit a binary is built from (cmake/build_commit.cmake; `qedcheck --version` and the
# certificates' build_commit / build_tree): ci/checks/build_commit_check.cmake runs the script on a
# scratch repository through a commit, an edit, an untracked file, a second commit, and a folder
# outside any repository.
add_test(NAME build_commit_follows_git
         COMMAND ${CMAKE_COMMAND} -DSCRIPT=${PROJECT_SOURCE_DIR}/cmake/build_commit.cmake
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/build_commit_check
                 -P ${PROJECT_SOURCE_DIR}/ci/checks/build_commit_check.cmake)
set_tests_properties(build_commit_follows_git PROPERTIES LABELS cpu TIMEOUT 60)
