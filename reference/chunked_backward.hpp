// The chunked backward pass of MATH.md §6: forward recompute of the chunk-start states, a reverse
// sweep over chunks (§6.1, §6.2, the compact decay gradient §6.3), then the token-level VJPs
// (§5.2 and z = w⊙v). Produces the same Grads<S> as recurrent_backward, for every variant.
//
// Precision twin (operands != none): rounded before their product are Ō, Ŝ' (the incoming
// state adjoint), M, K̂, U and the state S (in Ū = s Mᵀ Ō + K̂ Ŝ', M̄ = s Ō Uᵀ, Q̃̄ = s Ō Sᵀ,
// K̂̄ = U Ŝ'ᵀ); L and Ū (in Ȳ = Lᵀ Ū); Q̃, Ã and Ȳ (in Ŝ = s Q̃ᵀ Ō + Diag(γ) Ŝ' − Ãᵀ Ȳ, with
// Diag(γ) Ŝ' in S); Ȳ, S and U (in Ã̄ = −Ȳ Sᵀ, T̄ = −Ȳ Uᵀ). The §6.2 sums through the pairwise
// decay factors are computed in S; with `factored` they are products whose operands T̄, M̄,
// K⊙Γ⁻¹, Ã and Q̃ are rounded. The decay gradient (§6.3) and the token VJPs are computed in S.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/chunked_core.hpp"
#include "reference/vjp.hpp"
#include "reference/lane.hpp"
#include "reference/parallel.hpp"
#include "reference/recurrent.hpp"
#include "reference/types.hpp"

namespace qed::reference {

// Chunk-level gradients of one chunk, before the token-level VJPs.
template <class S>
struct ChunkGrads {
  std::vector<S> qbar, kbar, abar, gbar;  // n x K
  std::vector<S> zbar;                    // n x V
  std::vector<S> Sh;                      // K x V: adjoint of the chunk-start state
};

// Reverse step through one chunk. Sn, Snext: chunk-start and chunk-end states; Sh: adjoint of
// Snext; Obar: the chunk's n rows of do, contiguous (n x V).
template <class S>
ChunkGrads<S> chunk_backward(const Chunk<S>& ch, const std::vector<S>& Sn,
                             const std::vector<S>& Snext, const std::vector<S>& Sh,
                             const std::vector<S>& Obar, const S& scale) {
  const int64_t n = ch.n, K = ch.K, V = ch.V;
  const size_t nK = static_cast<size_t>(n * K), nV = static_cast<size_t>(n * V);
  const size_t nn = static_cast<size_t>(n * n);
  const std::vector<S> Sr = rounded_copy(Sn, ch.ops);
  const std::vector<S> Ur = chunk_pseudo_values(ch, Sr);
  const std::vector<S> Shr = rounded_copy(Sh, ch.ops);
  std::vector<S> Ob(nV);
  for (size_t i = 0; i < nV; ++i) Ob[i] = ch.rnd(Obar[i]);

  // Ū = s Mᵀ Ō + K̂ Ŝ'.
  std::vector<S> Ub(nV, S(0));
  for (int64_t j = 0; j < n; ++j) {
    S* u = Ub.data() + j * V;
    for (int64_t r = j; r < n; ++r) {
      const S mrj = ch.Mm[r * n + j];
      for (int64_t v = 0; v < V; ++v) u[v] += mrj * Ob[r * V + v];
    }
    for (int64_t v = 0; v < V; ++v) u[v] *= scale;
    for (int64_t c = 0; c < K; ++c) {
      const S kh = ch.Kh[j * K + c];
      for (int64_t v = 0; v < V; ++v) u[v] += kh * Shr[c * V + v];
    }
  }
  // M̄ = s tril(Ō Uᵀ), Q̃̄ = s Ō Sᵀ, K̂̄ = U Ŝ'ᵀ.
  std::vector<S> Mb(nn, S(0)), Qtb(nK, S(0)), Khb(nK, S(0));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j <= r; ++j) {
      S acc(0);
      for (int64_t v = 0; v < V; ++v) acc += Ob[r * V + v] * Ur[j * V + v];
      Mb[r * n + j] = scale * acc;
    }
    for (int64_t c = 0; c < K; ++c) {
      S acc(0), acc2(0);
      for (int64_t v = 0; v < V; ++v) {
        acc += Ob[r * V + v] * Sr[c * V + v];
        acc2 += Ur[r * V + v] * Shr[c * V + v];
      }
      Qtb[r * K + c] = scale * acc;
      Khb[r * K + c] = acc2;
    }
  }
  // Ȳ = Lᵀ Ū: the gradient w.r.t. Y = Z − Ã S, i.e. the chunk's Z̄.
  ChunkGrads<S> g;
  g.zbar.assign(nV, S(0));
  {
    const std::vector<S> Ubr = rounded_copy(Ub, ch.ops);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t r = j; r < n; ++r) {
        const S l = ch.L[r * n + j];
        for (int64_t v = 0; v < V; ++v) g.zbar[j * V + v] += l * Ubr[r * V + v];
      }
  }
  const std::vector<S> Ybr = rounded_copy(g.zbar, ch.ops);
  // Ŝ_[n] = s Q̃ᵀ Ō + Diag(γ_n) Ŝ' − Ãᵀ Ȳ.
  g.Sh.assign(static_cast<size_t>(K * V), S(0));
  for (int64_t c = 0; c < K; ++c) {
    S* row = g.Sh.data() + c * V;
    for (int64_t r = 0; r < n; ++r) {
      const S qt = ch.Qt[r * K + c];
      for (int64_t v = 0; v < V; ++v) row[v] += qt * Ob[r * V + v];
    }
    const S gl = ch.gam[(n - 1) * K + c];
    for (int64_t v = 0; v < V; ++v) row[v] = scale * row[v] + gl * Sh[c * V + v];
    for (int64_t r = 0; r < n; ++r) {
      const S at = ch.At[r * K + c];
      for (int64_t v = 0; v < V; ++v) row[v] -= at * Ybr[r * V + v];
    }
  }
  // Ã̄ = −Ȳ Sᵀ, T̄ = −stril(Ȳ Uᵀ).
  std::vector<S> Atb(nK, S(0)), Tb(nn, S(0));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < K; ++c) {
      S acc(0);
      for (int64_t v = 0; v < V; ++v) acc += Ybr[r * V + v] * Sr[c * V + v];
      Atb[r * K + c] = -acc;
    }
    for (int64_t j = 0; j < r; ++j) {
      S acc(0);
      for (int64_t v = 0; v < V; ++v) acc += Ybr[r * V + v] * Ur[j * V + v];
      Tb[r * n + j] = -acc;
    }
  }
  // §6.2: through the decay factors.
  g.abar.assign(nK, S(0));
  g.qbar.assign(nK, S(0));
  g.kbar.assign(nK, S(0));
  if (ch.factored) {
    const std::vector<S> Tbr = rounded_copy(Tb, ch.ops), Mbr = rounded_copy(Mb, ch.ops);
    std::vector<S> kacc(nK, S(0));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j <= r; ++j) {
        const S t = Tbr[r * n + j], mm = Mbr[r * n + j];
        for (int64_t c = 0; c < K; ++c) {
          g.abar[r * K + c] += t * ch.Kinv[j * K + c];
          g.qbar[r * K + c] += mm * ch.Kinv[j * K + c];
          kacc[j * K + c] += t * ch.At[r * K + c] + mm * ch.Qt[r * K + c];
        }
      }
    for (size_t i = 0; i < nK; ++i) {
      g.abar[i] = (g.abar[i] + Atb[i]) * ch.gam[i];
      g.qbar[i] = (g.qbar[i] + Qtb[i]) * ch.gam[i];
      g.kbar[i] = kacc[i] * ch.ginv[i];
    }
  } else {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j <= r; ++j) {
        const S t = Tb[r * n + j], mm = Mb[r * n + j];
        for (int64_t c = 0; c < K; ++c) {
          const S e = ch.decay(r, j, c);
          g.abar[r * K + c] += t * ch.k[j * K + c] * e;
          g.qbar[r * K + c] += mm * ch.k[j * K + c] * e;
          g.kbar[j * K + c] += (t * ch.a[r * K + c] + mm * ch.q[r * K + c]) * e;
        }
      }
    for (size_t i = 0; i < nK; ++i) {
      g.abar[i] += Atb[i] * ch.gam[i];
      g.qbar[i] += Qtb[i] * ch.gam[i];
    }
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < K; ++c) g.kbar[j * K + c] += Khb[j * K + c] * ch.decay_end(j, c);

  // §6.3: Ḡ_r = a⊙ā + q⊙q̄ − k⊙k̄ (+ rowsum(Ŝ'⊙S_[n+1]) on the last row); ḡ = reverse cumsum.
  g.gbar.assign(nK, S(0));
  for (int64_t c = 0; c < K; ++c) {
    S acc(0);
    for (int64_t v = 0; v < V; ++v) acc += Sh[c * V + v] * Snext[c * V + v];
    for (int64_t r = n - 1; r >= 0; --r) {
      const size_t i = static_cast<size_t>(r * K + c);
      acc += ch.a[i] * g.abar[i] + ch.q[i] * g.qbar[i] - ch.k[i] * g.kbar[i];
      g.gbar[i] = acc;
    }
  }
  return g;
}

// Gradients of L = sum(do*o) + sum(dht*ht) by the chunked form; same layout and gate mapping as
// recurrent_backward. Chunk intermediates are kept from the forward recompute (O(T C + T K)
// memory per lane), the chunk-start states too.
template <class S>
Grads<S> chunked_backward(const Inputs<S>& in, const Cotangents<S>& cot, const ChunkOptions& opt,
                          int threads = 0) {
  check_options(opt);
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
  std::vector<S> dgc(nK, S(0)), dbc(nK, S(0)), dwc(nV, S(0));
  auto lanes = lanes_of(in);
  std::vector<S> lane_dlambda(lanes.size(), S(0));
  std::vector<std::vector<S>> lane_dr(lanes.size());

  parallel_for(
      static_cast<int64_t>(lanes.size()),
      [&](int64_t li) {
        const auto& Lv = lanes[li];
        const int64_t len = Lv.span.len;
        std::vector<Chunk<S>> chunks;
        std::vector<std::vector<S>> states{detail::initial_state(Lv)};
        for (int64_t t0 = 0; t0 < len; t0 += opt.chunk) {
          chunks.push_back(build_chunk(Lv, t0, std::min(opt.chunk, len - t0), opt));
          std::vector<S> St = states.back();
          const std::vector<S> Ur =
              chunk_pseudo_values(chunks.back(), rounded_copy(St, opt.operands));
          chunk_advance_state(chunks.back(), Ur, St);
          states.push_back(std::move(St));
        }
        std::vector<S> Sh(static_cast<size_t>(K * V), S(0));
        if (!cot.dht.empty())
          for (int64_t i = 0; i < K * V; ++i) Sh[i] = cot.dht[Lv.state_offset() + i];
        if (lay.has_r) lane_dr[li].assign(static_cast<size_t>(K), S(0));
        S* dr = lay.has_r ? lane_dr[li].data() : nullptr;
        S dlam(0);
        std::vector<S> mbar(K);
        for (int64_t ci = static_cast<int64_t>(chunks.size()) - 1; ci >= 0; --ci) {
          const Chunk<S>& ch = chunks[ci];
          std::vector<S> Obar(static_cast<size_t>(ch.n * V));
          for (int64_t r = 0; r < ch.n; ++r)
            for (int64_t j = 0; j < V; ++j) Obar[r * V + j] = cot.do_[Lv.tok(ch.t0 + r, V) + j];
          ChunkGrads<S> g = chunk_backward(ch, states[ci], states[ci + 1], Sh, Obar, in.scale);
          for (int64_t r = 0; r < ch.n; ++r) {
            const int64_t t = ch.t0 + r;
            S* dq = gr.dq.data() + Lv.tok(t, K);
            S* dk = gr.dk.data() + Lv.tok(t, K);
            S* dg = dgc.data() + Lv.tok(t, K);
            for (int64_t c = 0; c < K; ++c) {
              dq[c] = g.qbar[r * K + c];
              dk[c] = g.kbar[r * K + c];
              dg[c] = g.gbar[r * K + c];
            }
            const S* vt = Lv.v(t);
            for (int64_t j = 0; j < V; ++j) {
              const S zb = g.zbar[r * V + j];
              gr.dv[Lv.tok(t, V) + j] = Lv.w(t, j) * zb;
              dwc[Lv.tok(t, V) + j] = vt[j] * zb;
            }
            erase_vector_vjp(Lv, t, g.abar.data() + r * K, ch.p.data() + r * K, ch.m.data() + r * K,
                             dq, dk, dbc.data() + Lv.tok(t, K), dlam, dr, mbar);
          }
          Sh = std::move(g.Sh);
        }
        for (int64_t i = 0; i < K * V; ++i) gr.dh0[Lv.state_offset() + i] = Sh[i];
        lane_dlambda[li] = dlam;
      },
      threads);
  map_gate_grads(in, lanes, std::move(dgc), std::move(dbc), std::move(dwc), lane_dlambda, lane_dr,
                 gr);
  return gr;
}

}  // namespace qed::reference
