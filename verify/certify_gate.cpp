#include "verify/certify_gate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#ifdef QEDCHECK_HAVE_CUDA
#include "kernels/api.hpp"
#endif
#include "reference/error.hpp"
#include "verify/certificate.hpp"
#include "verify/certify.hpp"

namespace qed::verify {

namespace {

std::string sci(double x) {
  if (std::isnan(x)) return "-";
  return fmt::format("{:.3e}", x);
}

RunOptions candidate_of(const Certificate& cert, const GateOptions& o, int threads) {
  RunOptions r = subject_run_options(cert.subject, threads);
  if (o.impl) r.impl = *o.impl;
  if (o.operands) r.operands = *o.operands;
  if (o.precision) r.precision = reference::parse_precision(*o.precision);
  if (o.dtype) r.dtype = *o.dtype;
  if (o.chunk) r.chunk = *o.chunk;
  return r;
}

std::string run_text(const RunOptions& r) {
  std::string s = r.impl;
  if (r.impl.rfind("reference-", 0) == 0) s += " precision=" + r.precision.name();
  if (r.impl == "reference-chunked") s += fmt::format(" chunk={} operands={}", r.chunk, r.operands);
  if (r.impl.rfind("cuda-", 0) == 0) s += fmt::format(" chunk={} dtype={}", r.chunk, r.dtype);
  return s;
}

// Which kernels a CUDA certificate measured against the ones re-measured now: a gate failure
// against another build's certificate may be an intended change of the kernels' numerics (then
// re-certify after checking it), against the same build it is not.
std::string kernel_note(const std::string& path, const Certificate& cert) {
  std::string here = "unknown (no CUDA in this build)";
#ifdef QEDCHECK_HAVE_CUDA
  here = kernels::source_fingerprint();
#endif
  if (cert.kernel_fingerprint == here)
    return fmt::format("{}: kernels {}, the ones this certificate measured", path, here);
  return fmt::format(
      "{}: kernels {}; the certificate measured {}: a failure may be a change the kernels made on "
      "purpose (check it, then re-certify with `qedcheck certify --impl {}`)",
      path, here, cert.kernel_fingerprint.empty() ? "kernels it did not record" : "kernels " + cert.kernel_fingerprint,
      cert.subject.impl);
}

}  // namespace

GateResult run_gate(const GateOptions& o, std::FILE* log) {
  const auto t0 = std::chrono::steady_clock::now();
  GateResult res;
  if (o.certificates.empty() && !o.exact && o.bench_table.empty())
    throw qed::Error(
        "gate: nothing to check (give --certificate, keep the exactness checks, or "
        "give --bench-table)");
  std::vector<RunOptions> candidates;
  for (const auto& path : o.certificates) {
    const Certificate cert = read_certificate(path);
    const RunOptions run = candidate_of(cert, o, o.threads);
    // A CUDA certificate on a machine without a device: skipped with the reason, unless
    // --require-all (the device job) makes that a failure.
    try {
      probe_runs_here(run, cert.subject.case_dtype());
    } catch (const qed::Error& e) {
      res.notes.push_back(fmt::format("{}: {} cannot run here ({}): {}", path, run_text(run),
                                      e.what(),
                                      o.require_all ? "FAIL (--require-all)" : "skipped"));
      res.pass = res.pass && !o.require_all;
      continue;
    }
    candidates.push_back(run);
    int64_t max_T = o.max_T;
    if (max_T <= 0) {
      max_T = INT64_MAX;
      for (const auto& c : cert.cells)
        if (c.status == "certified") max_T = std::min(max_T, c.spec.T);
    }
    const std::string cand = run_text(run);
    const std::string own = run_text(subject_run_options(cert.subject, o.threads));
    res.notes.push_back(fmt::format("{}: {} on {} inputs{}", path, cand, cert.subject.case_dtype(),
                                    cand == own ? "" : " (certificate's subject: " + own + ")"));
    if (run.impl.rfind("cuda-", 0) == 0) res.notes.push_back(kernel_note(path, cert));
    int cells = 0;
    for (const auto& cell : cert.cells) {
      if (cell.status != "certified") continue;
      if (!o.all_cells && cell.spec.T > max_T) continue;
      if (log) fmt::print(log, "gate: {} {}\n", cert.subject.name(), cell.spec.key());
      std::vector<CellResult> m;
      try {
        m = measure_cell(cell.spec, cert.subject.case_dtype(), {run}, /*oracle_digits=*/false,
                         o.threads);
      } catch (const qed::Error& e) {
        throw qed::Error(fmt::format("{}: cell {}: {}", path, cell.spec.key(), e.what()));
      }
      ++cells;
      res.runs += static_cast<int>(cell.spec.seeds.size());
      for (const auto& cd : cell.datasets) {
        const DatasetStats* md = m[0].find(cd.name);
        for (size_t s = 0; s < cell.spec.seeds.size(); ++s) {
          for (const char* metric : {"rel_frobenius", "max_abs"}) {
            GateRow row;
            row.certificate = path;
            row.cell = cell.spec.key();
            row.dataset = cd.name;
            row.metric = metric;
            row.seed = cell.spec.seeds[s];
            const bool rel = metric == std::string("rel_frobenius");
            row.bound = rel ? cd.bound_rel_frobenius : cd.bound_max_abs;
            row.recorded = rel ? cd.rel_frobenius[s] : cd.max_abs[s];
            row.measured = !md ? std::nan("") : rel ? md->rel_frobenius.at(s) : md->max_abs.at(s);
            // NaN (not produced, or NaN error) fails: only a number within the bound passes.
            row.pass = row.measured <= row.bound;
            res.pass = res.pass && row.pass;
            res.rows.push_back(row);
          }
        }
      }
    }
    res.cells += cells;
    if (cells == 0) {
      res.notes.push_back(path + ": no certified cell to re-measure (fails the gate)");
      res.pass = false;
    }
  }
  if (o.exact) {
    res.exact.push_back(exact_chunked_vs_recurrent());
    // lambda = 0 against gdn2 for the CPU twins and for every candidate being gated.
    std::vector<RunOptions> runs = candidates;
    RunOptions rec;
    rec.impl = "reference-recurrent";
    rec.precision = reference::Precision::f32();
    rec.threads = o.threads;
    runs.push_back(rec);
    for (const char* ops : {"fp32", "bf16"}) {
      RunOptions ch = rec;
      ch.impl = "reference-chunked";
      ch.operands = ops;
      runs.push_back(ch);
    }
    std::vector<std::string> seen;
    for (const auto& run : runs) {
      if (std::find(seen.begin(), seen.end(), run_text(run)) != seen.end()) continue;
      seen.push_back(run_text(run));
      res.exact.push_back(exact_lambda0_is_gdn2(run, run));
    }
    for (const auto& e : res.exact) res.pass = res.pass && e.pass;
  }
  if (!o.bench_table.empty()) {
    std::string baseline = o.bench_baseline;
    if (baseline.empty())
      baseline =
          (std::filesystem::path("reports/bench") / std::filesystem::path(o.bench_table).filename())
              .string();
    if (std::filesystem::exists(o.bench_table) && std::filesystem::exists(baseline) &&
        std::filesystem::equivalent(o.bench_table, baseline))
      throw qed::Error(
          "--bench-table " + o.bench_table +
          " is the committed baseline itself; give the fresh table and --bench-baseline");
    const BenchTable fresh = read_bench_table(o.bench_table);
    const BenchTable base = read_bench_table(baseline);
    res.bench = compare_bench(base, fresh, o.bench_margin);
    res.notes.push_back(
        fmt::format("benchmarks: {} against committed {} (fail when slower by more "
                    "than {:.0f}%)",
                    o.bench_table, baseline, 100 * o.bench_margin));
    for (const auto& b : res.bench) res.pass = res.pass && b.pass;
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

void print_gate(std::FILE* out, const GateResult& r) {
  for (const auto& n : r.notes) fmt::print(out, "{}\n", n);
  if (!r.rows.empty()) {
    // One line per cell: its worst check, as measured / certified bound.
    std::string last;
    for (size_t i = 0; i < r.rows.size();) {
      if (r.rows[i].certificate != last) {
        last = r.rows[i].certificate;
        fmt::print(out, "\n{}\n{:<56} {:>8} {:>8} {:>9}  {}\n", last, "cell", "dataset", "metric",
                   "measured/bound", "verdict");
      }
      const std::string key = r.rows[i].certificate + r.rows[i].cell;
      size_t j = i, worst = i;
      bool pass = true;
      for (; j < r.rows.size() && r.rows[j].certificate + r.rows[j].cell == key; ++j) {
        const double q = r.rows[j].measured / r.rows[j].bound;
        const double qw = r.rows[worst].measured / r.rows[worst].bound;
        if (!(q <= qw)) worst = j;
        pass = pass && r.rows[j].pass;
      }
      const auto& w = r.rows[worst];
      fmt::print(out, "{:<56} {:>8} {:>8} {:>14.3f}  {}\n", w.cell, w.dataset,
                 w.metric == "rel_frobenius" ? "rel_F" : "max_abs", w.measured / w.bound,
                 pass ? "ok" : "FAIL");
      i = j;
    }
    const auto failing =
        std::count_if(r.rows.begin(), r.rows.end(), [](const GateRow& x) { return !x.pass; });
    if (failing) {
      // The worst failing check of each cell and dataset (seeds and metrics folded).
      std::vector<const GateRow*> worst;
      for (const auto& x : r.rows) {
        if (x.pass) continue;
        auto it = std::find_if(worst.begin(), worst.end(), [&](const GateRow* w) {
          return w->certificate == x.certificate && w->cell == x.cell && w->dataset == x.dataset;
        });
        if (it == worst.end()) {
          worst.push_back(&x);
        } else if (!(x.measured / x.bound <= (*it)->measured / (*it)->bound)) {
          *it = &x;
        }
      }
      fmt::print(out,
                 "\n{} check(s) above their certified bound; the worst per cell and dataset:\n",
                 failing);
      fmt::print(out, "{:<44} {:>7} {:>4} {:>8} {:>11} {:>11} {:>11} {:>8}\n", "cell", "dataset",
                 "seed", "metric", "certified", "recorded", "measured", "x bound");
      for (const GateRow* x : worst)
        fmt::print(out, "{:<44} {:>7} {:>4} {:>8} {:>11} {:>11} {:>11} {:>8.2f}\n", x->cell,
                   x->dataset, x->seed, x->metric == "rel_frobenius" ? "rel_F" : "max_abs",
                   sci(x->bound), sci(x->recorded), sci(x->measured), x->measured / x->bound);
    }
  }
  if (!r.exact.empty()) {
    fmt::print(out, "\nexactness properties:\n");
    for (const auto& e : r.exact)
      fmt::print(out, "  {:<4} {}: {}\n", e.pass ? "ok" : "FAIL", e.name, e.detail);
  }
  if (!r.bench.empty()) {
    fmt::print(out, "\n{:<60} {:>11} {:>11} {:>7}  {}\n", "benchmark", "committed", "fresh",
               "ratio", "verdict");
    for (const auto& b : r.bench)
      fmt::print(out, "{:<60} {:>11} {:>11} {:>7}  {}\n", b.name,
                 std::isnan(b.baseline_ms) ? "-" : fmt::format("{:.4g} ms", b.baseline_ms),
                 std::isnan(b.fresh_ms) ? "-" : fmt::format("{:.4g} ms", b.fresh_ms),
                 std::isnan(b.ratio) ? "-" : fmt::format("{:.3f}", b.ratio),
                 b.status == "slower" ? "FAIL (slower)" : b.status);
  }
  fmt::print(out,
             "\ngate: {} ({} cells, {} seed runs re-measured, {} exactness checks, {} benchmarks; "
             "{:.1f} s)\n",
             r.pass ? "PASS" : "FAIL", r.cells, r.runs, r.exact.size(), r.bench.size(), r.seconds);
}

}  // namespace qed::verify
