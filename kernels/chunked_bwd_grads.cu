// Chunk-parallel gradient pass of the chunked backward (MATH.md §6.1-§6.3, §5.2), one block of eight
// warps per (chunk, head), after the recomputing forward (S_[n] of every chunk, U, L) and the reverse
// sweep (Ŝ' = the adjoint of the chunk's end state, Ū; chunked_bwd_sweep.cu). In order:
//  1. Ȳ = Lᵀ Ū, the chunk's Z̄ (into the token array the VJPs read);
//  2. M̄ = s tril(Ō Uᵀ) (its diagonal kept apart) and T̄ = −stril(Ȳ Uᵀ);
//  3. per slab of 32 key channels: Q̃̄ = s Ō Sᵀ, Ã̄ = −Ȳ Sᵀ, K̂̄ = U Ŝ'ᵀ, ρ = rowsum(Ŝ'⊙S); then
//     §6.2 through the decay factors on tensor cores: for a 16-row block I the pairs (r, j) of
//     ā°, q̄° share the reference R = G at row 16I-1 and those of k̄° the reference R' = G at row
//     16I+15, so E_rj = 2^(G_r - R) 2^(R - G_j) with both factors <= 1 off the diagonal blocks and
//     at most 2^64 inside them; channels whose in-block decay is steeper go pair by pair (as the
//     forward's prep pass does). Then ā, q̄, k̄ and the decay gradient of §6.3 in the
//     cancellation-free arrangement of chunked_backward_tile.hpp (chunk_block), into the token
//     arrays;
//  4. the token VJPs of §5.2 for the chunk's tokens: chunked_backward_tile.hpp's token_item.
// Operands sit in shared memory as split-bf16 planes (x = hi + lo, two terms: 16 significant bits;
// the bf16 inputs q, k, do need one) and reach the tensor cores through ldmatrix, in either
// orientation; products are mma m16n8k16 with fp32 accumulation (chunked_common.cuh: mma_split).
// bf16 inputs only: fp32 inputs take the fp32 CUDA-core path of chunked_backward.cu.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/chunked_backward_tile.hpp"
#include "kernels/chunked_bwd_grads.hpp"
#include "kernels/chunked_common.cuh"

namespace qed::kernels::chunked_bwd {
namespace {

using bf = __nv_bfloat16;
using chunked::ldsm_x4;
using chunked::ldsm_x4_t;
using chunked::mma_split;
using chunked::split2;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSW = 32;  // key channels per slab
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A tile of R x C values as N bf16 planes (the split terms), row pitch C + 8 elements: the eight
// 16-byte rows an ldmatrix reads land on distinct banks.
template <int R, int C, int N>
struct Planes {
  static constexpr int P = C + 8;
  static constexpr int PE = R * P;  // elements per plane
  static constexpr int bytes = N * PE * 2;
  bf* p;
  // A fragment (rows m0.., columns k0..) of the tile as stored, or of its transpose.
  __device__ void a(uint32_t* f, int m0, int k0, int lane) const {
    const bf* q = p + (m0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * P + k0 + 8 * ((lane >> 4) & 1);
#pragma unroll
    for (int i = 0; i < N; ++i) ldsm_x4(f + 4 * i, q + i * PE);
  }
  __device__ void a_t(uint32_t* f, int m0, int k0, int lane) const {
    const bf* q = p + (k0 + (lane & 7) + 8 * ((lane >> 4) & 1)) * P + m0 + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int i = 0; i < N; ++i) ldsm_x4_t(f + 4 * i, q + i * PE);
  }
  // B fragments of two n-tiles (n0.., n0+8..; k0..) of the tile as stored ([n][k]: b) or of its
  // transpose ([k][n]: b_t).
  __device__ void b(uint32_t* f0, uint32_t* f1, int n0, int k0, int lane) const {
    const bf* q = p + (n0 + (lane & 7) + 8 * ((lane >> 4) & 1)) * P + k0 + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      uint32_t r[4];
      ldsm_x4(r, q + i * PE);
      f0[2 * i] = r[0], f0[2 * i + 1] = r[1], f1[2 * i] = r[2], f1[2 * i + 1] = r[3];
    }
  }
  __device__ void b_t(uint32_t* f0, uint32_t* f1, int n0, int k0, int lane) const {
    const bf* q = p + (k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * P + n0 + 8 * ((lane >> 4) & 1);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      uint32_t r[4];
      ldsm_x4_t(r, q + i * PE);
      f0[2 * i] = r[0], f0[2 * i + 1] = r[1], f1[2 * i] = r[2], f1[2 * i + 1] = r[3];
    }
  }
  // Columns c, c+1 (c even) of row r from two fp32 values.
  __device__ void put2(int r, int c, float x, float y) const {
    uint32_t v[N];
    split2<N>(x, y, v);
#pragma unroll
    for (int i = 0; i < N; ++i) *reinterpret_cast<uint32_t*>(p + i * PE + r * P + c) = v[i];
  }
  __device__ float get(int r, int c) const {
    float x = 0.f;
#pragma unroll
    for (int i = N - 1; i >= 0; --i) x += __bfloat162float(p[i * PE + r * P + c]);
    return x;
  }
};

template <int K, int V, int NT>
struct GradSmem {
  using O = Planes<kC, V, 1>;    // Ō (bf16 do: one term)
  using UP = Planes<kC, V, NT>;  // U; Ū, then Ȳ
  using TP = Planes<kC, kC, NT>; // T̄, M̄ (strictly lower), L
  using SP = Planes<kSW, V, NT>; // S, Ŝ' rows of a slab
  static constexpr int QP = kSW + 8;  // bf16 slab tiles of q, k, b
  static constexpr int GP = kSW + 4;  // fp32 slab tile of G
  static constexpr int XP = kSW + 1;  // fp32 slab tiles of Ḡ', K̂⊙K̂̄
  static constexpr int oO = 0;
  static constexpr int oU = oO + O::bytes;
  static constexpr int oY = oU + UP::bytes;
  static constexpr int oT = oY + UP::bytes;
  static constexpr int oM = oT + TP::bytes;
  static constexpr int oMisc = oM + TP::bytes;  // coef, M̄ diagonal [kC]; rho, steep masks
  static constexpr int oSlab = oMisc + 4 * (2 * kC + kSW + 4);
  // the slab area: L in step 1, then per slab
  static constexpr int oL = oSlab;
  static constexpr int oS = oSlab;
  static constexpr int oSh = oS + SP::bytes;
  static constexpr int oq = oSh + SP::bytes;
  static constexpr int ok = oq + kC * QP * 2;
  static constexpr int ob = ok + kC * QP * 2;
  static constexpr int oG = ob + kC * QP * 2;
  static constexpr int oGp = oG + kC * GP * 4;
  static constexpr int oKK = oGp + kC * XP * 4;
  static constexpr int slab_end = oKK + kC * XP * 4;
  static constexpr int total = (slab_end > oL + TP::bytes ? slab_end : oL + TP::bytes);
  static_assert(oSlab % 16 == 0 && oSh % 16 == 0 && oq % 16 == 0 && oG % 16 == 0, "GradSmem: 16-byte alignment");
};

// Warp tasks of step 2 (M̄, T̄): row block I and the 8-column tiles nt0 .. nt0+cnt-1 of it, the
// 20 tiles on or below the diagonal blocks spread over eight warps.
__device__ __forceinline__ void step2_task(int warp, int& I, int& nt0, int& cnt) {
  // warp:        0  1  2  3  4  5  6  7
  // row block:   3  3  3  2  2  1  1  0   (2 bits per warp)
  // first tile:  0  3  6  0  3  0  2  0   (4 bits per warp)
  // tiles:       3  3  2  3  3  2  2  2
  I = static_cast<int>((0x16bfu >> (2 * warp)) & 3u);
  nt0 = static_cast<int>((0x02030630u >> (4 * warp)) & 15u);
  cnt = static_cast<int>((0x22233233u >> (4 * warp)) & 15u);
}

template <int K, int V, int NT>
__global__ void __launch_bounds__(kThreads, 1) grads_kernel(const GradArgs G) {
  using Z = GradSmem<K, V, NT>;
  using O = typename Z::O;
  using UP = typename Z::UP;
  using TP = typename Z::TP;
  using SP = typename Z::SP;
  constexpr int QP = Z::QP, GP = Z::GP, XP = Z::XP;
  const BwdArgs& A = G.b;
  extern __shared__ __align__(16) unsigned char sm[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t gc = blockIdx.x, h = blockIdx.y;
  int64_t seq = 0, loc = 0;
  if (!locate_chunk(A, gc, seq, loc)) return;
  const Span sp = seq_span(A, seq);
  const int64_t rem = sp.len - loc * kC;
  if (rem <= 0) return;
  const int n = rem < kC ? static_cast<int>(rem) : kC;
  const int64_t t0 = sp.bos + loc * kC, brow = sp.brow;
  const float s = A.scale;
  const bool qed = A.variant == kQed;
  const bool projected = qed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  const bool chan_bw = A.variant == kGdn2 || qed;
  const bool chan_g = chan_bw || A.variant == kKda;
  const float lam = qed ? A.lambda[h] : 0.f;

  const O Ob{reinterpret_cast<bf*>(sm + Z::oO)};
  const UP Up{reinterpret_cast<bf*>(sm + Z::oU)};
  const UP Yp{reinterpret_cast<bf*>(sm + Z::oY)};
  const TP Tp{reinterpret_cast<bf*>(sm + Z::oT)};
  const TP Mp{reinterpret_cast<bf*>(sm + Z::oM)};
  const TP Lp{reinterpret_cast<bf*>(sm + Z::oL)};
  float* coef = reinterpret_cast<float*>(sm + Z::oMisc);  // [kC] (k.m)/(k.k), projected arms
  float* mdiag = coef + kC;                                // [kC] s (Ō Uᵀ)_rr
  float* rho = mdiag + kC;                                 // [kSW]
  uint32_t* steep = reinterpret_cast<uint32_t*>(rho + kSW);  // [4] one bit per slab channel
  const SP Ss{reinterpret_cast<bf*>(sm + Z::oS)};
  const SP Shp{reinterpret_cast<bf*>(sm + Z::oSh)};
  bf* qsl = reinterpret_cast<bf*>(sm + Z::oq);
  bf* ksl = reinterpret_cast<bf*>(sm + Z::ok);
  bf* bsl = reinterpret_cast<bf*>(sm + Z::ob);
  float* Gs = reinterpret_cast<float*>(sm + Z::oG);
  float* Gp = reinterpret_cast<float*>(sm + Z::oGp);
  float* KK = reinterpret_cast<float*>(sm + Z::oKK);

  const int64_t cht = gc * A.H + h;  // (chunk, head) index of the workspace arrays
  const int64_t HK = A.H * K, BTHK = A.B * A.T * HK;
  auto tokk = [&](int r) { return ((brow * A.T) + t0 + r) * HK + h * K; };

  // ---- staging: Ō, U, Ū, L; the projection coefficients; T̄ and M̄ zeroed ----
  for (int i = tid; i < kC * V; i += kThreads) {
    const int r = i / V, v = i % V;
    Ob.p[r * O::P + v] = __float2bfloat16_rn(r < n ? ld(A.dout, brow, t0 + r, h, v) : 0.f);
  }
  {
    const float4* u4 = reinterpret_cast<const float4*>(G.u + cht * kC * V);
    const float4* ub4 = reinterpret_cast<const float4*>(G.ubar + cht * kC * V);
    for (int i = tid; i < kC * V / 4; i += kThreads) {
      const int r = (4 * i) / V, v = (4 * i) % V;
      const float4 x = u4[i], y = ub4[i];
      Up.put2(r, v, x.x, x.y);
      Up.put2(r, v + 2, x.z, x.w);
      Yp.put2(r, v, y.x, y.y);
      Yp.put2(r, v + 2, y.z, y.w);
    }
    const float4* l4 = reinterpret_cast<const float4*>(G.bws + cht * G.bblob + G.lm_off);
    for (int i = tid; i < kC * kC / 4; i += kThreads) {
      const int r = (4 * i) / kC, c = (4 * i) % kC;
      const float4 x = l4[i];
      Lp.put2(r, c, x.x, x.y);
      Lp.put2(r, c + 2, x.z, x.w);
    }
  }
  for (int i = tid; i < 2 * TP::bytes / 16; i += kThreads) reinterpret_cast<uint4*>(sm + Z::oT)[i] = make_uint4(0, 0, 0, 0);
  for (int r = warp; r < kC; r += kWarps) {  // one warp per row, lanes over channels, fixed order
    float nn = 0.f, km = 0.f;
    if (projected && r < n)
      for (int c = lane; c < K; c += 32) {
        const float kk = ld(A.k, brow, t0 + r, h, c);
        const float bb = ld(A.b, brow, t0 + r, h, c);
        const float m = A.arm == kArmFull ? bb * ld(A.q, brow, t0 + r, h, c)
                                          : (A.arm == kArmRand ? bb * A.r[h * K + c] : ld(A.q, brow, t0 + r, h, c));
        nn = fmaf(kk, kk, nn);
        km = fmaf(kk, m, km);
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      nn += __shfl_xor_sync(0xffffffffu, nn, o);
      km += __shfl_xor_sync(0xffffffffu, km, o);
    }
    if (lane == 0) coef[r] = (projected && nn > 0.f) ? km / nn : 0.f;
  }
  __syncthreads();

  // ---- 1. Ȳ = Lᵀ Ū: warp -> rows 16J.. of Ȳ, half of the value columns ----
  {
    constexpr int NP = V / 32;  // pairs of 8-column tiles per half
    const int J = warp >> 1, vh = warp & 1;
    float acc[NP][2][4];
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[p][q][e] = 0.f;
    for (int kb = J; kb < 4; ++kb) {  // L is lower triangular: rows r >= 16J meet column block J
      uint32_t a[4 * NT];
      Lp.a_t(a, 16 * J, 16 * kb, lane);
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        uint32_t b0[2 * NT], b1[2 * NT];
        Yp.b_t(b0, b1, vh * (V / 2) + 16 * p, 16 * kb, lane);
        mma_split<NT, NT>(acc[p][0], a, b0);
        mma_split<NT, NT>(acc[p][1], a, b1);
      }
    }
    float* zbar = A.tok_v;
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int j = 16 * J + g + 8 * hh, v = vh * (V / 2) + 16 * p + 8 * q + 2 * t;
          if (j < n)
            *reinterpret_cast<float2*>(zbar + ((brow * A.T + t0 + j) * A.H + h) * V + v) =
                make_float2(acc[p][q][2 * hh], acc[p][q][2 * hh + 1]);
        }
    __syncthreads();  // every warp has read Ū
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          Yp.put2(16 * J + g + 8 * hh, vh * (V / 2) + 16 * p + 8 * q + 2 * t, acc[p][q][2 * hh], acc[p][q][2 * hh + 1]);
  }
  __syncthreads();

  // ---- 2. M̄ = s tril(Ō Uᵀ), T̄ = −stril(Ȳ Uᵀ) (k: value columns) ----
  {
    int I, nt0, cnt;
    step2_task(warp, I, nt0, cnt);
    float accM[3][4], accT[3][4];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) accM[i][e] = accT[i][e] = 0.f;
#pragma unroll 2
    for (int k0 = 0; k0 < V; k0 += 16) {
      uint32_t aO[4], aY[4 * NT];
      Ob.a(aO, 16 * I, k0, lane);
      Yp.a(aY, 16 * I, k0, lane);
#pragma unroll
      for (int i = 0; i < 3; i += 2) {
        if (i >= cnt) break;
        uint32_t b0[2 * NT], b1[2 * NT];
        Up.b(b0, b1, 8 * (nt0 + i), k0, lane);  // Uᵀ (k: value columns, n: rows j of U)
        mma_split<1, NT>(accM[i], aO, b0);
        mma_split<NT, NT>(accT[i], aY, b0);
        if (i + 1 < cnt) {
          mma_split<1, NT>(accM[i + 1], aO, b1);
          mma_split<NT, NT>(accT[i + 1], aY, b1);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      if (i >= cnt) break;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 16 * I + g + 8 * hh, j = 8 * (nt0 + i) + 2 * t;
        float m0 = s * accM[i][2 * hh], m1 = s * accM[i][2 * hh + 1];
        if (j == r) mdiag[r] = m0;
        if (j + 1 == r) mdiag[r] = m1;
        Mp.put2(r, j, j < r ? m0 : 0.f, j + 1 < r ? m1 : 0.f);
        Tp.put2(r, j, j < r ? -accT[i][2 * hh] : 0.f, j + 1 < r ? -accT[i][2 * hh + 1] : 0.f);
      }
    }
  }
  __syncthreads();

  // ---- 3. slabs of kSW key channels ----
  const int I = warp >> 1, hh = warp & 1;  // this warp's row block and 16 channels of the slab
  for (int cb = 0; cb < K; cb += kSW) {
    // 3a. q, k, b (beta for the scalar-gate variants), raw g; S and Ŝ' rows, ρ.
    for (int i = tid; i < kC * kSW; i += kThreads) {
      const int r = i / kSW, c = i % kSW, cg = cb + c;
      float qv = 0.f, kv = 0.f, bv = 0.f, gv = 0.f;
      if (r < n) {
        const int64_t tt = t0 + r;
        qv = ld(A.q, brow, tt, h, cg);
        kv = ld(A.k, brow, tt, h, cg);
        bv = chan_bw ? ld(A.b, brow, tt, h, cg) : ld(A.beta, brow, tt, h, 0);
        gv = A.variant == kDeltanet ? 0.f : ld(A.g, brow, tt, h, chan_g ? cg : 0);
      }
      qsl[r * QP + c] = __float2bfloat16_rn(qv);
      ksl[r * QP + c] = __float2bfloat16_rn(kv);
      bsl[r * QP + c] = __float2bfloat16_rn(bv);
      Gs[r * GP + c] = gv * kLog2e;
    }
    {
      // thread -> channel c = tid / 8 of the slab, value columns (tid % 8) * V/8 ..
      const int c = tid >> 3, part = tid & 7;
      constexpr int VP = V / 8;
      const float* Sg = A.cs + (cht * K + cb + c) * V + part * VP;
      const float* Hg = G.ds + (cht * K + cb + c) * V + part * VP;
      float acc = 0.f;
#pragma unroll
      for (int v = 0; v < VP; v += 4) {
        const float4 x = *reinterpret_cast<const float4*>(Sg + v), y = *reinterpret_cast<const float4*>(Hg + v);
        Ss.put2(c, part * VP + v, x.x, x.y);
        Ss.put2(c, part * VP + v + 2, x.z, x.w);
        Shp.put2(c, part * VP + v, y.x, y.y);
        Shp.put2(c, part * VP + v + 2, y.z, y.w);
        acc = fmaf(y.x, x.x, acc);
        acc = fmaf(y.y, x.y, acc);
        acc = fmaf(y.z, x.z, acc);
        acc = fmaf(y.w, x.w, acc);
      }
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      acc += __shfl_xor_sync(0xffffffffu, acc, 4);
      if (part == 0) rho[c] = A.mutant == kMutantNoDecayRho ? 0.f : acc;
    }
    __syncthreads();
    {  // in-chunk cumulative log2-decay (rows past the chunk: g = 0); eight threads of eight rows
       // per channel, the segment totals added in segment order
      const int c = tid >> 3, sg = tid & 7;
      float x[8], run = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        run += Gs[(8 * sg + i) * GP + c];
        x[i] = run;
      }
      float before = 0.f;
#pragma unroll
      for (int o = 1; o < 8; ++o) {
        const float tot = __shfl_sync(0xffffffffu, run, (lane & ~7) | ((sg + o) & 7));
        if (sg + o >= 8) before += tot;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) Gs[(8 * sg + i) * GP + c] = x[i] + before;
    }
    __syncthreads();
    if (warp < 4) {  // steep channels of diagonal block `warp`
      const float Gpr = warp == 0 ? 0.f : Gs[(16 * warp - 1) * GP + lane];
      const unsigned m = __ballot_sync(0xffffffffu, (Gpr - Gs[(16 * warp + 15) * GP + lane]) > G.max_diag);
      if (lane == 0) steep[warp] = m;
    }

    // 3b. Q̃̄, Ã̄, K̂̄ for rows 16I.. and slab channels 16hh.. (k: value columns)
    float aQ[2][4], aA[2][4], aK[2][4];
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) aQ[q][e] = aA[q][e] = aK[q][e] = 0.f;
#pragma unroll 2
    for (int k0 = 0; k0 < V; k0 += 16) {
      uint32_t fO[4], fY[4 * NT], fU[4 * NT], s0[2 * NT], s1[2 * NT], h0[2 * NT], h1[2 * NT];
      Ob.a(fO, 16 * I, k0, lane);
      Yp.a(fY, 16 * I, k0, lane);
      Up.a(fU, 16 * I, k0, lane);
      Ss.b(s0, s1, 16 * hh, k0, lane);
      Shp.b(h0, h1, 16 * hh, k0, lane);
      mma_split<1, NT>(aQ[0], fO, s0);
      mma_split<1, NT>(aQ[1], fO, s1);
      mma_split<NT, NT>(aA[0], fY, s0);
      mma_split<NT, NT>(aA[1], fY, s1);
      mma_split<NT, NT>(aK[0], fU, h0);
      mma_split<NT, NT>(aK[1], fU, h1);
    }
    __syncthreads();  // steep masks

    // 3c. §6.2 on tensor cores. Lane element (hr, q, e): row r = 16I + g + 8hr, slab channel
    // c = 16hh + 8q + 2t + e (accumulator entry 2hr + e of n-tile q).
    auto aval = [&](int r, int c) {  // erase vector a (MATH.md §2) from the slab tiles
      const float kk = __bfloat162float(ksl[r * QP + c]), bb = __bfloat162float(bsl[r * QP + c]);
      if (!qed) return bb * kk;
      const float qq = __bfloat162float(qsl[r * QP + c]);
      const float m = A.arm == kArmFull ? bb * qq : (A.arm == kArmRand ? bb * A.r[h * K + cb + c] : qq);
      return fmaf(bb, kk, fmaf(lam, m, -lam * coef[r] * kk));
    };
    const uint32_t stI = steep[I];
    float aB[2][4], qB[2][4], kB[2][4];  // ā°, q̄°, k̄° (diagonal M̄ terms left out)
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) aB[q][e] = qB[q][e] = kB[q][e] = 0.f;
    {
      // ā°, q̄°: Σ_{J <= I} [T̄, M̄]_IJ (K_J ⊙ 2^(R - G_J)), R = G at row 16I - 1 (0 for I = 0).
      for (int J = 0; J <= I; ++J) {
        uint32_t fT[4 * NT], fM[4 * NT];
        Tp.a(fT, 16 * I, 16 * J, lane);
        Mp.a(fM, 16 * I, 16 * J, lane);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int c = 16 * hh + 8 * q + g;
          const float R = I == 0 ? 0.f : Gs[(16 * I - 1) * GP + c];
          const bool drop = J == I && ((stI >> c) & 1u);
          uint32_t bk[2 * NT];
#pragma unroll
          for (int reg = 0; reg < 2; ++reg) {
            const int j = 16 * J + 2 * t + 8 * reg;
            float x0 = __bfloat162float(ksl[j * QP + c]) * ex2(R - Gs[j * GP + c]);
            float x1 = __bfloat162float(ksl[(j + 1) * QP + c]) * ex2(R - Gs[(j + 1) * GP + c]);
            if (drop) x0 = x1 = 0.f;
            uint32_t x[NT];
            split2<NT>(x0, x1, x);
#pragma unroll
            for (int i = 0; i < NT; ++i) bk[2 * i + reg] = x[i];
          }
          mma_split<NT, NT>(aB[q], fT, bk);
          mma_split<NT, NT>(qB[q], fM, bk);
        }
      }
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * I + g + 8 * (e >> 1), c = 16 * hh + 8 * q + 2 * t + (e & 1);
          const float x = ex2(Gs[r * GP + c] - (I == 0 ? 0.f : Gs[(16 * I - 1) * GP + c]));
          aB[q][e] *= x;
          qB[q][e] *= x;
        }
    }
    {
      // k̄°: Σ_{I' >= I} [T̄, M̄]_{I'I}ᵀ ([A, Q]_{I'} ⊙ 2^(G_{I'} - R')), R' = G at row 16I + 15.
      for (int J = I; J < 4; ++J) {
        uint32_t fT[4 * NT], fM[4 * NT];
        Tp.a_t(fT, 16 * I, 16 * J, lane);
        Mp.a_t(fM, 16 * I, 16 * J, lane);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int c = 16 * hh + 8 * q + g;
          const float R = Gs[(16 * I + 15) * GP + c];
          const bool drop = J == I && ((stI >> c) & 1u);
          uint32_t ba[2 * NT], bq[2 * NT];
#pragma unroll
          for (int reg = 0; reg < 2; ++reg) {
            const int r = 16 * J + 2 * t + 8 * reg;
            const float e0 = drop ? 0.f : ex2(Gs[r * GP + c] - R), e1 = drop ? 0.f : ex2(Gs[(r + 1) * GP + c] - R);
            uint32_t x[NT], y[NT];
            split2<NT>(aval(r, c) * e0, aval(r + 1, c) * e1, x);
            split2<NT>(__bfloat162float(qsl[r * QP + c]) * e0, __bfloat162float(qsl[(r + 1) * QP + c]) * e1, y);
#pragma unroll
            for (int i = 0; i < NT; ++i) ba[2 * i + reg] = x[i], bq[2 * i + reg] = y[i];
          }
          mma_split<NT, NT>(kB[q], fT, ba);
          mma_split<NT, NT>(kB[q], fM, bq);
        }
      }
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * I + g + 8 * (e >> 1), c = 16 * hh + 8 * q + 2 * t + (e & 1);
          kB[q][e] *= ex2(Gs[(16 * I + 15) * GP + c] - Gs[r * GP + c]);
        }
    }
    // Steep channels: the pairs inside diagonal block I with pairwise exponents (<= 0).
    if (stI != 0u) {
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * I + g + 8 * (e >> 1), c = 16 * hh + 8 * q + 2 * t + (e & 1);
          if (!((stI >> c) & 1u)) continue;
          const float Gr = Gs[r * GP + c];
          float ab = 0.f, qb = 0.f, kb = 0.f;
          for (int j = 16 * I; j < r; ++j) {
            const float kd = __bfloat162float(ksl[j * QP + c]) * ex2(Gr - Gs[j * GP + c]);
            ab = fmaf(Tp.get(r, j), kd, ab);
            qb = fmaf(Mp.get(r, j), kd, qb);
          }
          for (int r2 = r + 1; r2 < 16 * I + 16; ++r2) {
            const float x = fmaf(Tp.get(r2, r), aval(r2, c), Mp.get(r2, r) * __bfloat162float(qsl[r2 * QP + c]));
            kb = fmaf(x, ex2(Gs[r2 * GP + c] - Gr), kb);
          }
          aB[q][e] += ab;
          qB[q][e] += qb;
          kB[q][e] += kb;
        }
    }

    // 3d. ā, q̄, k̄ into the token arrays; Ḡ' and K̂⊙K̂̄ for the decay gradient.
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * I + g + 8 * (e >> 1), c = 16 * hh + 8 * q + 2 * t + (e & 1);
        const float Gr = Gs[r * GP + c], gam = ex2(Gr), kh = ex2(Gs[(kC - 1) * GP + c] - Gr);
        const float kk = __bfloat162float(ksl[r * QP + c]), qq = __bfloat162float(qsl[r * QP + c]);
        const float ab = fmaf(-aA[q][e], gam, aB[q][e]);
        const float qb = fmaf(s * aQ[q][e], gam, qB[q][e]);
        const float kb = kB[q][e];
        Gp[r * XP + c] = aval(r, c) * ab + qq * qb - kk * kb;
        KK[r * XP + c] = kk * kh * aK[q][e];
        if (r < n) {
          const int64_t o = tokk(r) + cb + c;
          float kfull = fmaf(mdiag[r], qq, kb);
          if (A.mutant != kMutantNoKhatGrad) kfull = fmaf(aK[q][e], kh, kfull);
          A.tok_k[o] = ab;
          A.tok_k[BTHK + o] = fmaf(mdiag[r], kk, qb);
          A.tok_k[2 * BTHK + o] = kfull;
        }
      }
    __syncthreads();
    // 3e. §6.3: ḡ_i = γ_n ρ + Σ_{j<i} K̂_j⊙K̂̄_j + Σ_{r>=i} Ḡ'_r per channel; eight threads of eight
    // rows each, the segment totals combined over the eight lanes in a fixed order.
    {
      const int c = tid >> 3, sg = tid & 7, r0 = 8 * sg;
      float suf[8], pre[8];
      float run = 0.f;
#pragma unroll
      for (int i = 7; i >= 0; --i) {
        run += Gp[(r0 + i) * XP + c];
        suf[i] = run;
      }
      const float totG = run;
      run = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        pre[i] = run;
        run += KK[(r0 + i) * XP + c];
      }
      const float totK = run;
      float after = 0.f, before = 0.f;  // Σ of the other segments' totals, in segment order
#pragma unroll
      for (int o = 1; o < 8; ++o) {
        const float tg = __shfl_sync(0xffffffffu, totG, (lane & ~7) | ((sg + o) & 7));
        const float tk = __shfl_sync(0xffffffffu, totK, (lane & ~7) | ((sg + o) & 7));
        if (sg + o < 8) after += tg;
        if (sg + o >= 8) before += tk;
      }
      const float base = rho[c] * ex2(Gs[(kC - 1) * GP + c]) + before;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = r0 + i;
        if (r < n) A.tok_k[3 * BTHK + tokk(r) + cb + c] = (suf[i] + after) + (base + pre[i]);
      }
    }
    __syncthreads();
  }

  // ---- 4. token VJPs (§5.2) of the chunk's tokens, one warp per token ----
  for (int r = warp; r < n; r += kWarps) {
    const int64_t item = (brow * A.T + t0 + r) * A.H + h;
    token_item(A, item, lane, 32, [](float x) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
      return x;
    });
  }
}

template <int K, int V>
cudaError_t launch_t(const GradArgs& G, int64_t chunks, cudaStream_t st) {
  using Z = GradSmem<K, V, 2>;
  static_assert(Z::total <= 227 * 1024, "grads_kernel: shared memory over the per-block limit");
  auto kern = grads_kernel<K, V, 2>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Z::total);
  if (e != cudaSuccess) return e;
  if (chunks == 0 || G.b.H == 0) return cudaSuccess;
  kern<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(G.b.H)), kThreads, Z::total, st>>>(G);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_grads(const GradArgs& G, int64_t chunks, cudaStream_t st) {
  if (G.b.K == 64) return G.b.V == 64 ? launch_t<64, 64>(G, chunks, st) : launch_t<64, 128>(G, chunks, st);
  return G.b.V == 64 ? launch_t<128, 64>(G, chunks, st) : launch_t<128, 128>(G, chunks, st);
}

}  // namespace qed::kernels::chunked_bwd
