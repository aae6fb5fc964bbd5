// Replaying the golden corpus against an implementation: every case of a corpus folder is run
// through `run_implementation` and its results judged by `verify` against the corpus' budget.
// `qedcheck golden --replay` prints it (CI replays the CPU references through
// properties/test_golden.cpp, ci/device.sh the CUDA kernels through the verb).
#pragma once

#include <string>
#include <vector>

#include "verify/implementations.hpp"
#include "verify/tolerance.hpp"

namespace qed::verify {

struct ReplayRow {
  std::string name;              // corpus case
  bool pass = false;
  double worst_score = 0;        // largest error / bound over the datasets (<= 1 passes)
  std::string worst_dataset;     // where it was reached
  double worst_rel_frobenius = 0;
  std::string reference_source;  // "golden" (stored values) or "oracle" (inputs were rounded)
  int datasets = 0;
  double seconds = 0;
};

// The budget file of fixtures/golden that fits an implementation: replay_float64.json for double
// (and wider) CPU references, replay_bf16.json for bf16 operands or CUDA bf16 inputs,
// replay_float32.json otherwise.
std::string default_replay_budget(const RunOptions& run);

// Replays every case of DIR/MANIFEST.json (in manifest order); `tolerance` empty: DIR's default
// budget for `run`. Throws qed::Error when the corpus cannot be read or the implementation cannot
// run a case (no device, unsupported size), naming the case.
std::vector<ReplayRow> replay_golden(const std::string& dir, const RunOptions& run,
                                     const std::string& tolerance_file = "");

}  // namespace qed::verify
