// The mathematics of the chunked backward (MATH.md §6, §5.2) as host/device functions, shared by
// the CUDA kernels (kernels/chunked_backward.cu) and the CPU test that runs them on g++
// (properties/test_chunked_backward_tiles.cpp). Every "block" function below is the whole body
// of one CUDA block: the kernel only passes its block coordinates, its shared memory and an
// executor (BlockExec: threads stride over an index range, sync = __syncthreads); the CPU test
// passes the same arguments with host pointers and SerialExec, which runs each index range in
// a chosen order (a result that depends on the order would be a data race on the GPU).
//
// Pipeline (one lane = one sequence and head; chunks of C = 64 never straddle sequences):
//  0. chunked_forward (kernels/chunked_api.hpp) stores the chunk-start states S_[n].
//  A. prep_block, per (chunk, head): cumulative decay G, erase vectors a, T and M by pairwise
//     exponents exp(G_r - G_j) <= 1 (§4.6: no overflow for any g <= 0), L = (I+T)^-1 by forward
//     substitution, Ã, Q̃, K̂, W_a = L Ã, W_z = L Z, γ_C into a workspace blob.
//  B. state_block, per (sequence, head, tile of value columns): the reverse sweep of §6.1 over
//     the chunks, carrying the adjoint Ŝ; writes Z̄ and per-tile partial sums (M̄, T̄, Q̃̄, K̂̄,
//     Ã̄ and rowsum(Ŝ'⊙S_[n])), and dh0.
//  C. chunk_block, per (chunk, head): sums the tile partials in tile order, §6.2 through the
//     decay factors, and the §6.3 decay gradient in a cancellation-free arrangement (below),
//     into per-token fp32 arrays.
//  D. token_item, per (token, head), one warp each: the §5.2 erase-vector VJP, z = w⊙v, the
//     variant mapping.
//  E. head_reduce_parts, head_reduce_final: dlambda and dr summed over tokens in a fixed order.
// Arithmetic is fp32 with explicit fmaf; there are no atomics, so results are bitwise
// reproducible. The GPU swaps in tensor-core versions of the plain matrix products through the
// hooks of prep_block (ScalarPrepTM, ScalarPrepProducts) and chunk_block (ScalarOffDiag), and of
// the whole of state_block (chunked_backward.cu); these loops stay the reference the CPU test runs.
// Mutant switches (BwdArgs::mutant) drop one term each, for the tests.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define QED_HD __host__ __device__
#else
#define QED_HD
#endif

namespace qed::kernels::chunked_bwd {

constexpr int kC = 64;   // chunk size
constexpr int kVT = 64;  // value columns per state_block tile

enum : int { kGdn2 = 0, kQed = 1, kKda = 2, kGdn = 3, kDeltanet = 4 };
enum : int { kArmNone = 0, kArmFull = 1, kArmNogate = 2, kArmNoproj = 3, kArmRand = 4 };
// Deliberately wrong kernels for the tests: each drops one term of the backward.
enum : int {
  kMutantNone = 0,
  kMutantNoKhatGrad = 1,   // k̄ without the K̂̄ term (§6.2, third line)
  kMutantNoDecayRho = 2,   // ḡ without rowsum(Ŝ'⊙S_[n+1]) on the chunk's last row (§6.3)
  kMutantNoProjGrad = 3,   // k̄ without the projector term of §5.2 (QED projected arms)
  kMutantHoldOrder = 4,    // grads kernel: held partials not shifted along (GradArgs::hold)
};

// ---- tensors ----

struct SeqIn {  // [B,T,H,D], D contiguous; dt 0 fp32, 1 bf16
  const void* p = nullptr;
  int64_t sb = 0, st = 0, sh = 0;
  int dt = 0;
};
struct SeqOut {
  void* p = nullptr;
  int64_t sb = 0, st = 0, sh = 0;
  int dt = 0;
};

QED_HD inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
QED_HD inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

QED_HD inline float ld(const SeqIn& x, int64_t brow, int64_t t, int64_t h, int64_t c) {
  const int64_t i = brow * x.sb + t * x.st + h * x.sh + c;
  if (x.dt == 0) return static_cast<const float*>(x.p)[i];
  return bf16_to_float(static_cast<const uint16_t*>(x.p)[i]);
}
QED_HD inline void st(const SeqOut& x, int64_t brow, int64_t t, int64_t h, int64_t c, float v) {
  const int64_t i = brow * x.sb + t * x.st + h * x.sh + c;
  if (x.dt == 0)
    static_cast<float*>(x.p)[i] = v;
  else
    static_cast<uint16_t*>(x.p)[i] = float_to_bf16(v);
}

// ---- arguments of every block ----

struct BwdArgs {
  int variant = 0, arm = 0;
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0, N = 0;
  float scale = 1.f;
  const int64_t* cu = nullptr;          // [N+1] or null
  const int64_t* chunk_base = nullptr;  // [N+1] when cu is given
  int64_t chunks_per_seq = 0;           // without cu
  int64_t chunk_bound = 0;              // chunk slots per head (blob and partial sets)
  SeqIn q, k, v, g, b, w, beta, dout;
  const float* lambda = nullptr;  // [H]
  const float* r = nullptr;       // [H,K]
  const float* dht = nullptr;     // optional
  int64_t dht_sn = 0, dht_sh = 0, dht_sk = 0;
  const float* cs = nullptr;  // chunk-start states [chunk_bound, H, K, V] (the forward's output)
  float* dh0 = nullptr;
  int64_t dh0_sn = 0, dh0_sh = 0, dh0_sk = 0;
  SeqOut dq, dk, dv, dg, db, dw, dbeta;
  float* blob = nullptr;  // per (chunk, head): blob_floats(K, V)
  float* part = nullptr;  // per (chunk, head, tile): part_floats(K)
  int n_vt = 1;           // value tiles of kVT columns
  float* tok_k = nullptr;  // 4 arrays [B*T*H*K]: ā, q̄, k̄ (chunk level, §6.2), ḡ
  float* tok_v = nullptr;  // [B*T*H*V]: Z̄
  float* dlam_tok = nullptr;  // [B*T*H]
  float* dr_tok = nullptr;    // [B*T*H*K]
  int mutant = kMutantNone;
};

// Workspace blob of one (chunk, head), floats: L, M [C][C]; Ã, Q̃, K̂, W_a [C][K]; W_z [C][V]; γ_C [K].
struct Blob {
  float *L, *M, *At, *Qt, *Kh, *Wa, *Wz, *gl;
};
QED_HD inline int64_t blob_floats(int64_t K, int64_t V) { return 2 * kC * kC + 4 * kC * K + kC * V + K; }
QED_HD inline Blob blob_at(const BwdArgs& A, int64_t gc, int64_t h) {
  float* p = A.blob + (gc * A.H + h) * blob_floats(A.K, A.V);
  const int64_t CK = kC * A.K;
  Blob b;
  b.L = p;
  b.M = p + kC * kC;
  b.At = b.M + kC * kC;
  b.Qt = b.At + CK;
  b.Kh = b.Qt + CK;
  b.Wa = b.Kh + CK;
  b.Wz = b.Wa + CK;
  b.gl = b.Wz + kC * A.V;
  return b;
}
// Partial sums of one (chunk, head, value tile): M̄, T̄ [C][C]; Q̃̄, K̂̄, Ã̄ [C][K]; ρ [K].
struct Part {
  float *Mb, *Tb, *Qtb, *Khb, *Atb, *rho;
};
QED_HD inline int64_t part_floats(int64_t K) { return 2 * kC * kC + 3 * kC * K + K; }
QED_HD inline Part part_at(const BwdArgs& A, int64_t gc, int64_t h, int64_t vt) {
  float* p = A.part + ((gc * A.H + h) * A.n_vt + vt) * part_floats(A.K);
  const int64_t CK = kC * A.K;
  Part q;
  q.Mb = p;
  q.Tb = p + kC * kC;
  q.Qtb = q.Tb + kC * kC;
  q.Khb = q.Qtb + CK;
  q.Atb = q.Khb + CK;
  q.rho = q.Atb + CK;
  return q;
}
QED_HD inline int64_t part_stride(const BwdArgs& A) { return part_floats(A.K); }

// Shared memory (floats) of each block kind.
// Rows of the [C][K] and [K][kVT] tiles in shared memory are padded by one float: threads that
// walk down a column (one row per thread) then hit 32 different banks instead of one.
QED_HD inline int64_t tile_ld(int64_t K) { return K + 1; }
constexpr int kVP = kVT + 1;  // row stride of state_block's tiles
QED_HD inline int64_t prep_smem_floats(int64_t K) { return 4 * kC * tile_ld(K) + 2 * kC * kC + kC; }
// chunk_block: q, k, a, G; T̄, M̄; coef, ρ; and Ḡ', K̂̄ [C][K] unpadded (read along rows).
QED_HD inline int64_t chunk_smem_floats(int64_t K) {
  return 4 * kC * tile_ld(K) + 2 * kC * kC + kC + K + 2 * kC * K;
}
QED_HD inline int64_t state_smem_floats(int64_t K) { return (3 * K + 4 * kC) * kVP; }
constexpr int kReduceGroups = 256;
QED_HD inline int64_t reduce_smem_floats() { return kReduceGroups; }

// ---- sequences and chunks ----

struct Span {
  int64_t brow, bos, len;
};
QED_HD inline Span seq_span(const BwdArgs& A, int64_t n) {
  if (!A.cu) return {n, 0, A.T};
  int64_t s = A.cu[n], e = A.cu[n + 1];
  s = s < 0 ? 0 : (s > A.T ? A.T : s);
  e = e < s ? s : (e > A.T ? A.T : e);
  return {0, s, e - s};
}
QED_HD inline int64_t first_chunk(const BwdArgs& A, int64_t n) {
  return A.cu ? A.chunk_base[n] : n * A.chunks_per_seq;
}
// The sequence and local index of global chunk gc; false when gc is no chunk.
QED_HD inline bool locate_chunk(const BwdArgs& A, int64_t gc, int64_t& seq, int64_t& loc) {
  if (!A.cu) {
    if (A.chunks_per_seq <= 0) return false;
    seq = gc / A.chunks_per_seq;
    loc = gc % A.chunks_per_seq;
    return seq < A.N;
  }
  if (gc >= A.chunk_base[A.N] || gc >= A.chunk_bound) return false;
  int64_t lo = 0, hi = A.N;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (A.chunk_base[mid] <= gc) lo = mid; else hi = mid;
  }
  seq = lo;
  loc = gc - A.chunk_base[lo];
  return true;
}

// ---- executors ----

// CPU: every index of a range, in the order `mode` picks (0 ascending, 1 descending, 2 a fixed
// stride permutation). sync() is a no-op: a range finishes before the next starts.
struct SerialExec {
  int mode = 0;
  template <class F>
  void for_each(int64_t n, F&& f) const {
    if (mode == 1) {
      for (int64_t i = n - 1; i >= 0; --i) f(i);
    } else if (mode == 2) {
      int64_t s = 7;
      while (n > 1 && gcd(s, n) != 1) ++s;
      for (int64_t i = 0, j = 0; i < n; ++i, j = (j + s) % n) f(j);
    } else {
      for (int64_t i = 0; i < n; ++i) f(i);
    }
  }
  void sync() const {}
  static int64_t gcd(int64_t a, int64_t b) { return b == 0 ? a : gcd(b, a % b); }
};

// ---- staging: one chunk's q, k, a, G in (shared) memory ----

struct ChunkTiles {
  float *q, *k, *a, *G;  // [C][K] each, row stride ld = tile_ld(K)
  int64_t ld;
  float* coef;           // [C]: (k.m)/(k.k) for projected QED arms, else 0
  int64_t brow, t0, h;
  int n;                 // rows of the chunk (<= C)
};

QED_HD inline float m_value(const BwdArgs& A, const ChunkTiles& s, int r, int c, float bval) {
  const int64_t K = A.K;
  if (A.arm == kArmFull) return bval * s.q[r * s.ld + c];
  if (A.arm == kArmRand) return bval * A.r[s.h * K + c];
  return s.q[r * s.ld + c];
}

// Loads q, k, raw g and b (beta broadcast for kda, gdn, deltanet) and forms G (in-chunk cumulative
// log-decay, fp32 sums of non-positive terms, so G is non-increasing and every G_r - G_j, j <= r,
// is <= 0) and the erase vectors a (MATH.md §2) in place of b.
template <class Ex>
QED_HD void stage_chunk(const Ex& ex, const BwdArgs& A, ChunkTiles& s) {
  const int64_t K = A.K;
  const int n = s.n;
  const bool chan_bw = A.variant == kGdn2 || A.variant == kQed;
  const bool chan_g = chan_bw || A.variant == kKda;
  ex.for_each(n * K, [&](int64_t i) {
    const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
    const int64_t t = s.t0 + r, e = r * s.ld + c;
    s.q[e] = ld(A.q, s.brow, t, s.h, c);
    s.k[e] = ld(A.k, s.brow, t, s.h, c);
    s.a[e] = chan_bw ? ld(A.b, s.brow, t, s.h, c) : ld(A.beta, s.brow, t, s.h, 0);
    s.G[e] = A.variant == kDeltanet ? 0.f : ld(A.g, s.brow, t, s.h, chan_g ? c : 0);
  });
  ex.sync();
  ex.for_each(K, [&](int64_t c) {
    float acc = 0.f;
    for (int r = 0; r < n; ++r) {
      acc += s.G[r * s.ld + c];
      s.G[r * s.ld + c] = acc;
    }
  });
  const bool qed = A.variant == kQed;
  const bool projected = qed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  const float lam = qed ? A.lambda[s.h] : 0.f;
  ex.for_each(n, [&](int64_t r) {
    float nn = 0.f, km = 0.f;
    if (projected)
      for (int c = 0; c < K; ++c) {
        const float kk = s.k[r * s.ld + c];
        nn = fmaf(kk, kk, nn);
        km = fmaf(kk, m_value(A, s, static_cast<int>(r), c, s.a[r * s.ld + c]), km);
      }
    s.coef[r] = (projected && nn > 0.f) ? km / nn : 0.f;
  });
  ex.sync();
  ex.for_each(n * K, [&](int64_t i) {
    const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
    const int64_t e = r * s.ld + c;
    const float bb = s.a[e], kk = s.k[e];
    float av = bb * kk;
    if (qed) av = fmaf(lam, m_value(A, s, r, c, bb) - s.coef[r] * kk, av);
    s.a[e] = av;
  });
  ex.sync();
}

// ---- A: state-independent chunk intermediates ----

// z_j = w_j ⊙ v_j (gdn2, qed) or beta_j v_j, one element.
QED_HD inline float z_value(const BwdArgs& A, const ChunkTiles& s, int j, int64_t v) {
  const int64_t t = s.t0 + j;
  const bool chan_bw = A.variant == kGdn2 || A.variant == kQed;
  const float wv = chan_bw ? ld(A.w, s.brow, t, s.h, v) : ld(A.beta, s.brow, t, s.h, 0);
  return wv * ld(A.v, s.brow, t, s.h, v);
}

// The last step of prep_block, W_a = L Ã and W_z = L Z into the blob, as scalar loops (the CPU
// and the scalar GPU path; chunked_backward.cu has a tensor-core version). s.a holds Ã.
struct ScalarPrepProducts {
  template <class Ex>
  QED_HD void operator()(const Ex& ex, const BwdArgs& A, const ChunkTiles& s, const float* Lm,
                         const Blob& bl) const {
    const int n = s.n;
    const int64_t K = A.K, V = A.V;
    ex.for_each(n * K, [&](int64_t i) {
      const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
      float acc = 0.f;
      for (int j = 0; j <= r; ++j) acc = fmaf(Lm[r * kC + j], s.a[j * s.ld + c], acc);
      bl.Wa[i] = acc;
    });
    ex.for_each(n * V, [&](int64_t i) {
      const int r = static_cast<int>(i / V), v = static_cast<int>(i % V);
      float acc = 0.f;
      for (int j = 0; j <= r; ++j) acc = fmaf(Lm[r * kC + j], z_value(A, s, j, v), acc);
      bl.Wz[i] = acc;
    });
  }
};

// One entry (r, j) of T and M with pairwise exponents (zero above the diagonal).
QED_HD inline void tm_entry(const ChunkTiles& s, int64_t K, int r, int j, float* Tm, const Blob& bl) {
  float tv = 0.f, mv = 0.f;
  if (j <= r)
    for (int c = 0; c < K; ++c) {
      const float kd = s.k[j * s.ld + c] * expf(s.G[r * s.ld + c] - s.G[j * s.ld + c]);
      tv = fmaf(s.a[r * s.ld + c], kd, tv);
      mv = fmaf(s.q[r * s.ld + c], kd, mv);
    }
  Tm[r * kC + j] = j < r ? tv : 0.f;
  bl.M[r * kC + j] = j <= r ? mv : 0.f;
}
// The first step of prep_block: T (strictly lower, into Tm in shared memory) and M (lower with
// the diagonal, into the blob), every entry of the n x n squares, with pairwise exponents <= 0.
// Scalar loops (the CPU and QEDCHECK_CHUNKED_BWD_SCALAR=1; chunked_backward.cu has a tensor-core
// version).
struct ScalarPrepTM {
  template <class Ex>
  QED_HD void operator()(const Ex& ex, const BwdArgs& A, const ChunkTiles& s, float* Tm, const Blob& bl) const {
    const int n = s.n;
    ex.for_each(n * n, [&](int64_t i) {
      tm_entry(s, A.K, static_cast<int>(i / n), static_cast<int>(i % n), Tm, bl);
    });
  }
};

template <class Ex, class Products = ScalarPrepProducts, class TM = ScalarPrepTM>
QED_HD void prep_block(const Ex& ex, const BwdArgs& A, int64_t gc, int64_t h, float* sm,
                       const Products& products = Products{}, const TM& tm = TM{}) {
  int64_t seq = 0, loc = 0;
  if (!locate_chunk(A, gc, seq, loc)) return;
  const Span sp = seq_span(A, seq);
  const int64_t rem = sp.len - loc * kC;
  if (rem <= 0) return;
  const int64_t K = A.K;
  ChunkTiles s;
  s.ld = tile_ld(K);
  s.q = sm;
  s.k = s.q + kC * s.ld;
  s.a = s.k + kC * s.ld;
  s.G = s.a + kC * s.ld;
  float* Tm = s.G + kC * s.ld;  // [C][C]
  float* Lm = Tm + kC * kC;  // [C][C]
  s.coef = Lm + kC * kC;
  s.brow = sp.brow;
  s.t0 = sp.bos + loc * kC;
  s.h = h;
  s.n = rem < kC ? static_cast<int>(rem) : kC;
  const int n = s.n;
  stage_chunk(ex, A, s);
  const Blob bl = blob_at(A, gc, h);
  tm(ex, A, s, Tm, bl);
  ex.sync();
  // L = (I + T)^-1, one column per index: forward substitution down the column.
  ex.for_each(n, [&](int64_t col) {
    for (int r = 0; r < n; ++r) {
      float l;
      if (r < col) {
        l = 0.f;
      } else if (r == col) {
        l = 1.f;
      } else {
        float acc = 0.f;
        for (int j = static_cast<int>(col); j < r; ++j) acc = fmaf(Tm[r * kC + j], Lm[j * kC + col], acc);
        l = -acc;
      }
      Lm[r * kC + col] = l;
      bl.L[r * kC + col] = l;
    }
  });
  ex.sync();
  // Ã = A⊙Γ (also in place of a in shared memory), Q̃ = Q⊙Γ, K̂ = K⊙exp(G_n - G), γ_n.
  ex.for_each(n * K, [&](int64_t i) {
    const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
    const int64_t e = r * s.ld + c;
    const float gam = expf(s.G[e]);
    const float at = s.a[e] * gam;
    bl.At[i] = at;
    s.a[e] = at;
    bl.Qt[i] = s.q[e] * gam;
    bl.Kh[i] = s.k[e] * expf(s.G[(n - 1) * s.ld + c] - s.G[e]);
  });
  ex.for_each(K, [&](int64_t c) { bl.gl[c] = expf(s.G[(n - 1) * s.ld + c]); });
  ex.sync();
  products(ex, A, s, Lm, bl);
}

// ---- B: the reverse sweep over the chunks of one lane, one tile of value columns ----

template <class Ex>
QED_HD void state_block(const Ex& ex, const BwdArgs& A, int64_t seq, int64_t h, int vt, float* sm) {
  const int64_t K = A.K, V = A.V;
  const int64_t v0 = static_cast<int64_t>(vt) * kVT;
  const int vw = static_cast<int>(V - v0 < kVT ? V - v0 : kVT);
  if (vw <= 0) return;
  float* S = sm;             // [K][kVP] chunk-start state S_[n] (kVT columns used)
  float* Sh = S + K * kVP;   // adjoint Ŝ' of the chunk-end state
  float* Shn = Sh + K * kVP; // adjoint Ŝ of the chunk-start state
  float* O = Shn + K * kVP;  // [C][kVP] Ō
  float* U = O + kC * kVP;   // U
  float* Ub = U + kC * kVP;  // Ū
  float* Y = Ub + kC * kVP;  // Ȳ = Z̄
  const Span sp = seq_span(A, seq);
  const int64_t c0 = first_chunk(A, seq);
  int64_t nch = (sp.len + kC - 1) / kC;
  if (c0 + nch > A.chunk_bound) nch = A.chunk_bound - c0 > 0 ? A.chunk_bound - c0 : 0;
  const float s = A.scale;
  ex.for_each(K * vw, [&](int64_t i) {
    const int64_t c = i / vw, v = i % vw;
    Sh[c * kVP + v] = A.dht ? A.dht[seq * A.dht_sn + h * A.dht_sh + c * A.dht_sk + v0 + v] : 0.f;
  });
  ex.sync();
  for (int64_t ci = nch - 1; ci >= 0; --ci) {
    const int64_t gc = c0 + ci;
    const int64_t rem = sp.len - ci * kC;
    const int n = rem < kC ? static_cast<int>(rem) : kC;
    const int64_t t0 = sp.bos + ci * kC;
    const Blob bl = blob_at(A, gc, h);
    const Part pt = part_at(A, gc, h, vt);
    const float* Sg = A.cs + (gc * A.H + h) * K * V;
    ex.for_each(K * vw, [&](int64_t i) {
      const int64_t c = i / vw, v = i % vw;
      S[c * kVP + v] = Sg[c * V + v0 + v];
    });
    ex.for_each(n * vw, [&](int64_t i) {
      const int64_t r = i / vw, v = i % vw;
      O[r * kVP + v] = ld(A.dout, sp.brow, t0 + r, h, v0 + v);
    });
    ex.sync();
    // U = W_z - W_a S (4.3); Ū = s Mᵀ Ō + K̂ Ŝ' (§6.1).
    ex.for_each(n * vw, [&](int64_t i) {
      const int r = static_cast<int>(i / vw), v = static_cast<int>(i % vw);
      float acc = 0.f;
      for (int c = 0; c < K; ++c) acc = fmaf(bl.Wa[r * K + c], S[c * kVP + v], acc);
      U[r * kVP + v] = bl.Wz[r * V + v0 + v] - acc;
      float mo = 0.f, ks = 0.f;
      for (int r2 = r; r2 < n; ++r2) mo = fmaf(bl.M[r2 * kC + r], O[r2 * kVP + v], mo);
      for (int c = 0; c < K; ++c) ks = fmaf(bl.Kh[r * K + c], Sh[c * kVP + v], ks);
      Ub[r * kVP + v] = fmaf(s, mo, ks);
    });
    ex.sync();
    // Ȳ = Lᵀ Ū (the chunk's Z̄); partials M̄ = s tril(Ō Uᵀ), Q̃̄ = s Ō Sᵀ, K̂̄ = U Ŝ'ᵀ and
    // ρ_S = rowsum(Ŝ'⊙S_[n]) (see chunk_block for why S_[n] and not S_[n+1]).
    ex.for_each(n * vw, [&](int64_t i) {
      const int j = static_cast<int>(i / vw), v = static_cast<int>(i % vw);
      float acc = 0.f;
      for (int r = j; r < n; ++r) acc = fmaf(bl.L[r * kC + j], Ub[r * kVP + v], acc);
      Y[j * kVP + v] = acc;
      A.tok_v[(((sp.brow * A.T) + t0 + j) * A.H + h) * V + v0 + v] = acc;
    });
    ex.for_each(n * n, [&](int64_t i) {
      const int r = static_cast<int>(i / n), j = static_cast<int>(i % n);
      float acc = 0.f;
      if (j <= r)
        for (int v = 0; v < vw; ++v) acc = fmaf(O[r * kVP + v], U[j * kVP + v], acc);
      pt.Mb[r * kC + j] = s * acc;
    });
    ex.for_each(n * K, [&](int64_t i) {
      const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
      float qa = 0.f, ka = 0.f;
      for (int v = 0; v < vw; ++v) {
        qa = fmaf(O[r * kVP + v], S[c * kVP + v], qa);
        ka = fmaf(U[r * kVP + v], Sh[c * kVP + v], ka);
      }
      pt.Qtb[r * K + c] = s * qa;
      pt.Khb[r * K + c] = ka;
    });
    ex.for_each(K, [&](int64_t c) {
      float acc = 0.f;
      for (int v = 0; v < vw; ++v) acc = fmaf(Sh[c * kVP + v], S[c * kVP + v], acc);
      pt.rho[c] = acc;
    });
    ex.sync();
    // Ŝ_[n] = s Q̃ᵀ Ō + Diag(γ_n) Ŝ' − Ãᵀ Ȳ; partials T̄ = −stril(Ȳ Uᵀ), Ã̄ = −Ȳ Sᵀ.
    ex.for_each(K * vw, [&](int64_t i) {
      const int c = static_cast<int>(i / vw), v = static_cast<int>(i % vw);
      float qo = 0.f, ay = 0.f;
      for (int r = 0; r < n; ++r) {
        qo = fmaf(bl.Qt[r * K + c], O[r * kVP + v], qo);
        ay = fmaf(bl.At[r * K + c], Y[r * kVP + v], ay);
      }
      Shn[c * kVP + v] = fmaf(s, qo, bl.gl[c] * Sh[c * kVP + v]) - ay;
    });
    ex.for_each(n * n, [&](int64_t i) {
      const int r = static_cast<int>(i / n), j = static_cast<int>(i % n);
      float acc = 0.f;
      if (j < r)
        for (int v = 0; v < vw; ++v) acc = fmaf(Y[r * kVP + v], U[j * kVP + v], acc);
      pt.Tb[r * kC + j] = -acc;
    });
    ex.for_each(n * K, [&](int64_t i) {
      const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
      float acc = 0.f;
      for (int v = 0; v < vw; ++v) acc = fmaf(Y[r * kVP + v], S[c * kVP + v], acc);
      pt.Atb[r * K + c] = -acc;
    });
    ex.sync();
    ex.for_each(K * vw, [&](int64_t i) {
      const int64_t c = i / vw, v = i % vw;
      Sh[c * kVP + v] = Shn[c * kVP + v];
    });
    ex.sync();
  }
  ex.for_each(K * vw, [&](int64_t i) {
    const int64_t c = i / vw, v = i % vw;
    A.dh0[seq * A.dh0_sn + h * A.dh0_sh + c * A.dh0_sk + v0 + v] = Sh[c * kVP + v];
  });
}

// ---- C: through the decay factors (§6.2) and the decay gradient (§6.3) ----

// §6.2's sums over the pairs (r, j) whose rows lie in different 16-row blocks, the part a GPU
// can do as matrix products (chunked_backward.cu: tensor cores, with one reference row between
// the blocks so that both decay factors are <= 1). For r in block I >= 1 and every c,
//   ā°_r = Σ_{j < 16I} T̄_rj k_j E_rj,  q̄°_r = Σ_{j < 16I} M̄_rj k_j E_rj   (into ab, qb)
// and for j in block J with 16(J+1) < n,
//   k̄°_j = Σ_{r >= 16(J+1)} (T̄_rj a_r + M̄_rj q_r) E_rj                    (into kb)
// with E_rj = exp(G_r - G_j). chunk_block adds the pairs inside a block. This version: scalar
// loops with pairwise exponents (the CPU emulation and QEDCHECK_CHUNKED_BWD_SCALAR=1).
struct ScalarOffDiag {
  template <class Ex, class Tok>
  QED_HD void operator()(const Ex& ex, const BwdArgs& A, const ChunkTiles& s, const float* Tb, const float* Mb,
                         const Tok& tok, float* ab_t, float* qb_t, float* kb_t) const {
    const int n = s.n;
    const int64_t K = A.K;
    ex.for_each(n * K, [&](int64_t i) {
      const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
      const int lo = r / 16 * 16, hi = lo + 16;
      const float Gr = s.G[r * s.ld + c];
      if (lo > 0) {
        float ab = 0.f, qb = 0.f;
        for (int j = 0; j < lo; ++j) {
          const float kd = s.k[j * s.ld + c] * expf(Gr - s.G[j * s.ld + c]);
          ab = fmaf(Tb[r * kC + j], kd, ab);
          qb = fmaf(Mb[r * kC + j], kd, qb);
        }
        ab_t[tok(r) + c] = ab;
        qb_t[tok(r) + c] = qb;
      }
      if (hi < n) {
        float kb = 0.f;
        for (int r2 = hi; r2 < n; ++r2) {
          const float x = fmaf(Tb[r2 * kC + r], s.a[r2 * s.ld + c], Mb[r2 * kC + r] * s.q[r2 * s.ld + c]);
          kb = fmaf(x, expf(s.G[r2 * s.ld + c] - Gr), kb);
        }
        kb_t[tok(r) + c] = kb;
      }
    });
  }
};

template <class Ex, class OffDiag = ScalarOffDiag>
QED_HD void chunk_block(const Ex& ex, const BwdArgs& A, int64_t gc, int64_t h, float* sm,
                        const OffDiag& off_diag = OffDiag{}) {
  int64_t seq = 0, loc = 0;
  if (!locate_chunk(A, gc, seq, loc)) return;
  const Span sp = seq_span(A, seq);
  const int64_t rem = sp.len - loc * kC;
  if (rem <= 0) return;
  const int64_t K = A.K;
  ChunkTiles s;
  s.ld = tile_ld(K);
  s.q = sm;
  s.k = s.q + kC * s.ld;
  s.a = s.k + kC * s.ld;
  s.G = s.a + kC * s.ld;
  float* Tb = s.G + kC * s.ld;  // [C][C]
  float* Mb = Tb + kC * kC;  // [C][C]
  s.coef = Mb + kC * kC;
  float* rho = s.coef + kC;  // [K]
  float* Gs = rho + K;        // [C][K] Ḡ'_r, then its suffix sums
  float* Kk = Gs + kC * K;    // [C][K] K̂̄ summed over the value tiles
  s.brow = sp.brow;
  s.t0 = sp.bos + loc * kC;
  s.h = h;
  s.n = rem < kC ? static_cast<int>(rem) : kC;
  const int n = s.n;
  stage_chunk(ex, A, s);
  const int nvt = A.n_vt;
  const Part p0 = part_at(A, gc, h, 0);
  const int64_t ps = part_stride(A);  // the tiles of one (chunk, head) are consecutive
  ex.for_each(n * n, [&](int64_t i) {
    const int r = static_cast<int>(i / n), j = static_cast<int>(i % n);
    float t = 0.f, m = 0.f;
    for (int vt = 0; vt < nvt; ++vt) {
      t += p0.Tb[vt * ps + r * kC + j];
      m += p0.Mb[vt * ps + r * kC + j];
    }
    Tb[r * kC + j] = t;
    Mb[r * kC + j] = m;
  });
  ex.for_each(K, [&](int64_t c) {
    float acc = 0.f;
    for (int vt = 0; vt < nvt; ++vt) acc += p0.rho[vt * ps + c];
    rho[c] = A.mutant == kMutantNoDecayRho ? 0.f : acc;
  });
  ex.sync();
  const int64_t HK = A.H * K, BTHK = A.B * A.T * HK;
  float* abar_t = A.tok_k;
  float* qbar_t = A.tok_k + BTHK;
  float* kbar_t = A.tok_k + 2 * BTHK;
  float* gbar_t = A.tok_k + 3 * BTHK;
  auto tok = [&](int r) { return ((s.brow * A.T) + s.t0 + r) * HK + h * K; };
  auto khb = [&](int r, int64_t c) {  // K̂̄ summed over the value tiles, in tile order
    float x = 0.f;
    for (int vt = 0; vt < nvt; ++vt) x += p0.Khb[vt * ps + r * K + c];
    return x;
  };
  // §6.2. Besides ā, q̄, k̄ (stored for the token VJPs), each element leaves its row term of the
  // decay gradient, Ḡ'_r = a⊙ā + q⊙q̄° − k⊙k̄°, in gbar_t, where q̄°, k̄° omit the diagonal M̄_rr
  // terms (their contributions q_r M̄_rr k_r and k_r M̄_rr q_r cancel exactly) and k̄° the K̂̄
  // term (handled with ρ below). What remains are products with decays exp(G_r - G_j), j < r,
  // and γ_r, so no O(1) terms cancel when the true ḡ is tiny (g = -20: ḡ ~ e^-20).
  off_diag(ex, A, s, Tb, Mb, tok, abar_t, qbar_t, kbar_t);
  ex.sync();
  ex.for_each(n * K, [&](int64_t i) {
    const int r = static_cast<int>(i / K), c = static_cast<int>(i % K);
    const float Gr = s.G[r * s.ld + c];
    const int lo = r / 16 * 16, hi = lo + 16 < n ? lo + 16 : n;
    float ab = lo > 0 ? abar_t[tok(r) + c] : 0.f, qb = lo > 0 ? qbar_t[tok(r) + c] : 0.f;
    float kb = lo + 16 < n ? kbar_t[tok(r) + c] : 0.f;
    for (int j = lo; j < r; ++j) {  // row r: ā and q̄ from columns j < r of its block
      const float kd = s.k[j * s.ld + c] * expf(Gr - s.G[j * s.ld + c]);
      ab = fmaf(Tb[r * kC + j], kd, ab);
      qb = fmaf(Mb[r * kC + j], kd, qb);
    }
    for (int r2 = r + 1; r2 < hi; ++r2) {  // column r: k̄ from rows r2 > r of its block
      const float x = fmaf(Tb[r2 * kC + r], s.a[r2 * s.ld + c], Mb[r2 * kC + r] * s.q[r2 * s.ld + c]);
      kb = fmaf(x, expf(s.G[r2 * s.ld + c] - Gr), kb);
    }
    float at = 0.f, qt = 0.f;
    for (int vt = 0; vt < nvt; ++vt) {
      at += p0.Atb[vt * ps + r * K + c];
      qt += p0.Qtb[vt * ps + r * K + c];
    }
    const float gam = expf(Gr);
    ab = fmaf(at, gam, ab);
    qb = fmaf(qt, gam, qb);
    const int64_t e = r * s.ld + c;
    const float o = s.a[e] * ab + s.q[e] * qb - s.k[e] * kb;
    const float mrr = Mb[r * kC + r];
    float kfull = fmaf(mrr, s.q[e], kb);
    const float kh = khb(r, c);
    if (A.mutant != kMutantNoKhatGrad) kfull = fmaf(kh, expf(s.G[(n - 1) * s.ld + c] - Gr), kfull);
    abar_t[tok(r) + c] = ab;
    qbar_t[tok(r) + c] = fmaf(mrr, s.k[e], qb);
    kbar_t[tok(r) + c] = kfull;
    Gs[r * K + c] = o;
    Kk[r * K + c] = kh;
  });
  ex.sync();
  // §6.3: ḡ_i = ρ + Σ_{r>=i} Ḡ_r with ρ = rowsum(Ŝ'⊙S_[n+1]) and Ḡ_r ∋ −K̂_r⊙K̂̄_r. Since
  // S_[n+1] = Diag(γ_n) S_[n] + K̂ᵀU and K̂̄ = U Ŝ'ᵀ, ρ = γ_n⊙rowsum(Ŝ'⊙S_[n]) + Σ_j K̂_j⊙K̂̄_j, so
  //   ḡ_i = γ_n⊙ρ_S + Σ_{j<i} K̂_j⊙K̂̄_j + Σ_{r>=i} Ḡ'_r       (same value, no cancelling terms).
  // (Shared memory, not the token arrays, carries the two sequential sums: a chain of dependent
  // global reads and writes per channel cost more than the rest of the block.)
  ex.for_each(K, [&](int64_t c) {
    float acc = 0.f;
    for (int r = n - 1; r >= 0; --r) {  // suffix sums of Ḡ'
      acc += Gs[r * K + c];
      Gs[r * K + c] = acc;
    }
    const float Gn = s.G[(n - 1) * s.ld + c];
    float pre = rho[c] * expf(Gn);
    for (int r = 0; r < n; ++r) {
      gbar_t[tok(r) + c] = Gs[r * K + c] + pre;
      pre = fmaf(s.k[r * s.ld + c] * expf(Gn - s.G[r * s.ld + c]), Kk[r * K + c], pre);
    }
  });
}

// ---- D: token-level VJPs (§5.2, z = w⊙v) and the variant mapping ----

// Lane sums of a token item on one thread (the CPU): nothing to add.
struct SoloSum {
  QED_HD float operator()(float x) const { return x; }
};

// One (token, head) item, item = bt * H + h over all B*T tokens, on a group of nl lanes: lane l
// takes channels l, l + nl, ... (so a warp reads and writes whole rows, coalesced), `sum` totals a
// per-lane value over the group, the same total on every lane in a fixed order (SoloSum on the
// CPU, a warp butterfly on the GPU). Per-item scalars are stored by lane 0.
template <class Sum>
QED_HD inline void token_item(const BwdArgs& A, int64_t item, int lane, int nl, const Sum& sum) {
  const int64_t K = A.K, V = A.V, H = A.H;
  const int64_t bt = item / H, h = item % H;
  const int64_t brow = bt / A.T, t = bt % A.T;
  const int64_t BTHK = A.B * A.T * H * K;
  const float* abar = A.tok_k + item * K;
  const float* qbar = A.tok_k + BTHK + item * K;
  const float* kbar = A.tok_k + 2 * BTHK + item * K;
  const float* gbar = A.tok_k + 3 * BTHK + item * K;
  const float* zbar = A.tok_v + item * V;
  const bool qed = A.variant == kQed;
  const bool projected = qed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  const bool chan_bw = A.variant == kGdn2 || qed;
  const bool chan_g = chan_bw || A.variant == kKda;
  const float lam = qed ? A.lambda[h] : 0.f;
  const float beta = chan_bw ? 0.f : ld(A.beta, brow, t, h, 0);
  auto bval = [&](int64_t c) { return chan_bw ? ld(A.b, brow, t, h, c) : beta; };
  auto mval = [&](int64_t c) {
    if (A.arm == kArmFull) return bval(c) * ld(A.q, brow, t, h, c);
    if (A.arm == kArmRand) return bval(c) * A.r[h * K + c];
    return ld(A.q, brow, t, h, c);
  };
  float nn = 0.f, km = 0.f, ee = 0.f;
  if (qed) {
    for (int64_t c = lane; c < K; c += nl) {
      const float kk = ld(A.k, brow, t, h, c);
      nn = fmaf(kk, kk, nn);
      km = fmaf(kk, mval(c), km);
      ee = fmaf(kk, abar[c], ee);
    }
    nn = sum(nn), km = sum(km), ee = sum(ee);
  }
  const bool proj = projected && nn > 0.f;
  const float f = proj ? km / nn : 0.f;
  float dl = 0.f, dbsum = 0.f, dgsum = 0.f;
  for (int64_t c = lane; c < K; c += nl) {
    const float kk = ld(A.k, brow, t, h, c), bb = bval(c), ab = abar[c];
    float dq = qbar[c];
    float dk = fmaf(ab, bb, kbar[c]);
    float db = ab * kk;
    if (qed) {
      const float m = mval(c);
      dl = fmaf(ab, m - f * kk, dl);
      float mbar = lam * ab;
      if (proj) {
        mbar = lam * (ab - kk * (ee / nn));
        if (A.mutant != kMutantNoProjGrad)
          dk -= lam * (f * ab + (ee / nn) * m - 2.f * f * (ee / nn) * kk);
      }
      if (A.arm == kArmFull) {
        dq = fmaf(mbar, bb, dq);
        db = fmaf(mbar, ld(A.q, brow, t, h, c), db);
      } else if (A.arm == kArmRand) {
        db = fmaf(mbar, A.r[h * K + c], db);
        A.dr_tok[item * K + c] = mbar * bb;
      } else {
        dq += mbar;
      }
    }
    st(A.dq, brow, t, h, c, dq);
    st(A.dk, brow, t, h, c, dk);
    if (chan_g) st(A.dg, brow, t, h, c, gbar[c]);
    if (chan_bw) st(A.db, brow, t, h, c, db);
    dbsum += db;
    dgsum += gbar[c];
  }
  if (qed) dl = sum(dl);
  if (A.variant == kGdn) dgsum = sum(dgsum);
  if (!chan_bw) dbsum = sum(dbsum);
  if (qed && lane == 0) A.dlam_tok[item] = dl;
  if (A.variant == kGdn && lane == 0) st(A.dg, brow, t, h, 0, dgsum);
  float svz = 0.f;
  for (int64_t j = lane; j < V; j += nl) {
    const float zb = zbar[j], vv = ld(A.v, brow, t, h, j);
    if (chan_bw) {
      st(A.dv, brow, t, h, j, ld(A.w, brow, t, h, j) * zb);
      st(A.dw, brow, t, h, j, vv * zb);
    } else {
      st(A.dv, brow, t, h, j, beta * zb);
      svz = fmaf(vv, zb, svz);
    }
  }
  if (!chan_bw) {
    svz = sum(svz);
    if (lane == 0) st(A.dbeta, brow, t, h, 0, dbsum + svz);
  }
}

// ---- E: per-head sums over tokens, fixed order ----

// out[h*D + c] = sum over bt of tok[(bt*H + h)*D + c], in two levels so that the work spreads
// over many blocks (one block per head walked B*T*D values alone: milliseconds for dr, D = K):
//  1. head_reduce_parts, block (p, h) of P = reduce_parts(BT): the tokens [p S, (p+1) S),
//     S = ceil(BT / P), kReduceGroups/D groups striding them, the groups added in order, into
//     part[(p*H + h)*D + c] (reduce_part_floats(BT, H, D) floats); scratch: reduce_smem_floats();
//  2. head_reduce_final, block h: the P parts added in order.
// P depends on BT alone, so the order, and the result, are the same on every machine.
QED_HD inline int64_t reduce_parts(int64_t BT) {
  const int64_t p = (BT + 127) / 128;
  return p < 1 ? 1 : (p > 1024 ? 1024 : p);
}
QED_HD inline int64_t reduce_part_floats(int64_t BT, int64_t H, int D) { return reduce_parts(BT) * H * D; }

template <class Ex>
QED_HD void head_reduce_parts(const Ex& ex, const float* tok, int64_t BT, int64_t H, int D,
                              int64_t h, int64_t p, float* part, float* scratch) {
  const int64_t P = reduce_parts(BT), S = (BT + P - 1) / P;
  const int64_t lo = p * S, hi = lo + S < BT ? lo + S : BT;
  const int G = kReduceGroups / D > 0 ? kReduceGroups / D : 1;
  ex.for_each(static_cast<int64_t>(G) * D, [&](int64_t i) {
    const int g = static_cast<int>(i / D), c = static_cast<int>(i % D);
    float a = 0.f;
    for (int64_t bt = lo + g; bt < hi; bt += G) a += tok[(bt * H + h) * D + c];
    scratch[i] = a;
  });
  ex.sync();
  ex.for_each(D, [&](int64_t c) {
    float a = 0.f;
    for (int g = 0; g < G; ++g) a += scratch[g * D + c];
    part[(p * H + h) * D + c] = a;
  });
}

template <class Ex>
QED_HD void head_reduce_final(const Ex& ex, const float* part, int64_t BT, int64_t H, int D,
                              int64_t h, float* out) {
  const int64_t P = reduce_parts(BT);
  ex.for_each(D, [&](int64_t c) {
    float a = 0.f;
    for (int64_t p = 0; p < P; ++p) a += part[(p * H + h) * D + c];
    out[h * D + c] = a;
  });
}

}  // namespace qed::kernels::chunked_bwd
