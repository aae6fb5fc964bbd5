// Tolerances for `qedcheck verify`: per-dataset bounds from a tolerance file, from --rtol/--atol,
// or from the default "twin" rule, and the judgement of one dataset's metrics against its bound.
//
// Tolerance file, schema "qedcheck.tolerance/1" (JSON):
//   {"schema": "qedcheck.tolerance/1",
//    "description": "free text (optional)",
//    "datasets": {"o":  {"rtol_frobenius": 1e-6, "atol_max": 1e-5},
//                 "dk": {"rtol_frobenius": 1e-5},
//                 "*":  {"atol_max": 1e-4}}}
// Dataset keys are result names without their group ("o", "ht", "dq", ... "dh0"; "outputs/o"
// and "grads/dq" are accepted too) or "*" for every dataset without its own entry. An entry has
// rtol_frobenius (bound on ||cand-ref||_F / ||ref||_F) and/or atol_max (bound on max|cand-ref|),
// each a finite number >= 0; a dataset passes when every bound it has holds. Datasets that the
// file does not cover (no entry, no "*") fall back to the twin rule. Unknown keys inside an
// entry are errors (a typo must not loosen a gate); other top-level members are ignored, and a
// document whose top level is not a tolerance (a certificate) may carry one as its member
// "tolerance": that is how the certificate format extends this one.
//
// Default twin rule (in the spirit of FlashAttention's "at most twice the error of a reference
// implementation in the same precision"): for each dataset,
//   rtol_frobenius = F * max(e_F, u)        atol_max = F * max(e_max, u * max|ref|)
// with F = 2, u the unit roundoff of /inputs@dtype, and e_F, e_max the relative Frobenius and
// max abs errors against the oracle of the worst of the reference's own implementations run in
// that precision on the same inputs (twin_plan). The u floor is one correct rounding of the
// exact result to the dtype: no implementation that stores its results in that dtype can beat
// it, so a twin that happens to be exact does not demand the impossible. A dataset whose oracle
// value is exactly zero everywhere (dh0 when the first step's erase annihilates the state) has no
// scale of its own: it gets atol_max = F * max(e_max, u * S) alone, S the largest |ref| among the
// datasets of its group (outputs or grads), i.e. one rounding of the values it is computed from.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "verify/compare.hpp"
#include "verify/implementations.hpp"

namespace qed::verify {

inline constexpr double kTwinFactor = 2.0;

// Chunk sizes of the chunked twins. One twin's error is a single draw of the rounding a correct
// implementation makes, and a noisy one where a dataset has few values and long sequences (ht of
// small heads); the worst of several summation orders estimates that scale better. Measured with
// `qedcheck fuzz --impl reference-chunked --precision float --min-score 1e9 --iterations 1500`
// (a correct implementation; candidate chunk 40, seed 11 / chunk 24, seed 12): with twins
// recurrent + C=64 alone 38 and 23 configurations scored above 1; with C=32, 16 and 8 added, 20
// and 9 (about 1.6 times the twin time).
inline constexpr int64_t kTwinChunks[] = {64, 32, 16, 8};

// Bounds of one dataset; NaN = not checked.
struct Bound {
  double rtol_frobenius = std::numeric_limits<double>::quiet_NaN();
  double atol_max = std::numeric_limits<double>::quiet_NaN();
  std::string source;  // "rule:twin", "options", "file:PATH[o]", ...
  bool any() const { return rtol_frobenius == rtol_frobenius || atol_max == atol_max; }
};

// Where bounds come from: explicit options, a file, or (for everything else) the twin rule.
struct ToleranceSpec {
  std::optional<Bound> options;            // --rtol / --atol: every dataset
  std::string file;                        // tolerance file path, empty if none
  std::map<std::string, Bound> per_dataset;  // from the file, keyed "outputs/o", "grads/dq", ...
  std::optional<Bound> wildcard;           // from the file's "*"
  // The file's or the options' bound for a dataset, if any (otherwise the twin rule applies).
  std::optional<Bound> explicit_bound(const std::string& name) const;
};

ToleranceSpec tolerance_from_options(double rtol, std::optional<double> atol);
ToleranceSpec read_tolerance_file(const std::string& path);
// Parses the JSON text of a tolerance document; `where` names it in messages.
ToleranceSpec parse_tolerance(const std::string& text, const std::string& where);

// The twins of a dtype: the reference's implementations in that precision, on the same inputs.
struct TwinPlan {
  std::vector<RunOptions> runs;
  std::vector<std::string> labels;  // "reference-recurrent@float", ...
  bool provisional = false;         // the matching low-precision twin is not built yet
  std::string note;                 // why provisional
};
// candidate_chunk > 0 (the candidate's own chunk size, where known) adds a chunked twin with that
// chunk when it is none of kTwinChunks: a kernel with a longer chunk sums in an order the default
// twins do not sample (a correct chunk-128 implementation in double scores about 2.5 against
// them) and is judged against its own order's rounding instead.
//
// longest > 0 (the case's longest sequence, where known): chunks of at least that length are one
// and the same computation, so on short sequences the chunk list continues with 4, 2 and 1 until
// it holds as many distinct effective chunks as kTwinChunks (T = 5: 5, 4, 2, 1 instead of one
// order four times); sequences of 64 or more keep the list as it is.
TwinPlan twin_plan(const std::string& dtype, int64_t candidate_chunk = 0, int64_t longest = 0);
// The longest sequence of a case's inputs (T, or the longest cu_seqlens segment).
int64_t longest_sequence(const reference::Inputs<double>& in);
std::string twin_plan_text(const std::string& dtype);  // one line, for --help and verdicts

// Twin error of one dataset, maximised over the twins of a plan.
struct TwinError {
  double rel_frobenius = 0;
  double max_abs_error = 0;
  std::string worst_twin;  // label of the twin with the largest relative Frobenius error
};
// group_scale: the largest max|ref| of the case's datasets in this one's group (GroupScales); it
// only matters for a dataset whose reference is all zero.
Bound twin_rule_bound(const TwinError& e, const Metrics& reference_scale, double unit_roundoff,
                      double group_scale = 0, double factor = kTwinFactor);

// The largest max|ref| per group of a case's datasets (the group: the part of a dataset's name
// before '/', "outputs" or "grads").
class GroupScales {
 public:
  void add(const Metrics& m);
  double of(const std::string& name) const;

 private:
  std::map<std::string, double> max_;
};

// score = max over the bound's checks of metric / bound (<= 1 passes); infinite for non-finite
// candidates. A zero bound with a zero metric scores 0.
double judge(const Metrics& m, const Bound& b);

// The rule as it is printed in --help and in every verdict.
std::string twin_rule_text();

}  // namespace qed::verify
