// The recurrent reference (MATH.md §3 forward, §5 adjoint) for every variant and QED arm,
// generic over the scalar type. Lanes run in parallel; every reduction over lanes is done
// afterwards in lane order, so results are identical for any thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/lane.hpp"
#include "reference/parallel.hpp"
#include "reference/types.hpp"
#include "reference/vjp.hpp"

namespace qed::reference {

namespace detail {

// One forward step on state S (K x V, row-major): S <- D S + k u^T with u = z - (D S)^T a.
// Writes u (pseudo-value) and leaves S as S_t.
template <class S>
void step_forward(const LaneView<S>& L, int64_t t, std::vector<S>& St, std::vector<S>& a,
                  std::vector<S>& p, std::vector<S>& m, std::vector<S>& alpha, std::vector<S>& u) {
  using std::exp;
  const int64_t K = L.K, V = L.V;
  L.erase_vector(t, a, p, m);
  const S* kt = L.k(t);
  const S* vt = L.v(t);
  for (int64_t c = 0; c < K; ++c) alpha[c] = exp(L.g(t, c));
  for (int64_t j = 0; j < V; ++j) u[j] = L.w(t, j) * vt[j];
  for (int64_t c = 0; c < K; ++c) {
    S* row = St.data() + c * V;
    const S al = alpha[c];
    const S ac = a[c];
    for (int64_t j = 0; j < V; ++j) {
      row[j] *= al;
      u[j] -= row[j] * ac;
    }
  }
  for (int64_t c = 0; c < K; ++c) {
    S* row = St.data() + c * V;
    const S kc = kt[c];
    for (int64_t j = 0; j < V; ++j) row[j] += kc * u[j];
  }
}

template <class S>
void read_out(const LaneView<S>& L, int64_t t, const std::vector<S>& St, S* o) {
  const int64_t K = L.K, V = L.V;
  const S* qt = L.q(t);
  for (int64_t j = 0; j < V; ++j) o[j] = S(0);
  for (int64_t c = 0; c < K; ++c) {
    const S* row = St.data() + c * V;
    const S qc = qt[c];
    for (int64_t j = 0; j < V; ++j) o[j] += qc * row[j];
  }
  for (int64_t j = 0; j < V; ++j) o[j] *= L.in->scale;
}

template <class S>
std::vector<S> initial_state(const LaneView<S>& L) {
  std::vector<S> St(static_cast<size_t>(L.K * L.V), S(0));
  if (!L.in->h0.empty())
    for (int64_t i = 0; i < L.K * L.V; ++i) St[i] = L.in->h0[L.state_offset() + i];
  return St;
}

}  // namespace detail

// Forward pass of the whole case: o [B,T,H,V] and ht [N,H,K,V]. Positions of o that belong to no
// sequence (never the case for valid inputs) stay zero.
template <class S>
Outputs<S> recurrent_forward(const Inputs<S>& in, int threads = 0) {
  const auto& d = in.dims;
  Outputs<S> out;
  out.o.assign(static_cast<size_t>(d.B * d.T * d.H * d.V), S(0));
  out.ht.assign(static_cast<size_t>(in.num_sequences() * d.H * d.K * d.V), S(0));
  auto lanes = lanes_of(in);
  parallel_for(
      static_cast<int64_t>(lanes.size()),
      [&](int64_t li) {
        const auto& L = lanes[li];
        std::vector<S> St = detail::initial_state(L);
        std::vector<S> a(L.K), p(L.K), m(L.K), alpha(L.K), u(L.V);
        for (int64_t t = 0; t < L.span.len; ++t) {
          detail::step_forward(L, t, St, a, p, m, alpha, u);
          detail::read_out(L, t, St, out.o.data() + L.tok(t, L.V));
        }
        for (int64_t i = 0; i < L.K * L.V; ++i) out.ht[L.state_offset() + i] = St[i];
      },
      threads);
  return out;
}

// Adjoint of the forward pass (MATH.md §5.1, §5.2) for L = sum(do*o) + sum(dht*ht).
// States are recomputed per segment from stored segment-start states (never by inverting a
// step, which is singular when k^T a = 1).
template <class S>
Grads<S> recurrent_backward(const Inputs<S>& in, const Cotangents<S>& cot, int threads = 0) {
  using std::exp;
  const auto& d = in.dims;
  const Layout lay = layout_of(in.variant, in.arm);
  const int64_t K = d.K, V = d.V, H = d.H;
  const size_t nK = static_cast<size_t>(d.B * d.T * H * K);
  const size_t nV = static_cast<size_t>(d.B * d.T * H * V);
  Grads<S> gr;
  gr.dq.assign(nK, S(0));
  gr.dk.assign(nK, S(0));
  gr.dv.assign(nV, S(0));
  gr.dh0.assign(static_cast<size_t>(in.num_sequences() * H * K * V), S(0));
  // Channel-wise gate gradients of the general form, mapped to the variant's gates at the end.
  std::vector<S> dgc(nK, S(0)), dbc(nK, S(0)), dwc(nV, S(0));
  auto lanes = lanes_of(in);
  std::vector<S> lane_dlambda(lanes.size(), S(0));
  std::vector<std::vector<S>> lane_dr(lanes.size());

  parallel_for(
      static_cast<int64_t>(lanes.size()),
      [&](int64_t li) {
        const auto& L = lanes[li];
        const int64_t Tn = L.span.len;
        const S scale = in.scale;
        // Segment length ~ sqrt(T): stored checkpoints plus one segment of states.
        int64_t seg = 1;
        while (seg * seg < Tn) ++seg;
        const int64_t nseg = Tn == 0 ? 0 : (Tn + seg - 1) / seg;
        std::vector<std::vector<S>> checkpoints;
        std::vector<S> a(K), p(K), m(K), alpha(K), u(V);
        {
          std::vector<S> St = detail::initial_state(L);
          for (int64_t t = 0; t < Tn; ++t) {
            if (t % seg == 0) checkpoints.push_back(St);
            detail::step_forward(L, t, St, a, p, m, alpha, u);
          }
        }
        std::vector<S> Sh(static_cast<size_t>(K * V), S(0));  // adjoint state
        if (!cot.dht.empty())
          for (int64_t i = 0; i < K * V; ++i) Sh[i] = cot.dht[L.state_offset() + i];
        std::vector<S> ubar(V), abar(K), mbar(K);
        if (lay.has_r) lane_dr[li].assign(static_cast<size_t>(K), S(0));
        S dlam(0);
        for (int64_t sg = nseg - 1; sg >= 0; --sg) {
          const int64_t t0 = sg * seg, t1 = std::min(Tn, t0 + seg);
          // states[i] = S_{t0+i} (state before step t0+i), i = 0..t1-t0
          std::vector<std::vector<S>> states;
          states.push_back(checkpoints[sg]);
          for (int64_t t = t0; t < t1; ++t) {
            std::vector<S> St = states.back();
            detail::step_forward(L, t, St, a, p, m, alpha, u);
            states.push_back(std::move(St));
          }
          for (int64_t t = t1 - 1; t >= t0; --t) {
            const std::vector<S>& Sprev = states[t - t0];
            const std::vector<S>& Scur = states[t - t0 + 1];
            const S* qt = L.q(t);
            const S* kt = L.k(t);
            const S* vt = L.v(t);
            const S* dot = cot.do_.data() + L.tok(t, V);
            S* dq = gr.dq.data() + L.tok(t, K);
            S* dk = gr.dk.data() + L.tok(t, K);
            // Output: o_t = s S_t^T q_t.
            for (int64_t c = 0; c < K; ++c) {
              S* row = Sh.data() + c * V;
              const S sq = scale * qt[c];
              S acc(0);
              for (int64_t j = 0; j < V; ++j) {
                row[j] += sq * dot[j];
                acc += Scur[c * V + j] * dot[j];
              }
              dq[c] += scale * acc;
            }
            // Recompute the step's intermediates.
            L.erase_vector(t, a, p, m);
            for (int64_t c = 0; c < K; ++c) alpha[c] = exp(L.g(t, c));
            for (int64_t j = 0; j < V; ++j) u[j] = L.w(t, j) * vt[j];
            for (int64_t c = 0; c < K; ++c)
              for (int64_t j = 0; j < V; ++j) u[j] -= alpha[c] * Sprev[c * V + j] * a[c];
            // ubar = Sh^T k ; dk_dir = Sh u
            for (int64_t j = 0; j < V; ++j) ubar[j] = S(0);
            for (int64_t c = 0; c < K; ++c) {
              const S* row = Sh.data() + c * V;
              S acc(0);
              for (int64_t j = 0; j < V; ++j) {
                ubar[j] += row[j] * kt[c];
                acc += row[j] * u[j];
              }
              dk[c] += acc;
            }
            // zbar = ubar -> dv, dw
            for (int64_t j = 0; j < V; ++j) {
              gr.dv[L.tok(t, V) + j] = L.w(t, j) * ubar[j];
              dwc[L.tok(t, V) + j] = vt[j] * ubar[j];
            }
            // abar = -P ubar with P = D S_{t-1}; Pbar = Sh - a ubar^T; alphabar; Sh <- D Pbar
            for (int64_t c = 0; c < K; ++c) {
              S* row = Sh.data() + c * V;
              const S* prow = Sprev.data() + c * V;
              S pu(0), albar(0);
              for (int64_t j = 0; j < V; ++j) {
                pu += prow[j] * ubar[j];
                row[j] -= a[c] * ubar[j];
                albar += row[j] * prow[j];
                row[j] *= alpha[c];
              }
              abar[c] = -alpha[c] * pu;
              dgc[L.tok(t, K) + c] = alpha[c] * albar;
            }
            // Erase-vector VJP (§5.2).
            erase_vector_vjp(L, t, abar.data(), p.data(), m.data(), dq, dk,
                             dbc.data() + L.tok(t, K), dlam,
                             lay.has_r ? lane_dr[li].data() : nullptr, mbar);
          }
        }
        for (int64_t i = 0; i < K * V; ++i) gr.dh0[L.state_offset() + i] = Sh[i];
        lane_dlambda[li] = dlam;
      },
      threads);

  map_gate_grads(in, lanes, std::move(dgc), std::move(dbc), std::move(dwc), lane_dlambda, lane_dr, gr);
  return gr;
}

}  // namespace qed::reference
