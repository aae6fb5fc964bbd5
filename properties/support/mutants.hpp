// Deliberately broken implementations for the mutation checks: a compact copy of the general
// recurrence (MATH.md §3 forward, §5 adjoint) in which one switch plants one plausible bug. With
// Bug::none they compute the right function; each property family is shown to catch one bug.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/types.hpp"

namespace qed::properties::mutants {

using reference::Arm;
using reference::Cotangents;
using reference::Grads;
using reference::Inputs;
using reference::Outputs;
using reference::Variant;

enum class Fwd {
  none,
  erase_q_scaled,        // the erase uses scale*q (MATH.md §1 warns against it)
  decay_after_erase,     // S <- D (I - k a^T) S + k z^T instead of (I - k a^T) D S + ...
  state_leaks,           // sequence n starts from sequence n-1's final state (cross-lane mixing)
  lambda_of_head0,       // every head uses lambda[0] (cross-head mixing)
  reads_next_q,          // o_t read with q_{t+1} (a look-ahead)
  v_normalised,          // writes v / |v|
  erase_q_normalised,    // the erase uses q / |q|
  decay_off_by_one,      // step t decays with g_{t-1}
  decay_channel0,        // every channel decays with channel 0's g
  diagonal_projector,    // P(k) m computed as m - (k ⊙ k ⊙ m) / |k|^2
  rand_unprojected,      // arm rand forgets the projector
  erase_reads_undecayed  // u = z - S^T a from the state before the decay: S <- (D - k a^T) S + k z^T
};

enum class Bwd {
  none,
  drop_2ce_term,         // §5.2: dk loses the +2 lambda c e / n^2 k term
  dq_misses_erase_path,  // dq loses the contribution through m_t
  dw_uses_w,             // dw = w ⊙ zbar instead of v ⊙ zbar
  dg_without_alpha       // dg = alphabar instead of alpha ⊙ alphabar
};

namespace detail {

// One lane's view of a token in the general form (g, b, w per channel; lambda; arm).
template <class S>
struct Token {
  std::vector<S> q, k, v, alpha, b, w, m, p, a;
  S lambda = S(0);
};

struct Lane {
  int64_t row, t0, len, n, h;
};

template <class S>
std::vector<Lane> lanes(const Inputs<S>& in) {
  std::vector<Lane> out;
  const auto spans = in.spans();
  for (size_t n = 0; n < spans.size(); ++n)
    for (int64_t h = 0; h < in.dims.H; ++h)
      out.push_back({spans[n].b, spans[n].t0, spans[n].len, static_cast<int64_t>(n), h});
  return out;
}

inline int64_t row_of(const reference::Dims& d, const Lane& L, int64_t t, int64_t D) {
  return ((L.row * d.T + L.t0 + t) * d.H + L.h) * D;
}

template <class S>
Token<S> token(const Inputs<S>& in, const Lane& L, int64_t t, Fwd bug) {
  using std::exp;
  using std::sqrt;
  const auto& d = in.dims;
  const int64_t K = d.K, V = d.V;
  Token<S> x;
  auto rowK = [&](const std::vector<S>& src, int64_t tt) {
    return std::vector<S>(src.begin() + row_of(d, L, tt, K), src.begin() + row_of(d, L, tt, K) + K);
  };
  x.q = rowK(in.q, t);
  x.k = rowK(in.k, t);
  x.v.assign(in.v.begin() + row_of(d, L, t, V), in.v.begin() + row_of(d, L, t, V) + V);
  const int64_t tg = bug == Fwd::decay_off_by_one ? t - 1 : t;
  x.alpha.assign(static_cast<size_t>(K), S(1));
  for (int64_t c = 0; c < K && tg >= 0; ++c) {
    const int64_t cc = bug == Fwd::decay_channel0 ? 0 : c;
    switch (in.variant) {
      case Variant::gdn2:
      case Variant::qed:
      case Variant::kda: x.alpha[c] = exp(in.g[row_of(d, L, tg, K) + cc]); break;
      case Variant::gdn: x.alpha[c] = exp(in.g[row_of(d, L, tg, 1)]); break;
      case Variant::deltanet: break;
    }
  }
  if (in.variant == Variant::gdn2 || in.variant == Variant::qed) {
    x.b = rowK(in.b, t);
    x.w.assign(in.w.begin() + row_of(d, L, t, V), in.w.begin() + row_of(d, L, t, V) + V);
  } else {
    x.b.assign(static_cast<size_t>(K), in.beta[row_of(d, L, t, 1)]);
    x.w.assign(static_cast<size_t>(V), in.beta[row_of(d, L, t, 1)]);
  }
  if (bug == Fwd::v_normalised) {
    S n(0);
    for (auto& e : x.v) n += e * e;
    n = sqrt(n);
    if (n != S(0))
      for (auto& e : x.v) e /= n;
  }
  x.m.assign(static_cast<size_t>(K), S(0));
  x.p.assign(static_cast<size_t>(K), S(0));
  x.a.assign(static_cast<size_t>(K), S(0));
  for (int64_t c = 0; c < K; ++c) x.a[c] = x.b[c] * x.k[c];
  if (in.variant != Variant::qed) return x;
  x.lambda = in.lambda[bug == Fwd::lambda_of_head0 ? 0 : L.h];
  std::vector<S> qe = x.q;
  if (bug == Fwd::erase_q_scaled)
    for (auto& e : qe) e *= in.scale;
  if (bug == Fwd::erase_q_normalised) {
    S n(0);
    for (auto& e : qe) n += e * e;
    n = sqrt(n);
    for (auto& e : qe) e /= n;
  }
  for (int64_t c = 0; c < K; ++c) {
    switch (in.arm) {
      case Arm::full: x.m[c] = x.b[c] * qe[c]; break;
      case Arm::nogate:
      case Arm::nogate_noproj: x.m[c] = qe[c]; break;
      case Arm::rand: x.m[c] = x.b[c] * in.r[L.h * K + c]; break;
      case Arm::none: break;
    }
  }
  x.p = x.m;
  const bool project = in.arm == Arm::full || in.arm == Arm::nogate ||
                       (in.arm == Arm::rand && bug != Fwd::rand_unprojected);
  S nn(0), km(0);
  for (int64_t c = 0; c < K; ++c) {
    nn += x.k[c] * x.k[c];
    km += x.k[c] * x.m[c];
  }
  if (project && nn != S(0))
    for (int64_t c = 0; c < K; ++c)
      x.p[c] -= bug == Fwd::diagonal_projector ? S(x.k[c] * x.k[c] * x.m[c] / nn) : S(x.k[c] * km / nn);
  for (int64_t c = 0; c < K; ++c) x.a[c] += x.lambda * x.p[c];
  return x;
}

// S <- (I - k a^T) D S + k z^T (or the decay_after_erase mutant); returns u.
template <class S>
std::vector<S> step(const Token<S>& x, std::vector<S>& St, int64_t K, int64_t V, Fwd bug) {
  std::vector<S> u(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) u[j] = x.w[j] * x.v[j];
  const bool after = bug == Fwd::decay_after_erase;
  const bool undecayed = bug == Fwd::erase_reads_undecayed;
  for (int64_t c = 0; c < K; ++c)
    for (int64_t j = 0; j < V; ++j) {
      if (undecayed) u[j] -= St[c * V + j] * x.a[c];
      if (!after) St[c * V + j] *= x.alpha[c];
      if (!undecayed) u[j] -= St[c * V + j] * x.a[c];
    }
  for (int64_t c = 0; c < K; ++c)
    for (int64_t j = 0; j < V; ++j) {
      St[c * V + j] += x.k[c] * u[j];
      if (after) St[c * V + j] *= x.alpha[c];
    }
  return u;
}

template <class S>
std::vector<S> initial(const Inputs<S>& in, const Lane& L) {
  const int64_t KV = in.dims.K * in.dims.V;
  if (in.h0.empty()) return std::vector<S>(static_cast<size_t>(KV), S(0));
  return std::vector<S>(in.h0.begin() + (L.n * in.dims.H + L.h) * KV,
                        in.h0.begin() + (L.n * in.dims.H + L.h + 1) * KV);
}

}  // namespace detail

template <class S>
Outputs<S> forward(const Inputs<S>& in, Fwd bug) {
  const auto& d = in.dims;
  const int64_t K = d.K, V = d.V;
  Outputs<S> out;
  out.o.assign(static_cast<size_t>(d.B * d.T * d.H * V), S(0));
  out.ht.assign(static_cast<size_t>(in.num_sequences() * d.H * K * V), S(0));
  const auto lanes = detail::lanes(in);
  for (const auto& L : lanes) {
    std::vector<S> St = detail::initial(in, L);
    if (bug == Fwd::state_leaks && L.n > 0)
      St.assign(out.ht.begin() + ((L.n - 1) * d.H + L.h) * K * V, out.ht.begin() + ((L.n - 1) * d.H + L.h + 1) * K * V);
    for (int64_t t = 0; t < L.len; ++t) {
      const auto x = detail::token(in, L, t, bug);
      detail::step(x, St, K, V, bug);
      const bool ahead = bug == Fwd::reads_next_q && t + 1 < L.len;
      const auto q = ahead ? detail::token(in, L, t + 1, bug).q : x.q;
      for (int64_t j = 0; j < V; ++j) {
        S acc(0);
        for (int64_t c = 0; c < K; ++c) acc += q[c] * St[c * V + j];
        out.o[detail::row_of(d, L, t, V) + j] = in.scale * acc;
      }
    }
    std::copy(St.begin(), St.end(), out.ht.begin() + (L.n * d.H + L.h) * K * V);
  }
  return out;
}

}  // namespace qed::properties::mutants

#include "properties/support/mutants_backward.hpp"
