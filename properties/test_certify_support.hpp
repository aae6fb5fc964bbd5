// Helpers of the certify, gate and report tests: scratch folders, a tiny sweep that runs in a
// second, seeds with replay hints, and running the qedcheck binary.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "verify/certify.hpp"

namespace qed::certify_test {

// QEDCHECK_SEED overrides the first seed of every tiny sweep, to replay a failure.
inline uint64_t test_seed(uint64_t dflt = 0) {
  if (const char* s = std::getenv("QEDCHECK_SEED")) return std::strtoull(s, nullptr, 10);
  return dflt;
}
inline std::string replay(uint64_t seed) {
  return "replay: QEDCHECK_SEED=" + std::to_string(seed) + " and the same --gtest_filter";
}

// A fresh empty folder under the temporary directory, removed by the destructor.
struct Scratch {
  std::filesystem::path dir;
  explicit Scratch(const std::string& name) {
    dir = std::filesystem::temp_directory_path() /
          ("qedcheck-" + name + "-" + std::to_string(static_cast<long>(::getpid())));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    if (!std::getenv("QEDCHECK_KEEP_SCRATCH")) std::filesystem::remove_all(dir, ec);
  }
  std::string operator/(const std::string& f) const { return (dir / f).string(); }
};

// Two families x two regimes x two lengths, K = V = 8, one head, two seeds: 8 problems per dtype.
inline verify::CertifyOptions tiny_sweep(const std::string& out, uint64_t first_seed) {
  verify::CertifyOptions o;
  o.impls = {"reference-recurrent", "reference-chunked"};
  o.dtypes = {"fp32"};
  o.out_dir = out;
  o.seeds = 2;
  o.first_seed = first_seed;
  o.Ts = {16, 40};
  o.head_dims = {8};
  o.families = {"gdn2", "qed.full@1"};
  o.regimes = {"std", "hard"};
  o.unstable = false;
  o.heads = 1;
  o.threads = 1;
  o.progress = false;
  return o;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline int count_lines(const std::string& path) {
  int n = 0;
  for (char ch : read_text(path)) n += ch == '\n';
  return n;
}

// Runs a shell command line; returns its exit status (-1 if it did not exit normally).
inline int shell(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace qed::certify_test
