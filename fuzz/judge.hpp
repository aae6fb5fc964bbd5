// Judging one case: run the implementation under test, compute the oracle at a precision well
// beyond it (fuzz/impl.hpp oracle_precision), and hold every result dataset it produced to the
// bound `qedcheck verify` would apply: a tolerance file's (or certificate's) entry, else the
// default twin rule of verify/tolerance.hpp. A case the oracle or a twin cannot represent
// (overflow to Inf/NaN in that precision) is skipped, with the reason, rather than judged.
#pragma once

#include <exception>

#include <string>
#include <vector>

#include "fixtures/case.hpp"
#include "fuzz/impl.hpp"
#include "verify/compare.hpp"
#include "verify/tolerance.hpp"

namespace qed::fuzz {

enum class Outcome { pass, fail, skip };
const char* to_string(Outcome o);

struct DatasetScore {
  verify::Metrics metrics;
  verify::Bound bound;
  double score = 0;  // metric / bound, max over the bound's checks (> 1 fails)
};

struct Judgement {
  Outcome outcome = Outcome::pass;
  double score = 0;        // worst dataset's score
  std::string worst;       // its name ("outputs/o", ...)
  std::string note;        // why skipped ("reason: detail"), or what failed (one line)
  std::vector<DatasetScore> datasets;
};

struct JudgeOptions {
  verify::ToleranceSpec tolerance;  // empty: twin rule for every dataset
  int threads = 1;
};

// Runs the implementation on c and judges it. An implementation that finds no CUDA device is
// not judged: that error propagates (is_no_device), so that a campaign or replay stops with it
// (exit 2) instead of saving a counterexample.
Judgement judge_case(const fixtures::Case& c, const ImplSpec& spec, const JudgeOptions& opt);
bool is_no_device(const std::exception& e);

// Whether a failure is clear rather than rounding noise at the edge of the bound: some dataset
// scores above `threshold`, not counting a dataset whose oracle value is exactly zero everywhere
// (cancelling terms: the twin rule's bound is then 0) while its error is at most threshold * u *
// the largest |oracle value| among the case's datasets.
bool clear_failure(const Judgement& j, double unit_roundoff, double threshold);

// One line: "FAIL outputs/o rel_F 3.1e-01 > bound 2.4e-07 (score 1.3e+06) at (b=0, t=3, h=0, v=1)".
std::string summary(const Judgement& j);

}  // namespace qed::fuzz
