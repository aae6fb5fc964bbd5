// Deliberately broken implementations, for showing that the fuzzer (and the corpus replay) find
// real bugs: each is the recurrent reference with one classic mistake. Test-only: run_impl
// refuses them unless QEDCHECK_ENABLE_MUTANTS=1.
//   mutant-decay-after-erase  u_t = z_t - S_{t-1}^T a_t (erase reads the undecayed state)
//   mutant-scaled-erase-q     QED erase built from scale * q (MATH.md §1: must be unscaled)
//   mutant-varlen-carry       packed sequences (cu_seqlens) do not restart from their own h0
//   mutant-dq-readout-only    backward: dq misses the erase-vector term of MATH.md §5.2
// Forward mutants return /outputs only; mutant-dq-readout-only returns outputs and grads.
#pragma once

#include <string>
#include <vector>

#include "fixtures/case.hpp"
#include "verify/implementations.hpp"

namespace qed::fuzz {

std::vector<std::string> mutant_names();
fixtures::Case run_mutant(const fixtures::Case& c, const verify::RunOptions& opt);

}  // namespace qed::fuzz
