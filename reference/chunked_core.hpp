// One chunk of the chunkwise-parallel (WY / UT transform) form of MATH.md §4: the chunk's
// cumulative decay, erase vectors, the matrices T, M, L = (I+T)^-1, W_a, W_z, and the step that
// maps the chunk-start state to the chunk's outputs and the next chunk-start state.
//
// Precision twin. With ChunkOptions::operands != none, every operand of a matrix product that a
// tensor-core kernel would issue is rounded (round-to-nearest-even, reference/rounding.hpp) to
// the storage type just before the product; products accumulate in S and the state stays in S.
// Rounded operands, forward: L, Ã = A⊙Γ, Z (in W_a = L Ã, W_z = L Z); W_a and S (in W_a S);
// W_z (stored, as a kernel stores it between passes); U (in M U and K̂ᵀU); Q̃ = Q⊙Γ and S (in
// Q̃ S); M; K̂. T, M and L themselves are computed in S: T and M by pairwise decay sums, L by
// forward substitution. With `factored`, T = Ã (K⊙Γ⁻¹)ᵀ and M = Q̃ (K⊙Γ⁻¹)ᵀ are products
// whose operands Ã, Q̃ and K⊙Γ⁻¹ are rounded. Backward: see chunked_backward.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "reference/error.hpp"
#include "reference/lane.hpp"
#include "reference/rounding.hpp"
#include "reference/types.hpp"

namespace qed::reference {

struct ChunkOptions {
  int64_t chunk = 64;
  Operands operands = Operands::none;
  // Decay factors as exp(G_r) exp(-G_j) (matmul-friendly, overflows in fp32 once -G > 88.7)
  // instead of the reference's pairwise exp(G_r - G_j) with exponent <= 0 (MATH.md §4.6).
  bool factored = false;
};

inline void check_options(const ChunkOptions& o) {
  if (o.chunk < 1)
    throw qed::Error("chunked reference: chunk size " + std::to_string(o.chunk) + " is not >= 1");
}

// Intermediates of one chunk (tokens t0 .. t0+n-1 of a lane), row-major. Entries marked
// "operand" hold the value rounded to the operand type (equal to the S value when none).
template <class S>
struct Chunk {
  int64_t t0 = 0, n = 0, K = 0, V = 0;
  Operands ops = Operands::none;
  bool factored = false;
  std::vector<S> G;        // n x K  cumulative log-decay G_r (§4.1)
  std::vector<S> gam;      // n x K  exp(G_r)
  std::vector<S> ginv;     // n x K  exp(-G_r) (factored form only)
  std::vector<S> a, p, m;  // n x K  erase vector a_r and its p_r, m_r (for the §5.2 VJP)
  std::vector<S> q, k;     // n x K  copies of the chunk's q_r, k_r
  std::vector<S> z;        // n x V  z_r = w_r ⊙ v_r
  std::vector<S> Tm;       // n x n  T_rj (j < r), in S
  std::vector<S> Mm;       // n x n  M_rj (j <= r), operand
  std::vector<S> L;        // n x n  (I + T)^-1, operand
  std::vector<S> At;       // n x K  Ã = A⊙Γ, operand
  std::vector<S> Qt;       // n x K  Q̃ = Q⊙Γ, operand
  std::vector<S> Kh;       // n x K  K̂ = K⊙exp(G_n - G_j), operand
  std::vector<S> Kinv;     // n x K  K⊙Γ⁻¹, operand (factored form only)
  std::vector<S> Wa, Wz;   // n x K, n x V  L Ã and L Z, operands

  S rnd(const S& x) const { return round_operand(x, ops); }
  // Decay exp(G_{r,c} - G_{j,c}) for j <= r, in the chosen form.
  S decay(int64_t r, int64_t j, int64_t c) const {
    using std::exp;
    if (factored) return gam[r * K + c] * ginv[j * K + c];
    return exp(G[r * K + c] - G[j * K + c]);
  }
  // Decay of token j to the chunk end, exp(G_{n,c} - G_{j,c}).
  S decay_end(int64_t j, int64_t c) const { return decay(n - 1, j, c); }
};

// Builds every state-independent intermediate of the chunk [t0, t0+n) of lane Lv.
template <class S>
Chunk<S> build_chunk(const LaneView<S>& Lv, int64_t t0, int64_t n, const ChunkOptions& opt) {
  using std::exp;
  const int64_t K = Lv.K, V = Lv.V;
  Chunk<S> ch;
  ch.t0 = t0;
  ch.n = n;
  ch.K = K;
  ch.V = V;
  ch.ops = opt.operands;
  ch.factored = opt.factored;
  const size_t nK = static_cast<size_t>(n * K), nV = static_cast<size_t>(n * V);
  const size_t nn = static_cast<size_t>(n * n);
  ch.G.assign(nK, S(0));
  ch.gam.assign(nK, S(0));
  ch.a.assign(nK, S(0));
  ch.p.assign(nK, S(0));
  ch.m.assign(nK, S(0));
  ch.q.assign(nK, S(0));
  ch.k.assign(nK, S(0));
  ch.z.assign(nV, S(0));
  std::vector<S> a(K), p(K), m(K);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = t0 + r;
    Lv.erase_vector(t, a, p, m);
    const S* qt = Lv.q(t);
    const S* kt = Lv.k(t);
    const S* vt = Lv.v(t);
    for (int64_t c = 0; c < K; ++c) {
      const S prev = r == 0 ? S(0) : ch.G[(r - 1) * K + c];
      ch.G[r * K + c] = prev + Lv.g(t, c);
      ch.gam[r * K + c] = exp(ch.G[r * K + c]);
      ch.a[r * K + c] = a[c];
      ch.p[r * K + c] = p[c];
      ch.m[r * K + c] = m[c];
      ch.q[r * K + c] = qt[c];
      ch.k[r * K + c] = kt[c];
    }
    for (int64_t j = 0; j < V; ++j) ch.z[r * V + j] = Lv.w(t, j) * vt[j];
  }
  if (ch.factored) {
    ch.ginv.assign(nK, S(0));
    for (size_t i = 0; i < nK; ++i) ch.ginv[i] = exp(-ch.G[i]);
  }
  ch.At.assign(nK, S(0));
  ch.Qt.assign(nK, S(0));
  ch.Kh.assign(nK, S(0));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < K; ++c) {
      const size_t i = static_cast<size_t>(r * K + c);
      ch.At[i] = ch.rnd(ch.a[i] * ch.gam[i]);
      ch.Qt[i] = ch.rnd(ch.q[i] * ch.gam[i]);
      ch.Kh[i] = ch.rnd(ch.k[i] * ch.decay_end(r, c));
    }
  if (ch.factored) {
    ch.Kinv.assign(nK, S(0));
    for (size_t i = 0; i < nK; ++i) ch.Kinv[i] = ch.rnd(ch.k[i] * ch.ginv[i]);
  }

  // T (strictly lower) and M (lower, diagonal included), §4.2 and §4.4.
  ch.Tm.assign(nn, S(0));
  ch.Mm.assign(nn, S(0));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j <= r; ++j) {
      S tv(0), mv(0);
      if (ch.factored) {
        for (int64_t c = 0; c < K; ++c) {
          tv += ch.At[r * K + c] * ch.Kinv[j * K + c];
          mv += ch.Qt[r * K + c] * ch.Kinv[j * K + c];
        }
      } else {
        for (int64_t c = 0; c < K; ++c) {
          const S kd = ch.k[j * K + c] * ch.decay(r, j, c);
          tv += ch.a[r * K + c] * kd;
          mv += ch.q[r * K + c] * kd;
        }
      }
      if (j < r) ch.Tm[r * n + j] = tv;
      ch.Mm[r * n + j] = ch.rnd(mv);
    }

  // L = (I + T)^-1 by forward substitution: row r is e_r - sum_{j<r} T_rj L_j.
  std::vector<S> Ls(nn, S(0));
  for (int64_t r = 0; r < n; ++r) {
    Ls[r * n + r] = S(1);
    for (int64_t j = 0; j < r; ++j) {
      const S trj = ch.Tm[r * n + j];
      for (int64_t i = 0; i <= j; ++i) Ls[r * n + i] -= trj * Ls[j * n + i];
    }
  }
  ch.L.assign(nn, S(0));
  for (size_t i = 0; i < nn; ++i) ch.L[i] = ch.rnd(Ls[i]);

  // W_a = L Ã and W_z = L Z with operands L, Ã, Z rounded; the results are stored rounded.
  ch.Wa.assign(nK, S(0));
  ch.Wz.assign(nV, S(0));
  std::vector<S> Zr(nV);
  for (size_t i = 0; i < nV; ++i) Zr[i] = ch.rnd(ch.z[i]);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j <= r; ++j) {
      const S l = ch.L[r * n + j];
      for (int64_t c = 0; c < K; ++c) ch.Wa[r * K + c] += l * ch.At[j * K + c];
      for (int64_t v = 0; v < V; ++v) ch.Wz[r * V + v] += l * Zr[j * V + v];
    }
  }
  for (auto& x : ch.Wa) x = ch.rnd(x);
  for (auto& x : ch.Wz) x = ch.rnd(x);
  return ch;
}

// Operand copy of a state (K x V).
template <class S>
std::vector<S> rounded_copy(const std::vector<S>& x, Operands ops) {
  std::vector<S> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = round_operand(x[i], ops);
  return out;
}

// U = W_z - W_a S (4.3), from the operand copy Sr of the chunk-start state; returned rounded.
template <class S>
std::vector<S> chunk_pseudo_values(const Chunk<S>& ch, const std::vector<S>& Sr) {
  const int64_t n = ch.n, K = ch.K, V = ch.V;
  std::vector<S> U(ch.Wz.begin(), ch.Wz.end());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < K; ++c) {
      const S w = ch.Wa[r * K + c];
      for (int64_t v = 0; v < V; ++v) U[r * V + v] -= w * Sr[c * V + v];
    }
  for (auto& x : U) x = ch.rnd(x);
  return U;
}

// Row r of O = s (Q̃ S + M U) (4.4), written to o (V values).
template <class S>
void chunk_output_row(const Chunk<S>& ch, int64_t r, const std::vector<S>& Sr,
                      const std::vector<S>& Ur, const S& scale, S* o) {
  const int64_t n = ch.n, K = ch.K, V = ch.V;
  for (int64_t v = 0; v < V; ++v) o[v] = S(0);
  for (int64_t c = 0; c < K; ++c) {
    const S qc = ch.Qt[r * K + c];
    for (int64_t v = 0; v < V; ++v) o[v] += qc * Sr[c * V + v];
  }
  for (int64_t j = 0; j <= r; ++j) {
    const S mj = ch.Mm[r * n + j];
    for (int64_t v = 0; v < V; ++v) o[v] += mj * Ur[j * V + v];
  }
  for (int64_t v = 0; v < V; ++v) o[v] *= scale;
}

// S <- Diag(γ_n) S + K̂ᵀ U (4.5), in place; S is kept in the scalar type.
template <class S>
void chunk_advance_state(const Chunk<S>& ch, const std::vector<S>& Ur, std::vector<S>& St) {
  const int64_t n = ch.n, K = ch.K, V = ch.V;
  for (int64_t c = 0; c < K; ++c) {
    S* row = St.data() + c * V;
    const S gl = ch.gam[(n - 1) * K + c];
    for (int64_t v = 0; v < V; ++v) row[v] *= gl;
    for (int64_t j = 0; j < n; ++j) {
      const S kh = ch.Kh[j * K + c];
      for (int64_t v = 0; v < V; ++v) row[v] += kh * Ur[j * V + v];
    }
  }
}

// Number of chunks of a sequence of length len.
inline int64_t chunk_count(int64_t len, int64_t C) { return len <= 0 ? 0 : (len + C - 1) / C; }

}  // namespace qed::reference
