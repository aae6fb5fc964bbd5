// libFuzzer harness for the case loader: arbitrary bytes are written to a file (on tmpfs when
// /dev/shm exists) and read with fixtures::read_case under a 64 MiB allocation bound, in process
// (isolate = false: the fork()ed reader that protects the CLI from libhdf5 would hide both the
// coverage and the crashes from libFuzzer). The only acceptable outcomes are a case or a
// qed::Error; anything else (a crash, a sanitizer report, another exception type escaping, a
// leak) is a finding. libhdf5 1.10's own failures on damaged files (huge allocations in
// H5T__conv_vlen, endless loops) show up as OOM and timeout reports: ci/fuzz_parsers.sh counts
// them apart, since the isolated reader is what stops them in production. read_case takes a
// path, hence the file.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "fixtures/case.hpp"

namespace {

std::string scratch_path() {
  const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  return std::string(dir) + "/qedcheck_fuzz_case_" + std::to_string(::getpid()) + ".h5";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = scratch_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  qed::fixtures::ReadOptions opt;
  opt.max_bytes = 64u << 20;
  opt.isolate = false;
  try {
    const qed::fixtures::Case c = qed::fixtures::read_case(path, opt);
    (void)c;
  } catch (const qed::Error&) {
  }
  return 0;
}
