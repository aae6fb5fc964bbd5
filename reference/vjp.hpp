// Token-level pieces of every backward pass (recurrent and chunked), independent of how the
// state adjoint was obtained: the erase-vector VJP of MATH.md §5.2 and the mapping of the general
// channel-wise gate gradients onto a variant's own gates.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/lane.hpp"
#include "reference/types.hpp"

namespace qed::reference {

// Adds the §5.2 contributions of abar (the gradient w.r.t. a_t of token t) to dq, dk, db (the
// channel-form erase gate), dlam, and dr (K values, may be null when r is not trainable).
// p and m are the token's p_t and m_t as returned by LaneView::erase_vector; mbar is scratch.
template <class S>
void erase_vector_vjp(const LaneView<S>& Lv, int64_t t, const S* abar, const S* p, const S* m,
                      S* dq, S* dk, S* db, S& dlam, S* dr, std::vector<S>& mbar) {
  const int64_t K = Lv.K;
  const S* kt = Lv.k(t);
  const S* qt = Lv.q(t);
  for (int64_t c = 0; c < K; ++c) {
    db[c] += abar[c] * kt[c];
    dk[c] += abar[c] * Lv.b(t, c);
  }
  if (!Lv.has_lambda()) return;
  const S lam = Lv.lambda();
  mbar.resize(static_cast<size_t>(K));
  for (int64_t c = 0; c < K; ++c) dlam += abar[c] * p[c];
  if (Lv.projected()) {
    S nn(0), cc(0), ee(0);
    for (int64_t c = 0; c < K; ++c) {
      nn += kt[c] * kt[c];
      cc += kt[c] * m[c];
      ee += kt[c] * abar[c];
    }
    if (nn == S(0)) {
      // P(0) = I by convention: p = m, and no gradient reaches k through the projector.
      for (int64_t c = 0; c < K; ++c) mbar[c] = lam * abar[c];
    } else {
      for (int64_t c = 0; c < K; ++c) {
        mbar[c] = lam * (abar[c] - kt[c] * ee / nn);
        dk[c] -= lam * (cc / nn * abar[c] + ee / nn * m[c] - S(2) * cc * ee / (nn * nn) * kt[c]);
      }
    }
  } else {
    for (int64_t c = 0; c < K; ++c) mbar[c] = lam * abar[c];
  }
  for (int64_t c = 0; c < K; ++c) {
    switch (Lv.in->arm) {
      case Arm::full:
        dq[c] += mbar[c] * Lv.b(t, c);
        db[c] += mbar[c] * qt[c];
        break;
      case Arm::nogate:
      case Arm::nogate_noproj: dq[c] += mbar[c]; break;
      case Arm::rand:
        db[c] += mbar[c] * Lv.in->r[Lv.h * K + c];
        if (dr) dr[c] += mbar[c] * Lv.b(t, c);
        break;
      case Arm::none: break;
    }
  }
}

// Maps the channel-form gradients (dgc [B,T,H,K], dbc [B,T,H,K], dwc [B,T,H,V]) and the
// per-lane dlambda / dr onto the variant's gates, reducing in lane order (deterministic):
// channel g -> dg; scalar g (gdn) -> channel sum; b, w -> db, dw; beta -> sum db + sum dw.
template <class S>
void map_gate_grads(const Inputs<S>& in, const std::vector<LaneView<S>>& lanes,
                    std::vector<S>&& dgc, std::vector<S>&& dbc, std::vector<S>&& dwc,
                    const std::vector<S>& lane_dlambda, const std::vector<std::vector<S>>& lane_dr,
                    Grads<S>& gr) {
  const auto& d = in.dims;
  const Layout lay = layout_of(in.variant, in.arm);
  const int64_t K = d.K, V = d.V, H = d.H;
  const size_t nS = static_cast<size_t>(d.B * d.T * H);
  if (lay.channel_g) gr.dg = std::move(dgc);
  if (lay.scalar_g) {
    gr.dg.assign(nS, S(0));
    for (size_t i = 0; i < nS; ++i)
      for (int64_t c = 0; c < K; ++c) gr.dg[i] += dgc[i * K + c];
  }
  if (lay.has_beta) {
    gr.dbeta.assign(nS, S(0));
    for (size_t i = 0; i < nS; ++i) {
      S acc(0);
      for (int64_t c = 0; c < K; ++c) acc += dbc[i * K + c];
      for (int64_t j = 0; j < V; ++j) acc += dwc[i * V + j];
      gr.dbeta[i] = acc;
    }
  }
  if (lay.has_bw) {
    gr.db = std::move(dbc);
    gr.dw = std::move(dwc);
  }
  if (lay.has_lambda) {
    gr.dlambda.assign(static_cast<size_t>(H), S(0));
    for (size_t li = 0; li < lanes.size(); ++li) gr.dlambda[lanes[li].h] += lane_dlambda[li];
  }
  if (lay.has_r) {
    gr.dr.assign(static_cast<size_t>(H * K), S(0));
    for (size_t li = 0; li < lanes.size(); ++li)
      for (int64_t c = 0; c < K; ++c) gr.dr[lanes[li].h * K + c] += lane_dr[li][c];
  }
}

}  // namespace qed::reference
