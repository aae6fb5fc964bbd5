#include "verify/certify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>

#include "reference/error.hpp"
#include "verify/compare.hpp"

#ifdef QEDCHECK_HAVE_CUDA
#include "kernels/api.hpp"
#endif

namespace qed::verify {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string duration_text(double s) {
  if (s < 90) return fmt::format("{:.0f} s", s);
  if (s < 5400) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

std::vector<std::string> default_dtypes(const std::string& impl) {
  if (impl == "reference-recurrent") return {"fp32"};
  return {"fp32", "bf16"};
}

struct ModePlan {
  std::vector<std::string> families, regimes;
  std::vector<std::pair<std::string, std::string>> unstable;  // family, regime
  std::vector<int64_t> Ts, dims;
  // cells for the CUDA kernels only (impl "cuda-..."): lengths x head sizes
  std::vector<int64_t> cuda_Ts, cuda_dims;
};

// --quick fits the CPU twins into a few minutes on two cores (README: measured time); --full
// is the long sweep of MATH.md §10 and beyond.
ModePlan mode_plan(const std::string& mode) {
  ModePlan p;
  p.regimes = {"std", "mixed", "hard", "a1b1", "hard_corr"};
  if (mode == "quick") {
    p.families = {"gdn2", "qed.full@1", "qed.nogate_noproj@1", "kda"};
    p.unstable = {{"qed.full@2", "a1b1"}};
    p.Ts = {64, 128, 256};
    p.dims = {64};
    // one chunk: the oracle's float128 check at K = 128 costs four times K = 64's per token, and
    // the gate re-measures exactly the T = 64 cells
    p.cuda_Ts = {64};
    p.cuda_dims = {128};
  } else if (mode == "full") {
    p.families = {"gdn2",       "qed.full@1",   "qed.nogate@1", "qed.nogate_noproj@1",
                  "qed.rand@1", "qed.full@0.5", "kda",          "gdn",
                  "deltanet"};
    p.unstable = {{"qed.full@2", "a1b1"}, {"qed.nogate_noproj@2", "a1b1"}, {"qed.full@2", "hard"}};
    p.Ts = {64, 256, 1024, 4096, 16384};
    p.dims = {64, 128};
  } else {
    throw qed::Error("certify mode '" + mode + "': expected quick or full");
  }
  return p;
}

CellSpec cell_of(const Family& f, const std::string& regime, int64_t T, int64_t D, int64_t H,
                 int seeds, uint64_t first_seed) {
  CellSpec s;
  s.variant = f.variant;
  s.arm = f.arm;
  s.lambda = f.lambda;
  s.regime = regime;
  s.T = T;
  s.H = H;
  s.K = s.V = D;
  for (int i = 0; i < seeds; ++i) s.seeds.push_back(first_seed + static_cast<uint64_t>(i));
  s.unstable = f.unstable;
  return s;
}

// A stable order of cells inside a certificate, whatever order they were measured in.
auto cell_order(const CellSpec& s) {
  return std::make_tuple(s.unstable, s.variant, s.arm, s.lambda, s.regime, s.K, s.V, s.H, s.B, s.T);
}

struct Problem {
  CellSpec spec;
  std::string case_dtype;
  std::vector<size_t> subjects;
  double work = 0;
};

}  // namespace

double subject_bound_floor(const Subject&) {
  // Every implementation certified here computes in float (bf16 and fp16 kernels accumulate in
  // fp32): one rounding of that arithmetic is the smallest error any of them can claim.
  return std::ldexp(1.0, -24);
}

RunOptions subject_run_options(const Subject& s, int threads) {
  RunOptions r;
  r.impl = s.impl;
  r.precision = reference::Precision::f32();
  r.chunk = s.chunk;
  r.operands = s.impl == "reference-chunked" ? s.operands : "none";
  r.dtype = s.dtype;
  r.threads = threads;
  return r;
}

void probe_runs_here(const RunOptions& run, const std::string& case_dtype) {
  CellSpec tiny;
  tiny.T = 8;
  tiny.H = 1;
  tiny.K = tiny.V = 64;  // every CUDA kernel is built for 64 (not for tiny sizes such as 4)
  (void)run_implementation(certify_case(tiny, 0, case_dtype), run);
}

std::vector<Subject> requested_subjects(const CertifyOptions& o) {
  std::vector<std::string> impls = o.impls;
  if (impls.empty()) impls = implementation_names();
  std::vector<Subject> out;
  for (const auto& impl : impls)
    for (const auto& dt : o.dtypes.empty() ? default_dtypes(impl) : o.dtypes) {
      Subject s = make_subject(impl, dt);
      bool dup = false;
      for (const auto& x : out) dup = dup || x.name() == s.name();
      if (!dup) out.push_back(s);
    }
  return out;
}

std::vector<CellSpec> planned_cells(const CertifyOptions& opt, const Subject& subject) {
  const ModePlan mp = mode_plan(opt.mode);
  const auto& fam_names = opt.families.empty() ? mp.families : opt.families;
  const auto& regimes = opt.regimes.empty() ? mp.regimes : opt.regimes;
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> grids;  // Ts, dims
  grids.emplace_back(opt.Ts.empty() ? mp.Ts : opt.Ts, opt.head_dims.empty() ? mp.dims : opt.head_dims);
  // the CUDA kernels' own cells, unless the lengths or head sizes are chosen by hand
  if (subject.impl.rfind("cuda-", 0) == 0 && opt.Ts.empty() && opt.head_dims.empty() &&
      !mp.cuda_dims.empty())
    grids.emplace_back(mp.cuda_Ts, mp.cuda_dims);
  std::vector<CellSpec> cells;
  for (const auto& [Ts, dims] : grids)
    for (int64_t T : Ts)
      for (int64_t D : dims) {
        for (const auto& fn : fam_names)
          for (const auto& r : regimes)
            cells.push_back(cell_of(parse_family(fn), r, T, D, opt.heads, opt.seeds, opt.first_seed));
        if (opt.unstable)
          for (const auto& [fn, r] : mp.unstable) {
            Family f = parse_family(fn);
            f.unstable = true;
            cells.push_back(cell_of(f, r, T, D, opt.heads, opt.seeds, opt.first_seed));
          }
      }
  return cells;
}

CertifySummary run_certify(const CertifyOptions& opt, std::FILE* log) {
  const auto t0 = Clock::now();
  CertifySummary sum;
  if (opt.seeds < 1) throw qed::Error("--seeds must be at least 1");
  (void)mode_plan(opt.mode);  // a mode that is none of quick, full fails before anything runs

  // Subjects that can run here: a CUDA kernel without a device throws qed::Error on a tiny case.
  std::vector<Subject> subjects;
  for (const Subject& s : requested_subjects(opt)) {
    try {
      probe_runs_here(subject_run_options(s, 1), s.case_dtype());
      subjects.push_back(s);
    } catch (const qed::Error& e) {
      sum.skipped.push_back(s.name() + ": " + e.what());
      if (log) fmt::print(log, "certify: skipping {}: {}\n", s.name(), e.what());
    }
  }

  // The cells of the plan: every subject's, each cell once (in plan order), with the subjects
  // that plan it.
  std::vector<CellSpec> cells;
  std::map<std::string, std::vector<bool>> planned_for;  // cell key -> per subject
  for (size_t i = 0; i < subjects.size(); ++i)
    for (const CellSpec& spec : planned_cells(opt, subjects[i])) {
      auto [it, fresh] = planned_for.try_emplace(spec.key(), subjects.size(), false);
      if (fresh) cells.push_back(spec);
      it->second[i] = true;
    }

  // What the certificate calls this run: the mode's own plan, or "custom" when overridden.
  const bool custom = !opt.Ts.empty() || !opt.head_dims.empty() || !opt.families.empty() ||
                      !opt.regimes.empty() || opt.seeds != 3 || opt.first_seed != 0 ||
                      opt.heads != 2 || !opt.unstable;
  const std::string run_mode = custom ? "custom" : opt.mode;

  // Certificates, with what earlier (possibly interrupted) runs measured.
  std::filesystem::create_directories(opt.out_dir);
  std::vector<Certificate> certs(subjects.size());
  std::vector<std::string> paths(subjects.size());
  // Each subject's kernel fingerprint: this binary's for a CUDA kernel, none for a CPU reference
  // (or a binary without kernels). The certificate and every journal line record it, and both are
  // resumed only with the same (require_same_kernels, journal_read).
  std::vector<std::string> fingerprints(subjects.size());
#ifdef QEDCHECK_HAVE_CUDA
  for (size_t i = 0; i < subjects.size(); ++i)
    if (subjects[i].impl.rfind("cuda-", 0) == 0) fingerprints[i] = kernels::source_fingerprint();
#endif
  for (size_t i = 0; i < subjects.size(); ++i) {
    paths[i] = (std::filesystem::path(opt.out_dir) / (subjects[i].name() + ".json")).string();
    Certificate& c = certs[i];
    if (std::filesystem::exists(paths[i])) {
      c = read_certificate(paths[i]);
      if (c.subject.name() != subjects[i].name())
        throw qed::Error(paths[i] + ": certifies " + c.subject.name() + ", not " +
                         subjects[i].name());
      if (c.mode != run_mode) c.mode = "mixed";
      require_same_kernels(paths[i], c.kernel_fingerprint, fingerprints[i]);
    } else {
      c.subject = subjects[i];
      c.mode = run_mode;
      c.created = utc_now_iso();
    }
    c.bound_floor = subject_bound_floor(subjects[i]);
    int bad = 0;
    for (auto& jc : journal_read(journal_path(paths[i]), subjects[i], &bad, fingerprints[i])) {
      auto it = std::find_if(c.cells.begin(), c.cells.end(),
                             [&](const CellResult& x) { return x.spec.key() == jc.spec.key(); });
      if (it != c.cells.end())
        *it = jc;
      else
        c.cells.push_back(jc);
    }
    if (bad && log)
      fmt::print(log, "certify: {}: {} unreadable journal line(s) ignored\n",
                 journal_path(paths[i]), bad);
  }

  // Problems: one cell and dtype, shared by every subject consuming that dtype.
  std::vector<Problem> problems;
  for (const auto& spec : cells) {
    std::map<std::string, Problem> by_dtype;
    for (size_t i = 0; i < subjects.size(); ++i) {
      if (!planned_for.at(spec.key())[i]) continue;
      const CellResult* done = certs[i].find(spec.key());
      if (done && done->spec.seeds == spec.seeds) {
        ++sum.cells_resumed;
        continue;
      }
      Problem& p = by_dtype[subjects[i].case_dtype()];
      p.spec = spec;
      p.case_dtype = subjects[i].case_dtype();
      p.subjects.push_back(i);
    }
    for (auto& [dt, p] : by_dtype) {
      // Cost model for the time left: float128 costs ~25 doubles; every run scales as T K V.
      const double unit = static_cast<double>(spec.T * spec.H * spec.K * spec.V);
      p.work = unit * (static_cast<double>(spec.seeds.size()) * (1.0 + p.subjects.size()) + 25.0);
      problems.push_back(std::move(p));
    }
  }
  sum.problems_total = static_cast<int>(problems.size());
  double total_work = 0, done_work = 0;
  for (const auto& p : problems) total_work += p.work;
  if (log && opt.progress)
    fmt::print(log,
               "certify: {} subject(s), {} cells planned, {} problem(s) to measure ({} mode, "
               "{} seed(s))\n",
               subjects.size(), cells.size(), problems.size(), run_mode, opt.seeds);

  const Machine machine = this_machine();
  // The device's name, asked once, for the certificates of CUDA subjects.
  std::string gpu;
#ifdef QEDCHECK_HAVE_CUDA
  for (const auto& c : certs)
    if (gpu.empty() && c.subject.impl.rfind("cuda-", 0) == 0) gpu = kernels::device_name();
#endif
  const std::string commit = git_commit_or_unknown(), tree = git_tree_state();
  auto save = [&](size_t i) {
    Certificate& c = certs[i];
    std::stable_sort(c.cells.begin(), c.cells.end(), [](const CellResult& a, const CellResult& b) {
      return cell_order(a.spec) < cell_order(b.spec);
    });
    c.machine = machine;
    if (c.subject.impl.rfind("cuda-", 0) == 0) {
      c.machine.gpu = gpu;
      c.kernel_fingerprint = fingerprints[i];
    }
    c.git_commit = commit;
    c.git_tree = tree;
    c.build_commit = build_commit();
    c.build_tree = build_tree_state();
    c.updated = utc_now_iso();
    write_certificate(paths[i], c);
  };

  const auto tm = Clock::now();
  for (size_t n = 0; n < problems.size(); ++n) {
    if (opt.max_new_cells >= 0 && sum.problems_measured >= opt.max_new_cells) {
      sum.interrupted = true;
      break;
    }
    const Problem& p = problems[n];
    std::vector<RunOptions> runs;
    std::string names;
    for (size_t i : p.subjects) {
      runs.push_back(subject_run_options(subjects[i], opt.threads));
      names += (names.empty() ? "" : ", ") + subjects[i].name();
    }
    if (log && opt.progress)
      fmt::print(log, "certify [{}/{}] {} {}{} x{} seeds -> {}\n", n + 1, problems.size(),
                 p.case_dtype, p.spec.key(), p.spec.unstable ? " (unstable)" : "",
                 p.spec.seeds.size(), names);
    auto results = measure_cell(p.spec, p.case_dtype, runs, /*oracle_digits=*/true, opt.threads);
    for (size_t k = 0; k < p.subjects.size(); ++k) {
      const size_t i = p.subjects[k];
      CellResult& r = results[k];
      finalize_cell(r, certs[i].safety_factor, certs[i].bound_floor, unit_roundoff(p.case_dtype));
      journal_append(journal_path(paths[i]), subjects[i], r, fingerprints[i]);
      auto it = std::find_if(certs[i].cells.begin(), certs[i].cells.end(),
                             [&](const CellResult& x) { return x.spec.key() == r.spec.key(); });
      if (it != certs[i].cells.end())
        *it = r;
      else
        certs[i].cells.push_back(r);
      save(i);
    }
    ++sum.problems_measured;
    done_work += p.work;
    if (log && opt.progress) {
      const double el = since(tm);
      fmt::print(log, "certify   done in {:.1f} s; {} elapsed, about {} left\n",
                 results.empty() ? 0.0 : results[0].seconds, duration_text(el),
                 duration_text(el / done_work * (total_work - done_work)));
    }
  }
  for (size_t i = 0; i < subjects.size(); ++i) {
    if (!std::filesystem::exists(paths[i])) save(i);
    sum.certificates.push_back(paths[i]);
  }
  sum.seconds = since(t0);
  return sum;
}

}  // namespace qed::verify
