// The kernels' source fingerprint (see api.hpp), from the header the build generates.
#include "kernel_fingerprint.hpp"
#include "kernels/api.hpp"

namespace qed::kernels {
const char* source_fingerprint() { return QED_KERNEL_SOURCE_FINGERPRINT; }
}  // namespace qed::kernels
