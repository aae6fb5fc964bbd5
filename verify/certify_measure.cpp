// One cell of a certification sweep: the cases of its seeds, the oracle, every implementation,
// and the per-dataset errors.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "fixtures/generate.hpp"
#include "reference/error.hpp"
#include "reference/rounding.hpp"
#include "verify/certify.hpp"
#include "verify/compare.hpp"
#include "verify/evaluate.hpp"

namespace qed::verify {

namespace {

void round_all(std::vector<double>& x, const reference::BinaryFormat& f) {
  for (auto& e : x) e = reference::round_to_format(e, f);
}


// The double oracle checked against float128 on the same inputs: per dataset the element-wise
// certified digits (the rule of reference/oracle.hpp: agreement relative to each element, floored
// at 10^-16 of the largest) and the oracle's own rel_F and max abs error. Also returns the double
// values as the reference datasets of `ref`.
std::vector<OracleStats> checked_oracle(const fixtures::Case& c, int threads, fixtures::Case& ref) {
  // float128 results become mpfr at the process-wide default precision: set it first (an
  // earlier float run left it at 88 bits).
  reference::set_mpfr_bits(113 + 64);
  const auto compute = recurrent_compute(c, threads);
  const reference::Named check = compute(reference::Precision::f128());
  const reference::Named value = compute(reference::Precision::f64());
  const double cap = reference::Precision::f64().decimal_digits();
  ref = c;
  ref.outputs.clear();
  ref.grads.clear();
  std::vector<OracleStats> out;
  for (size_t d = 0; d < value.size(); ++d) {
    const auto& v = value[d].second;
    const auto& k = check[d].second;
    const std::string& name = value[d].first;
    fixtures::Dataset ds;
    ds.shape = result_shape(c, name);
    ds.data.resize(v.size());
    double max_check = 0;
    for (const auto& x : k) max_check = std::max(max_check, std::abs(static_cast<double>(x)));
    const double floor_abs = max_check * std::pow(10.0, -cap);
    double worst = 0, ss_diff = 0, ss_ref = 0, max_abs = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      ds.data[i] = static_cast<double>(v[i]);  // exact: the values were computed in double
      const double diff = std::abs(static_cast<double>(reference::mpfr_float(v[i] - k[i])));
      const double kd = std::abs(static_cast<double>(k[i]));
      if (diff > 0) worst = std::max(worst, diff / std::max(kd, floor_abs));
      ss_diff += diff * diff;
      ss_ref += kd * kd;
      max_abs = std::max(max_abs, diff);
    }
    OracleStats o;
    o.name = name.substr(name.find('/') + 1);
    o.digits = max_check == 0 ? cap : std::clamp(worst > 0 ? -std::log10(worst) : cap, 0.0, cap);
    o.rel_frobenius = ss_ref > 0 ? std::sqrt(ss_diff / ss_ref) : std::sqrt(ss_diff);
    o.max_abs = max_abs;
    out.push_back(o);
    (name.rfind("outputs/", 0) == 0 ? ref.outputs : ref.grads)[o.name] = std::move(ds);
  }
  return out;
}

DatasetStats& stats_for(CellResult& r, const std::string& name) {
  for (auto& d : r.datasets)
    if (d.name == name) return d;
  r.datasets.push_back({});
  r.datasets.back().name = name;
  return r.datasets.back();
}

}  // namespace

Family parse_family(const std::string& text) {
  Family f;
  std::string rest = text;
  const auto at = rest.find('@');
  std::string lambda_text;
  if (at != std::string::npos) {
    lambda_text = rest.substr(at + 1);
    rest = rest.substr(0, at);
  }
  const auto dot = rest.find('.');
  f.variant = rest.substr(0, dot);
  reference::Variant v;
  if (!reference::parse_variant(f.variant, v))
    throw qed::Error("family '" + text + "': variant must be gdn2, qed, kda, gdn or deltanet");
  if (v == reference::Variant::qed) {
    reference::Arm a;
    f.arm = dot == std::string::npos ? "full" : rest.substr(dot + 1);
    if (!reference::parse_arm(f.arm, a))
      throw qed::Error("family '" + text +
                       "': qed arm must be full, nogate, nogate_noproj or rand");
    f.lambda = 1.0;
    if (!lambda_text.empty()) {
      char* end = nullptr;
      f.lambda = std::strtod(lambda_text.c_str(), &end);
      if (*end != '\0' || !std::isfinite(f.lambda) || f.lambda < 0)
        throw qed::Error("family '" + text + "': lambda after @ must be a number >= 0");
    }
  } else if (dot != std::string::npos || at != std::string::npos) {
    throw qed::Error("family '" + text + "': only qed takes an arm and @lambda (e.g. qed.full@1)");
  }
  return f;
}

fixtures::Case certify_case(const CellSpec& spec, uint64_t seed, const std::string& case_dtype) {
  fixtures::GenSpec g;
  if (!reference::parse_variant(spec.variant, g.variant))
    throw qed::Error("cell " + spec.key() + ": unknown variant '" + spec.variant + "'");
  if (g.variant == reference::Variant::qed && !reference::parse_arm(spec.arm, g.arm))
    throw qed::Error("cell " + spec.key() + ": unknown qed arm '" + spec.arm + "'");
  g.dims = {spec.B, spec.T, spec.H, spec.K, spec.V};
  g.regime = fixtures::parse_regime(spec.regime);
  g.seed = seed;
  g.lambda = spec.lambda;
  fixtures::Case c;
  c.inputs = fixtures::generate(g);
  c.cotangents = fixtures::generate_cotangents(c.inputs, seed, /*with_dht=*/true);
  const reference::Operands ops = case_dtype == "float32"    ? reference::Operands::fp32
                                  : case_dtype == "bfloat16" ? reference::Operands::bf16
                                                             : reference::Operands::none;
  if (ops == reference::Operands::none)
    throw qed::Error("certify: case dtype '" + case_dtype + "' (expected float32 or bfloat16)");
  const auto f = reference::format_of(ops);
  auto& in = c.inputs;
  for (auto* x : {&in.q, &in.k, &in.v, &in.g, &in.b, &in.w, &in.beta, &in.lambda, &in.r, &in.h0})
    round_all(*x, f);
  round_all(c.cotangents->do_, f);
  round_all(c.cotangents->dht, f);
  c.dtype = case_dtype;
  c.producer = "qedcheck certify";
  fixtures::validate_case(c, "certify " + spec.key() + " seed " + std::to_string(seed));
  return c;
}

std::vector<CellResult> measure_cell(const CellSpec& spec, const std::string& case_dtype,
                                     const std::vector<RunOptions>& runs, bool oracle_digits,
                                     int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<CellResult> out(runs.size());
  for (auto& r : out) {
    r.spec = spec;
    r.oracle_min_digits = std::numeric_limits<double>::quiet_NaN();
  }
  const double u = unit_roundoff(case_dtype);
  for (size_t si = 0; si < spec.seeds.size(); ++si) {
    const uint64_t seed = spec.seeds[si];
    const fixtures::Case c = certify_case(spec, seed, case_dtype);
    fixtures::Case ref;
    std::vector<OracleStats> oracle;
    double min_digits = std::numeric_limits<double>::infinity();
    if (si == 0 && oracle_digits) {
      oracle = checked_oracle(c, threads, ref);
      for (const auto& o : oracle) min_digits = std::min(min_digits, o.digits);
    } else {
      RunOptions o;
      o.impl = "reference-recurrent";
      o.precision = reference::Precision::f64();
      o.threads = threads;
      ref = run_implementation(c, o);
    }
    double state_norm = 0;
    if (const auto* ht = find_result(ref, "outputs/ht"))
      for (double x : ht->data) state_norm += x * x;
    state_norm = std::sqrt(state_norm);

    for (size_t k = 0; k < runs.size(); ++k) {
      const fixtures::Case cand = run_implementation(c, runs[k]);
      for (const auto& name : result_names(c)) {
        const fixtures::Dataset* rd = find_result(ref, name);
        const fixtures::Dataset* cd = find_result(cand, name);
        if (!rd) throw qed::Error("certify: the oracle produced no " + name);
        if (!cd) {
          const std::string miss = name + " not produced";
          if (out[k].note.find(miss) == std::string::npos)
            out[k].note += (out[k].note.empty() ? "" : "; ") + miss;
          continue;
        }
        const Metrics m = compare_dataset(name, result_axes(c, name), *cd, *rd, u);
        DatasetStats& ds = stats_for(out[k], name.substr(name.find('/') + 1));
        const double inf = std::numeric_limits<double>::infinity();
        ds.rel_frobenius.push_back(m.finite ? m.rel_frobenius : inf);
        ds.max_abs.push_back(m.finite ? m.max_abs_error : inf);
        ds.ref_max_abs.push_back(m.ref_max_abs);
      }
      out[k].state_norm.push_back(state_norm);
      if (si == 0 && oracle_digits) {
        out[k].oracle_seed = seed;
        out[k].oracle = oracle;
        out[k].oracle_min_digits = min_digits;
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& r : out) r.seconds = secs;
  return out;
}

}  // namespace qed::verify
