// The CI regression gate: re-measures a fast subset of a certificate's cells (same seeds) and
// fails when an error leaves its certified bound, when an exactness property regresses, or when
// a fresh benchmark table is slower than the committed one by more than a margin.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "verify/certify_bench.hpp"
#include "verify/implementations.hpp"

namespace qed::verify {

struct GateOptions {
  std::vector<std::string> certificates;
  int64_t max_T =
      0;  // re-measure certified cells with T <= max_T (0: each certificate's smallest T)
  bool all_cells = false;
  // The candidate, when it is not the certificate's own subject (a new kernel against an old
  // certificate, or a deliberately degraded one in the gate's own tests).
  std::optional<std::string> impl, operands, precision, dtype;
  std::optional<int64_t> chunk;
  bool exact = true;           // run the exactness properties
  bool require_all = false;    // an implementation that cannot run here fails the gate
  std::string bench_table;     // fresh table (JSON or Markdown); empty: no benchmark gate
  std::string bench_baseline;  // committed table; default reports/bench/<same name>
  double bench_margin = kBenchMargin;
  int threads = 0;
};

struct GateRow {
  std::string certificate, cell, dataset, metric;  // metric: rel_frobenius | max_abs
  uint64_t seed = 0;
  double bound = 0, recorded = 0, measured = 0;
  bool pass = true;
};

struct ExactCheck {
  std::string name;
  double measured = 0, limit = 0;  // largest discrepancy found and what is allowed
  bool pass = false;
  std::string detail;
};

struct GateResult {
  std::vector<GateRow> rows;
  std::vector<ExactCheck> exact;
  std::vector<BenchDiff> bench;
  std::vector<std::string> notes;
  int cells = 0, runs = 0;
  bool pass = true;
  double seconds = 0;
};

GateResult run_gate(const GateOptions& options, std::FILE* log);
// The readable report: one line per re-measured cell, then every failing row with bound,
// recorded and measured values, the exactness checks and the benchmark comparison.
void print_gate(std::FILE* out, const GateResult& r);

// Chunked (chunk 4, two and a half chunks) against recurrent, forward and every gradient, both
// in mpfr at the given precisions, on tiny qed/full and gdn2 cases with h0 and dht; measured as
// max |chunked - recurrent| / max |recurrent| over datasets. Limit 1e-60 (at 256 bits both
// forms agree to ~1e-75; a lower precision on one side is the check's own mutation test).
ExactCheck exact_chunked_vs_recurrent(int bits_chunked = 256, int bits_recurrent = 256,
                                      uint64_t seed = 0);
// qed with lambda = 0 (arm full) against gdn2 on the same float32 inputs: o, ht and every shared
// gradient must be equal value for value (MATH.md: lambda = 0 is GDN-2 exactly).
ExactCheck exact_lambda0_is_gdn2(const RunOptions& qed_run, const RunOptions& gdn2_run,
                                 uint64_t seed = 0);

}  // namespace qed::verify
