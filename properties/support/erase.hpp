// One erase step in isolation, for the stability facts of MATH.md §8: the reference's own erase
// vector a = b ⊙ k + lambda p for a single token (through LaneView, i.e. the code the recurrence
// runs), the reference's projection P(k) x (arm nogate, b = 0, lambda = 1 makes a = P(k) x), the
// closed-form spectral norm of I - k a^T (§8.3) and the same norm from an SVD in double.
#pragma once

#include <Eigen/Dense>

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/lane.hpp"
#include "reference/types.hpp"

namespace qed::properties {

// a_t of the reference for one token with key k, query q, erase gate b, lambda and r.
template <class S>
std::vector<S> reference_erase(reference::Variant variant, reference::Arm arm, const std::vector<S>& k,
                               const std::vector<S>& q, const std::vector<S>& b, const S& lambda,
                               const std::vector<S>& r) {
  const int64_t K = static_cast<int64_t>(k.size());
  reference::Inputs<S> in;
  in.variant = variant;
  in.arm = arm;
  in.dims = {1, 1, 1, K, 1};
  in.q = q;
  in.k = k;
  in.v = {S(0)};
  in.g.assign(static_cast<size_t>(K), S(0));
  in.b = b;
  in.w = {S(1)};
  if (variant == reference::Variant::qed) in.lambda = {lambda};
  if (arm == reference::Arm::rand) in.r = r;
  reference::LaneView<S> lane(in, reference::Span{0, 0, 1}, 0, 0);
  std::vector<S> a(static_cast<size_t>(K)), p(static_cast<size_t>(K)), m(static_cast<size_t>(K));
  lane.erase_vector(0, a, p, m);
  return a;
}

// P(k) x as the reference computes it.
template <class S>
std::vector<S> reference_projection(const std::vector<S>& k, const std::vector<S>& x) {
  const std::vector<S> zeros(k.size(), S(0));
  return reference_erase<S>(reference::Variant::qed, reference::Arm::nogate, k, x, zeros, S(1), {});
}

template <class S>
S dot(const std::vector<S>& x, const std::vector<S>& y) {
  S acc(0);
  for (size_t i = 0; i < x.size(); ++i) acc += x[i] * y[i];
  return acc;
}

template <class S>
S norm(const std::vector<S>& x) {
  using std::sqrt;
  return sqrt(dot(x, x));
}

// ||I - k a^T||_2 by MATH.md §8.3's closed form: c = k^T a, s = ||k|| ||P(k) a||, eps = |1 - c|.
// Valid for K >= 2 (for K = 1 the matrix is the scalar 1 - c).
inline double closed_form_norm(const std::vector<double>& k, const std::vector<double>& a) {
  const double n2 = dot(k, k);
  const double c = dot(k, a);
  std::vector<double> pa = a;
  for (size_t i = 0; i < a.size(); ++i) pa[i] -= k[i] * dot(k, a) / n2;
  const double s = std::sqrt(n2) * norm(pa);
  const double e = std::abs(1 - c);
  return 0.5 * (std::hypot(1 + e, s) + std::hypot(1 - e, s));
}

inline Eigen::MatrixXd erase_matrix(const std::vector<double>& k, const std::vector<double>& a) {
  const int64_t K = static_cast<int64_t>(k.size());
  Eigen::MatrixXd M = Eigen::MatrixXd::Identity(K, K);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) M(i, j) -= k[i] * a[j];
  return M;
}

inline double svd_norm(const std::vector<double>& k, const std::vector<double>& a) {
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(erase_matrix(k, a));
  return svd.singularValues()(0);
}

}  // namespace qed::properties
