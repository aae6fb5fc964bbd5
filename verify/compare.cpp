#include "verify/compare.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "reference/error.hpp"

namespace qed::verify {

using reference::Layout;

double unit_roundoff(const std::string& dtype) {
  if (dtype == "float64") return std::ldexp(1.0, -53);
  if (dtype == "float32") return std::ldexp(1.0, -24);
  if (dtype == "bfloat16") return std::ldexp(1.0, -8);
  if (dtype == "float16") return std::ldexp(1.0, -11);
  throw qed::Error("dtype '" + dtype + "': expected float64, float32, bfloat16 or float16");
}

Axes result_axes(const fixtures::Case& c, const std::string& name) {
  const auto& d = c.inputs.dims;
  const int64_t N = c.inputs.num_sequences();
  const Layout lay = reference::layout_of(c.inputs.variant, c.inputs.arm);
  const std::string key = name.substr(name.find('/') + 1);
  const std::string base = name.rfind("grads/", 0) == 0 ? key.substr(1) : key;
  auto seq = [&](int64_t D, const char* last) {
    return Axes{{d.B, d.T, d.H, D}, {"b", "t", "h", last}};
  };
  if (base == "o" || base == "v" || base == "w") return seq(d.V, "v");
  if (base == "q" || base == "k" || base == "b") return seq(d.K, "k");
  if (base == "ht" || base == "h0") return Axes{{N, d.H, d.K, d.V}, {"n", "h", "k", "v"}};
  if (base == "g")
    return lay.scalar_g ? Axes{{d.B, d.T, d.H}, {"b", "t", "h"}} : seq(d.K, "k");
  if (base == "beta") return Axes{{d.B, d.T, d.H}, {"b", "t", "h"}};
  if (base == "lambda") return Axes{{d.H}, {"h"}};
  if (base == "r") return Axes{{d.H, d.K}, {"h", "k"}};
  throw qed::Error("dataset '" + name + "': not an output or gradient name of CASE_FORMAT.md");
}

Location locate(const Axes& axes, int64_t flat) {
  Location loc;
  loc.flat = flat;
  loc.labels = axes.labels;
  if (flat < 0) return loc;
  loc.index.assign(axes.shape.size(), 0);
  int64_t rest = flat;
  for (size_t i = axes.shape.size(); i-- > 0;) {
    loc.index[i] = axes.shape[i] > 0 ? rest % axes.shape[i] : 0;
    rest = axes.shape[i] > 0 ? rest / axes.shape[i] : 0;
  }
  return loc;
}

std::string Location::text() const {
  if (flat < 0) return "-";
  std::string s = "(";
  for (size_t i = 0; i < index.size(); ++i)
    s += fmt::format("{}{}={}", i ? ", " : "", i < labels.size() ? labels[i] : "?", index[i]);
  return s + ")";
}

Metrics compare_dataset(const std::string& name, const Axes& axes, const fixtures::Dataset& cand,
                        const fixtures::Dataset& ref, double u) {
  int64_t count = 1;
  for (int64_t n : axes.shape) count *= n;
  auto check_size = [&](const std::vector<double>& x, const char* what) {
    if (static_cast<int64_t>(x.size()) != count)
      throw qed::Error(fmt::format("{}: {} has {} elements, expected {} (shape [{}])", name, what,
                                   x.size(), count, fmt::join(axes.shape, ",")));
  };
  check_size(cand.data, "candidate");
  check_size(ref.data, "reference");
  if (!cand.lo.empty()) check_size(cand.lo, "candidate low part");
  if (!ref.lo.empty()) check_size(ref.lo, "reference low part");

  Metrics m;
  m.name = name;
  m.axes = axes;
  m.count = count;
  auto value_lo = [](const fixtures::Dataset& d, int64_t i) { return d.lo.empty() ? 0.0 : d.lo[i]; };

  // Scaled sums of squares (as in LAPACK's dnrm2) so that huge states do not overflow.
  auto frob = [](double scale, double ssq) { return scale * std::sqrt(ssq); };
  double r_scale = 0, r_ssq = 1, e_scale = 0, e_ssq = 1;
  auto accumulate = [](double x, double& scale, double& ssq) {
    const double ax = std::abs(x);
    if (ax == 0) return;
    if (scale < ax) {
      ssq = 1 + ssq * (scale / ax) * (scale / ax);
      scale = ax;
    } else {
      ssq += (ax / scale) * (ax / scale);
    }
  };
  for (int64_t i = 0; i < count; ++i) {
    const double r = ref.data[i] + value_lo(ref, i);
    m.ref_max_abs = std::max(m.ref_max_abs, std::abs(r));
    accumulate(r, r_scale, r_ssq);
  }
  m.ref_frobenius = frob(r_scale, r_ssq);
  m.significant_floor = kSignificantFraction * m.ref_max_abs;

  for (int64_t i = 0; i < count; ++i) {
    const double c = cand.data[i];
    const double clo = value_lo(cand, i);
    if (!std::isfinite(c) || !std::isfinite(clo)) {
      if (m.finite) {
        m.finite = false;
        m.first_nonfinite = locate(axes, i);
        m.nonfinite_value = std::isfinite(c) ? clo : c;
      }
      continue;
    }
    const double diff = (c - ref.data[i]) + (clo - value_lo(ref, i));
    const double ad = std::abs(diff);
    accumulate(diff, e_scale, e_ssq);
    if (ad > m.max_abs_error || (m.max_abs_at.flat < 0 && ad > 0)) {
      m.max_abs_error = ad;
      m.max_abs_at = locate(axes, i);
    }
    const double ar = std::abs(ref.data[i] + value_lo(ref, i));
    if (ar >= m.significant_floor && ar > 0 && ad / ar > m.max_rel_error) {
      m.max_rel_error = ad / ar;
      m.max_rel_at = locate(axes, i);
    }
  }
  if (!m.finite) {
    const double inf = std::numeric_limits<double>::infinity();
    m.err_frobenius = m.rel_frobenius = m.max_abs_error = m.max_rel_error = m.eps_units = inf;
    m.max_abs_at = m.first_nonfinite;
    return m;
  }
  m.err_frobenius = frob(e_scale, e_ssq);
  m.rel_frobenius = m.ref_frobenius > 0 ? m.err_frobenius / m.ref_frobenius : m.err_frobenius;
  m.eps_units = m.rel_frobenius / u;
  return m;
}

}  // namespace qed::verify
