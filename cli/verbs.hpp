// How verbs join the `qedcheck` binary: each cli/verb_*.cpp defines a static RegisterVerb that
// adds its subcommand to the CLI11 app and, when chosen, sets the action to run. main() maps
// qed::Error to exit code 2 with one line on stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "verify/implementations.hpp"

namespace qed::cli {

// The chosen verb's work; returns the process exit code.
using Action = std::function<int()>;
using VerbSetup = std::function<void(CLI::App& app, Action& action)>;

struct VerbEntry {
  int order;  // position in --help
  VerbSetup setup;
};

inline std::vector<VerbEntry>& verb_registry() {
  static std::vector<VerbEntry> verbs;
  return verbs;
}

struct RegisterVerb {
  RegisterVerb(int order, VerbSetup setup) { verb_registry().push_back({order, std::move(setup)}); }
};

// The options that pick an implementation and how it computes (run, bench, golden --replay):
// --impl, --precision (parsed later into run.precision), --chunk, --operands, --dtype. `scope`
// prefixes their help ("--replay: ").
inline void add_implementation_options(CLI::App* sub, verify::RunOptions& run, std::string& precision,
                                       const std::string& scope = "") {
  sub->add_option("--impl", run.impl,
                  scope + "reference-recurrent | reference-chunked | cuda-recurrent | cuda-chunked")
      ->capture_default_str();
  sub->add_option("--precision", precision, scope + "CPU references: float | double | float128 | mpfr:BITS")
      ->capture_default_str();
  sub->add_option("--chunk", run.chunk, scope + "chunk size of the chunked implementations")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--operands", run.operands,
                  scope + "reference-chunked: round matmul operands to none | fp32 | bf16 | fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "fp32", "bf16", "fp16"}));
  sub->add_option("--dtype", run.dtype, scope + "CUDA kernels: input dtype fp32 | bf16 (| fp16: recurrent)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
}

}  // namespace qed::cli
