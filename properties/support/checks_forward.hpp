// Forward properties of MATH.md §9 as functions `residual = check_Px(impl, inputs, ...)`: impl is
// any callable Inputs<S> -> Outputs<S> (the reference, the literal oracle, a mutant), so the same
// check runs on real and deliberately broken implementations. Residuals: bitwise ones are 0 or
// the max abs difference; the others are relative to the max magnitude of the expected result.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fixtures/generate.hpp"
#include "properties/support/numerics.hpp"
#include "properties/support/transforms.hpp"
#include "reference/literal.hpp"
#include "reference/types.hpp"

namespace qed::properties {

template <class S>
S from_d(double x) {
  return S(x);
}

// P1: the run on the first Tp tokens reproduces o[0, Tp) of the full run (bitwise).
template <class S, class F>
double check_P1_causality(F&& impl, const Inputs<S>& in, int64_t Tp) {
  const auto full = impl(in);
  const auto part = impl(prefix(in, Tp));
  return bitwise_residual(part.o, slice_tokens(full.o, in.dims, in.dims.V, 0, Tp));
}

// P2: run [0, tau), pass ht on as h0 of [tau, T): outputs and final state equal the single run.
template <class S, class F>
double check_P2_split(F&& impl, const Inputs<S>& in, int64_t tau) {
  const auto full = impl(in);
  const auto r1 = impl(token_range(in, 0, tau));
  auto second = token_range(in, tau, in.dims.T);
  second.h0 = r1.ht;
  const auto r2 = impl(second);
  return std::max({bitwise_residual(r1.o, slice_tokens(full.o, in.dims, in.dims.V, 0, tau)),
                   bitwise_residual(r2.o, slice_tokens(full.o, in.dims, in.dims.V, tau, in.dims.T)),
                   bitwise_residual(r2.ht, full.ht)});
}

// P2 across sequence boundaries: a packed (or batched) case equals its sequences run alone.
template <class S, class F>
double check_P2_sequences(F&& impl, const Inputs<S>& in) {
  const auto full = impl(in);
  double r = 0;
  for (int64_t n = 0; n < in.num_sequences(); ++n) {
    const auto one = impl(sequence(in, n));
    r = std::max({r, bitwise_residual(one.o, sequence_o(in, full.o, n)),
                  bitwise_residual(one.ht, sequence_state(in, full.ht, n))});
  }
  return r;
}

// The floor under the scale that P3, P7, P8, P9 (c) and P10 measure o against. Each o_t is a sum over the K
// key channels of state entries times query entries, so its rounding is proportional to
// |S_t|^T |q_t|, not to |o_t|: when q_t is nearly orthogonal to the state's rows, o_t is small
// and a combined, relabelled or rotated run legitimately differs from it by a few ulps of the
// terms. (A one-step K = 2 case with |q . k| about 0.03 gave 4e-13 relative to max|o| in P8,
// 1.9e-16 relative to this floor.) The floor is max|S| over the initial and final states times
// the largest l1 norm of a scaled query; a broken invariance moves o by O(1) of it, so mutants
// are still caught.
template <class S>
double query_state_floor(const Inputs<S>& in, const std::vector<S>& ht) {
  const int64_t K = in.dims.K;
  using std::abs;
  S qmax(0);
  for (size_t i = 0; i * K < in.q.size(); ++i) {
    S l1(0);
    for (int64_t c = 0; c < K; ++c) l1 += abs(in.q[i * K + c]);
    qmax = std::max<S>(qmax, l1);
  }
  const S smax = std::max<S>(max_abs(ht), in.h0.empty() ? S(0) : max_abs(in.h0));
  return std::max(to_d(smax * qmax * abs(in.scale)), 1e-300);
}

// The floor under the scale that P9 (c) and P10 measure ht against: the largest write term |k_t| |z_t| of
// any step (z = w v, or beta v), or |h0|. A state that ends small because a step's erase cancels
// most of what it held (raw keys with b |k|^2 near 1, K = 1: 1 - b k^2 is itself a cancelling
// difference) is rounded at the scale of those terms, so two correct evaluation orders (the
// recurrence and the literal formula) differ by ulps of the terms, not of ht: 3.3e-14 relative
// to |ht| was seen at T = 5, K = V = 1. An algebra error moves ht by O(1) of the terms.
template <class S>
double write_term_floor(const Inputs<S>& in) {
  using std::abs;
  const int64_t K = in.dims.K, V = in.dims.V;
  S m = in.h0.empty() ? S(0) : max_abs(in.h0);
  for (size_t i = 0; i * K < in.k.size(); ++i) {
    S kmax(0), zmax(0);
    for (int64_t c = 0; c < K; ++c) kmax = std::max<S>(kmax, abs(in.k[i * K + c]));
    for (int64_t j = 0; j < V; ++j) {
      const S gate = !in.w.empty() ? abs(in.w[i * V + j]) : (!in.beta.empty() ? abs(in.beta[i]) : S(1));
      zmax = std::max<S>(zmax, gate * abs(in.v[i * V + j]));
    }
    m = std::max<S>(m, kmax * zmax);
  }
  return std::max(to_d(m), 1e-300);
}

// The residual of P9 (c) and P10, two evaluations of the same map on `in`: o against the
// query-times-state floor, ht against the write-term floor, each alongside max|value| as usual.
template <class S, class R>
double floored_residual(const Inputs<S>& in, const R& got, const R& want) {
  return std::max(rel_max(got.o, want.o, query_state_floor(in, want.ht)),
                  rel_max(got.ht, want.ht, write_term_floor(in)));
}

// max_i |x_i - (ca y_i + cb z_i)| / max(max_i (|ca y_i| + |cb z_i|), floor)
template <class S>
double rel_combo(const std::vector<S>& x, const std::vector<S>& y, const std::vector<S>& z, const S& ca,
                 const S& cb, double floor = 1e-300) {
  using std::abs;
  if (x.size() != y.size() || x.size() != z.size()) return std::numeric_limits<double>::infinity();
  std::vector<S> comb(x.size()), mag(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    comb[i] = ca * y[i] + cb * z[i];
    mag[i] = abs(ca * y[i]) + abs(cb * z[i]);
  }
  return max_abs_diff(x, comb) / std::max(to_d(max_abs(mag)), floor);
}

// P3: (o, ht) is jointly linear in (v, h0). A second (v, h0) is drawn from `seed`.
template <class S, class F>
double check_P3_linearity(F&& impl, const Inputs<S>& in, uint64_t seed, double ca_d, double cb_d) {
  fixtures::Rng rng(seed);
  Inputs<S> in2 = in;
  for (auto& e : in2.v) e = S(rng.normal());
  if (!in.h0.empty())
    for (auto& e : in2.h0) e = S(rng.normal());
  const S ca(ca_d), cb(cb_d);
  Inputs<S> in3 = in;
  for (size_t i = 0; i < in.v.size(); ++i) in3.v[i] = ca * in.v[i] + cb * in2.v[i];
  for (size_t i = 0; i < in.h0.size(); ++i) in3.h0[i] = ca * in.h0[i] + cb * in2.h0[i];
  const auto r1 = impl(in), r2 = impl(in2), r3 = impl(in3);
  using std::abs;
  const double floor = std::max({to_d(abs(ca)) * query_state_floor(in, r1.ht),
                                 to_d(abs(cb)) * query_state_floor(in2, r2.ht), query_state_floor(in3, r3.ht)});
  return std::max(rel_combo(r3.o, r1.o, r2.o, ca, cb, floor), rel_combo(r3.ht, r1.ht, r2.ht, ca, cb));
}

inline bool q_in_erase(Variant v, Arm a) {
  return v == Variant::qed && (a == Arm::full || a == Arm::nogate || a == Arm::nogate_noproj);
}

// P4: q enters the erase only as lambda q: o(cq; lam) = c o(q; c lam), ht(cq; lam) = ht(q; c lam);
// where it does not enter the erase (gdn2, rand, kda, gdn, deltanet): o(cq) = c o(q), ht unchanged.
template <class S, class F>
double check_P4_homogeneity(F&& impl, const Inputs<S>& in, double c_d) {
  const S c(c_d);
  Inputs<S> scaled_q = in, scaled_lam = in;
  for (auto& e : scaled_q.q) e *= c;
  if (q_in_erase(in.variant, in.arm))
    for (auto& e : scaled_lam.lambda) e *= c;
  const auto rq = impl(scaled_q), rl = impl(scaled_lam);
  std::vector<S> co = rl.o;
  for (auto& e : co) e *= c;
  return std::max(rel_max(rq.o, co), rel_max(rq.ht, rl.ht));
}

// P6: identity steps (k = 0, g = 0, z = 0) inserted anywhere leave o elsewhere and ht unchanged.
template <class S, class F>
double check_P6_padding(F&& impl, const Inputs<S>& in, const std::vector<int64_t>& pads, uint64_t seed) {
  std::vector<int64_t> pos;
  const auto padded = insert_identity_steps(in, pads, pos, seed);
  const auto r = impl(in), rp = impl(padded);
  return std::max(rel_max(gather_tokens(rp.o, in.dims, padded.dims.T, pos), r.o), rel_max(rp.ht, r.ht));
}

// P7: relabelling key and value channels relabels o and ht accordingly.
template <class S, class F>
double check_P7_permutation(F&& impl, const Inputs<S>& in, const std::vector<int64_t>& pK,
                            const std::vector<int64_t>& pV) {
  const auto r = impl(in), rp = impl(permute_channels(in, pK, pV));
  return std::max(rel_max(rp.o, permute_values(r.o, in.dims.V, pV), query_state_floor(in, r.ht)),
                  rel_max(rp.ht, permute_states(r.ht, in.dims, pK, pV)));
}

// Makes b_t and g_t constant over channels (channel 0's value), the premise of P8.
template <class S>
Inputs<S> scalar_gates(Inputs<S> in) {
  const int64_t K = in.dims.K;
  const auto lay = reference::layout_of(in.variant, in.arm);
  for (size_t i = 0; i * K < in.b.size(); ++i)
    for (int64_t c = 1; c < K; ++c) in.b[i * K + c] = in.b[i * K];
  if (lay.channel_g)
    for (size_t i = 0; i * K < in.g.size(); ++i)
      for (int64_t c = 1; c < K; ++c) in.g[i * K + c] = in.g[i * K];
  return in;
}

// P8: with scalar gates, q, k, r -> Rq, Rk, Rr and h0 -> R h0 give the same o and ht -> R ht.
template <class S, class F>
double check_P8_rotation(F&& impl, const Inputs<S>& in0, const std::vector<S>& R) {
  const Inputs<S> in = scalar_gates(in0);
  const int64_t K = in.dims.K, V = in.dims.V;
  Inputs<S> rot = in;
  rot.q = rotate_rows(in.q, K, R);
  rot.k = rotate_rows(in.k, K, R);
  if (!in.r.empty()) rot.r = rotate_rows(in.r, K, R);
  if (!in.h0.empty()) rot.h0 = rotate_states(in.h0, K, V, R);
  const auto r = impl(in), rr = impl(rot);
  return std::max(rel_max(rr.o, r.o, query_state_floor(in, r.ht)), rel_max(rr.ht, rotate_states(r.ht, K, V, R)));
}

// gdn2 or qed inputs recast as the qed variant with `arm` (r drawn from `seed` when needed).
template <class S>
Inputs<S> as_arm(Inputs<S> in, Arm arm, uint64_t seed) {
  const int64_t H = in.dims.H, K = in.dims.K;
  if (in.variant != Variant::qed) in.lambda.assign(static_cast<size_t>(H), S(0.7));
  in.variant = Variant::qed;
  in.arm = arm;
  if (arm == Arm::rand && in.r.empty()) {
    fixtures::Rng rng(seed);
    for (int64_t h = 0; h < H; ++h) {
      std::vector<S> x(static_cast<size_t>(K));
      S n(0);
      for (auto& e : x) {
        e = S(rng.normal());
        n += e * e;
      }
      using std::sqrt;
      n = sqrt(n);
      for (auto& e : x) in.r.push_back(e / n);
    }
  }
  if (arm != Arm::rand) in.r.clear();
  return in;
}

template <class S>
Inputs<S> as_gdn2(Inputs<S> in) {
  in.variant = Variant::gdn2;
  in.arm = Arm::none;
  in.lambda.clear();
  in.r.clear();
  return in;
}

// P9 (a): lambda = 0 makes every arm equal gdn2, bitwise.
template <class S, class F>
double check_P9_lambda0(F&& impl, const Inputs<S>& in, uint64_t seed) {
  const auto g = impl(as_gdn2(in));
  double r = 0;
  for (Arm a : {Arm::full, Arm::nogate, Arm::nogate_noproj, Arm::rand}) {
    Inputs<S> x = as_arm(in, a, seed);
    for (auto& l : x.lambda) l = S(0);
    const auto o = impl(x);
    r = std::max({r, bitwise_residual(o.o, g.o), bitwise_residual(o.ht, g.ht)});
  }
  return r;
}

// P9 (b): b = 1 makes full equal nogate.
template <class S, class F>
double check_P9_b_one(F&& impl, const Inputs<S>& in, uint64_t seed) {
  Inputs<S> x = as_arm(in, Arm::full, seed);
  for (auto& e : x.b) e = S(1);
  const auto f = impl(x), n = impl(as_arm(x, Arm::nogate, seed));
  return std::max(rel_max(f.o, n.o), rel_max(f.ht, n.ht));
}

// P9 (c): q_t orthogonal to k_t makes nogate equal nogate_noproj.
template <class S, class F>
double check_P9_q_perp_k(F&& impl, const Inputs<S>& in, uint64_t seed) {
  Inputs<S> x = as_arm(in, Arm::nogate, seed);
  const int64_t K = x.dims.K;
  for (size_t t = 0; t * K < x.q.size(); ++t) {
    S kk(0), kq(0);
    for (int64_t c = 0; c < K; ++c) {
      kk += x.k[t * K + c] * x.k[t * K + c];
      kq += x.k[t * K + c] * x.q[t * K + c];
    }
    if (kk != S(0))
      for (int64_t c = 0; c < K; ++c) x.q[t * K + c] -= kq / kk * x.k[t * K + c];
  }
  const auto n = impl(x), np = impl(as_arm(x, Arm::nogate_noproj, seed));
  // q is orthogonal to k only to rounding, so nogate's projection is a few ulps, not 0: o and ht
  // are measured against the floors of P10 (cancelling outputs and states seen at 5.5e-14 of
  // max|value| with random seeds).
  return floored_residual(x, n, np);
}

// P9 (d): q_t = r (every t) makes full equal rand.
template <class S, class F>
double check_P9_q_is_r(F&& impl, const Inputs<S>& in, uint64_t seed) {
  Inputs<S> x = as_arm(in, Arm::rand, seed);
  const int64_t K = x.dims.K, H = x.dims.H;
  for (size_t bt = 0; bt * H * K < x.q.size(); ++bt)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < K; ++c) x.q[(bt * H + h) * K + c] = x.r[h * K + c];
  Inputs<S> f = x;
  f.arm = Arm::full;
  const auto rr = impl(x), rf = impl(f);
  return std::max(rel_max(rf.o, rr.o), rel_max(rf.ht, rr.ht));
}

// The gdn2 case that a kda / gdn / deltanet case reduces to: b = w = beta broadcast, g broadcast
// over channels (gdn) or zero (deltanet).
template <class S>
Inputs<S> tied_gdn2(const Inputs<S>& in) {
  const auto& d = in.dims;
  Inputs<S> x = in;
  x.variant = Variant::gdn2;
  x.arm = Arm::none;
  x.beta.clear();
  const size_t BTH = static_cast<size_t>(d.B * d.T * d.H);
  x.b.resize(BTH * d.K);
  x.w.resize(BTH * d.V);
  x.g.assign(BTH * d.K, S(0));
  for (size_t i = 0; i < BTH; ++i) {
    for (int64_t c = 0; c < d.K; ++c) {
      x.b[i * d.K + c] = in.beta[i];
      if (in.variant == Variant::kda) x.g[i * d.K + c] = in.g[i * d.K + c];
      if (in.variant == Variant::gdn) x.g[i * d.K + c] = in.g[i];
    }
    for (int64_t j = 0; j < d.V; ++j) x.w[i * d.V + j] = in.beta[i];
  }
  return x;
}

// P10 (a): gdn2 with tied gates against the literal KDA / GDN / DeltaNet rule of `in`'s variant.
template <class S, class F>
double check_P10_tied(F&& impl, const Inputs<S>& in) {
  const auto lit = reference::literal::forward(in);
  const auto r = impl(tied_gdn2(in));
  return floored_residual(in, r, lit);
}

// P10 (b): the implementation against the literal rule of the same variant (matrix oracle for
// gdn2 and qed).
template <class S, class F>
double check_P10_literal(F&& impl, const Inputs<S>& in) {
  const auto lit = reference::literal::forward(in);
  const auto r = impl(in);
  return floored_residual(in, r, lit);
}

}  // namespace qed::properties
