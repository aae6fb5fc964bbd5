// `qedcheck certify`: sweeps implementations x dtypes x variant/arm x regime x T x head dims over
// several seeds, compares every output and gradient with the oracle, and writes one certificate
// per implementation and dtype (verify/certificate.hpp), resumable cell by cell.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fixtures/case.hpp"
#include "verify/certificate.hpp"
#include "verify/implementations.hpp"

namespace qed::verify {

// A problem family: variant, arm and lambda (qed), parsed from "gdn2", "kda", "qed.full@1", ...
struct Family {
  std::string variant = "gdn2", arm = "none";
  double lambda = 0;
  bool unstable = false;  // reported, never certified
};
Family parse_family(const std::string& text);  // throws qed::Error naming the rule

struct CertifyOptions {
  std::vector<std::string> impls;   // empty: every implementation of this build
  std::vector<std::string> dtypes;  // empty: each implementation's default dtypes
  std::string mode = "quick";       // quick | full
  std::string out_dir = "reports/certificates";
  int seeds = 3;
  uint64_t first_seed = 0;            // seeds first_seed .. first_seed + seeds - 1
  std::vector<int64_t> Ts;            // overrides the mode's lengths
  std::vector<int64_t> head_dims;     // overrides the mode's K = V
  std::vector<std::string> families;  // overrides the mode's stable families
  std::vector<std::string> regimes;   // overrides the mode's regimes
  bool unstable = true;               // add the mode's unstable configurations
  int64_t heads = 2;                  // H: the reference runs one thread per head
  int max_new_cells = -1;             // stop after measuring this many problem cells (< 0: all)
  int threads = 0;
  bool progress = true;
};

struct CertifySummary {
  std::vector<std::string> certificates;  // paths written
  std::vector<std::string> skipped;       // "cuda-chunked+bf16: no CUDA device" ...
  int problems_total = 0, problems_measured = 0;
  int cells_resumed = 0;     // subject cells already measured (journal or certificate): skipped
  bool interrupted = false;  // stopped by max_new_cells
  double seconds = 0;
};

CertifySummary run_certify(const CertifyOptions& options, std::FILE* log);

// The cells a run plans for one subject: the mode's plan, or the options' overrides. A quick run
// also gives the CUDA kernels cells at K = V = 128 and T = 64 (which the gate re-measures): the
// head size their benchmarks and most of their code paths are built around (the CPU twins keep
// to 64: four times the work per cell on two cores).
std::vector<CellSpec> planned_cells(const CertifyOptions& options, const Subject& subject);

// The run options of a subject's implementation.
RunOptions subject_run_options(const Subject& s, int threads);
// Throws qed::Error (with the implementation's reason) when `run` cannot execute on this machine:
// a CUDA implementation without a device. Runs a tiny case (T = 8, H = 1, K = V = 64: a head
// size every kernel is built for).
void probe_runs_here(const RunOptions& run, const std::string& case_dtype);
// The subjects an options set asks for (before probing for devices).
std::vector<Subject> requested_subjects(const CertifyOptions& options);

// The case of a cell for one seed: generated in double (fixtures/generate.hpp), every input and
// cotangent (do, dht) rounded to nearest even in `case_dtype` (float32 | bfloat16).
fixtures::Case certify_case(const CellSpec& spec, uint64_t seed, const std::string& case_dtype);

// Measures one cell for several implementations consuming the same inputs: per seed, the
// oracle (double recurrent pass; on the first seed checked against float128 when
// `oracle_digits`) and every run, compared dataset by dataset. One CellResult per run, not yet
// finalized (finalize_cell sets statistics, bounds and status).
std::vector<CellResult> measure_cell(const CellSpec& spec, const std::string& case_dtype,
                                     const std::vector<RunOptions>& runs, bool oracle_digits,
                                     int threads);

// Unit roundoff of the arithmetic a subject computes in: the relative floor of its bounds.
double subject_bound_floor(const Subject& s);

}  // namespace qed::verify
