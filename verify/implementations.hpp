// Every implementation the suite can run on a case, by name: the CPU references (recurrent,
// chunked twin) and, where built, the CUDA kernels. Verbs that compare, certify or fuzz are
// written against run_implementation, so a new kernel is one entry away from all of them.
#pragma once

#include <string>
#include <vector>

#include "fixtures/case.hpp"
#include "reference/scalar.hpp"

namespace qed::verify {

struct RunOptions {
  std::string impl = "reference-recurrent";
  reference::Precision precision = reference::Precision::f64();  // CPU references
  int64_t chunk = 64;                 // reference-chunked, cuda-chunked
  std::string operands = "none";      // reference-chunked: none | fp32 | bf16 | fp16
  std::string dtype = "fp32";         // cuda-*: fp32 | bf16 (inputs rounded to it first)
  int threads = 0;
};

std::vector<std::string> implementation_names();
// Throws qed::Error ("implementation 'X' is not available in this build (known: ...)") unless
// `impl` is one of implementation_names().
void require_implementation(const std::string& impl);

// Runs `opt.impl` on the case's inputs and returns the case with /outputs and (when the case has
// cotangents and the implementation has a backward) /grads filled. CUDA implementations replace
// the inputs by the rounded values they consumed and set /inputs@dtype accordingly.
fixtures::Case run_implementation(const fixtures::Case& c, const RunOptions& opt);

}  // namespace qed::verify
