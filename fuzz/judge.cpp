#include "fuzz/judge.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "reference/oracle.hpp"
#include "verify/evaluate.hpp"

namespace qed::fuzz {

using verify::Bound;
using verify::Metrics;

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::pass: return "pass";
    case Outcome::fail: return "FAIL";
    case Outcome::skip: return "skip";
  }
  return "?";
}

namespace {

const fixtures::Dataset* find(const fixtures::Case& c, const std::string& name) {
  const bool out = name.rfind("outputs/", 0) == 0;
  const auto& group = out ? c.outputs : c.grads;
  auto it = group.find(name.substr(name.find('/') + 1));
  return it == group.end() ? nullptr : &it->second;
}

bool all_finite(const fixtures::Dataset& d) {
  for (double x : d.data)
    if (!std::isfinite(x)) return false;
  return true;
}

bool same_run(const verify::RunOptions& a, const verify::RunOptions& b) {
  return a.impl == b.impl && a.precision.name() == b.precision.name() && a.operands == b.operands &&
         (a.impl != "reference-chunked" || a.chunk == b.chunk);
}

// The oracle's results in case-file form (hi + lo beyond double).
fixtures::Case oracle(const fixtures::Case& problem, const reference::Precision& p, int threads) {
  const reference::Named named = verify::recurrent_compute(problem, threads)(p);
  reference::set_mpfr_bits(p.bits + 64);
  fixtures::Case ref = problem;
  for (const auto& [name, values] : named) {
    fixtures::Dataset ds;
    ds.shape = verify::result_shape(problem, name);
    ds.data.resize(values.size());
    if (p.bits > 53) ds.lo.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ds.data[i] = static_cast<double>(values[i]);
      if (p.bits > 53) ds.lo[i] = static_cast<double>(reference::mpfr_float(values[i] - ds.data[i]));
    }
    const std::string key = name.substr(name.find('/') + 1);
    (name.rfind("outputs/", 0) == 0 ? ref.outputs : ref.grads)[key] = std::move(ds);
  }
  return ref;
}

Judgement skip(const std::string& why) {
  Judgement j;
  j.outcome = Outcome::skip;
  j.note = why;
  return j;
}

}  // namespace

bool is_no_device(const std::exception& e) {
  return std::string(e.what()).rfind("no CUDA device", 0) == 0;
}

Judgement judge_case(const fixtures::Case& c, const ImplSpec& spec, const JudgeOptions& opt) {
  fixtures::Case problem = c;
  problem.outputs.clear();
  problem.grads.clear();
  ImplSpec run_spec = spec;
  run_spec.run.threads = opt.threads;

  fixtures::Case cand;
  try {
    cand = run_impl(problem, run_spec);
  } catch (const qed::Error& e) {
    const std::string m = e.what();
    if (is_no_device(e)) throw;  // the machine's condition, not the kernel's answer
    if (m.find("unsupported") != std::string::npos || m.find("not supported") != std::string::npos)
      return skip(std::string("implementation does not support this shape: ") + m);
    Judgement j;
    j.outcome = Outcome::fail;
    j.score = std::numeric_limits<double>::infinity();
    j.note = "implementation rejected a valid case: " + m;
    return j;
  }
  // Judge what the implementation produced; gradients only when it produced them.
  if (cand.grads.empty()) problem.cotangents.reset();
  std::vector<std::string> names;
  for (const auto& n : verify::result_names(problem))
    if (find(cand, n)) names.push_back(n);
  if (names.empty()) {
    Judgement j;
    j.outcome = Outcome::fail;
    j.score = std::numeric_limits<double>::infinity();
    j.note = "implementation produced no results";
    return j;
  }

  const fixtures::Case ref = oracle(problem, oracle_precision(spec), opt.threads);
  for (const auto& n : names)
    if (!all_finite(*find(ref, n)))
      return skip(fmt::format("oracle ({}) overflows: {}", oracle_precision(spec).name(), n));

  const double u = verify::unit_roundoff(c.dtype);
  Judgement j;
  bool need_twins = false;
  for (const auto& n : names) {
    DatasetScore d;
    d.metrics = verify::compare_dataset(n, verify::result_axes(c, n), *find(cand, n), *find(ref, n), u);
    if (auto b = opt.tolerance.explicit_bound(n)) d.bound = *b;
    else need_twins = true;
    j.datasets.push_back(std::move(d));
  }
  // An overflow where the exact values are already beyond the square root of the range of the
  // implementation's arithmetic (exponentially growing, unstable configurations) is the format's
  // limit, not a bug: intermediate products of such states overflow first.
  const double range = oracle_precision(spec).kind == reference::ScalarKind::f64    ? 3.4028234663852886e38
                       : oracle_precision(spec).kind == reference::ScalarKind::f128 ? 1.7976931348623157e308
                                                                                    : 0;
  double ref_max = 0;
  bool cand_finite = true;
  for (const auto& d : j.datasets) {
    ref_max = std::max(ref_max, d.metrics.ref_max_abs);
    cand_finite = cand_finite && d.metrics.finite;
  }
  if (!cand_finite && range > 0 && ref_max > std::sqrt(range))
    return skip(fmt::format("overflow where the exact values pass the square root of the {} range: up to {:.3g}",
                            oracle_precision(spec).kind == reference::ScalarKind::f64 ? "float" : "double", ref_max));
  if (need_twins) {
    const verify::TwinPlan plan = verify::twin_plan(c.dtype, 0, verify::longest_sequence(c.inputs));
    std::vector<verify::TwinError> err(j.datasets.size());
    for (size_t r = 0; r < plan.runs.size(); ++r) {
      fixtures::Case twin;
      if (same_run(plan.runs[r], spec.run)) {
        twin = cand;  // the implementation is its own twin: identical results, no second run
      } else {
        verify::RunOptions run = plan.runs[r];
        run.threads = opt.threads;
        twin = verify::run_implementation(problem, run);
      }
      for (size_t i = 0; i < j.datasets.size(); ++i) {
        const Metrics& m = j.datasets[i].metrics;
        const fixtures::Dataset* td = find(twin, m.name);
        if (!td) return skip("twin " + plan.labels[r] + " did not produce a result: " + m.name);
        const Metrics tm = verify::compare_dataset(m.name, m.axes, *td, *find(ref, m.name), u);
        if (!tm.finite)
          return skip(fmt::format("twin {} overflows (beyond the range of {}): {}", plan.labels[r], c.dtype,
                                  m.name));
        if (tm.rel_frobenius >= err[i].rel_frobenius || err[i].worst_twin.empty()) {
          err[i].rel_frobenius = tm.rel_frobenius;
          err[i].worst_twin = plan.labels[r];
        }
        err[i].max_abs_error = std::max(err[i].max_abs_error, tm.max_abs_error);
      }
    }
    verify::GroupScales scales;
    for (const auto& d : j.datasets) scales.add(d.metrics);
    for (size_t i = 0; i < j.datasets.size(); ++i)
      if (!opt.tolerance.explicit_bound(j.datasets[i].metrics.name))
        j.datasets[i].bound =
            verify::twin_rule_bound(err[i], j.datasets[i].metrics, u, scales.of(j.datasets[i].metrics.name));
  }
  for (auto& d : j.datasets) {
    d.score = verify::judge(d.metrics, d.bound);
    if (d.score > j.score || j.worst.empty()) {
      j.score = d.score;
      j.worst = d.metrics.name;
    }
  }
  j.outcome = j.score > 1.0 ? Outcome::fail : Outcome::pass;
  if (j.outcome == Outcome::fail) j.note = summary(j);
  return j;
}

bool clear_failure(const Judgement& j, double u, double threshold) {
  if (j.outcome != Outcome::fail) return false;
  if (j.datasets.empty()) return true;  // the implementation threw or produced nothing
  double scale = 0;
  for (const auto& d : j.datasets) scale = std::max(scale, d.metrics.ref_max_abs);
  for (const auto& d : j.datasets) {
    if (!(d.score > threshold)) continue;
    const auto& m = d.metrics;
    if (m.finite && m.ref_max_abs == 0 && m.max_abs_error <= threshold * u * scale) continue;
    return true;
  }
  return false;
}

std::string summary(const Judgement& j) {
  if (j.outcome == Outcome::skip) return "skip: " + j.note;
  for (const auto& d : j.datasets) {
    if (d.metrics.name != j.worst) continue;
    const auto& m = d.metrics;
    if (!m.finite)
      return fmt::format("{} {}: non-finite value {} at {}", to_string(j.outcome), m.name, m.nonfinite_value,
                         m.first_nonfinite.text());
    return fmt::format("{} {}: rel_F {:.3e} (bound {:.3e}), max_abs {:.3e} (bound {:.3e}) at {}; score {:.3g}",
                       to_string(j.outcome), m.name, m.rel_frobenius, d.bound.rtol_frobenius,
                       m.max_abs_error, d.bound.atol_max, m.max_abs_at.text(), d.score);
  }
  return std::string(to_string(j.outcome)) + (j.note.empty() ? "" : ": " + j.note);
}

}  // namespace qed::fuzz
