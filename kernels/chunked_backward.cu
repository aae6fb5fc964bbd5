// Chunked backward (kernels/chunked_api.hpp): argument checks, workspace, and the launches of
// the block functions of kernels/chunked_backward_tile.hpp, each a thin __global__ wrapper that
// passes its block coordinates, its dynamic shared memory and BlockExec (threads stride over an
// index range; sync = __syncthreads). The same functions run on the CPU in
// properties/test_chunked_backward_tiles.cpp.
//
// Accuracy contract (properties/test_gpu_chunked_backward.cpp): against the double recurrent
// reference on the inputs the kernel consumed, every gradient X has
//   relF(X) <= 8 max(relF_twin32(X), relF_rec32(X)) + 2e-6          (fp32 inputs)
// with twin32 = reference::chunked_backward<float> (C = 64, operands none) and rec32 = the float
// recurrence (the CPU run of the same block functions on reference chunk states passes 4x + 1e-6,
// properties/test_chunked_backward_tiles.cpp); bf16 inputs take the larger of that and
//   2 relF_twinbf16(X)                                               (bf16 inputs)
// with twinbf16 = the same twin with every matmul operand rounded to bf16 (the README's default
// rule for bf16 candidates): with bf16 inputs the products carry 16 of fp32's 24 bits (two split
// terms), far more than the inputs' own 8, and the rest is fp32.
//
// Speed: the matrix products (the reverse state sweep, W_a and W_z, the off-diagonal blocks of T,
// M and of §6.2's decay-factor sums) run on tensor cores as split-bf16 products with three terms
// per operand for fp32 inputs (fp32-faithful, kernels/chunked_backward_mma.cuh) and two for bf16
// inputs (QEDCHECK_CHUNKED_BWD_TERMS=1|2|3 overrides); the diagonal 16 x 16 blocks with
// their pairwise exponents, the forward substitution for L and the token VJPs stay on CUDA cores.
// The passes still hand fp32 matrices through a large workspace (6.8 GB at [8,4096,16,128]);
// fusing them is the next step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/chunked_api.hpp"
#include "kernels/chunked_backward_mma.cuh"
#include "kernels/chunked_backward_tile.hpp"
#include "kernels/chunked_bwd_grads.hpp"
#include "kernels/chunked_common.cuh"

namespace qed::kernels {
namespace cb = chunked_bwd;

namespace {

constexpr int kThreadsBwd = 256;

struct BlockExec {
  template <class F>
  __host__ __device__ void for_each(int64_t n, F&& f) const {
#ifdef __CUDA_ARCH__
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(i);
#else
    (void)n;
    (void)f;
#endif
  }
  __host__ __device__ void sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
};

// bf16 terms per operand of the backward's tensor-core products (NTB below): 3 keep all 24 bits
// of fp32 (fp32 inputs); bf16 inputs take 2 (16 bits, far below the error their rounding already
// carries) unless QEDCHECK_CHUNKED_BWD_TERMS=1|2|3 says otherwise.

// prep_block's W_a = L Ã and W_z = L Z on tensor cores.
template <int NTB>
struct TcPrepProducts {
  __device__ void operator()(const BlockExec&, const cb::BwdArgs& A, const cb::ChunkTiles& s, const float* Lm,
                             const cb::Blob& bl) const {
    constexpr int kC = cb::kC;
    const int n = s.n, n16 = (n + 15) / 16 * 16, K = static_cast<int>(A.K), V = static_cast<int>(A.V);
    auto kr = [&](int m0, int& lo, int& hi) { lo = 0, hi = m0 + 16 < n16 ? m0 + 16 : n16; };
    auto fl = [&](int r, int j) { return (r < n && j < n) ? Lm[r * kC + j] : 0.f; };
    cb::tc::block_gemm<NTB, 4>(
        kC, K, kr, fl, [&](int j, int c) { return j < n ? s.a[j * s.ld + c] : 0.f; },
        [&](int r, int c, float x) {
          if (r < n) bl.Wa[r * K + c] = x;
        });
    cb::tc::block_gemm<NTB, 4>(
        kC, V, kr, fl, [&](int j, int v) { return j < n ? cb::z_value(A, s, j, v) : 0.f; },
        [&](int r, int v, float x) {
          if (r < n) bl.Wz[r * V + v] = x;
        });
  }
};

// prep_block's T and M: the 16 x 16 blocks below the diagonal blocks on tensor cores, with the
// log-decay R of the row before block I as reference: for r in block I and j < 16I,
// E_rj = exp(G_r - R) exp(R - G_j), both exponents <= 0 (MATH.md §4.6), so
//   T_IJ = (A_I ⊙ exp(G_I - R)) (K_J ⊙ exp(R - G_J))ᵀ and M_IJ the same with Q_I;
// the diagonal blocks keep pairwise exponents, one thread per entry; zeros above.
template <int NTB>
struct TcPrepTM {
  __device__ void operator()(const BlockExec& ex, const cb::BwdArgs& A, const cb::ChunkTiles& s, float* Tm,
                             const cb::Blob& bl) const {
    constexpr int kC = cb::kC;
    const int n = s.n, K = static_cast<int>(A.K), ld = static_cast<int>(s.ld), nb = (n + 15) / 16;
    const int warp = static_cast<int>(threadIdx.x >> 5), nw = static_cast<int>(blockDim.x >> 5);
    const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    const int pairs = nb * (nb - 1) / 2;
    for (int task = warp; task < pairs; task += nw) {
      int I = 1, rest = task;  // pair (I, J), J < I, in the order (1,0) (2,0) (2,1) (3,0) ...
      while (rest >= I) rest -= I, ++I;
      const int J = rest, m0 = 16 * I, j0 = 16 * J;
      const float* Rg = s.G + (m0 - 1) * ld;
      float acc[2][2][4] = {};
      for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t aA[4 * NTB], aQ[4 * NTB];
        cb::tc::frag_a<NTB>(
            aA, [&](int r, int c) { return r < n ? s.a[r * ld + c] * expf(s.G[r * ld + c] - Rg[c]) : 0.f; }, m0,
            k0, g, t);
        cb::tc::frag_a<NTB>(
            aQ, [&](int r, int c) { return r < n ? s.q[r * ld + c] * expf(s.G[r * ld + c] - Rg[c]) : 0.f; }, m0,
            k0, g, t);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          uint32_t b[2 * NTB];
          cb::tc::frag_b<NTB>(
              b, [&](int c, int j) { return s.k[j * ld + c] * expf(Rg[c] - s.G[j * ld + c]); }, k0, j0 + 8 * nt,
              g, t);
          cb::tc::step<NTB>(acc[0][nt], aA, b);
          cb::tc::step<NTB>(acc[1][nt], aQ, b);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = m0 + g + (e >> 1) * 8, j = j0 + 8 * nt + 2 * t + (e & 1);
          if (r >= n) continue;
          Tm[r * kC + j] = acc[0][nt][e];
          bl.M[r * kC + j] = acc[1][nt][e];
        }
    }
    // Diagonal blocks (pairwise exponents) and the zeros above them.
    ex.for_each(n * n, [&](int64_t i) {
      const int r = static_cast<int>(i / n), j = static_cast<int>(i % n);
      if (j / 16 >= r / 16) cb::tm_entry(s, K, r, j, Tm, bl);  // below them: the products above
    });
  }
};

template <int NTB>
__global__ void __launch_bounds__(kThreadsBwd) bwd_prep_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_prep[];
  cb::prep_block(BlockExec{}, A, blockIdx.x, blockIdx.y, sm_prep, TcPrepProducts<NTB>{}, TcPrepTM<NTB>{});
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_prep_scalar_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_prep[];
  cb::prep_block(BlockExec{}, A, blockIdx.x, blockIdx.y, sm_prep);
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_state_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_state[];
  cb::state_block(BlockExec{}, A, blockIdx.x, blockIdx.y, static_cast<int>(blockIdx.z), sm_state);
}
// The reverse sweep of state_block (chunked_backward_tile.hpp) with its matrix products on
// tensor cores (chunked_backward_mma.cuh, three bf16 terms per operand): same inputs, same
// outputs (Z̄, the tile partials, dh0), same shared-memory tiles; rho stays a scalar loop.
// `QEDCHECK_CHUNKED_BWD_SCALAR=1` launches the scalar prep, state and chunk blocks instead.
template <int NTB>
__global__ void __launch_bounds__(kThreadsBwd) bwd_state_tc_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm[];
  namespace tc = cb::tc;
  constexpr int kC = cb::kC, P = cb::kVP, VT = cb::kVT;
  const int64_t seq = blockIdx.x, h = blockIdx.y;
  const int vt = static_cast<int>(blockIdx.z);
  const int K = static_cast<int>(A.K);
  const int64_t V = A.V;
  const int64_t v0 = static_cast<int64_t>(vt) * VT;
  if (V - v0 < VT) return;  // V is a multiple of kVT (check_built_sizes)
  float* S = sm;
  float* Sh = S + K * P;
  float* Shn = Sh + K * P;
  float* O = Shn + K * P;
  float* U = O + kC * P;
  float* Ub = U + kC * P;
  float* Y = Ub + kC * P;
  const cb::Span sp = cb::seq_span(A, seq);
  const int64_t c0 = cb::first_chunk(A, seq);
  int64_t nch = (sp.len + kC - 1) / kC;
  if (c0 + nch > A.chunk_bound) nch = A.chunk_bound - c0 > 0 ? A.chunk_bound - c0 : 0;
  const float s = A.scale;
  const int tid = static_cast<int>(threadIdx.x), nth = static_cast<int>(blockDim.x);
  for (int i = tid; i < K * VT; i += nth) {
    const int c = i / VT, v = i % VT;
    Sh[c * P + v] = A.dht ? A.dht[seq * A.dht_sn + h * A.dht_sh + c * A.dht_sk + v0 + v] : 0.f;
  }
  __syncthreads();
  for (int64_t ci = nch - 1; ci >= 0; --ci) {
    const int64_t gc = c0 + ci;
    const int64_t rem = sp.len - ci * kC;
    const int n = rem < kC ? static_cast<int>(rem) : kC;
    const int n16 = (n + 15) / 16 * 16;
    const int64_t t0 = sp.bos + ci * kC;
    const cb::Blob bl = cb::blob_at(A, gc, h);
    const cb::Part pt = cb::part_at(A, gc, h, vt);
    const float* Sg = A.cs + (gc * A.H + h) * K * V;
    for (int i = tid; i < K * VT; i += nth) {
      const int c = i / VT, v = i % VT;
      S[c * P + v] = Sg[c * V + v0 + v];
    }
    for (int i = tid; i < kC * VT; i += nth) {
      const int r = i / VT, v = i % VT;
      O[r * P + v] = r < n ? cb::ld(A.dout, sp.brow, t0 + r, h, v0 + v) : 0.f;
    }
    __syncthreads();
    // U = W_z - W_a S;  Ū = s Mᵀ Ō + K̂ Ŝ' (k runs over the chunk's rows, then the channels).
    tc::block_gemm<NTB, 4>(
        kC, VT, [&](int, int& lo, int& hi) { lo = 0, hi = K; },
        [&](int r, int c) { return r < n ? bl.Wa[r * K + c] : 0.f; },
        [&](int c, int v) { return S[c * P + v]; },
        [&](int r, int v, float x) { U[r * P + v] = r < n ? bl.Wz[r * V + v0 + v] - x : 0.f; });
    tc::block_gemm<NTB, 4>(
        kC, VT, [&](int m0, int& lo, int& hi) { lo = m0, hi = kC + K; },
        [&](int r, int k) {
          if (r >= n) return 0.f;
          if (k < kC) return k < n ? s * bl.M[k * kC + r] : 0.f;
          return bl.Kh[r * K + (k - kC)];
        },
        [&](int k, int v) { return k < kC ? O[k * P + v] : Sh[(k - kC) * P + v]; },
        [&](int r, int v, float x) { Ub[r * P + v] = r < n ? x : 0.f; });
    __syncthreads();
    // Ȳ = Lᵀ Ū (the chunk's Z̄); partials M̄ = s tril(Ō Uᵀ), Q̃̄ = s Ō Sᵀ, K̂̄ = U Ŝ'ᵀ, ρ_S.
    float* zbar = A.tok_v + ((sp.brow * A.T + t0) * A.H + h) * V + v0;
    tc::block_gemm<NTB, 4>(
        kC, VT, [&](int m0, int& lo, int& hi) { lo = m0, hi = n16; },
        [&](int j, int r) { return (j < n && r < n) ? bl.L[r * kC + j] : 0.f; },
        [&](int r, int v) { return Ub[r * P + v]; },
        [&](int j, int v, float x) {
          Y[j * P + v] = j < n ? x : 0.f;
          if (j < n) zbar[static_cast<int64_t>(j) * A.H * V + v] = x;
        });
    tc::block_gemm<NTB, 4>(
        kC, kC, [&](int, int& lo, int& hi) { lo = 0, hi = VT; },
        [&](int r, int v) { return O[r * P + v]; }, [&](int v, int j) { return U[j * P + v]; },
        [&](int r, int j, float x) {
          if (r < n && j < n) pt.Mb[r * kC + j] = j <= r ? s * x : 0.f;
        });
    tc::block_gemm<NTB, 4>(
        kC, K, [&](int, int& lo, int& hi) { lo = 0, hi = VT; },
        [&](int r, int v) { return O[r * P + v]; }, [&](int v, int c) { return S[c * P + v]; },
        [&](int r, int c, float x) {
          if (r < n) pt.Qtb[r * K + c] = s * x;
        });
    tc::block_gemm<NTB, 4>(
        kC, K, [&](int, int& lo, int& hi) { lo = 0, hi = VT; },
        [&](int r, int v) { return U[r * P + v]; }, [&](int v, int c) { return Sh[c * P + v]; },
        [&](int r, int c, float x) {
          if (r < n) pt.Khb[r * K + c] = x;
        });
    for (int c = tid; c < K; c += nth) {
      float acc = 0.f;
      for (int v = 0; v < VT; ++v) acc = fmaf(Sh[c * P + v], S[c * P + v], acc);
      pt.rho[c] = acc;
    }
    __syncthreads();
    // Ŝ_[n] = s Q̃ᵀ Ō + Diag(γ_n) Ŝ' − Ãᵀ Ȳ; partials T̄ = −stril(Ȳ Uᵀ), Ã̄ = −Ȳ Sᵀ.
    tc::block_gemm<NTB, 4>(
        K, VT, [&](int, int& lo, int& hi) { lo = 0, hi = 2 * kC; },
        [&](int c, int k) {
          if (k < kC) return k < n ? s * bl.Qt[k * K + c] : 0.f;
          return k - kC < n ? -bl.At[(k - kC) * K + c] : 0.f;
        },
        [&](int k, int v) { return k < kC ? O[k * P + v] : Y[(k - kC) * P + v]; },
        [&](int c, int v, float x) { Shn[c * P + v] = fmaf(bl.gl[c], Sh[c * P + v], x); });
    tc::block_gemm<NTB, 4>(
        kC, kC, [&](int, int& lo, int& hi) { lo = 0, hi = VT; },
        [&](int r, int v) { return Y[r * P + v]; }, [&](int v, int j) { return U[j * P + v]; },
        [&](int r, int j, float x) {
          if (r < n && j < n) pt.Tb[r * kC + j] = j < r ? -x : 0.f;
        });
    tc::block_gemm<NTB, 4>(
        kC, K, [&](int, int& lo, int& hi) { lo = 0, hi = VT; },
        [&](int r, int v) { return Y[r * P + v]; }, [&](int v, int c) { return S[c * P + v]; },
        [&](int r, int c, float x) {
          if (r < n) pt.Atb[r * K + c] = -x;
        });
    __syncthreads();
    for (int i = tid; i < K * VT; i += nth) {
      const int c = i / VT, v = i % VT;
      Sh[c * P + v] = Shn[c * P + v];
    }
    __syncthreads();
  }
  for (int i = tid; i < K * VT; i += nth) {
    const int c = i / VT, v = i % VT;
    A.dh0[seq * A.dh0_sn + h * A.dh0_sh + c * A.dh0_sk + v0 + v] = Sh[c * P + v];
  }
}

// chunk_block's sums over pairs of rows in different 16-row blocks (cb::ScalarOffDiag) on tensor
// cores. With R the log-decay of the last row before block I (lower part) or of the last row of
// block J (upper part), E_rj = exp(G_r - R) exp(R - G_j) with both exponents <= 0 for every g <= 0
// (MATH.md §4.6), so no factor overflows; one that underflows belongs to a pair whose E_rj is
// smaller still. Lower: ā°_I = exp(G_I - R) ⊙ Σ_J T̄_IJ (K_J ⊙ exp(R - G_J)) (q̄° with M̄, same
// right operand); upper: k̄°_J = exp(R - G_J) ⊙ Σ_I (T̄_IJᵀ (A_I ⊙ exp(G_I - R)) + M̄_IJᵀ (Q_I ⊙ ...)).
// One warp per (block, 32 channels).
template <int NTB>
struct TcOffDiag {
  template <class Tok>
  __device__ void operator()(const BlockExec&, const cb::BwdArgs& A, const cb::ChunkTiles& s, const float* Tb,
                             const float* Mb, const Tok& tok, float* ab_t, float* qb_t, float* kb_t) const {
    constexpr int kC = cb::kC, NN = 4;
    const int n = s.n, K = static_cast<int>(A.K), ld = static_cast<int>(s.ld);
    const int warp = static_cast<int>(threadIdx.x >> 5), nw = static_cast<int>(blockDim.x >> 5);
    const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    const int groups = K / (8 * NN), nb = (n + 15) / 16;
    // tasks: lower blocks I = 1..nb-1, then upper blocks J = 0..nb-2, each x channel groups
    const int tasks = 2 * (nb - 1) * groups;
    for (int task = warp; task < tasks; task += nw) {
      const bool lower = task < (nb - 1) * groups;
      const int tt = lower ? task : task - (nb - 1) * groups;
      const int blk = lower ? 1 + tt / groups : tt / groups;
      const int n0 = (tt % groups) * 8 * NN;
      const int m0 = 16 * blk;
      const int rref = lower ? m0 - 1 : m0 + 15;  // reference row (< n in both cases)
      const float* Rg = s.G + rref * ld;
      float acc[2][NN][4];
#pragma unroll
      for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int j = 0; j < NN; ++j) acc[p][j][0] = acc[p][j][1] = acc[p][j][2] = acc[p][j][3] = 0.f;
      if (lower) {
        for (int J = 0; J < blk; ++J) {
          uint32_t aT[4 * NTB], aM[4 * NTB];
          const int k0 = 16 * J;
          cb::tc::frag_a<NTB>(aT, [&](int r, int j) { return r < n ? Tb[r * kC + j] : 0.f; }, m0, k0, g, t);
          cb::tc::frag_a<NTB>(aM, [&](int r, int j) { return r < n ? Mb[r * kC + j] : 0.f; }, m0, k0, g, t);
#pragma unroll
          for (int jj = 0; jj < NN; ++jj) {
            uint32_t b[2 * NTB];
            cb::tc::frag_b<NTB>(
                b, [&](int j, int c) { return s.k[j * ld + c] * expf(Rg[c] - s.G[j * ld + c]); }, k0,
                n0 + 8 * jj, g, t);
            cb::tc::step<NTB>(acc[0][jj], aT, b);
            cb::tc::step<NTB>(acc[1][jj], aM, b);
          }
        }
      } else {
        for (int I = blk + 1; I < nb; ++I) {
          uint32_t aT[4 * NTB], aM[4 * NTB];
          const int k0 = 16 * I;
          cb::tc::frag_a<NTB>(aT, [&](int j, int r) { return r < n ? Tb[r * kC + j] : 0.f; }, m0, k0, g, t);
          cb::tc::frag_a<NTB>(aM, [&](int j, int r) { return r < n ? Mb[r * kC + j] : 0.f; }, m0, k0, g, t);
#pragma unroll
          for (int jj = 0; jj < NN; ++jj) {
            uint32_t b[2 * NTB];
            cb::tc::frag_b<NTB>(
                b, [&](int r, int c) { return r < n ? s.a[r * ld + c] * expf(s.G[r * ld + c] - Rg[c]) : 0.f; },
                k0, n0 + 8 * jj, g, t);
            cb::tc::step<NTB>(acc[0][jj], aT, b);
            cb::tc::frag_b<NTB>(
                b, [&](int r, int c) { return r < n ? s.q[r * ld + c] * expf(s.G[r * ld + c] - Rg[c]) : 0.f; },
                k0, n0 + 8 * jj, g, t);
            cb::tc::step<NTB>(acc[0][jj], aM, b);
          }
        }
      }
#pragma unroll
      for (int jj = 0; jj < NN; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = m0 + g + (e >> 1) * 8, c = n0 + 8 * jj + 2 * t + (e & 1);
          if (r >= n) continue;
          const float x = lower ? expf(s.G[r * ld + c] - Rg[c]) : expf(Rg[c] - s.G[r * ld + c]);
          if (lower) {
            ab_t[tok(r) + c] = acc[0][jj][e] * x;
            qb_t[tok(r) + c] = acc[1][jj][e] * x;
          } else {
            kb_t[tok(r) + c] = acc[0][jj][e] * x;
          }
        }
    }
  }
};

template <int NTB>
__global__ void __launch_bounds__(kThreadsBwd) bwd_chunk_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_chunk[];
  cb::chunk_block(BlockExec{}, A, blockIdx.x, blockIdx.y, sm_chunk, TcOffDiag<NTB>{});
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_chunk_scalar_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_chunk[];
  cb::chunk_block(BlockExec{}, A, blockIdx.x, blockIdx.y, sm_chunk);
}
struct WarpSum {  // butterfly: every lane ends with the same total, in a fixed order
  __device__ float operator()(float x) const {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
};
constexpr int kTokenWarps = kThreadsBwd / 32;  // token items per block, one warp each
__global__ void __launch_bounds__(kThreadsBwd) bwd_token_kernel(const cb::BwdArgs A, int64_t items) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kTokenWarps + threadIdx.x / 32;
  if (item < items) cb::token_item(A, item, static_cast<int>(threadIdx.x % 32), 32, WarpSum{});
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_head_parts_kernel(const float* tok, int64_t BT,
                                                                  int64_t H, int D, float* part) {
  __shared__ float scratch[cb::kReduceGroups];
  cb::head_reduce_parts(BlockExec{}, tok, BT, H, D, blockIdx.y, blockIdx.x, part, scratch);
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_head_final_kernel(const float* part, int64_t BT,
                                                                  int64_t H, int D, float* out) {
  cb::head_reduce_final(BlockExec{}, part, BT, H, D, blockIdx.x, out);
}
// dlambda or dr: the per-token values summed per head (chunked_backward_tile.hpp, part E).
cudaError_t head_reduce(const float* tok, int64_t BT, int64_t H, int D, float* part, float* out,
                        cudaStream_t st) {
  const unsigned P = static_cast<unsigned>(cb::reduce_parts(BT));
  bwd_head_parts_kernel<<<dim3(P, static_cast<unsigned>(H)), kThreadsBwd, 0, st>>>(tok, BT, H, D, part);
  bwd_head_final_kernel<<<static_cast<unsigned>(H), kThreadsBwd, 0, st>>>(part, BT, H, D, out);
  return cudaGetLastError();
}

const char* kFn = "chunked_backward";

Status bad(const std::string& msg) { return {StatusCode::invalid_argument, std::string(kFn) + ": " + msg}; }
Status unsupported(const std::string& msg) { return {StatusCode::unsupported, std::string(kFn) + ": " + msg}; }
Status cuda_fail(const char* what, cudaError_t e) {
  return {StatusCode::cuda_error, std::string(kFn) + ": " + what + ": " + cudaGetErrorString(e)};
}

// Testing hook: QEDCHECK_CHUNKED_BWD_MUTANT=khat|rho|proj drops one term (chunked_backward_tile.hpp);
// =hold finishes the gradient pass's held partials (GradArgs::hold) in the wrong slabs' channels.
int mutant() {
  const char* m = std::getenv("QEDCHECK_CHUNKED_BWD_MUTANT");
  if (!m) return cb::kMutantNone;
  if (std::strcmp(m, "khat") == 0) return cb::kMutantNoKhatGrad;
  if (std::strcmp(m, "rho") == 0) return cb::kMutantNoDecayRho;
  if (std::strcmp(m, "proj") == 0) return cb::kMutantNoProjGrad;
  if (std::strcmp(m, "hold") == 0) return cb::kMutantHoldOrder;
  return cb::kMutantNone;
}

// Benchmark hook: QEDCHECK_CHUNKED_BWD_STOP=k returns after pass k (1 the recomputing forward,
// 2 prep, 3 the reverse state sweep, 4 chunk, 5 token); the time of a pass is the difference of
// neighbouring cuts (bench/bench_chunked.py --only bwdphases). The gradients are then incomplete.
bool scalar_blocks() {
  const char* s = std::getenv("QEDCHECK_CHUNKED_BWD_SCALAR");
  return s && std::strcmp(s, "1") == 0;
}
int bwd_stop() {
  const char* s = std::getenv("QEDCHECK_CHUNKED_BWD_STOP");
  return s ? std::atoi(s) : 0;
}
// Split terms of the tensor-core products: 3 for fp32 inputs, 2 for 16-bit ones;
// QEDCHECK_CHUNKED_BWD_TERMS=1|2|3 overrides (timing and the accuracy tests).
int bwd_terms(bool fp32_inputs) {
  if (const char* s = std::getenv("QEDCHECK_CHUNKED_BWD_TERMS")) {
    const int n = std::atoi(s);
    if (n >= 1 && n <= 3) return n;
  }
  return fp32_inputs ? 3 : 2;
}
struct TcKernels {
  void (*prep)(cb::BwdArgs);
  void (*state)(cb::BwdArgs);
  void (*chunk)(cb::BwdArgs);
};
template <int NTB>
TcKernels tc_kernels() {
  return {bwd_prep_kernel<NTB>, bwd_state_tc_kernel<NTB>, bwd_chunk_kernel<NTB>};
}
TcKernels kernels_for(int terms) {
  if (scalar_blocks()) return {bwd_prep_scalar_kernel, bwd_state_kernel, bwd_chunk_scalar_kernel};
  return terms == 1 ? tc_kernels<1>() : terms == 2 ? tc_kernels<2>() : tc_kernels<3>();
}

Status check(const ChunkedBackwardParams& p) {
  const Problem& pr = p.problem;
  if (Status s = validate_problem(kFn, pr); !s.ok()) return s;
  if (Status s = validate_inputs(kFn, pr, p.in); !s.ok()) return s;
  if (Status s = validate_grads(kFn, pr, p.grads); !s.ok()) return s;
  if (!p.do_.data) return bad("do_ is required");
  const SeqTensorOut d{const_cast<void*>(p.do_.data), p.do_.dtype, p.do_.stride_b, p.do_.stride_t,
                       p.do_.stride_h};
  if (Status s = validate_output(kFn, "do_", pr, d); !s.ok()) return s;
  if (Status s = validate_state(kFn, "dht", p.dht); !s.ok()) return s;
  if (Status s = chunked::check_built_sizes(kFn, pr, p.in.q.dtype); !s.ok()) return s;
  const DType dt = p.in.q.dtype;
  const std::pair<const SeqTensor*, const char*> same[] = {{&p.in.k, "k"},       {&p.in.v, "v"},
                                                           {&p.in.b, "b"},       {&p.in.w, "w"},
                                                           {&p.in.beta, "beta"}, {&p.do_, "do_"}};
  for (const auto& [t, n] : same)
    if (t->data && t->dtype != dt)
      return bad(std::string(n) + " dtype " + to_string(t->dtype) + " differs from q dtype " +
                 to_string(dt) + " (q, k, v, b, w, beta, do_ share one dtype)");
  if (p.in.g.data && p.in.g.dtype != dt && p.in.g.dtype != DType::fp32)
    return bad(std::string("g dtype ") + to_string(p.in.g.dtype) + " must be fp32 or q's dtype");
  const std::pair<const SeqTensorOut*, const char*> outs[] = {
      {&p.grads.dq, "dq"}, {&p.grads.dk, "dk"}, {&p.grads.dv, "dv"},      {&p.grads.dg, "dg"},
      {&p.grads.db, "db"}, {&p.grads.dw, "dw"}, {&p.grads.dbeta, "dbeta"}};
  for (const auto& [t, n] : outs)
    if (t->data && t->dtype != DType::fp32 && t->dtype != DType::bf16)
      return unsupported(std::string(n) + " dtype " + to_string(t->dtype) + " (fp32 or bf16 only)");
  return {};
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Which pipeline runs: "v2" (bf16 inputs only: the recompute also keeps U and the backward's blobs,
// a reverse sweep on tensor cores, one chunk-parallel gradient pass; kernels/chunked_bwd_sweep.cu,
// kernels/chunked_bwd_grads.cu) or "v1" (the block functions of chunked_backward_tile.hpp, fp32
// matrices through the workspace; every fp32 input). QEDCHECK_CHUNKED_BWD_IMPL=v1|v2 chooses for
// bf16 inputs; kDefaultV2 is the choice when it does not say.
constexpr bool kDefaultV2 = true;
bool use_v2(const ChunkedBackwardParams& p) {
  if (p.in.q.dtype != DType::bf16) return false;
  const char* e = std::getenv("QEDCHECK_CHUNKED_BWD_IMPL");
  if (e && std::strcmp(e, "v1") == 0) return false;
  if (e && std::strcmp(e, "v2") == 0) return true;
  return kDefaultV2;
}

struct Layout {
  bool v2 = false;
  int64_t bound = 0, per = 0;
  int n_vt = 1;
  size_t base = 0, fwd = 0, cs = 0, o = 0, blob = 0, part = 0, tok_k = 0, tok_v = 0, dlam = 0,
         dr = 0, red = 0, total = 0;
  size_t fwd_bytes = 0;
  size_t bws = 0, u = 0, ds = 0, ubar = 0;  // v2
  int64_t bblob = 0;
};

// The forward that recomputes the chunk-start states: o (bf16, discarded) and chunk_states in the
// workspace; `ws` may be null for the workspace query (pointers then only need to be non-null).
ChunkedForwardParams forward_params(const ChunkedBackwardParams& p, char* ws, const Layout& L) {
  const Problem& pr = p.problem;
  char* base = ws ? ws : reinterpret_cast<char*>(256);
  ChunkedForwardParams fp;
  fp.problem = pr;
  fp.in = p.in;
  fp.o = seq_tensor_out(base + L.o, DType::bf16, pr.T, pr.H, pr.V);
  fp.chunk_states = state_tensor_out(reinterpret_cast<float*>(base + L.cs), pr.H, pr.K, pr.V);
  fp.workspace = ws ? ws + L.fwd : nullptr;
  fp.workspace_bytes = L.fwd_bytes;
  return fp;
}

// Where the v2 recompute puts U and the backward's blobs.
chunked::BwdHooks hooks_of(const Layout& L, char* ws) {
  chunked::BwdHooks hk;
  hk.bws = ws + L.bws;
  hk.bblob = L.bblob;
  hk.u_out = reinterpret_cast<float*>(ws + L.u);
  return hk;
}

Status layout_for(const ChunkedBackwardParams& p, Layout* out) {
  const Problem& pr = p.problem;
  const reference::Layout lay = reference::layout_of(pr.variant, pr.arm);
  Layout L;
  L.per = (pr.T + cb::kC - 1) / cb::kC;
  L.bound = pr.cu_seqlens ? L.per + pr.sequences() : pr.B * L.per;
  L.n_vt = static_cast<int>((pr.V + cb::kVT - 1) / cb::kVT);
  const size_t H = pr.H, K = pr.K, V = pr.V, BTH = static_cast<size_t>(pr.B * pr.T) * H;
  const size_t bound = static_cast<size_t>(L.bound);
  size_t off = 0;
  L.base = off;
  off = align256(off + (pr.cu_seqlens ? (static_cast<size_t>(pr.sequences()) + 1) * 8 : 0));
  L.cs = off;
  off = align256(off + bound * H * K * V * 4);
  L.o = off;
  off = align256(off + BTH * V * 2);
  L.v2 = use_v2(p);
  if (L.v2) {
    L.bblob = chunked::bwd_blob_bytes(static_cast<int>(pr.K), chunked::Mode::bf16);
    L.bws = off;
    off = align256(off + bound * H * static_cast<size_t>(L.bblob));
    L.u = off;
    off = align256(off + bound * H * cb::kC * V * 4);
    L.ds = off;
    off = align256(off + bound * H * K * V * 4);
    L.ubar = off;
    off = align256(off + bound * H * cb::kC * V * 4);
  } else {
    L.blob = off;
    off = align256(off + bound * H * static_cast<size_t>(cb::blob_floats(pr.K, pr.V)) * 4);
    L.part = off;
    off = align256(off + bound * H * L.n_vt * static_cast<size_t>(cb::part_floats(pr.K)) * 4);
  }
  // v1: ā, q̄, k̄, ḡ and Z̄ per token; v2 needs none (QED's final pass reads its partial dq, dk, db
  // back from the gradient outputs).
  L.tok_k = off;
  if (!L.v2) off = align256(off + 4 * BTH * K * 4);
  L.tok_v = off;
  if (!L.v2) off = align256(off + BTH * V * 4);
  L.dlam = off;
  if (lay.has_lambda) off = align256(off + BTH * 4);
  L.dr = off;
  if (lay.has_r) off = align256(off + BTH * K * 4);
  L.red = off;  // the two-level head reduction's parts (dlambda, then dr)
  if (lay.has_lambda || lay.has_r)
    off = align256(off + static_cast<size_t>(cb::reduce_part_floats(pr.B * pr.T, pr.H, lay.has_r ? static_cast<int>(K) : 1)) * 4);
  L.fwd = off;
  ChunkedForwardParams fp = forward_params(p, nullptr, L);
  if (Status s = chunked_forward_workspace(fp, &L.fwd_bytes); !s.ok()) return s;
  if (L.v2) L.fwd_bytes = chunked::forward_workspace_bytes(pr, chunked::Mode::bf16);
  L.total = align256(off + L.fwd_bytes);
  *out = L;
  return {};
}

cb::SeqIn seq_in(const SeqTensor& t) {
  cb::SeqIn s;
  s.p = t.data;
  s.sb = t.stride_b, s.st = t.stride_t, s.sh = t.stride_h;
  s.dt = t.dtype == DType::fp32 ? 0 : 1;
  return s;
}
cb::SeqOut seq_out(const SeqTensorOut& t) {
  cb::SeqOut s;
  s.p = t.data;
  s.sb = t.stride_b, s.st = t.stride_t, s.sh = t.stride_h;
  s.dt = t.dtype == DType::fp32 ? 0 : 1;
  return s;
}

// Value-tile width 16*MT of the reverse sweep: the widest tile that still gives about one block per
// multiprocessor (its shared memory allows one); QEDCHECK_CHUNKED_SWEEP_MT=1|2|4 overrides.
int sweep_mt(const Problem& pr) {
  const int64_t vt16 = pr.V / 16, lanes = pr.sequences() * pr.H;
  if (const char* e = std::getenv("QEDCHECK_CHUNKED_SWEEP_MT")) {
    const int mt = std::atoi(e);
    if ((mt == 1 || mt == 2 || mt == 4) && vt16 % mt == 0) return mt;
  }
  const int sms = chunked::num_sms();
  for (int mt = 4; mt > 1; mt /= 2)
    if (vt16 % mt == 0 && 4 * lanes * (vt16 / mt) >= 3 * int64_t{sms}) return mt;
  return 1;
}

// The v2 passes after the recompute: the reverse sweep (every chunk's Ŝ' and Ū, dh0), then the
// chunk-parallel gradient pass with the token VJPs. `go(pass)`: the benchmark cut (2 the sweep,
// 3 the gradient pass).
template <class Go>
cudaError_t run_v2(const ChunkedBackwardParams& p, const Layout& L, char* ws, chunked::Args fa,
                   const cb::BwdArgs& A, cudaStream_t st, const Go& go) {
  const Problem& pr = p.problem;
  fa.dout = {p.do_.data, p.do_.stride_b, p.do_.stride_t, p.do_.stride_h, 1};
  fa.vec_do = chunked::rows_aligned16(p.do_, 2);
  fa.dht = p.dht.data;
  fa.dht_sn = p.dht.stride_n, fa.dht_sh = p.dht.stride_h, fa.dht_sk = p.dht.stride_k;
  fa.ds = reinterpret_cast<float*>(ws + L.ds);
  fa.ubar = reinterpret_cast<float*>(ws + L.ubar);
  fa.dh0 = p.grads.dh0.data;
  fa.dh0_sn = p.grads.dh0.stride_n, fa.dh0_sh = p.grads.dh0.stride_h, fa.dh0_sk = p.grads.dh0.stride_k;
  cudaError_t e = chunked::launch_sweep(fa, chunked::Mode::bf16, sweep_mt(pr), st);
  if (e != cudaSuccess || !go(3) || L.bound == 0 || pr.B * pr.T == 0) return e;
  cb::GradArgs G;
  G.b = A;
  G.u = reinterpret_cast<const float*>(ws + L.u);
  G.ubar = fa.ubar;
  G.ds = fa.ds;
  G.bws = ws + L.bws;
  G.bblob = L.bblob;
  G.lm_off = chunked::bwd_lm_offset(static_cast<int>(pr.K), chunked::Mode::bf16);
  G.pj_off = chunked::bwd_pj_offset(static_cast<int>(pr.K), chunked::Mode::bf16);
  G.max_diag = fa.max_diag;
  const bool chan_bw = pr.variant == Variant::gdn2 || pr.variant == Variant::qed;
  const bool chan_g = chan_bw || pr.variant == Variant::kda;
  const int ge = p.in.g.dtype == DType::fp32 ? 4 : 2;
  using chunked::rows_aligned16;
  G.vec = rows_aligned16(p.in.q, 2) && rows_aligned16(p.in.k, 2) && rows_aligned16(p.do_, 2) &&
          (!chan_bw || rows_aligned16(p.in.b, 2)) && (!chan_g || rows_aligned16(p.in.g, ge));
  if (const char* w = std::getenv("QEDCHECK_CHUNKED_GRADS_WARPS"); w && std::strcmp(w, "16") == 0)
    G.warps = 16;
  if (const char* a = std::getenv("QEDCHECK_CHUNKED_GRADS_AHEAD"); a && std::strcmp(a, "0") == 0)
    G.ahead = 0;
  if (const char* a = std::getenv("QEDCHECK_CHUNKED_GRADS_HOLD"); a && std::strcmp(a, "0") == 0)
    G.hold = 0;
  G.vec_vw = rows_aligned16(p.in.v, 2) && (!chan_bw || rows_aligned16(p.in.w, 2));
  const GradOutputs& o = p.grads;
  auto out16 = [](const SeqTensorOut& t) { return rows_aligned16(t, t.dtype == DType::fp32 ? 4 : 2); };
  G.vec_out = out16(o.dq) && out16(o.dk) && out16(o.dv) && (!chan_g || out16(o.dg)) &&
              (!chan_bw || (out16(o.db) && out16(o.dw)));
  auto b16 = [](const auto& t) { return t.dtype == DType::bf16; };
  G.raw = G.vec && G.vec_vw && G.vec_out && b16(p.in.q) && b16(p.in.k) && b16(p.in.v) && b16(p.do_) &&
          (!chan_bw || (b16(p.in.b) && b16(p.in.w))) && (!chan_g || b16(p.in.g));
  if (const char* r = std::getenv("QEDCHECK_CHUNKED_GRADS_RAW"); r && std::strcmp(r, "0") == 0)
    G.raw = 0;  // timing knob: the general kernel
  return cb::launch_grads(G, L.bound, st);
}

cudaError_t set_smem(const void* kern, int64_t floats) {
  return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(floats * 4));
}

}  // namespace

Status chunked_backward_workspace(const ChunkedBackwardParams& p, size_t* bytes) {
  if (!bytes) return bad("bytes is nullptr");
  if (Status s = check(p); !s.ok()) return s;
  Layout L;
  if (Status s = layout_for(p, &L); !s.ok()) return s;
  *bytes = L.total;
  return {};
}

Status chunked_backward(const ChunkedBackwardParams& p) {
  if (Status s = check(p); !s.ok()) return s;
  if (Status s = device_status(); !s.ok()) return s;
  Layout L;
  if (Status s = layout_for(p, &L); !s.ok()) return s;
  const Problem& pr = p.problem;
  const reference::Layout lay = reference::layout_of(pr.variant, pr.arm);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(pr.stream);
  char* ws = static_cast<char*>(p.workspace);
  bool owned = false;
  if (p.saved_forward && !ws)
    return bad("saved_forward needs the workspace chunked_forward_saving filled (workspace is nullptr)");
  if (!ws) {
    void* m = nullptr;
    if (cudaError_t e = cudaMallocAsync(&m, L.total > 0 ? L.total : 256, st); e != cudaSuccess)
      return cuda_fail("workspace allocation", e);
    ws = static_cast<char*>(m);
    owned = true;
  } else if (p.workspace_bytes < L.total) {
    return bad("workspace_bytes = " + std::to_string(p.workspace_bytes) + " is smaller than the " +
               std::to_string(L.total) + " bytes chunked_backward_workspace asks for");
  } else if (reinterpret_cast<uintptr_t>(ws) % 256 != 0) {
    return bad("workspace must be 256-byte aligned");
  }

  Status result;
  cudaError_t e = cudaSuccess;
  // 0. Chunk-start states from the chunked forward (v2: also U and the backward's blobs), unless
  // chunked_forward_saving left them in the workspace.
  chunked::Args fa;  // v2: the recompute's launch arguments, reused by the sweep
  {
    const ChunkedForwardParams fp = forward_params(p, ws, L);
    const chunked::BwdHooks hk = hooks_of(L, ws);
    Status s;
    if (p.saved_forward) {
      if (L.v2) fa = chunked::recompute_args(fp, hk);
    } else if (L.v2) {
      s = chunked::forward_for_backward(fp, hk, &fa);
    } else {
      s = chunked_forward(fp);
    }
    if (!s.ok()) result = {s.code, std::string(kFn) + ": recompute: " + s.message};
  }
  cb::BwdArgs A;
  A.variant = static_cast<int>(pr.variant);
  A.arm = static_cast<int>(pr.arm);
  A.B = pr.B, A.T = pr.T, A.H = pr.H, A.K = pr.K, A.V = pr.V, A.N = pr.sequences();
  A.scale = pr.scale;
  A.cu = pr.cu_seqlens;
  A.chunk_base = !pr.cu_seqlens ? nullptr
                 : L.v2         ? fa.chunk_base
                                : reinterpret_cast<const int64_t*>(ws + L.base);
  A.chunks_per_seq = L.per;
  A.chunk_bound = L.bound;
  A.q = seq_in(p.in.q), A.k = seq_in(p.in.k), A.v = seq_in(p.in.v), A.g = seq_in(p.in.g);
  A.b = seq_in(p.in.b), A.w = seq_in(p.in.w), A.beta = seq_in(p.in.beta), A.dout = seq_in(p.do_);
  A.g.dt = p.in.g.dtype == DType::fp32 ? 0 : 1;
  A.lambda = p.in.lambda;
  A.r = p.in.r;
  A.dht = p.dht.data;
  A.dht_sn = p.dht.stride_n, A.dht_sh = p.dht.stride_h, A.dht_sk = p.dht.stride_k;
  A.cs = reinterpret_cast<const float*>(ws + L.cs);
  A.dh0 = p.grads.dh0.data;
  A.dh0_sn = p.grads.dh0.stride_n, A.dh0_sh = p.grads.dh0.stride_h, A.dh0_sk = p.grads.dh0.stride_k;
  A.dq = seq_out(p.grads.dq), A.dk = seq_out(p.grads.dk), A.dv = seq_out(p.grads.dv);
  A.dg = seq_out(p.grads.dg), A.db = seq_out(p.grads.db), A.dw = seq_out(p.grads.dw);
  A.dbeta = seq_out(p.grads.dbeta);
  A.blob = reinterpret_cast<float*>(ws + L.blob);
  A.part = reinterpret_cast<float*>(ws + L.part);
  A.n_vt = L.n_vt;
  A.tok_k = reinterpret_cast<float*>(ws + L.tok_k);
  A.tok_v = reinterpret_cast<float*>(ws + L.tok_v);
  A.dlam_tok = reinterpret_cast<float*>(ws + L.dlam);
  A.dr_tok = reinterpret_cast<float*>(ws + L.dr);
  A.mutant = mutant();

  const int64_t BT = pr.B * pr.T, items = BT * pr.H;
  const unsigned H = static_cast<unsigned>(pr.H);
  if (result.ok() && pr.cu_seqlens && !L.v2) {
    chunked::Args ca;
    ca.T = pr.T;
    ca.N = pr.sequences();
    ca.cu = pr.cu_seqlens;
    e = chunked::launch_chunk_base(ca, reinterpret_cast<int64_t*>(ws + L.base), st);
  }
  const int stop = bwd_stop();
  auto go = [stop](int pass) { return stop <= 0 || pass <= stop; };
  if (L.v2) {
    if (result.ok() && go(2)) e = run_v2(p, L, ws, fa, A, st, go);
  } else if (!go(2)) {
    // benchmark cut after the recomputing forward
  } else if (result.ok() && e == cudaSuccess && L.bound > 0 && items > 0) {
    const int64_t fp = cb::prep_smem_floats(pr.K), fc = cb::chunk_smem_floats(pr.K);
    const TcKernels kk = kernels_for(bwd_terms(p.in.q.dtype == DType::fp32));
    const auto prep_kern = kk.prep;
    if ((e = set_smem(reinterpret_cast<const void*>(prep_kern), fp)) == cudaSuccess) {
      prep_kern<<<dim3(static_cast<unsigned>(L.bound), H), kThreadsBwd, fp * 4, st>>>(A);
      e = cudaGetLastError();
    }
    const int64_t fs = cb::state_smem_floats(pr.K);
    const auto state_kern = kk.state;
    if (go(3) && e == cudaSuccess && (e = set_smem(reinterpret_cast<const void*>(state_kern), fs)) == cudaSuccess) {
      state_kern<<<dim3(static_cast<unsigned>(A.N), H, static_cast<unsigned>(L.n_vt)), kThreadsBwd, fs * 4,
                   st>>>(A);
      e = cudaGetLastError();
    }
    const auto chunk_kern = kk.chunk;
    if (go(4) && e == cudaSuccess && (e = set_smem(reinterpret_cast<const void*>(chunk_kern), fc)) == cudaSuccess) {
      chunk_kern<<<dim3(static_cast<unsigned>(L.bound), H), kThreadsBwd, fc * 4, st>>>(A);
      e = cudaGetLastError();
    }
    if (go(5) && e == cudaSuccess) {
      bwd_token_kernel<<<static_cast<unsigned>((items + kTokenWarps - 1) / kTokenWarps), kThreadsBwd, 0, st>>>(
          A, items);
      e = cudaGetLastError();
    }
  } else if (result.ok() && e == cudaSuccess && A.N > 0) {
    // No tokens: dh0 = dht (or zero), written by the sequential pass with no chunks.
    const int64_t fs = cb::state_smem_floats(pr.K);
    if ((e = set_smem(reinterpret_cast<const void*>(bwd_state_kernel), fs)) == cudaSuccess) {
      bwd_state_kernel<<<dim3(static_cast<unsigned>(A.N), H, static_cast<unsigned>(L.n_vt)), kThreadsBwd,
                         fs * 4, st>>>(A);
      e = cudaGetLastError();
    }
  }
  if (result.ok() && e == cudaSuccess && lay.has_lambda && go(6)) {
    if (BT > 0) {
      e = head_reduce(A.dlam_tok, BT, pr.H, 1, reinterpret_cast<float*>(ws + L.red), p.grads.dlambda, st);
    } else {
      e = cudaMemsetAsync(p.grads.dlambda, 0, sizeof(float) * pr.H, st);
    }
  }
  if (result.ok() && e == cudaSuccess && lay.has_r && go(6)) {
    if (BT > 0) {
      e = head_reduce(A.dr_tok, BT, pr.H, static_cast<int>(pr.K), reinterpret_cast<float*>(ws + L.red),
                      p.grads.dr, st);
    } else {
      e = cudaMemsetAsync(p.grads.dr, 0, sizeof(float) * pr.H * pr.K, st);
    }
  }
  if (result.ok() && e != cudaSuccess) result = cuda_fail("kernel launch", e);
  if (owned) {
    const cudaError_t f = cudaFreeAsync(ws, st);
    if (result.ok() && f != cudaSuccess) result = cuda_fail("workspace free", f);
  }
  return result;
}

namespace {
// The backward's parameters and workspace layout for the problem and inputs of a forward.
Status backward_of(const ChunkedForwardParams& f, ChunkedBackwardParams* p, Layout* L) {
  p->problem = f.problem;
  p->in = f.in;
  return layout_for(*p, L);
}
}  // namespace

Status chunked_forward_saving_workspace(const ChunkedForwardParams& f, size_t* bytes) {
  if (!bytes) return {StatusCode::invalid_argument, "chunked_forward_saving_workspace: bytes is nullptr"};
  if (Status s = chunked_forward_workspace(f, bytes); !s.ok()) return s;  // validates the inputs
  ChunkedBackwardParams p;
  Layout L;
  if (Status s = backward_of(f, &p, &L); !s.ok()) return s;
  *bytes = L.total;
  return {};
}

Status chunked_forward_saving(const ChunkedForwardParams& f, void* bwd_workspace, size_t bwd_workspace_bytes) {
  constexpr const char* fn = "chunked_forward_saving";
  if (f.chunk_states.data)
    return {StatusCode::invalid_argument,
            std::string(fn) + ": chunk_states must be absent (the states stay in the backward's workspace)"};
  ChunkedBackwardParams p;
  Layout L;
  if (Status s = backward_of(f, &p, &L); !s.ok()) return {s.code, std::string(fn) + ": " + s.message};
  if (!bwd_workspace)
    return {StatusCode::invalid_argument, std::string(fn) + ": bwd_workspace is nullptr"};
  if (bwd_workspace_bytes < L.total)
    return {StatusCode::invalid_argument,
            std::string(fn) + ": bwd_workspace_bytes = " + std::to_string(bwd_workspace_bytes) +
                " is smaller than the " + std::to_string(L.total) +
                " bytes chunked_backward_workspace asks for"};
  if (reinterpret_cast<uintptr_t>(bwd_workspace) % 256 != 0)
    return {StatusCode::invalid_argument, std::string(fn) + ": bwd_workspace must be 256-byte aligned"};
  char* ws = static_cast<char*>(bwd_workspace);
  ChunkedForwardParams fp = forward_params(p, ws, L);
  fp.o = f.o;
  fp.ht = f.ht;
  Status s = L.v2 ? chunked::forward_for_backward(fp, hooks_of(L, ws), nullptr) : chunked_forward(fp);
  if (!s.ok()) return {s.code, std::string(fn) + ": " + s.message};
  return {};
}

}  // namespace qed::kernels
