// The commit this binary was built from (cmake/build_commit.cmake writes the header at build time).
#include "build_commit.hpp"
#include "verify/certificate.hpp"

namespace qed::verify {
std::string build_commit() { return QED_BUILD_COMMIT; }
std::string build_tree_state() { return QED_BUILD_TREE; }
}  // namespace qed::verify
