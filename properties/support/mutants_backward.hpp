// The adjoint half of mutants.hpp: the recurrent backward of MATH.md §5 written once more, states
// stored (no checkpointing), with a switch that plants one bug in the adjoint; and the small
// stand-alone mutants of the stability checks (projector, norm formula). Included by mutants.hpp.
#pragma once

#include "properties/support/mutants.hpp"

namespace qed::properties::mutants {

template <class S>
Grads<S> backward(const Inputs<S>& in, const Cotangents<S>& cot, Bwd bug) {
  const auto& d = in.dims;
  const int64_t K = d.K, V = d.V, H = d.H;
  const auto lay = reference::layout_of(in.variant, in.arm);
  const size_t nK = static_cast<size_t>(d.B * d.T * H * K), nV = static_cast<size_t>(d.B * d.T * H * V);
  const size_t nS = static_cast<size_t>(d.B * d.T * H);
  Grads<S> gr;
  gr.dq.assign(nK, S(0));
  gr.dk.assign(nK, S(0));
  gr.dv.assign(nV, S(0));
  gr.dh0.assign(static_cast<size_t>(in.num_sequences() * H * K * V), S(0));
  std::vector<S> dg(nK, S(0)), db(nK, S(0)), dw(nV, S(0)), dlam(static_cast<size_t>(H), S(0)),
      dr(static_cast<size_t>(H * K), S(0));
  const bool projected = in.variant == Variant::qed && in.arm != Arm::nogate_noproj;
  for (const auto& L : detail::lanes(in)) {
    std::vector<std::vector<S>> states{detail::initial(in, L)};
    std::vector<detail::Token<S>> toks;
    for (int64_t t = 0; t < L.len; ++t) {
      toks.push_back(detail::token(in, L, t, Fwd::none));
      std::vector<S> St = states.back();
      detail::step(toks.back(), St, K, V, Fwd::none);
      states.push_back(std::move(St));
    }
    std::vector<S> Sh(static_cast<size_t>(K * V), S(0));
    if (!cot.dht.empty())
      for (int64_t i = 0; i < K * V; ++i) Sh[i] = cot.dht[(L.n * H + L.h) * K * V + i];
    for (int64_t t = L.len - 1; t >= 0; --t) {
      const auto& x = toks[t];
      const auto& Sp = states[t];
      const auto& Sc = states[t + 1];
      const int64_t rk = detail::row_of(d, L, t, K), rv = detail::row_of(d, L, t, V);
      const S* dot = cot.do_.data() + rv;
      for (int64_t c = 0; c < K; ++c)
        for (int64_t j = 0; j < V; ++j) {
          Sh[c * V + j] += in.scale * x.q[c] * dot[j];
          gr.dq[rk + c] += in.scale * Sc[c * V + j] * dot[j];
        }
      std::vector<S> u(static_cast<size_t>(V)), ubar(static_cast<size_t>(V), S(0)), abar(static_cast<size_t>(K));
      for (int64_t j = 0; j < V; ++j) u[j] = x.w[j] * x.v[j];
      for (int64_t c = 0; c < K; ++c)
        for (int64_t j = 0; j < V; ++j) u[j] -= x.alpha[c] * Sp[c * V + j] * x.a[c];
      for (int64_t c = 0; c < K; ++c)
        for (int64_t j = 0; j < V; ++j) {
          ubar[j] += Sh[c * V + j] * x.k[c];
          gr.dk[rk + c] += Sh[c * V + j] * u[j];
        }
      for (int64_t j = 0; j < V; ++j) {
        gr.dv[rv + j] = x.w[j] * ubar[j];
        dw[rv + j] = (bug == Bwd::dw_uses_w ? x.w[j] : x.v[j]) * ubar[j];
      }
      for (int64_t c = 0; c < K; ++c) {
        S pu(0), albar(0);
        for (int64_t j = 0; j < V; ++j) {
          pu += x.alpha[c] * Sp[c * V + j] * ubar[j];
          Sh[c * V + j] -= x.a[c] * ubar[j];
          albar += Sh[c * V + j] * Sp[c * V + j];
          Sh[c * V + j] *= x.alpha[c];
        }
        abar[c] = -pu;
        dg[rk + c] = bug == Bwd::dg_without_alpha ? albar : x.alpha[c] * albar;
      }
      for (int64_t c = 0; c < K; ++c) {
        db[rk + c] += abar[c] * x.k[c];
        gr.dk[rk + c] += abar[c] * x.b[c];
      }
      if (in.variant != Variant::qed) continue;
      const S lam = x.lambda;
      std::vector<S> mbar(static_cast<size_t>(K));
      for (int64_t c = 0; c < K; ++c) dlam[L.h] += abar[c] * x.p[c];
      S nn(0), cc(0), ee(0);
      for (int64_t c = 0; c < K; ++c) {
        nn += x.k[c] * x.k[c];
        cc += x.k[c] * x.m[c];
        ee += x.k[c] * abar[c];
      }
      if (projected && nn != S(0)) {
        for (int64_t c = 0; c < K; ++c) {
          mbar[c] = lam * (abar[c] - x.k[c] * ee / nn);
          S term = cc / nn * abar[c] + ee / nn * x.m[c];
          if (bug != Bwd::drop_2ce_term) term -= S(2) * cc * ee / (nn * nn) * x.k[c];
          gr.dk[rk + c] -= lam * term;
        }
      } else {
        for (int64_t c = 0; c < K; ++c) mbar[c] = lam * abar[c];
      }
      const bool to_q = bug != Bwd::dq_misses_erase_path;
      for (int64_t c = 0; c < K; ++c) {
        switch (in.arm) {
          case Arm::full:
            if (to_q) gr.dq[rk + c] += mbar[c] * x.b[c];
            db[rk + c] += mbar[c] * x.q[c];
            break;
          case Arm::nogate:
          case Arm::nogate_noproj:
            if (to_q) gr.dq[rk + c] += mbar[c];
            break;
          case Arm::rand:
            db[rk + c] += mbar[c] * in.r[L.h * K + c];
            dr[L.h * K + c] += mbar[c] * x.b[c];
            break;
          case Arm::none: break;
        }
      }
    }
    for (int64_t i = 0; i < K * V; ++i) gr.dh0[(L.n * H + L.h) * K * V + i] = Sh[i];
  }
  if (lay.channel_g) gr.dg = dg;
  if (lay.scalar_g) {
    gr.dg.assign(nS, S(0));
    for (size_t i = 0; i < nS; ++i)
      for (int64_t c = 0; c < K; ++c) gr.dg[i] += dg[i * K + c];
  }
  if (lay.has_bw) {
    gr.db = db;
    gr.dw = dw;
  }
  if (lay.has_beta) {
    gr.dbeta.assign(nS, S(0));
    for (size_t i = 0; i < nS; ++i) {
      for (int64_t c = 0; c < K; ++c) gr.dbeta[i] += db[i * K + c];
      for (int64_t j = 0; j < V; ++j) gr.dbeta[i] += dw[i * V + j];
    }
  }
  if (lay.has_lambda) gr.dlambda = dlam;
  if (lay.has_r) gr.dr = dr;
  return gr;
}

}  // namespace qed::properties::mutants

namespace qed::properties::mutants {

// The projector family's mutant: P(k) x taken as x - (k ⊙ k ⊙ x) / |k|^2 (a "diagonal" projector
// that forgets the cross terms k_i k_j x_j).
template <class S>
std::vector<S> diagonal_projection(const std::vector<S>& k, const std::vector<S>& x) {
  S n(0);
  for (const auto& e : k) n += e * e;
  std::vector<S> p = x;
  if (n != S(0))
    for (size_t i = 0; i < x.size(); ++i) p[i] -= k[i] * k[i] * x[i] / n;
  return p;
}

}  // namespace qed::properties::mutants

namespace qed::properties::mutants {

// The §8.3 closed form with s = ||P(k) a|| instead of ||k|| ||P(k) a|| (right for unit keys only).
inline double closed_form_norm_without_key_norm(const std::vector<double>& k, const std::vector<double>& a) {
  double n2 = 0, c = 0;
  for (size_t i = 0; i < k.size(); ++i) {
    n2 += k[i] * k[i];
    c += k[i] * a[i];
  }
  double s2 = 0;
  for (size_t i = 0; i < k.size(); ++i) s2 += (a[i] - k[i] * c / n2) * (a[i] - k[i] * c / n2);
  const double s = std::sqrt(s2), e = std::abs(1 - c);
  return 0.5 * (std::hypot(1 + e, s) + std::hypot(1 - e, s));
}

}  // namespace qed::properties::mutants
