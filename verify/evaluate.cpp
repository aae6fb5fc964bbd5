#include "verify/evaluate.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "fixtures/case_rules.hpp"
#include "reference/recurrent.hpp"

namespace qed::verify {

using namespace qed::reference;

std::vector<std::string> grad_names(Variant v, Arm a) {
  const Layout l = layout_of(v, a);
  std::vector<std::string> names = {"dq", "dk", "dv"};
  if (l.channel_g || l.scalar_g) names.push_back("dg");
  if (l.has_bw) {
    names.push_back("db");
    names.push_back("dw");
  }
  if (l.has_beta) names.push_back("dbeta");
  if (l.has_lambda) names.push_back("dlambda");
  if (l.has_r) names.push_back("dr");
  names.push_back("dh0");
  return names;
}

std::vector<std::string> result_names(const fixtures::Case& c) {
  std::vector<std::string> names = {"outputs/o", "outputs/ht"};
  if (c.cotangents)
    for (auto& g : grad_names(c.inputs.variant, c.inputs.arm)) names.push_back("grads/" + g);
  return names;
}


Compute recurrent_compute(const fixtures::Case& c, int threads) {
  return [&c, threads](const Precision& p) -> Named {
    return with_scalar(p, [&]<class S>() {
      Inputs<S> in = convert_inputs<S>(c.inputs);
      Named out;
      Outputs<S> o = recurrent_forward(in, threads);
      out.emplace_back("outputs/o", to_mpfr_vec(o.o));
      out.emplace_back("outputs/ht", to_mpfr_vec(o.ht));
      if (c.cotangents) {
        Grads<S> g = recurrent_backward(in, convert_cotangents<S>(*c.cotangents), threads);
        for (auto& name : grad_names(c.inputs.variant, c.inputs.arm))
          out.emplace_back("grads/" + name, to_mpfr_vec(grad_field(g, name)));
      }
      return out;
    });
  };
}

std::vector<int64_t> result_shape(const fixtures::Case& c, const std::string& name) {
  const auto& d = c.inputs.dims;
  const int64_t N = c.inputs.num_sequences();
  if (name == "outputs/o") return {d.B, d.T, d.H, d.V};
  if (name == "outputs/ht" || name == "grads/dh0") return {N, d.H, d.K, d.V};
  if (name.rfind("grads/d", 0) == 0) return fixtures::input_shape(c.inputs, name.substr(7));
  throw qed::Error("unknown result dataset '" + name + "'");
}

void store_results(const OracleReport& rep, fixtures::Case& c) {
  for (const auto& d : rep.datasets) {
    const bool is_output = d.name.rfind("outputs/", 0) == 0;
    const std::string key = d.name.substr(d.name.find('/') + 1);
    fixtures::Dataset ds;
    ds.shape = result_shape(c, d.name);
    // A result past the float64 range (an unstable case grown too long: MATH.md §8.3) has no
    // digits to certify: refused, never written as inf or NaN with a digit count.
    // (A finite hi has a finite lo.)
    fixtures::rules::check_finite(c.path.empty() ? "oracle" : c.path, "/" + d.name, d.hi, ds.shape,
                                  "the oracle's results are finite in float64; this case's state or "
                                  "gradients leave that range");
    ds.data = d.hi;
    if (rep.precision.bits > 53) ds.lo = d.lo;
    ds.digits = d.digits;
    if (is_output) {
      c.outputs[key] = std::move(ds);
    } else {
      c.grads[key] = std::move(ds);
    }
  }
}

std::string PrecisionChoice::text() const {
  if (!automatic) return fixed.name();
  char buf[32];
  std::snprintf(buf, sizeof buf, "auto:%g", target_digits);
  return buf;
}

PrecisionChoice parse_precision_choice(const std::string& s) {
  PrecisionChoice pc;
  if (s.rfind("auto:", 0) == 0) {
    const std::string num = s.substr(5);
    char* end = nullptr;
    double d = std::strtod(num.c_str(), &end);
    if (num.empty() || *end != '\0' || !(d >= 1 && d <= reference::kMaxCertifiedDigits)) {
      char range[64];
      std::snprintf(range, sizeof range, "[1, %.1f]", reference::kMaxCertifiedDigits);
      throw qed::Error("precision '" + s + "': auto:DIGITS needs DIGITS in " + range +
                       " (rule: results are stored as double-double, 106 bits)");
    }
    pc.automatic = true;
    pc.target_digits = d;
    return pc;
  }
  pc.automatic = false;
  pc.fixed = parse_precision(s);
  return pc;
}

}  // namespace qed::verify
