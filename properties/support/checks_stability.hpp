// Checks of MATH.md §8's stability facts, in the `residual = check(impl, inputs)` shape: the
// projector identities (§8.1) for any projection function, evaluated exactly (the residual
// arithmetic runs in mpfr well above S's precision, so only the projection's own rounding
// counts), and the eigenvalue fact of §8.2 for an erase-vector function.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "properties/support/erase.hpp"
#include "properties/support/numerics.hpp"
#include "reference/oracle.hpp"

namespace qed::properties {

// Exactly converted copies in mpfr at the current default precision.
template <class S>
std::vector<mpfr_float> exact(const std::vector<S>& x) {
  return reference::to_mpfr_vec(x);
}

inline double hp_norm(const std::vector<mpfr_float>& x) { return to_d(sqrt(dot(x, x))); }

struct ProjectorResidual {
  double orth = 0;  // |k^T P x| / (|k| |x|)
  double idem = 0;  // |P(P x) - P x| / |x|
  double pk = 0;    // |P k| / |k|
  double sym = 0;   // |y^T P x - x^T P y| / (|x| |y|)
  double max() const { return std::max({orth, idem, pk, sym}); }
};

// `proj(k, x)` computes P(k) x in S. `work_bits` is the mpfr precision of the residual arithmetic.
template <class S, class Proj>
ProjectorResidual check_projector(Proj&& proj, const std::vector<S>& k, const std::vector<S>& x,
                                  const std::vector<S>& y, int s_bits, int work_bits) {
  if constexpr (std::is_same_v<S, mpfr_float>) reference::set_mpfr_bits(s_bits);
  const std::vector<S> px = proj(k, x), py = proj(k, y), ppx = proj(k, px), pk = proj(k, k);
  reference::set_mpfr_bits(work_bits);
  const auto K = exact(k), X = exact(x), Y = exact(y), PX = exact(px), PY = exact(py), PPX = exact(ppx),
             PK = exact(pk);
  ProjectorResidual r;
  const double nk = hp_norm(K), nx = hp_norm(X), ny = hp_norm(Y);
  r.orth = abs_d(dot(K, PX)) / (nk * nx);
  std::vector<mpfr_float> diff(PX.size());
  for (size_t i = 0; i < PX.size(); ++i) diff[i] = PPX[i] - PX[i];
  r.idem = hp_norm(diff) / nx;
  r.pk = hp_norm(PK) / nk;
  r.sym = abs_d(dot(Y, PX) - dot(X, PY)) / (nx * ny);
  if constexpr (std::is_same_v<S, mpfr_float>) reference::set_mpfr_bits(s_bits);
  return r;
}

// §8.2 for projected arms: k^T a = sum_i b_i k_i^2 for unit k. Residual |k^T a - sum b k^2| with
// k^T a evaluated exactly from the erase function's a.
template <class S, class Erase>
double check_eigen_fact(Erase&& erase, const std::vector<S>& k, const std::vector<S>& q, const std::vector<S>& b,
                        const S& lambda, const std::vector<S>& r, int s_bits, int work_bits) {
  if constexpr (std::is_same_v<S, mpfr_float>) reference::set_mpfr_bits(s_bits);
  const std::vector<S> a = erase(k, q, b, lambda, r);
  reference::set_mpfr_bits(work_bits);
  const auto K = exact(k), A = exact(a), B = exact(b);
  mpfr_float sbk(0);
  for (size_t i = 0; i < K.size(); ++i) sbk += B[i] * K[i] * K[i];
  const double res = abs_d(dot(K, A) - sbk);
  if constexpr (std::is_same_v<S, mpfr_float>) reference::set_mpfr_bits(s_bits);
  return res;
}

}  // namespace qed::properties
