#include "verify/verdict.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "reference/error.hpp"
#include "reference/oracle.hpp"
#include "reference/rounding.hpp"
#include "verify/compare_golden.hpp"
#include "verify/evaluate.hpp"

namespace qed::verify {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }


// The candidate's results in result_names order; throws for anything that cannot be judged.
std::vector<std::string> candidate_results(const fixtures::Case& c, const std::string& where) {
  if (c.outputs.empty() && c.grads.empty())
    throw qed::Error(where + ": carries no /outputs and no /grads (rule: a candidate holds the "
                             "results of the implementation under test; nothing to verify)");
  if (!c.grads.empty() && !c.cotangents)
    throw qed::Error(where + ": /grads/" + c.grads.begin()->first +
                     " is present but /cotangents/do is absent (rule: gradients are those of "
                     "L = sum(do*o) + sum(dht*ht))");
  fixtures::Case probe = c;
  if (!probe.cotangents) probe.cotangents.emplace();
  const auto known = result_names(probe);
  auto check_group = [&](const std::map<std::string, fixtures::Dataset>& g, const char* group) {
    for (const auto& [key, ds] : g) {
      const std::string name = std::string(group) + "/" + key;
      if (std::find(known.begin(), known.end(), name) == known.end())
        throw qed::Error(fmt::format("{}: /{} is not a result of variant {}{}{} (rule: /grads holds "
                                     "d<name> for the variant's differentiable inputs)",
                                     where, name, reference::to_string(c.inputs.variant),
                                     c.inputs.arm == reference::Arm::none ? "" : " arm ",
                                     c.inputs.arm == reference::Arm::none
                                         ? ""
                                         : std::string(reference::to_string(c.inputs.arm))));
      const Axes axes = result_axes(c, name);
      int64_t count = 1;
      for (int64_t n : axes.shape) count *= n;
      if ((!ds.shape.empty() && ds.shape != axes.shape) ||
          static_cast<int64_t>(ds.data.size()) != count)
        throw qed::Error(fmt::format("{}: /{} has shape [{}], expected [{}] from /inputs", where, name,
                                     fmt::join(ds.shape, ","), fmt::join(axes.shape, ",")));
      if (!ds.lo.empty() && ds.lo.size() != ds.data.size())
        throw qed::Error(fmt::format("{}: /{}_lo has {} elements, /{} has {} (rule: X_lo has the "
                                     "shape of X)",
                                     where, name, ds.lo.size(), name, ds.data.size()));
    }
  };
  check_group(c.outputs, "outputs");
  check_group(c.grads, "grads");
  std::vector<std::string> names;
  for (const auto& n : known)
    if (find_result(c, n)) names.push_back(n);
  return names;
}

// Inputs that the claimed dtype cannot hold: the case then does not hold what the kernel consumed.
std::string unrepresentable_input(const fixtures::Case& c) {
  if (c.dtype == "float64") return "";
  const reference::Operands ops = c.dtype == "float32"    ? reference::Operands::fp32
                                  : c.dtype == "bfloat16" ? reference::Operands::bf16
                                                          : reference::Operands::fp16;
  const auto& in = c.inputs;
  const std::pair<const char*, const std::vector<double>*> arrays[] = {
      {"q", &in.q}, {"k", &in.k}, {"v", &in.v}, {"g", &in.g}, {"b", &in.b}, {"w", &in.w},
      {"beta", &in.beta}, {"lambda", &in.lambda}, {"r", &in.r}, {"h0", &in.h0}};
  for (const auto& [name, x] : arrays)
    for (size_t i = 0; i < x->size(); ++i)
      if (reference::round_operand((*x)[i], ops) != (*x)[i])
        return fmt::format("/inputs/{}[{}] = {:.17g} is not a {} value (CASE_FORMAT: the inputs "
                           "are the values the kernel consumed, already rounded); the verdict "
                           "judges the function at the stored values",
                           name, i, (*x)[i], c.dtype);
  return "";
}

}  // namespace

Verdict verify_candidate(const fixtures::Case& cand, const VerifyOptions& opt) {
  const auto t0 = Clock::now();
  const std::string where = cand.path.empty() ? std::string("candidate") : cand.path;
  Verdict v;
  v.candidate_path = cand.path;
  v.variant = reference::to_string(cand.inputs.variant);
  v.arm = reference::to_string(cand.inputs.arm);
  v.dtype = cand.dtype;
  v.producer = cand.producer;
  v.dims = cand.inputs.dims;
  v.N = cand.inputs.num_sequences();
  v.unit_roundoff = unit_roundoff(cand.dtype);
  v.input_hash = input_hash(cand);
  const std::vector<std::string> names = candidate_results(cand, where);
  if (std::string w = unrepresentable_input(cand); !w.empty()) v.warnings.push_back(w);
  {  // what the case asks for (grads when it has cotangents) and the candidate does not hold
    std::vector<std::string> absent;
    for (const auto& n : result_names(cand))
      if (std::find(names.begin(), names.end(), n) == names.end()) absent.push_back(n);
    if (!absent.empty())
      v.warnings.push_back(fmt::format("not judged, absent from the candidate: {}", fmt::join(absent, ", ")));
  }

  // What the reference is computed on: the inputs, with cotangents only when grads are judged.
  fixtures::Case problem = cand;
  problem.outputs.clear();
  problem.grads.clear();
  if (cand.grads.empty()) problem.cotangents.reset();

  // Reference: the golden corpus' stored oracle values, else the oracle now.
  fixtures::Case ref;
  const auto tr = Clock::now();
  std::optional<GoldenHit> hit = find_golden(opt.golden_dir, problem, problem.cotangents.has_value());
  bool from_golden = false;
  if (hit) {
    from_golden = std::all_of(names.begin(), names.end(),
                              [&](const std::string& n) { return find_result(hit->c, n) != nullptr; });
  }
  if (from_golden) {
    ref = std::move(hit->c);
    v.reference.source = "golden";
    v.reference.path = hit->path;
    v.reference.precision = ref.producer;
  } else {
    const auto compute = recurrent_compute(problem, opt.threads);
    const reference::OracleReport rep = reference::evaluate_auto(compute, opt.digits, opt.cap_bits);
    ref = problem;
    store_results(rep, ref);
    v.reference.source = "oracle";
    v.reference.precision = rep.precision.name();
    v.reference.check_precision = rep.check.name();
    v.reference.target_met = rep.target_met;
    if (!rep.target_met) v.warnings.push_back("oracle: " + rep.note);
  }
  v.reference.seconds = since(tr);
  v.reference.min_digits = std::numeric_limits<double>::infinity();
  for (const auto& n : names) v.reference.min_digits = std::min(v.reference.min_digits, find_result(ref, n)->digits);

  // Metrics of the candidate, and which datasets need the twin rule.
  bool need_twins = false;
  int explicit_count = 0;
  for (const auto& n : names) {
    DatasetVerdict d;
    d.metrics = compare_dataset(n, result_axes(cand, n), *find_result(cand, n), *find_result(ref, n),
                                v.unit_roundoff);
    if (auto b = opt.tolerance.explicit_bound(n)) {
      d.bound = *b;
      ++explicit_count;
    } else {
      need_twins = true;
    }
    v.datasets.push_back(std::move(d));
  }

  v.twins = twin_plan(cand.dtype, opt.chunk, longest_sequence(cand.inputs));
  v.tolerance_file = opt.tolerance.file;
  if (need_twins) {
    const auto tt = Clock::now();
    std::vector<TwinError> err(v.datasets.size());
    for (size_t r = 0; r < v.twins.runs.size(); ++r) {
      RunOptions run = v.twins.runs[r];
      run.threads = opt.threads;
      const fixtures::Case twin = run_implementation(problem, run);
      for (size_t i = 0; i < v.datasets.size(); ++i) {
        const auto& m = v.datasets[i].metrics;
        const fixtures::Dataset* td = find_result(twin, m.name);
        if (!td) throw qed::Error("twin " + v.twins.labels[r] + " did not produce " + m.name);
        const Metrics tm = compare_dataset(m.name, m.axes, *td, *find_result(ref, m.name), v.unit_roundoff);
        // A twin that overflows is no yardstick (an infinite bound would pass anything): it is
        // left out, and when no twin is finite only the one-rounding floor remains.
        if (!tm.finite) {
          v.warnings.push_back(fmt::format("twin {} gave a non-finite {} at {}; it sets no bound",
                                           v.twins.labels[r], m.name, tm.first_nonfinite.text()));
          continue;
        }
        if (tm.rel_frobenius >= err[i].rel_frobenius || err[i].worst_twin.empty()) {
          err[i].rel_frobenius = tm.rel_frobenius;
          err[i].worst_twin = v.twins.labels[r];
        }
        err[i].max_abs_error = std::max(err[i].max_abs_error, tm.max_abs_error);
      }
    }
    GroupScales scales;
    for (const auto& d : v.datasets) scales.add(d.metrics);
    for (size_t i = 0; i < v.datasets.size(); ++i) {
      auto& d = v.datasets[i];
      if (opt.tolerance.explicit_bound(d.metrics.name)) continue;
      d.twin = err[i];
      d.bound = twin_rule_bound(err[i], d.metrics, v.unit_roundoff, scales.of(d.metrics.name));
      if (err[i].rel_frobenius >= 0.5)
        v.warnings.push_back(fmt::format(
            "{}: the twin's own relative error is {:.2g}: {} cannot resolve this dataset on these "
            "inputs, so the twin bound is nearly vacuous",
            d.metrics.name, err[i].rel_frobenius, cand.dtype));
    }
    v.twins_run = true;
    v.twin_seconds = since(tt);
    if (v.twins.provisional) v.warnings.push_back(v.twins.note);
  }
  v.tolerance_source = explicit_count == 0                              ? "rule"
                       : explicit_count < static_cast<int>(names.size()) ? "mixed"
                       : opt.tolerance.options                          ? "options"
                                                                        : "file";

  v.pass = true;
  double tightest = std::numeric_limits<double>::infinity();
  for (auto& d : v.datasets) {
    d.score = judge(d.metrics, d.bound);
    d.pass = d.score <= 1.0;
    v.pass = v.pass && d.pass;
    if (d.bound.rtol_frobenius == d.bound.rtol_frobenius) tightest = std::min(tightest, d.bound.rtol_frobenius);
  }
  // A bound finer than the reference's certified accuracy cannot be judged honestly.
  if (std::isfinite(tightest) && tightest > 0 && std::pow(10.0, -v.reference.min_digits) > 0.01 * tightest)
    v.warnings.push_back(fmt::format(
        "reference certified to {:.1f} digits only, not well below the tightest bound {:.2e}; "
        "raise --digits",
        v.reference.min_digits, tightest));
  v.exit_code = v.pass ? 0 : 1;
  v.seconds = since(t0);
  return v;
}

}  // namespace qed::verify
