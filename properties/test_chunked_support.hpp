// Helpers shared by the chunked-reference tests: seeds with replay hints, normwise comparisons of
// outputs and gradients in any scalar type, case construction, and time slicing for P1/P2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "fixtures/generate.hpp"
#include "reference/types.hpp"

namespace qed::chunked_test {

using namespace qed::reference;

// The seed of a random test: QEDCHECK_SEED overrides the default so a failure can be replayed.
inline uint64_t test_seed(uint64_t dflt) {
  if (const char* env = std::getenv("QEDCHECK_SEED")) return std::strtoull(env, nullptr, 10);
  return dflt;
}
inline std::string replay(uint64_t seed) {
  return "replay: QEDCHECK_SEED=" + std::to_string(seed) +
         " <test binary> --gtest_filter=<this test>";
}

inline const std::vector<std::pair<Variant, Arm>>& all_variants() {
  static const std::vector<std::pair<Variant, Arm>> v = {
      {Variant::gdn2, Arm::none},  {Variant::qed, Arm::full},
      {Variant::qed, Arm::nogate}, {Variant::qed, Arm::nogate_noproj},
      {Variant::qed, Arm::rand},   {Variant::kda, Arm::none},
      {Variant::gdn, Arm::none},   {Variant::deltanet, Arm::none}};
  return v;
}
inline std::string name_of(Variant v, Arm a) {
  std::string s(to_string(v));
  if (v == Variant::qed) s.append("/").append(to_string(a));
  return s;
}

// max|x - y| / max|y| (max|x| when y is all zero), evaluated in S.
template <class S>
double rel_max(const std::vector<S>& x, const std::vector<S>& y) {
  using std::abs;
  if (x.size() != y.size()) return INFINITY;
  S num(0), den(0);
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max<S>(num, S(abs(S(x[i] - y[i]))));
    den = std::max<S>(den, S(abs(y[i])));
  }
  if (num != num) return NAN;
  return den == S(0) ? static_cast<double>(num) : static_cast<double>(S(num / den));
}

// ||x - y||_F / ||y||_F in double (the rel_F of MATH.md §10); NaN if x has a non-finite entry.
template <class S, class R>
double rel_fro(const std::vector<S>& x, const std::vector<R>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = static_cast<double>(x[i]), yi = static_cast<double>(y[i]);
    if (!std::isfinite(xi)) return NAN;
    num += (xi - yi) * (xi - yi);
    den += yi * yi;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Worst rel_max over every tensor of a result; `what` names the worst one.
template <class S>
double worst_outputs(const Outputs<S>& x, const Outputs<S>& y, std::string* what = nullptr) {
  double eo = rel_max(x.o, y.o), eh = rel_max(x.ht, y.ht);
  if (what) *what = eo >= eh ? "o" : "ht";
  return std::max(eo, eh);
}

template <class S>
std::vector<std::pair<std::string, const std::vector<S>*>> grad_fields(const Grads<S>& g) {
  return {{"dq", &g.dq}, {"dk", &g.dk},  {"dv", &g.dv},       {"dg", &g.dg},
          {"db", &g.db}, {"dw", &g.dw},  {"dbeta", &g.dbeta}, {"dlambda", &g.dlambda},
          {"dr", &g.dr}, {"dh0", &g.dh0}};
}

template <class S>
double worst_grads(const Grads<S>& x, const Grads<S>& y, std::string* what = nullptr) {
  auto fx = grad_fields(x), fy = grad_fields(y);
  double worst = 0;
  for (size_t i = 0; i < fx.size(); ++i) {
    if (fx[i].second->size() != fy[i].second->size()) {
      if (what) *what = fx[i].first + " (size)";
      return INFINITY;
    }
    const double e = rel_max(*fx[i].second, *fy[i].second);
    if (!(e <= worst)) {
      worst = e;
      if (what) *what = fx[i].first;
    }
  }
  return worst;
}

// A property-regime case (MATH.md §9 distribution) of one variant.
inline fixtures::GenSpec spec_of(Variant v, Arm a, Dims dims, uint64_t seed) {
  fixtures::GenSpec s;
  s.variant = v;
  s.arm = a;
  s.dims = dims;
  s.seed = seed;
  s.with_h0 = true;
  s.scale = 0.3;
  return s;
}

// Tokens [t0, t1) of a fixed-length (not varlen) case; h0 kept.
template <class S>
Inputs<S> slice_time(const Inputs<S>& in, int64_t t0, int64_t t1) {
  Inputs<S> o = in;
  const auto& d = in.dims;
  o.dims.T = t1 - t0;
  auto cut = [&](const std::vector<S>& x, int64_t D) {
    std::vector<S> y;
    if (x.empty()) return y;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t i = 0; i < d.H * D; ++i) y.push_back(x[((b * d.T + t) * d.H) * D + i]);
    return y;
  };
  o.q = cut(in.q, d.K);
  o.k = cut(in.k, d.K);
  o.v = cut(in.v, d.V);
  o.g = cut(in.g, layout_of(in.variant, in.arm).scalar_g ? 1 : d.K);
  o.b = cut(in.b, d.K);
  o.w = cut(in.w, d.V);
  o.beta = cut(in.beta, 1);
  return o;
}

// Rows [t0, t1) of a [B,T,H,D] tensor.
template <class S>
std::vector<S> slice_rows(const std::vector<S>& x, const Dims& d, int64_t D, int64_t t0,
                          int64_t t1) {
  std::vector<S> y;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = 0; i < d.H * D; ++i) y.push_back(x[((b * d.T + t) * d.H) * D + i]);
  return y;
}

}  // namespace qed::chunked_test
