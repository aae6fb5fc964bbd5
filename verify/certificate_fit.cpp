// What a certificate concludes from its measurements: per-cell statistics and bounds, growth
// laws in T, and the tolerance document they imply.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "verify/certificate.hpp"

namespace qed::verify {

namespace {

double rms(const std::vector<double>& x) {
  if (x.empty()) return 0;
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s / static_cast<double>(x.size()));
}

double max_of(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) {
    if (std::isnan(v)) return v;
    m = std::max(m, v);
  }
  return m;
}

}  // namespace

void finalize_cell(CellResult& cell, double F, double floor, double u_dtype) {
  std::string reasons;
  for (auto& d : cell.datasets) {
    d.finite = true;
    for (size_t i = 0; i < d.rel_frobenius.size(); ++i)
      d.finite = d.finite && std::isfinite(d.rel_frobenius[i]) && std::isfinite(d.max_abs[i]);
    d.max_rel_frobenius = max_of(d.rel_frobenius);
    d.rms_rel_frobenius = rms(d.rel_frobenius);
    d.max_max_abs = max_of(d.max_abs);
    d.rms_max_abs = rms(d.max_abs);
    d.max_eps_units = d.max_rel_frobenius / u_dtype;
    d.rms_eps_units = d.rms_rel_frobenius / u_dtype;
    d.bound_rel_frobenius = d.bound_max_abs = std::nan("");
    if (!d.finite)
      reasons += fmt::format("{}{}: non-finite error", reasons.empty() ? "" : "; ", d.name);
    for (const auto& o : cell.oracle) {
      if (o.name != d.name || !d.finite) continue;
      // The measured error is off the true one by at most the oracle's own error, in the same
      // metric (triangle inequality): that must stay below a tenth of what is measured.
      const double ref = max_of(d.ref_max_abs);
      if (!(o.rel_frobenius <= 0.1 * std::max(d.max_rel_frobenius, floor)) ||
          !(o.max_abs <= 0.1 * std::max(d.max_max_abs, floor * ref)))
        reasons += fmt::format(
            "{}{}: oracle error rel_F {:.1e}, max abs {:.1e} ({:.1f} digits) "
            "not below a tenth of the measured {:.1e}, {:.1e}",
            reasons.empty() ? "" : "; ", d.name, o.rel_frobenius, o.max_abs, o.digits,
            d.max_rel_frobenius, d.max_max_abs);
    }
  }
  if (cell.spec.unstable) {
    cell.status = "unstable";
    if (cell.note.empty())
      cell.note = "exponentially growing state (MATH.md §8.3): reported, never certified";
    return;
  }
  if (!reasons.empty()) {
    cell.status = "not-certified";
    cell.note = reasons;
    return;
  }
  cell.status = "certified";
  for (auto& d : cell.datasets) {
    d.bound_rel_frobenius = F * std::max(d.max_rel_frobenius, floor);
    d.bound_max_abs = F * std::max(d.max_max_abs, floor * max_of(d.ref_max_abs));
  }
}

bool fit_power_law(const std::vector<double>& x, const std::vector<double>& y, double& c, double& p,
                   double& residual_log10) {
  std::vector<double> lx, ly;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (x[i] > 0 && y[i] > 0 && std::isfinite(x[i]) && std::isfinite(y[i])) {
      lx.push_back(std::log(x[i]));
      ly.push_back(std::log(y[i]));
    }
  const size_t n = lx.size();
  if (n < 2) return false;
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += lx[i];
    my += ly[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (lx[i] - mx) * (lx[i] - mx);
    sxy += (lx[i] - mx) * (ly[i] - my);
  }
  if (sxx <= 0) return false;  // all points at one T
  p = sxy / sxx;
  const double logc = my - p * mx;
  c = std::exp(logc);
  double ss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = ly[i] - (logc + p * lx[i]);
    ss += r * r;
  }
  residual_log10 = std::sqrt(ss / static_cast<double>(n)) / std::log(10.0);
  return true;
}

std::vector<PowerFit> fit_growth(const Certificate& cert) {
  using Series = std::tuple<std::string, std::string, double, std::string, int64_t, int64_t,
                            int64_t, bool, std::string>;
  std::map<Series, std::map<int64_t, double>> series;  // T -> worst max rel_F at that T
  std::vector<Series> order;
  for (const auto& c : cert.cells) {
    const auto& s = c.spec;
    for (const auto& d : c.datasets) {
      Series key{s.variant, s.arm, s.lambda, s.regime, s.H, s.K, s.V, s.unstable, d.name};
      if (!series.count(key)) order.push_back(key);
      double& y = series[key][s.T];
      y = std::max(y, d.max_rel_frobenius);
    }
  }
  std::vector<PowerFit> fits;
  for (const auto& key : order) {
    std::vector<double> x, y;
    for (const auto& [T, e] : series[key]) {
      x.push_back(static_cast<double>(T));
      y.push_back(e);
    }
    PowerFit f;
    std::tie(f.variant, f.arm, f.lambda, f.regime, f.H, f.K, f.V, f.unstable, f.dataset) = key;
    if (!fit_power_law(x, y, f.c, f.p, f.residual_log10)) continue;
    f.points = 0;
    f.T_min = INT64_MAX;
    f.T_max = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (y[i] > 0 && std::isfinite(y[i])) {
        ++f.points;
        f.T_min = std::min<int64_t>(f.T_min, static_cast<int64_t>(x[i]));
        f.T_max = std::max<int64_t>(f.T_max, static_cast<int64_t>(x[i]));
      }
    fits.push_back(f);
  }
  return fits;
}

nlohmann::json tolerance_of(const Certificate& cert) {
  struct Worst {
    double rtol = 0, atol = 0;
    std::string rtol_cell, atol_cell;
    int cells = 0;
  };
  std::map<std::string, Worst> worst;
  std::vector<std::string> order;
  std::set<std::string> families, regimes;
  int64_t T_max = 0;
  int certified = 0;
  for (const auto& c : cert.cells) {
    if (c.status != "certified") continue;
    ++certified;
    families.insert(c.spec.family());
    regimes.insert(c.spec.regime);
    T_max = std::max(T_max, c.spec.T);
    for (const auto& d : c.datasets) {
      if (!worst.count(d.name)) order.push_back(d.name);
      Worst& w = worst[d.name];
      ++w.cells;
      if (d.bound_rel_frobenius > w.rtol) {
        w.rtol = d.bound_rel_frobenius;
        w.rtol_cell = c.spec.key();
      }
      if (d.bound_max_abs > w.atol) {
        w.atol = d.bound_max_abs;
        w.atol_cell = c.spec.key();
      }
    }
  }
  nlohmann::json datasets = nlohmann::json::object();
  for (const auto& name : order) {
    const Worst& w = worst[name];
    datasets[name] = {
        {"rtol_frobenius", w.rtol},
        {"atol_max", w.atol},
        {"note", fmt::format("max over {} certified cells; rtol from {}, atol from {}", w.cells,
                             w.rtol_cell, w.atol_cell)}};
  }
  return {{"schema", "qedcheck.tolerance/1"},
          {"description",
           fmt::format("certified envelope of {} ({} inputs): the largest certified bound "
                       "(observed max x {:g}) over {} cells: {} in regimes {}, T <= {}. Valid for "
                       "cases inside that envelope only.",
                       cert.subject.name(), cert.subject.case_dtype(), cert.safety_factor,
                       certified, fmt::join(families, ", "), fmt::join(regimes, ", "), T_max)},
          {"datasets", datasets}};
}

}  // namespace qed::verify
