// The verdict of `qedcheck verify`: a candidate case's outputs and gradients judged against the
// oracle (or the golden corpus' stored oracle values when the inputs match bit for bit) under a
// tolerance (tolerance.hpp), as a printable table and as JSON (schema "qedcheck.verdict/1").
//
// JSON verdict, schema "qedcheck.verdict/1":
//   {"schema": "qedcheck.verdict/1", "qedcheck": "0.1.0",
//    "candidate": {"path", "variant", "arm", "dtype", "producer", "dims": {"B","T","H","K","V","N"},
//                  "input_hash", "unit_roundoff", "warnings": [...]},
//    "reference": {"source": "golden"|"oracle", "path", "precision", "check_precision",
//                  "min_digits", "target_met", "seconds"},
//    "tolerance": {"source": "rule"|"file"|"options"|"mixed", "file", "rule", "factor",
//                  "twins": [...], "provisional", "note", "seconds"},
//    "datasets": [{"name", "shape", "axes", "count", "ref_frobenius", "ref_max_abs",
//                  "rel_frobenius", "err_frobenius", "max_abs_error", "max_abs_at",
//                  "max_rel_error", "max_rel_at", "significant_floor", "eps_units", "finite",
//                  "first_nonfinite", "twin": {"rel_frobenius","max_abs_error","worst"}|null,
//                  "tolerance": {"rtol_frobenius","atol_max","source"}, "score", "pass"}],
//    "pass": true|false, "exit_code": 0|1|2, "error": "..." (exit 2 only), "seconds"}
// Locations are {"flat": i, "index": [...], "axes": ["b","t","h","k"]} or null. Non-finite
// numbers are written as strings ("inf", "nan") since JSON has no such numbers.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fixtures/case.hpp"
#include "verify/compare.hpp"
#include "verify/tolerance.hpp"

namespace qed::verify {

inline constexpr const char* kVerdictSchema = "qedcheck.verdict/1";

struct VerifyOptions {
  ToleranceSpec tolerance;   // empty: the twin rule for every dataset
  double digits = 20;        // oracle: certified digits to reach when recomputing
  int cap_bits = 4096;
  std::string golden_dir;    // corpus to look the inputs up in; empty: always recompute
  int threads = 0;
  int64_t chunk = 0;         // the candidate's chunk size, where given: one more chunked twin
};

struct DatasetVerdict {
  Metrics metrics;
  Bound bound;
  std::optional<TwinError> twin;  // present when the twin rule set the bound
  double score = 0;
  bool pass = false;
};

struct ReferenceInfo {
  std::string source;  // "golden" or "oracle"
  std::string path;    // golden file
  std::string precision, check_precision;
  double min_digits = 0;  // over the compared datasets
  bool target_met = true;
  double seconds = 0;
};

struct Verdict {
  std::string candidate_path, variant, arm, dtype, producer, input_hash;
  reference::Dims dims;
  int64_t N = 0;
  double unit_roundoff = 0;
  ReferenceInfo reference;
  std::string tolerance_source;  // rule | file | options | mixed
  std::string tolerance_file;
  TwinPlan twins;
  bool twins_run = false;
  double twin_seconds = 0;
  std::vector<DatasetVerdict> datasets;
  std::vector<std::string> warnings;
  bool pass = false;
  int exit_code = 1;
  double seconds = 0;
};

// Throws qed::Error (exit 2) when the candidate cannot be judged: no outputs or gradients, a
// result the variant does not have, a shape that disagrees with the inputs, gradients without
// cotangents.
Verdict verify_candidate(const fixtures::Case& candidate, const VerifyOptions& options);

// The human-readable verdict: header, one table row per dataset, the rule, the outcome.
void print_verdict(std::FILE* out, const Verdict& v);

nlohmann::json verdict_json(const Verdict& v);
// The JSON of a candidate that could not be judged (exit code 2).
nlohmann::json error_json(const std::string& candidate_path, const std::string& message);
// Writes JSON to `path` atomically (temporary file in the same folder, then rename).
void write_json_atomic(const std::string& path, const nlohmann::json& j);

}  // namespace qed::verify
