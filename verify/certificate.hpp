// Certificates: measured error envelopes of one implementation in one dtype, cell by cell
// (variant/arm x regime x T x head dims, several seeds each), with certified bounds, fitted
// growth laws and the tolerance they imply; plus the journal that makes a sweep resumable.
//
// Certificate, schema "qedcheck.certificate/1" (JSON; reports/certificates/README.md explains
// every member and the reasoning behind the numbers):
//   {"schema": "qedcheck.certificate/1", "qedcheck": "0.1.0",
//    "subject": {"name", "impl", "dtype" (fp32|bf16), "case_dtype" (float32|bfloat16),
//                "precision", "operands", "chunk"},
//    "mode": "quick"|"full"|"custom"|"mixed" (cells from runs of different plans),
//    "safety_factor": 4, "bound_floor": 5.96e-8,
//    "oracle": {"implementation", "precision", "check_precision", "justification"},
//    "machine": {"hostname", "cpu", "cores"[, "gpu"]}, "git_commit"[, "git_tree", "build_commit",
//    "build_tree", "kernel_fingerprint"], "created", "updated" (UTC ISO 8601),
//    "cells": [{"key", "variant", "arm", "lambda", "regime", "B", "T", "H", "K", "V",
//               "seeds": [...], "status": "certified"|"unstable"|"not-certified", "note",
//               "seconds", "oracle": {"seed", "min_digits",
//                                     "datasets": {"o": {"digits", "rel_frobenius", "max_abs"}}},
//               "state_norm": [||ht||_F per seed],
//               "datasets": [{"name", "samples", "rel_frobenius": [per seed],
//                             "max_abs": [per seed], "ref_max_abs": [per seed],
//                             "max_rel_frobenius", "rms_rel_frobenius", "max_max_abs",
//                             "rms_max_abs", "max_eps_units", "rms_eps_units",
//                             "bound_rel_frobenius", "bound_max_abs", "finite"}]}],
//    "fits": [{"variant", "arm", "lambda", "regime", "H", "K", "V", "dataset", "metric",
//              "c", "p", "residual_log10", "points", "T_min", "T_max", "unstable"}],
//    "summary": {"cells", "certified", "unstable", "not_certified", "samples"},
//    "tolerance": {"schema": "qedcheck.tolerance/1", "description",
//                  "datasets": {"o": {"rtol_frobenius", "atol_max", "note"}, ...}}}
// Non-finite numbers are written as the strings "inf", "-inf", "nan". The member "tolerance" is
// a complete tolerance document (verify/tolerance.hpp), so `qedcheck verify --tolerance CERT`
// reads a certificate as it stands. "fits", "summary" and "tolerance" are derived from "cells"
// whenever a certificate is written; reading ignores them and recomputes.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qed::verify {

inline constexpr const char* kCertificateSchema = "qedcheck.certificate/1";
inline constexpr const char* kJournalSchema = "qedcheck.certificate-journal/1";
// Certified bound = observed max over seeds x this factor (README: why 4).
inline constexpr double kCertifySafetyFactor = 4.0;

// What a certificate certifies: one implementation consuming inputs of one dtype.
struct Subject {
  std::string impl;  // reference-recurrent | reference-chunked | cuda-recurrent | cuda-chunked
  std::string dtype = "fp32";       // inputs (and cotangents) rounded to fp32 | bf16
  std::string precision = "float";  // CPU references: arithmetic precision
  std::string operands = "none";    // reference-chunked: matmul operand storage (fp32 | bf16)
  int64_t chunk = 64;
  std::string name() const;        // "reference-chunked+bf16"
  std::string case_dtype() const;  // float32 | bfloat16
};

// The CPU twin or kernel for `impl` consuming `dtype` inputs (throws qed::Error on bad names).
Subject make_subject(const std::string& impl, const std::string& dtype);

// One cell of the sweep: a problem family at one length and head size, several seeds.
struct CellSpec {
  std::string variant = "gdn2", arm = "none";  // arm "none" unless variant is qed
  double lambda = 0;                           // qed only
  std::string regime = "std";
  int64_t B = 1, T = 64, H = 2, K = 64, V = 64;
  std::vector<uint64_t> seeds;
  bool unstable = false;       // a configuration with exponentially growing state: reported only
  std::string family() const;  // "qed.full(l=1)", "gdn2"
  std::string key() const;     // family/regime/T=../H=../K=../V=.. (unique within a subject)
};

struct DatasetStats {
  std::string name;                                         // "o", "ht", "dq", ... (no group)
  std::vector<double> rel_frobenius, max_abs, ref_max_abs;  // one per seed
  double max_rel_frobenius = 0, rms_rel_frobenius = 0;
  double max_max_abs = 0, rms_max_abs = 0;
  double max_eps_units = 0, rms_eps_units = 0;
  double bound_rel_frobenius = std::numeric_limits<double>::quiet_NaN();  // NaN: not certified
  double bound_max_abs = std::numeric_limits<double>::quiet_NaN();
  bool finite = true;
};

// The oracle (double) against float128 on one seed of a cell, per dataset: certified digits
// (element-wise agreement, oracle.hpp's rule) and its own errors in the certificate's metrics.
struct OracleStats {
  std::string name;
  double digits = 0, rel_frobenius = 0, max_abs = 0;
};

struct CellResult {
  CellSpec spec;
  std::string status = "certified";  // certified | unstable | not-certified
  std::string note;
  double seconds = 0;
  uint64_t oracle_seed = 0;
  double oracle_min_digits = 0;  // NaN: the oracle was not checked (gate re-measurements)
  std::vector<OracleStats> oracle;
  std::vector<double> state_norm;  // ||ht||_F of the oracle per seed
  std::vector<DatasetStats> datasets;
  const DatasetStats* find(const std::string& name) const;
};

// err ~ c T^p by least squares on (log T, log err) over the cells of one series.
struct PowerFit {
  std::string variant, arm, regime, dataset, metric = "rel_frobenius";
  double lambda = 0;
  int64_t H = 0, K = 0, V = 0;
  double c = 0, p = 0;
  double residual_log10 = 0;  // RMS residual in decades
  int points = 0;
  int64_t T_min = 0, T_max = 0;
  bool unstable = false;
};

struct Machine {
  std::string hostname, cpu;
  int cores = 0;
  std::string gpu;  // certificates of CUDA implementations: the device's name ("" otherwise)
};
Machine this_machine();
std::string git_commit_or_unknown();
// Whether the working tree differs from that commit in tracked files: "clean", "modified" (then
// the commit alone does not say what was measured), or "unknown" (no git, not a repository).
std::string git_tree_state();
// The commit this binary was built from (40 hex digits) and the state of its tracked files then
// ("clean", "modified"), both "unknown" without git (verify/build_info.cpp, cmake/build_commit.cmake).
std::string build_commit();
std::string build_tree_state();
std::string utc_now_iso();

struct Certificate {
  Subject subject;
  std::string mode = "custom";
  double safety_factor = kCertifySafetyFactor;
  double bound_floor = 0;  // relative floor of every bound: the unit roundoff of the arithmetic
  std::string qedcheck_version = "0.1.0";
  std::string oracle_impl = "reference-recurrent", oracle_precision = "double",
              oracle_check = "float128";
  Machine machine;
  std::string git_commit = "unknown", created, updated;
  std::string git_tree = "unknown";  // git_tree_state() of the run that last added cells
  // build_commit() / build_tree_state() of the binary that last added cells: what was measured
  // even where git_commit is the commit of another copy (absent before 2026-12-06, third session)
  std::string build_commit = "unknown", build_tree = "unknown";
  // CUDA subjects: the fingerprint of the kernels' sources that were measured
  // (kernels::source_fingerprint()); empty for the CPU references and for certificates written
  // before 2026-12-06, which did not record it.
  std::string kernel_fingerprint;
  std::vector<CellResult> cells;
  const CellResult* find(const std::string& key) const;
};

// Statistics, bounds and status of a cell from its per-seed numbers (fills the derived members
// of every DatasetStats and the cell status; keeps "unstable" and "not-certified" notes).
void finalize_cell(CellResult& cell, double safety_factor, double bound_floor,
                   double unit_roundoff_dtype);

std::vector<PowerFit> fit_growth(const Certificate& cert);
// Least squares of log y on log x; returns false with fewer than two usable points.
bool fit_power_law(const std::vector<double>& x, const std::vector<double>& y, double& c, double& p,
                   double& residual_log10);
nlohmann::json tolerance_of(const Certificate& cert);

nlohmann::json cell_to_json(const CellResult& cell);
CellResult cell_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json certificate_to_json(const Certificate& cert);
Certificate certificate_from_json(const nlohmann::json& j, const std::string& where);
Certificate read_certificate(const std::string& path);
// The certificate as written: valid JSON, one cell (or fit, or tolerance entry) per line.
std::string certificate_text(const Certificate& cert);
void write_certificate(const std::string& path, const Certificate& cert);

// Resuming a CUDA kernel's certificate measured by other kernels would mix cells of two kernels
// under one fingerprint: throws qed::Error naming the file and both fingerprints when `recorded`
// (the certificate's) and `current` (this binary's) are both known and differ.
void require_same_kernels(const std::string& certificate_path, const std::string& recorded,
                          const std::string& current);

// The journal next to a certificate ("X.json" -> "X.journal.jsonl"): one finished cell a line.
std::string journal_path(const std::string& certificate_path);
// Appends by rewriting the whole file to a temporary one, fsync, rename: a crash leaves the old
// journal or the new one, never half a line.
// A CUDA subject's lines carry the kernel fingerprint of the binary that measured them.
void journal_append(const std::string& path, const Subject& subject, const CellResult& cell,
                    const std::string& kernel_fingerprint = "");
// Cells of `subject` recorded in the journal (lines of other subjects or unreadable lines are
// skipped and counted in *skipped). With a kernel fingerprint (a CUDA subject read by a binary
// with kernels), every line of the subject must carry that fingerprint: a line of other kernels,
// or of unknown ones (written before journal lines had fingerprints), throws qed::Error naming
// the file, the line and both fingerprints, since resuming would mix cells of two kernels.
std::vector<CellResult> journal_read(const std::string& path, const Subject& subject,
                                     int* skipped = nullptr,
                                     const std::string& kernel_fingerprint = "");

// write(2) + fsync + rename(2) + fsync of the folder.
void write_file_atomic(const std::string& path, const std::string& text);

// JSON numbers that may be non-finite ("inf", "nan" strings).
nlohmann::json json_number(double x);
double number_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace qed::verify
