// The implementation under test as the fuzzer sees it: a name plus run options (precision,
// chunk, operands, dtype), the case dtype its inputs must be rounded to, the oracle precision
// that judges it, and how to run it: verify::run_implementation, or one of the test-only mutants
// of fuzz/mutants.hpp when QEDCHECK_ENABLE_MUTANTS=1.
#pragma once

#include <string>
#include <vector>

#include "fixtures/case.hpp"
#include "reference/scalar.hpp"
#include "verify/implementations.hpp"

namespace qed::fuzz {

struct ImplSpec {
  verify::RunOptions run;
  // chunk <= 0 in a campaign: draw a chunk size per configuration (chunked implementations).
  bool draw_chunk = false;

  bool chunked() const;
  bool is_mutant() const;
  // Command-line form, e.g. "--impl reference-chunked --precision float --chunk 7 --operands bf16";
  // only options that matter for the implementation are written.
  std::string args() const;
};

// Parses the form args() writes (the order of options is free). Throws qed::Error.
ImplSpec parse_impl_args(const std::string& text);

// /inputs@dtype of the cases this implementation consumes: float64 for double and wider CPU
// references, float32 for float, bfloat16/float16 when matmul operands (or CUDA inputs) are.
std::string case_dtype(const ImplSpec& s);

// Rounds every input and cotangent of `c` to `dtype` (values a kernel of that dtype consumed)
// and sets c.dtype.
void round_case_to(fixtures::Case& c, const std::string& dtype);

// The oracle precision for judging this implementation: double for float-level results, float128
// for double, mpfr(2p + 64) beyond (each at least 50 bits finer than the implementation).
reference::Precision oracle_precision(const ImplSpec& s);

// Runs the implementation. Mutants need QEDCHECK_ENABLE_MUTANTS=1 (qed::Error otherwise).
fixtures::Case run_impl(const fixtures::Case& c, const ImplSpec& s);

// Real implementations of this build plus, when enabled, the mutants.
std::vector<std::string> known_impls();

}  // namespace qed::fuzz
