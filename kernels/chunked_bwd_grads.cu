// Chunk-parallel gradient pass of the chunked backward (MATH.md §6.1-§6.3, §5.2), one block of
// eight warps per (chunk, head), after the recomputing forward (S_[n] of every chunk, U, L) and the
// reverse sweep (Ŝ' = the adjoint of the chunk's end state, Ū; chunked_bwd_sweep.cu). In order:
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
//  4. the token VJPs of §5.2 for the chunk's tokens (chunked_backward_tile.hpp's token_item): in 3d
//     and 3f for every variant, QED's less the terms in en = k.ā / k.k; after the slabs, which
//     sum k.ā, QED's projected arms read their dq, dk, db back and add those terms.
// Operands sit in shared memory as split-bf16 planes (x = hi + lo, two terms: 16 significant bits;
// the bf16 inputs q, k, do need one) and reach the tensor cores through ldmatrix, in either
// orientation; products are mma m16n8k16 with fp32 accumulation (chunked_common.cuh: mma_split).
// bf16 inputs only: fp32 inputs take the fp32 CUDA-core path of chunked_backward.cu.
// Instances (launch_t): RAW (every input row bf16 and 16-byte aligned, output rows aligned) on
// eight warps, with each slab's global inputs loaded into registers one slab ahead; and the general
// kernel for any other layout or for sixteen warps. The RAW instance leaves the other layouts'
// code out on purpose: at one block per multiprocessor a larger kernel stalls on instruction fetch
// (reports/device/chunked.md runs 15-16; bench/kernel_sizes.sh prints the sizes).
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

// W, the warps of a block, is a template parameter (8 or 16; QEDCHECK_CHUNKED_GRADS_WARPS picks):
// sixteen warps hide more latency at one block per multiprocessor, eight need fewer registers
// each. Phases written for 256 threads run on the first eight warps either way.
constexpr int kBase = 256;  // threads of the fixed-size phases (kC rows x 4 parts, kSW x 8)
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
  // Columns c0..c0+7 (c0 a multiple of 8) of row r, from 16-byte reads of each plane.
  __device__ void get8(int r, int c0, float* x) const {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = 0.f;
#pragma unroll
    for (int i = N - 1; i >= 0; --i) {
      const uint4 u = *reinterpret_cast<const uint4*>(p + i * PE + r * P + c0);
      const bf* v = reinterpret_cast<const bf*>(&u);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] += __bfloat162float(v[e]);
    }
  }
  __device__ float get(int r, int c) const {
    float x = 0.f;
#pragma unroll
    for (int i = N - 1; i >= 0; --i) x += __bfloat162float(p[i * PE + r * P + c]);
    return x;
  }
};

template <int K, int V, int NT, int W>
struct GradSmem {
  using O = Planes<kC, V, 1>;         // Ō (bf16 do: one term)
  using UP = Planes<kC, V, NT>;       // U; Ū, then Ȳ
  using TP = Planes<kC, kC, NT>;      // T̄, M̄ (strictly lower), L
  using SP = Planes<kSW, V, NT>;      // S, Ŝ' rows of a slab
  static constexpr int QP = kSW + 8;  // bf16 slab tiles of q, k, b
  static constexpr int GP = kSW + 4;  // fp32 slab tile of G
  static constexpr int XP = kSW + 1;  // fp32 slab tiles of Ḡ', K̂⊙K̂̄
  static constexpr int oO = 0;
  static constexpr int oU = oO + O::bytes;
  static constexpr int oY = oU + UP::bytes;
  static constexpr int oT = oY + UP::bytes;
  static constexpr int oM = oT + TP::bytes;
  static constexpr int oMisc =
      oM + TP::bytes;  // coef, k.k, M̄ diagonal; per-token sums; rho, steep masks; rand's r
  static constexpr int oSlab = oMisc + 4 * (3 * kC + 4 * kC + 8 * kC + 8 * kC + kSW + 4 + K);
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
  static constexpr int oA = oKK + kC * XP * 4;  // fp32 slab tile of the erase vector a (pitch GP)
  // Four fp32 tiles [kC][XP] of the slab's per-token outputs (dq, dk, db, dg; QED's dq, dk, db less their en terms),
  // written out in 16-byte rows after the slab: in the S, Ŝ' area (free after 3b) where it fits.
  static constexpr int out_bytes = 4 * kC * XP * 4;
  static constexpr bool out_in_s = 2 * SP::bytes >= out_bytes;
  static constexpr int oOut = out_in_s ? oS : oA + kC * GP * 4;
  static constexpr int slab_end = oA + kC * GP * 4 + (out_in_s ? 0 : out_bytes);
  static constexpr int total = (slab_end > oL + TP::bytes ? slab_end : oL + TP::bytes);
  static_assert(oSlab % 16 == 0 && oSh % 16 == 0 && oq % 16 == 0 && oG % 16 == 0 && oA % 16 == 0,
                "GradSmem: 16-byte alignment");
};

// Warp tasks of step 2 (M̄, T̄): row block I and the 8-column tiles nt0 .. nt0+cnt-1 of it, the
// 20 tiles on or below the diagonal blocks spread over eight warps.
template <int W>
__device__ __forceinline__ void step2_task(int warp, int& I, int& nt0, int& cnt) {
  if constexpr (W == 16) {  // ten warps of two tiles: row block 3 x4, 2 x3, 1 x2, 0 x1
    // warp:        0 1 2 3 4 5 6 7 8 9 (10..15 idle)
    // row block:   3 3 3 3 2 2 2 1 1 0
    // first tile:  0 2 4 6 0 2 4 0 2 0
    I = static_cast<int>((0x16affu >> (2 * warp)) & 3u);
    nt0 = static_cast<int>((0x204206420ull >> (4 * warp)) & 15u);
    cnt = warp < 10 ? 2 : 0;
    return;
  }
  // warp:        0  1  2  3  4  5  6  7
  // row block:   3  3  3  2  2  1  1  0   (2 bits per warp)
  // first tile:  0  3  6  0  3  0  2  0   (4 bits per warp)
  // tiles:       3  3  2  3  3  2  2  2
  I = static_cast<int>((0x16bfu >> (2 * warp)) & 3u);
  nt0 = static_cast<int>((0x02030630u >> (4 * warp)) & 15u);
  cnt = static_cast<int>((0x22233233u >> (4 * warp)) & 15u);
}

// Eight consecutive elements c0.. of one row of a bf16 or fp32 [B,T,H,D] input (16-byte loads when
// the host found its rows aligned: `vec`).
__device__ __forceinline__ void ld8(const SeqIn& x, int64_t brow, int64_t t, int64_t h, int c0,
                                    bool vec, float* o) {
  const int64_t i = brow * x.sb + t * x.st + h * x.sh + c0;
  if (vec && x.dt == 1) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const bf*>(x.p) + i);
    const bf* e = reinterpret_cast<const bf*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __bfloat162float(e[j]);
  } else if (vec && x.dt == 0) {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(x.p) + i);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(x.p) + i + 4);
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = ld(x, brow, t, h, c0 + j);
  }
}

// The eight bf16 values of a raw 16-byte piece, as floats.
__device__ __forceinline__ void unpack8(const uint4& u, float* x) {
  const bf* e = reinterpret_cast<const bf*>(&u);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = __bfloat162float(e[j]);
}
// Eight floats as one 16-byte bf16 piece, rounded as st8x rounds a bf16 row (nearest even).
__device__ __forceinline__ uint4 pack8(const float* v) {
  uint4 u;
  __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) e[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  return u;
}

// The query-side vector m of the QED arms (MATH.md §2) at one element: b q (full), b r (rand),
// q (nogate, nogate_noproj), without branches on the arm: m = b (xf q + r) + xn q with the block's
// arm factors (ArmF) and r the head's rand vector in shared memory, zero for the other arms. The
// same value as the branching form for finite inputs (one rounding: fmaf(1, q, 0) = q,
// fmaf(0, q, r) = r, b 0 + q = q), up to the sign of a zero product.
struct ArmF {
  float xf = 0.f, xn = 0.f;  // xf 1 for full; xn 1 for every arm but full and rand
};
__device__ __forceinline__ ArmF arm_factors(int arm) {
  ArmF f;
  f.xf = arm == kArmFull ? 1.f : 0.f;
  f.xn = (arm == kArmFull || arm == kArmRand) ? 0.f : 1.f;
  return f;
}
__device__ __forceinline__ float arm_m(const ArmF& f, float b, float q, float r) {
  return fmaf(b, fmaf(f.xf, q, r), f.xn * q);
}

// Eight consecutive elements c0.. of one row of a gradient output (16-byte stores when the host
// found its rows aligned: `vec`); bf16 rounding as st() does it.
__device__ __forceinline__ void st8(const SeqOut& x, int64_t brow, int64_t t, int64_t h, int c0,
                                    bool vec, const float* v) {
  const int64_t i = brow * x.sb + t * x.st + h * x.sh + c0;
  if (vec && x.dt == 1) {
    uint4 u;
    uint16_t* e = reinterpret_cast<uint16_t*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = float_to_bf16(v[j]);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(x.p) + i) = u;
  } else if (vec && x.dt == 0) {
    float4* d = reinterpret_cast<float4*>(static_cast<float*>(x.p) + i);
    d[0] = make_float4(v[0], v[1], v[2], v[3]);
    d[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) st(x, brow, t, h, c0 + j, v[j]);
  }
}

// ld8 and st8 for a kernel that knows its rows' layout (RAW: bf16 inputs, 16-byte aligned input and
// output rows): only the 16-byte paths are compiled in, which keeps the kernel's code small.
// Eight consecutive bf16 elements c0.. of one row of a bf16 input, as one raw 16-byte piece.
__device__ __forceinline__ uint4 raw_piece(const SeqIn& x, int64_t brow, int64_t t, int64_t h, int c0) {
  return *reinterpret_cast<const uint4*>(static_cast<const bf*>(x.p) + brow * x.sb + t * x.st + h * x.sh + c0);
}
template <bool RAW>
__device__ __forceinline__ void ld8x(const SeqIn& x, int64_t brow, int64_t t, int64_t h, int c0,
                                     bool vec, float* o) {
  if constexpr (RAW)
    unpack8(raw_piece(x, brow, t, h, c0), o);
  else
    ld8(x, brow, t, h, c0, vec, o);
}
template <bool RAW>
__device__ __forceinline__ void st8x(const SeqOut& x, int64_t brow, int64_t t, int64_t h, int c0,
                                     bool vec, const float* v) {
  if constexpr (RAW) {
    const int64_t i = brow * x.sb + t * x.st + h * x.sh + c0;
    if (x.dt == 1) {  // the hardware's round to nearest even: float_to_bf16's bits for non-NaN values
      uint4 u;
      __nv_bfloat162* e = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
      for (int j = 0; j < 4; ++j) e[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
      *reinterpret_cast<uint4*>(static_cast<bf*>(x.p) + i) = u;
    } else {
      float4* d = reinterpret_cast<float4*>(static_cast<float*>(x.p) + i);
      d[0] = make_float4(v[0], v[1], v[2], v[3]);
      d[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  } else {
    st8(x, brow, t, h, c0, vec, v);
  }
}

// Eight consecutive elements c0.. of one row of a gradient output, read back (the QED final pass
// reads 3d's partial dq, dk, db): 16-byte reads where the rows are aligned (`vec`, RAW).
template <bool RAW>
__device__ __forceinline__ void ld8o(const SeqOut& x, int64_t brow, int64_t t, int64_t h, int c0,
                                     bool vec, float* o) {
  const int64_t i = brow * x.sb + t * x.st + h * x.sh + c0;
  if ((RAW || vec) && x.dt == 1) {
    unpack8(*reinterpret_cast<const uint4*>(static_cast<const bf*>(x.p) + i), o);
  } else if (RAW || vec) {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(x.p) + i);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(x.p) + i + 4);
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
  } else if (x.dt == 1) {
    const bf* p = static_cast<const bf*>(x.p) + i;
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __bfloat162float(p[j]);
  } else {
    const float* p = static_cast<const float*>(x.p) + i;
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = p[j];
  }
}

// A gradient value as a store into x and a load back give it (bf16 outputs: rounded to nearest
// even, as st8 / st8x round; fp32 outputs: unchanged).
__device__ __forceinline__ float as_stored(const SeqOut& x, float v) {
  return x.dt == 1 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// A row reduction over the 8 NQ channels a warp holds in its accumulator layout (NQ n-tiles, lane
// columns 2t, 2t+1): x[q][e] summed over q and e & 1, then over the four lanes t; lanes t = 0 end
// with rows g (hr = 0) and g + 8 (hr = 1). Fixed order: deterministic.
template <int NQ>
__device__ __forceinline__ void row_sums(const float (&x)[NQ][4], float& r0, float& r1) {
  if constexpr (NQ == 2) {
    r0 = (x[0][0] + x[0][1]) + (x[1][0] + x[1][1]);
    r1 = (x[0][2] + x[0][3]) + (x[1][2] + x[1][3]);
  } else {
    r0 = x[0][0] + x[0][1];
    r1 = x[0][2] + x[0][3];
  }
  r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
  r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
  r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
  r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
}

template <int K, int V, int NT, int W, bool AHEAD, bool RAW>
__global__ void __launch_bounds__(W * 32, 1) grads_kernel(const GradArgs G) {
  constexpr int kThreads = W * 32;
  constexpr int NQ = W == 8 ? 2 : 1;    // n-tiles (8 slab channels each) per warp in step 3
  constexpr int PW = kSW / (8 * NQ);    // warps per row block in step 3
  // eight warps load global inputs early into registers (sixteen have none to spare): see `issue`
  constexpr bool kAhead = AHEAD && W == 8;
  using Z = GradSmem<K, V, NT, W>;
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
  const bool vec = RAW || G.vec != 0;

  const O Ob{reinterpret_cast<bf*>(sm + Z::oO)};
  const UP Up{reinterpret_cast<bf*>(sm + Z::oU)};
  const UP Yp{reinterpret_cast<bf*>(sm + Z::oY)};
  const TP Tp{reinterpret_cast<bf*>(sm + Z::oT)};
  const TP Mp{reinterpret_cast<bf*>(sm + Z::oM)};
  const TP Lp{reinterpret_cast<bf*>(sm + Z::oL)};
  float* coef =
      reinterpret_cast<float*>(sm + Z::oMisc);  // [kC] (k.m)/(k.k), projected arms, else 0
  float* nnr = coef + kC;                       // [kC] k.k where projected, else 0
  float* mdiag = nnr + kC;                      // [kC] s (Ō Uᵀ)_rr
  float* tot = mdiag + kC;                      // [4][kC] per-token sums (see below)
  float* rowp = tot + 4 * kC;                   // [2 PW][kC] per-slab partial row sums (3d)
  float* rowq = rowp + 8 * kC;                  // [8][kC] per-slab partial row sums (3e)
  float* rho = rowq + 8 * kC;                   // [kSW]
  uint32_t* steep = reinterpret_cast<uint32_t*>(rho + kSW);  // [4] one bit per slab channel
  float* rsm = reinterpret_cast<float*>(steep + 4);  // [K] QED rand's r of head h, else zeros
  const ArmF af = arm_factors(qed ? A.arm : -1);
  const bool rand_arm = qed && A.arm == kArmRand;
  const SP Ss{reinterpret_cast<bf*>(sm + Z::oS)};
  const SP Shp{reinterpret_cast<bf*>(sm + Z::oSh)};
  bf* qsl = reinterpret_cast<bf*>(sm + Z::oq);
  bf* ksl = reinterpret_cast<bf*>(sm + Z::ok);
  bf* bsl = reinterpret_cast<bf*>(sm + Z::ob);
  float* Gs = reinterpret_cast<float*>(sm + Z::oG);
  float* Gp = reinterpret_cast<float*>(sm + Z::oGp);
  float* KK = reinterpret_cast<float*>(sm + Z::oKK);
  float* As = reinterpret_cast<float*>(sm + Z::oA);  // [kC][GP], the slab's a (see aval)
  float* OT = reinterpret_cast<float*>(sm + Z::oOut);  // [4][kC][XP], see GradSmem
  constexpr int OTS = kC * XP;                          // one tile

  const int64_t cht = gc * A.H + h;  // (chunk, head) index of the workspace arrays
  auto item = [&](int r) { return (brow * A.T + t0 + r) * A.H + h; };

  // RAW (the host's G.raw): every input row bf16 and 16-byte aligned, every output row aligned; rows
  // of q, k, b, g, v, w are then read as raw 16-byte pieces and converted at use, and the kernel
  // has no code for other layouts
  auto raw8 = [&](const SeqIn& x, int r, int c0) { return raw_piece(x, brow, t0 + r, h, c0); };

  // ---- staging: Ō (cp.async when aligned), U, Ū, L (all loads first); T̄, M̄ zeroed; per token
  // the projection coefficient and k.k (QED) and zeroed sums ----
  float2 pj = make_float2(0.f, 0.f);  // QED: k.k and k.m of row tid
  {
    constexpr int PR = V / 8;  // 16-byte pieces per row of do
    const bf* dp = static_cast<const bf*>(A.dout.p);
    for (int i = tid; i < kC * PR; i += kThreads) {
      const int r = i / PR, c = (i % PR) * 8;
      bf* dst = Ob.p + r * O::P + c;
      if (r >= n) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      } else if (vec) {
        chunked::cp16(dst, dp + brow * A.dout.sb + (t0 + r) * A.dout.st + h * A.dout.sh + c);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          dst[e] = __float2bfloat16_rn(ld(A.dout, brow, t0 + r, h, c + e));
      }
    }
    chunked::cp_commit();
    constexpr int NU4 = kC * V / 4 / kThreads, NL4 = kC * kC / 4 / kThreads;
    const float4* u4 = reinterpret_cast<const float4*>(G.u + cht * kC * V);
    const float4* ub4 = reinterpret_cast<const float4*>(G.ubar + cht * kC * V);
    const float4* l4 = reinterpret_cast<const float4*>(G.bws + cht * G.bblob + G.lm_off);
    float4 xu[NU4], xb[NU4], xl[NL4];
#pragma unroll
    for (int j = 0; j < NU4; ++j) xu[j] = u4[tid + j * kThreads], xb[j] = ub4[tid + j * kThreads];
#pragma unroll
    for (int j = 0; j < NL4; ++j) xl[j] = l4[tid + j * kThreads];
    // QED's per-row k.k and k.m, which the recompute's prep pass left in the blob
    if (projected && tid < n) pj = *reinterpret_cast<const float2*>(G.bws + cht * G.bblob + G.pj_off + 8 * tid);
#pragma unroll
    for (int j = 0; j < NU4; ++j) {
      const int i = 4 * (tid + j * kThreads), r = i / V, v = i % V;
      Up.put2(r, v, xu[j].x, xu[j].y);
      Up.put2(r, v + 2, xu[j].z, xu[j].w);
      Yp.put2(r, v, xb[j].x, xb[j].y);
      Yp.put2(r, v + 2, xb[j].z, xb[j].w);
    }
#pragma unroll
    for (int j = 0; j < NL4; ++j) {
      const int i = 4 * (tid + j * kThreads), r = i / kC, c = i % kC;
      Lp.put2(r, c, xl[j].x, xl[j].y);
      Lp.put2(r, c + 2, xl[j].z, xl[j].w);
    }
  }
  for (int i = tid; i < 2 * TP::bytes / 16; i += kThreads)
    reinterpret_cast<uint4*>(sm + Z::oT)[i] = make_uint4(0, 0, 0, 0);
  for (int i = tid; i < 4 * kC; i += kThreads) tot[i] = 0.f;
  for (int i = tid; i < K; i += kThreads) rsm[i] = rand_arm ? A.r[h * K + i] : 0.f;
  if (tid < kC) {  // the projection coefficient (k.m)/(k.k) and k.k where the arm projects and k != 0
    const bool proj = projected && pj.x > 0.f;
    coef[tid] = proj ? pj.y / pj.x : 0.f;
    nnr[tid] = proj ? pj.x : 0.f;
  }
  chunked::cp_wait<0>();
  __syncthreads();

  // A slab's global inputs, loaded into registers (`pf`) one slab ahead at eight warps, so that
  // their latency hides behind the previous slab's work (sixteen warps have no registers to
  // spare and load at use): the S, Ŝ' pieces, and q, k, b, g of a row thread's eight channels as
  // raw 16-byte bf16 pieces in the RAW kernel (the general one reads them at use).
  constexpr int F4 = V / 4, NJ = kSW * F4 / kThreads;  // F4 lanes per S row (value columns 4 (f % F4)..)
  static_assert(kSW * F4 % kThreads == 0 && F4 <= 32, "grads_kernel: slab load");
  const int sr = (tid >> 2) & (kC - 1), sc = 8 * (tid & 3);  // row threads: row, first channel
  const bool rowt = tid < kBase;
  struct SlabRegs {
    uint4 q, k, b, g;
    float4 s[NJ], d[NJ];
  } pf;
  auto issue = [&](int cb) {
    if (RAW && rowt && sr < n) {
      pf.q = raw8(A.q, sr, cb + sc);
      pf.k = raw8(A.k, sr, cb + sc);
      if (chan_bw) pf.b = raw8(A.b, sr, cb + sc);
      if (chan_g) pf.g = raw8(A.g, sr, cb + sc);
    }
    const float4* Sg = reinterpret_cast<const float4*>(A.cs + (cht * K + cb) * V);
    const float4* Hg = reinterpret_cast<const float4*>(G.ds + (cht * K + cb) * V);
#pragma unroll
    for (int j = 0; j < NJ; ++j) pf.s[j] = Sg[tid + j * kThreads], pf.d[j] = Hg[tid + j * kThreads];
  };
  if constexpr (kAhead) issue(0);  // in flight through steps 1 and 2

  // v and w of the dv/dw pass after step 1, loaded before its products at eight warps (raw
  // 16-byte bf16 pieces where those rows allow: `raw_vw`; else read at use).
  constexpr int NVW = kC * (V / 8) / kThreads;  // 16-byte pieces of a row of v per thread
  constexpr bool raw_vw = kAhead && RAW;
  uint4 pv[NVW], pw[NVW];
  if (raw_vw) {
#pragma unroll
    for (int j = 0; j < NVW; ++j) {
      const int i = tid + j * kThreads, r = i / (V / 8), c0 = (i % (V / 8)) * 8;
      if (r >= n) continue;
      pv[j] = raw8(A.v, r, c0);
      if (chan_bw) pw[j] = raw8(A.w, r, c0);
    }
  }

  // ---- 1. Ȳ = Lᵀ Ū (the chunk's Z̄): warp -> rows 16J.. of Ȳ, half of the value columns; then,
  // eight value columns of one row per thread, dv and dw (or dv and Σ_v v Z̄ for dbeta) ----
  {
    constexpr int VS = W / 4;            // value-column splits per row block
    constexpr int NP = V / (16 * VS);    // pairs of 8-column tiles per split
    const int J = warp / VS, vh = warp % VS;
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
        Yp.b_t(b0, b1, vh * (V / VS) + 16 * p, 16 * kb, lane);
        mma_split<NT, NT>(acc[p][0], a, b0);
        mma_split<NT, NT>(acc[p][1], a, b1);
      }
    }
    __syncthreads();  // every warp has read Ū
#pragma unroll
    for (int p = 0; p < NP; ++p)
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          Yp.put2(16 * J + g + 8 * hr, vh * (V / VS) + 16 * p + 8 * q + 2 * t, acc[p][q][2 * hr],
                  acc[p][q][2 * hr + 1]);
  }
  __syncthreads();
  {
    constexpr int PR = V / 8;  // threads per row (16 or 8: lanes of one warp)
    static_assert(kC * PR % kThreads == 0, "grads_kernel: dv/dw pass");
    const bool vvw = RAW || G.vec_vw != 0, vout = RAW || G.vec_out != 0;
    constexpr int UVW = raw_vw ? NVW : 1;  // unrolled only where pv, pw are indexed
#pragma unroll UVW
    for (int j = 0; j < NVW; ++j) {
      const int i = tid + j * kThreads, r = i / PR, c0 = (i % PR) * 8;
      const int64_t tt = t0 + r;
      float z[8], vv[8], o1[8], o2[8];
      Yp.get8(r, c0, z);
      float svz = 0.f;
      if (r < n) {
        if (raw_vw)
          unpack8(pv[j], vv);
        else
          ld8x<RAW>(A.v, brow, tt, h, c0, vvw, vv);
        if (chan_bw) {
          float ww[8];
          if (raw_vw)
            unpack8(pw[j], ww);
          else
            ld8x<RAW>(A.w, brow, tt, h, c0, vvw, ww);
#pragma unroll
          for (int e = 0; e < 8; ++e) o1[e] = ww[e] * z[e], o2[e] = vv[e] * z[e];
          st8x<RAW>(A.dv, brow, tt, h, c0, vout, o1);
          st8x<RAW>(A.dw, brow, tt, h, c0, vout, o2);
        } else {
          const float beta = ld(A.beta, brow, tt, h, 0);
#pragma unroll
          for (int e = 0; e < 8; ++e) o1[e] = beta * z[e], svz = fmaf(vv[e], z[e], svz);
          st8x<RAW>(A.dv, brow, tt, h, c0, vout, o1);
        }
      }
      if (!chan_bw) {  // Σ_v v Z̄ over the row's PR threads, in a fixed order
#pragma unroll
        for (int o = 1; o < PR; o <<= 1) svz += __shfl_xor_sync(0xffffffffu, svz, o);
        if (i % PR == 0) tot[3 * kC + r] = svz;
      }
    }
  }

  // ---- 2. M̄ = s tril(Ō Uᵀ), T̄ = −stril(Ȳ Uᵀ) (k: value columns) ----
  {
    int I, nt0, cnt;
    step2_task<W>(warp, I, nt0, cnt);
    float accM[3][4], accT[3][4];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) accM[i][e] = accT[i][e] = 0.f;
#pragma unroll 2
    for (int k0 = 0; cnt > 0 && k0 < V; k0 += 16) {
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
      for (int hr = 0; hr < 2; ++hr) {
        const int r = 16 * I + g + 8 * hr, j = 8 * (nt0 + i) + 2 * t;
        float m0 = s * accM[i][2 * hr], m1 = s * accM[i][2 * hr + 1];
        if (j == r) mdiag[r] = m0;
        if (j + 1 == r) mdiag[r] = m1;
        Mp.put2(r, j, j < r ? m0 : 0.f, j + 1 < r ? m1 : 0.f);
        Tp.put2(r, j, j < r ? -accT[i][2 * hr] : 0.f, j + 1 < r ? -accT[i][2 * hr + 1] : 0.f);
      }
    }
  }
  __syncthreads();

  // ---- 3. slabs of kSW key channels ----
  const int I = warp / PW, cw = 8 * NQ * (warp % PW);  // this warp's row block, first slab channel
  // QED's projected arms, bf16 dq, dk, db (the RAW kernel on eight warps; G.hold): the partial dq,
  // dk, db of every slab before the last stay in the registers of the row thread that made them in
  // 3f, which is the thread that finishes them in 4 (the same row and eight channels of each slab),
  // instead of a store and a read back. Packed as they would be stored (bf16), NH slots shifted
  // along by one per slab so that every index is static.
  constexpr bool kHold = W == 8 && RAW;
  constexpr int NH = kHold ? K / kSW - 1 : 1;
  uint4 hq[NH], hk[NH], hb[NH];
#pragma unroll
  for (int i = 0; i < NH; ++i) hq[i] = hk[i] = hb[i] = make_uint4(0, 0, 0, 0);
  const bool hold = kHold && projected && G.hold != 0 && A.dq.dt == 1 && A.dk.dt == 1 && A.db.dt == 1;
  // Step 4 (hold) reads k, b, q of the NH earlier slabs again. The last slab loads no next slab,
  // so its prefetch registers (pf, dead once 3a has read them) take those 3 NH pieces instead, in
  // flight through the last slab's work rather than waited for in step 4 (where the final pass
  // spent a third of its time on this load: reports/device/chunked.md run 25). Slot i of pf:
  // q, k, b, g, then s[j], d[j] alternately, bit for bit.
  constexpr bool kEarly = kHold && kAhead && 3 * NH <= 4 + 2 * NJ;
  auto put = [&](int i, uint4 v) {
    if (i < 4) {
      (i == 0 ? pf.q : i == 1 ? pf.k : i == 2 ? pf.b : pf.g) = v;
    } else {
      float4& f = ((i - 4) & 1) ? pf.d[(i - 4) >> 1] : pf.s[(i - 4) >> 1];
      f = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
    }
  };
  auto get = [&](int i) -> uint4 {
    if (i < 4) return i == 0 ? pf.q : i == 1 ? pf.k : i == 2 ? pf.b : pf.g;
    const float4 f = ((i - 4) & 1) ? pf.d[(i - 4) >> 1] : pf.s[(i - 4) >> 1];
    return make_uint4(__float_as_uint(f.x), __float_as_uint(f.y), __float_as_uint(f.z), __float_as_uint(f.w));
  };
  auto early = [&]() {
    if (rowt && sr < n && nnr[sr] > 0.f) {
#pragma unroll
      for (int sl = 0; sl < NH; ++sl) {
        put(3 * sl, raw8(A.k, sr, sl * kSW + sc));
        put(3 * sl + 1, raw8(A.b, sr, sl * kSW + sc));
        put(3 * sl + 2, raw8(A.q, sr, sl * kSW + sc));
      }
    }
  };
  for (int cb = 0; cb < K; cb += kSW) {
    // 3a. q, k, b (beta for the scalar-gate variants), raw g; S and Ŝ' rows, ρ; the next slab's
    // loads issued.
    if constexpr (!kAhead) issue(cb);
    {
      // the first kBase threads: eight channels of one row each
      const int r = sr, c = sc, cg = cb + c;
      float qv[8], kv[8], bv[8], gv[8];
      const int64_t tt = t0 + r;
      // a row piece of x: the RAW kernel's prefetched one (pf), else read now
      auto in8 = [&](const uint4& piece, const SeqIn& x, float* o) {
        if constexpr (RAW)
          unpack8(piece, o);
        else
          ld8(x, brow, tt, h, cg, vec, o);
      };
      if (rowt && r < n) {
        in8(pf.q, A.q, qv);
        in8(pf.k, A.k, kv);
        if (chan_bw) {
          in8(pf.b, A.b, bv);
        } else {
          const float beta = ld(A.beta, brow, tt, h, 0);
#pragma unroll
          for (int e = 0; e < 8; ++e) bv[e] = beta;
        }
        if (chan_g) {
          in8(pf.g, A.g, gv);
        } else {
          const float g0 = A.variant == kDeltanet ? 0.f : ld(A.g, brow, tt, h, 0);
#pragma unroll
          for (int e = 0; e < 8; ++e) gv[e] = g0;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) qv[e] = kv[e] = bv[e] = gv[e] = 0.f;
      }
      if (rowt) {
        uint4 pq, pk, pb;
        bf* eq = reinterpret_cast<bf*>(&pq);
        bf* ek = reinterpret_cast<bf*>(&pk);
        bf* eb = reinterpret_cast<bf*>(&pb);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          eq[e] = __float2bfloat16_rn(qv[e]);
          ek[e] = __float2bfloat16_rn(kv[e]);
          eb[e] = __float2bfloat16_rn(bv[e]);
          Gs[r * GP + c + e] = gv[e] * kLog2e;
        }
        *reinterpret_cast<uint4*>(qsl + r * QP + c) = pq;
        *reinterpret_cast<uint4*>(ksl + r * QP + c) = pk;
        *reinterpret_cast<uint4*>(bsl + r * QP + c) = pb;
        // the erase vector a (MATH.md §2) of these eight channels, from the tiles' rounded
        // values: b k, or for QED b k + lambda (m - coef k), m the arm's query-side vector
        float av[8];
        const float cf = r < n ? coef[r] : 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float kk = __bfloat162float(ek[e]), bb = __bfloat162float(eb[e]);
          av[e] = bb * kk;
          if (qed) {
            const float qq = __bfloat162float(eq[e]);
            av[e] = fmaf(bb, kk, fmaf(lam, arm_m(af, bb, qq, rsm[cg + e]), -lam * cf * kk));
          }
          if (r >= n) av[e] = 0.f;
        }
        *reinterpret_cast<float4*>(As + r * GP + c) = make_float4(av[0], av[1], av[2], av[3]);
        *reinterpret_cast<float4*>(As + r * GP + c + 4) = make_float4(av[4], av[5], av[6], av[7]);
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int f = tid + j * kThreads, ch = f / F4, v0 = 4 * (f % F4);
        const float4 x = pf.s[j], y = pf.d[j];
        Ss.put2(ch, v0, x.x, x.y);
        Ss.put2(ch, v0 + 2, x.z, x.w);
        Shp.put2(ch, v0, y.x, y.y);
        Shp.put2(ch, v0 + 2, y.z, y.w);
        float acc = fmaf(y.w, x.w, fmaf(y.z, x.z, fmaf(y.y, x.y, y.x * x.x)));
#pragma unroll
        for (int o = 1; o < F4; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (f % F4 == 0) rho[ch] = A.mutant == kMutantNoDecayRho ? 0.f : acc;
      }
    }
    if constexpr (kAhead) {
      if (cb + kSW < K) issue(cb + kSW);
      else if (kEarly && hold) early();
    }
    __syncthreads();
    if (tid < kBase) {  // in-chunk cumulative log2-decay (rows past the chunk: g = 0); eight
                        // threads of eight rows per channel, segment totals added in segment order
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
        const float tot8 = __shfl_sync(0xffffffffu, run, (lane & ~7) | ((sg + o) & 7));
        if (sg + o >= 8) before += tot8;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) Gs[(8 * sg + i) * GP + c] = x[i] + before;
    }
    __syncthreads();
    if (warp < 4) {  // steep channels of diagonal block `warp`
      const float Gpr = warp == 0 ? 0.f : Gs[(16 * warp - 1) * GP + lane];
      const unsigned m =
          __ballot_sync(0xffffffffu, (Gpr - Gs[(16 * warp + 15) * GP + lane]) > G.max_diag);
      if (lane == 0) steep[warp] = m;
    }

    // 3b. Q̃̄, Ã̄, K̂̄ for rows 16I.. and slab channels 16hh.. (k: value columns)
    float aQ[NQ][4], aA[NQ][4], aK[NQ][4];
#pragma unroll
    for (int q = 0; q < NQ; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) aQ[q][e] = aA[q][e] = aK[q][e] = 0.f;
#pragma unroll 2
    for (int k0 = 0; k0 < V; k0 += 16) {
      uint32_t fO[4], fY[4 * NT], fU[4 * NT], s0[2 * NT], s1[2 * NT], h0[2 * NT], h1[2 * NT];
      Ob.a(fO, 16 * I, k0, lane);
      Yp.a(fY, 16 * I, k0, lane);
      Up.a(fU, 16 * I, k0, lane);
      Ss.b(s0, s1, cw, k0, lane);  // NQ = 1: the second n-tile (s1, h1) is not used
      Shp.b(h0, h1, cw, k0, lane);
      mma_split<1, NT>(aQ[0], fO, s0);
      mma_split<NT, NT>(aA[0], fY, s0);
      mma_split<NT, NT>(aK[0], fU, h0);
      if constexpr (NQ == 2) {
        mma_split<1, NT>(aQ[NQ - 1], fO, s1);
        mma_split<NT, NT>(aA[NQ - 1], fY, s1);
        mma_split<NT, NT>(aK[NQ - 1], fU, h1);
      }
    }
    __syncthreads();  // steep masks

    // 3c. §6.2 on tensor cores. Lane element (hr, q, e): row r = 16I + g + 8hr, slab channel
    // c = 16hh + 8q + 2t + e (accumulator entry 2hr + e of n-tile q).
    auto aval = [&](int r, int c) { return As[r * GP + c]; };  // erase vector a, from 3a
    const uint32_t stI = steep[I];
    float aB[NQ][4], qB[NQ][4], kB[NQ][4];  // ā°, q̄°, k̄° (diagonal M̄ terms left out)
#pragma unroll
    for (int q = 0; q < NQ; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) aB[q][e] = qB[q][e] = kB[q][e] = 0.f;
    {
      // ā°, q̄°: Σ_{J <= I} [T̄, M̄]_IJ (K_J ⊙ 2^(R - G_J)), R = G at row 16I - 1 (0 for I = 0).
      for (int J = 0; J <= I; ++J) {
        uint32_t fT[4 * NT], fM[4 * NT];
        Tp.a(fT, 16 * I, 16 * J, lane);
        Mp.a(fM, 16 * I, 16 * J, lane);
#pragma unroll
        for (int q = 0; q < NQ; ++q) {
          const int c = cw + 8 * q + g;
          const float R = I == 0 ? 0.f : Gs[(16 * I - 1) * GP + c];
          const bool drop = J == I && ((stI >> c) & 1u);
          uint32_t bk[2 * NT];
#pragma unroll
          for (int reg = 0; reg < 2; ++reg) {
            const int j = 16 * J + 2 * t + 8 * reg;
            float x0 = 0.f, x1 = 0.f;
            if (!drop) {
              x0 = __bfloat162float(ksl[j * QP + c]) * ex2(R - Gs[j * GP + c]);
              x1 = __bfloat162float(ksl[(j + 1) * QP + c]) * ex2(R - Gs[(j + 1) * GP + c]);
            }
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
      for (int q = 0; q < NQ; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * I + g + 8 * (e >> 1), c = cw + 8 * q + 2 * t + (e & 1);
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
        for (int q = 0; q < NQ; ++q) {
          const int c = cw + 8 * q + g;
          const float R = Gs[(16 * I + 15) * GP + c];
          const bool drop = J == I && ((stI >> c) & 1u);
          uint32_t ba[2 * NT], bq[2 * NT];
#pragma unroll
          for (int reg = 0; reg < 2; ++reg) {
            const int r = 16 * J + 2 * t + 8 * reg;
            const float e0 = drop ? 0.f : ex2(Gs[r * GP + c] - R),
                        e1 = drop ? 0.f : ex2(Gs[(r + 1) * GP + c] - R);
            uint32_t x[NT], y[NT];
            split2<NT>(aval(r, c) * e0, aval(r + 1, c) * e1, x);
            split2<NT>(__bfloat162float(qsl[r * QP + c]) * e0,
                       __bfloat162float(qsl[(r + 1) * QP + c]) * e1, y);
#pragma unroll
            for (int i = 0; i < NT; ++i) ba[2 * i + reg] = x[i], bq[2 * i + reg] = y[i];
          }
          mma_split<NT, NT>(kB[q], fT, ba);
          mma_split<NT, NT>(kB[q], fM, bq);
        }
      }
#pragma unroll
      for (int q = 0; q < NQ; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * I + g + 8 * (e >> 1), c = cw + 8 * q + 2 * t + (e & 1);
          kB[q][e] *= ex2(Gs[(16 * I + 15) * GP + c] - Gs[r * GP + c]);
        }
    }
    // Steep channels: the pairs inside diagonal block I with pairwise exponents (<= 0).
    if (stI != 0u) {
#pragma unroll
      for (int q = 0; q < NQ; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * I + g + 8 * (e >> 1), c = cw + 8 * q + 2 * t + (e & 1);
          if (!((stI >> c) & 1u)) continue;
          const float Gr = Gs[r * GP + c];
          float ab = 0.f, qb = 0.f, kb = 0.f;
          for (int j = 16 * I; j < r; ++j) {
            const float kd = __bfloat162float(ksl[j * QP + c]) * ex2(Gr - Gs[j * GP + c]);
            ab = fmaf(Tp.get(r, j), kd, ab);
            qb = fmaf(Mp.get(r, j), kd, qb);
          }
          for (int r2 = r + 1; r2 < 16 * I + 16; ++r2) {
            const float x = fmaf(Tp.get(r2, r), aval(r2, c),
                                 Mp.get(r2, r) * __bfloat162float(qsl[r2 * QP + c]));
            kb = fmaf(x, ex2(Gs[r2 * GP + c] - Gr), kb);
          }
          aB[q][e] += ab;
          qB[q][e] += qb;
          kB[q][e] += kb;
        }
    }

    // 3d. ā, q̄, k̄; Ḡ' and K̂⊙K̂̄ for the decay gradient; the §5.2 VJP where it needs no sum over
    // channels (every variant but QED), per-token partial sums where it does.
    float rA[NQ][4], rB[NQ][4];  // per-element terms of this slab's per-token sums
    // QED: the projection coefficient of this thread's two rows (16I + g, 16I + g + 8), read once
    float cfr[2] = {0.f, 0.f};
    if (qed) cfr[0] = coef[16 * I + g], cfr[1] = coef[16 * I + g + 8];
    float* const drs = A.dr_tok + item(0) * K + cb;  // QED rand: row r, channel cb + c at r H K + c
#pragma unroll
    for (int q = 0; q < NQ; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * I + g + 8 * (e >> 1), c = cw + 8 * q + 2 * t + (e & 1);
        const float Gr = Gs[r * GP + c], gam = ex2(Gr), kh = ex2(Gs[(kC - 1) * GP + c] - Gr);
        const float kk = __bfloat162float(ksl[r * QP + c]), qq = __bfloat162float(qsl[r * QP + c]);
        const float bb = __bfloat162float(bsl[r * QP + c]);
        const float ab = fmaf(-aA[q][e], gam, aB[q][e]);
        const float qb = fmaf(s * aQ[q][e], gam, qB[q][e]);
        const float kb = kB[q][e];
        Gp[r * XP + c] = aval(r, c) * ab + qq * qb - kk * kb;
        KK[r * XP + c] = kk * kh * aK[q][e];
        float kfull = fmaf(mdiag[r], qq, kb);
        if (A.mutant != kMutantNoKhatGrad) kfull = fmaf(aK[q][e], kh, kfull);
        const float qfull = fmaf(mdiag[r], kk, qb);
        rA[q][e] = rB[q][e] = 0.f;
        if (r >= n) continue;
        float* ot = OT + r * XP + c;
        if (qed) {  // §5.2 less its terms in en = k.ā / k.k, which the final pass adds once the
                    // slabs have summed k.ā: dq, dk, db here are exact where en = 0
          // m̄ = λ ā enters dq as m̄ b (full) or m̄ (nogate), db as m̄ q (full) or m̄ r (rand),
          // dr as m̄ b (rand): selects, not branches, keep the unrolled code small
          // (arm factors, no branches: full ? b : (rand ? 0 : 1) is xf b + xn, full ? q : r is
          // xf q + r with r zero outside rand)
          const float la = lam * ab, rr = rsm[cb + c], f = cfr[e >> 1];
          float pk = fmaf(ab, bb, kfull);
          if (A.mutant != kMutantNoProjGrad) pk = fmaf(-lam * f, ab, pk);  // -λ f ā
          ot[0] = fmaf(la, fmaf(af.xf, bb, af.xn), qfull);
          ot[OTS] = pk;
          ot[2 * OTS] = fmaf(la, fmaf(af.xf, qq, rr), ab * kk);
          if (rand_arm) drs[r * A.H * K + c] = la * bb;
          rA[q][e] = kk * ab;                                   // e = k.ā
          rB[q][e] = ab * (arm_m(af, bb, qq, rr) - f * kk);  // dlambda
        } else {
          ot[0] = qfull;
          ot[OTS] = fmaf(ab, bb, kfull);
          if (chan_bw)
            ot[2 * OTS] = ab * kk;
          else
            rA[q][e] = ab * kk;  // dbeta
        }
      }
    if (qed || !chan_bw) {
      float a0, a1, b0, b1;
      row_sums<NQ>(rA, a0, a1);
      row_sums<NQ>(rB, b0, b1);
      const int pw = warp % PW;
      if (t == 0) {
        rowp[pw * kC + 16 * I + g] = a0;
        rowp[pw * kC + 16 * I + g + 8] = a1;
        rowp[(PW + pw) * kC + 16 * I + g] = b0;
        rowp[(PW + pw) * kC + 16 * I + g + 8] = b1;
      }
    }
    __syncthreads();
    if ((qed || !chan_bw) && tid < kC) {  // this slab's partial sums, in channel then slab order
      float x = 0.f, y = 0.f;
#pragma unroll
      for (int w = 0; w < PW; ++w) x += rowp[w * kC + tid], y += rowp[(PW + w) * kC + tid];
      tot[tid] += x;
      tot[kC + tid] += y;
    }
    // 3e. §6.3: ḡ_i = γ_n ρ + Σ_{j<i} K̂_j⊙K̂̄_j + Σ_{r>=i} Ḡ'_r per channel; eight threads of eight
    // rows each (the first kBase threads), the segment totals combined over the eight lanes in a
    // fixed order.
    if (tid < kBase) {
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
      float gb[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = r0 + i;
        gb[i] = (suf[i] + after) + (base + pre[i]);
        OT[3 * OTS + r * XP + c] = gb[i];
      }
      if (A.variant == kGdn) {  // scalar decay: Σ over channels, this warp's four first
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float x = gb[i];
          x += __shfl_xor_sync(0xffffffffu, x, 8);
          x += __shfl_xor_sync(0xffffffffu, x, 16);
          if (lane < 8) rowq[warp * kC + r0 + i] = x;
        }
      }
    }
    __syncthreads();
    if (A.variant == kGdn && tid < kC) {  // the eight warps' sums, in warp order, then slab order
      float x = 0.f;
#pragma unroll
      for (int w = 0; w < kBase / 32; ++w) x += rowq[w * kC + tid];
      tot[2 * kC + tid] += x;
    }
    {  // 3f. the slab's outputs from the tiles: eight channels of one row per thread
      static_assert(kC * (kSW / 8) == kBase, "grads_kernel: output pass");
      const int r = (tid >> 2) & (kC - 1), c0 = 8 * (tid & 3);
      const int64_t tt = t0 + r, cg = cb + c0;
      const bool vout = RAW || G.vec_out != 0;
      // the projected arms' last slab: dq, dk, db stay in the tiles for the final pass (4), which
      // would otherwise read them back from global memory
      const bool keep = projected && cb + kSW == K;
      if (tid < kBase && r < n) {
        float x[8];
        auto tile = [&](int k) {
#pragma unroll
          for (int e = 0; e < 8; ++e) x[e] = OT[k * OTS + r * XP + c0 + e];
        };
        if (hold && !keep) {  // into the registers (see hq); the mutant skips the shift
          if (A.mutant != kMutantHoldOrder) {
#pragma unroll
            for (int i = 0; i + 1 < NH; ++i) hq[i] = hq[i + 1], hk[i] = hk[i + 1], hb[i] = hb[i + 1];
          }
          tile(0);
          hq[NH - 1] = pack8(x);
          tile(1);
          hk[NH - 1] = pack8(x);
          tile(2);
          hb[NH - 1] = pack8(x);
        } else {
          if (!keep) {
            tile(0);
            st8x<RAW>(A.dq, brow, tt, h, static_cast<int>(cg), vout, x);
            tile(1);
            st8x<RAW>(A.dk, brow, tt, h, static_cast<int>(cg), vout, x);
          }
          if (chan_bw && !keep) {
            tile(2);
            st8x<RAW>(A.db, brow, tt, h, static_cast<int>(cg), vout, x);
          }
        }
        if (chan_g) {
          tile(3);
          st8x<RAW>(A.dg, brow, tt, h, static_cast<int>(cg), vout, x);
        }
      }
    }
    __syncthreads();  // the tiles share the next slab's S, Ŝ' area
  }
  __syncthreads();

  // ---- 4. what needs every channel: dlambda, dbeta, gdn's dg, and QED's dq, dk, db (k.ā) ----
  if (tid < n) {
    const int64_t tt = t0 + tid;
    if (qed) A.dlam_tok[item(tid)] = tot[kC + tid];
    if (!chan_bw) st(A.dbeta, brow, tt, h, 0, tot[tid] + tot[3 * kC + tid]);
    if (A.variant == kGdn) st(A.dg, brow, tt, h, 0, tot[2 * kC + tid]);
  }
  if (projected) {  // QED arms with a projection (nogate_noproj has no en terms)
    // The en terms of MATH.md §5.2 (token_item of chunked_backward_tile.hpp has the whole VJP):
    // dq, dk, db (and QED rand's dr) of 3d less λ en (k b, m - 2 f k, k q), rows with k.k > 0
    // only; eight channels of one row per item, UF items per thread with every load first. The
    // last slab's dq, dk, db come from the tiles (3f kept them), rounded as a store and a load
    // would have, and are stored here for every row.
    constexpr int GR = K / 8;  // items per row
    constexpr int CL = K - kSW;  // the last slab's first channel
    const bool vin = RAW || G.vec != 0, vout = RAW || G.vec_out != 0;
    constexpr int UF = kAhead ? 2 : 1;
    auto finish = [&](int i, bool live, float* dq, float* dk, float* db, const float* kk,
                      const float* bb, const float* qq) {
      const int r = i / GR, c0 = 8 * (i % GR);
      const int64_t tt = t0 + r;
      const float f = coef[r], len = live ? lam * tot[r] / nnr[r] : 0.f;  // λ en
      if (live) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int c = c0 + e;
          const float lk = len * kk[e], rr = rsm[c];
          if (A.mutant != kMutantNoProjGrad)
            dk[e] = fmaf(-len, fmaf(-2.f * f, kk[e], arm_m(af, bb[e], qq[e], rr)), dk[e]);
          dq[e] = fmaf(-lk, fmaf(af.xf, bb[e], af.xn), dq[e]);
          db[e] = fmaf(-lk, fmaf(af.xf, qq[e], rr), db[e]);
        }
      }
      if (rand_arm && live) {  // dr's token rows (rand only: its own loop, out of the others' way)
        float* dr = A.dr_tok + item(r) * K + c0;
#pragma unroll
        for (int e = 0; e < 8; ++e) dr[e] = fmaf(-len * kk[e], bb[e], dr[e]);
      }
      st8x<RAW>(A.dq, brow, tt, h, c0, vout, dq);
      st8x<RAW>(A.dk, brow, tt, h, c0, vout, dk);
      st8x<RAW>(A.db, brow, tt, h, c0, vout, db);
    };
    if constexpr (kHold) {
      if (hold) {  // each row thread its own row and channels: NH slabs from its registers, the
                   // last from the tiles; k, b, q of the earlier slabs loaded first, the last
                   // slab's from its shared-memory tiles (RAW: the inputs' own bf16 values)
        if (rowt && sr < n) {
          const int r = sr;
          const bool live = nnr[r] > 0.f;
          uint4 lk[NH], lb[NH], lq[NH];
          if (live) {
#pragma unroll
            for (int sl = 0; sl < NH; ++sl) {
              if constexpr (kEarly) {  // loaded during the last slab (early())
                lk[sl] = get(3 * sl);
                lb[sl] = get(3 * sl + 1);
                lq[sl] = get(3 * sl + 2);
              } else {
                lk[sl] = raw8(A.k, r, sl * kSW + sc);
                lb[sl] = raw8(A.b, r, sl * kSW + sc);
                lq[sl] = raw8(A.q, r, sl * kSW + sc);
              }
            }
          }
#pragma unroll
          for (int sl = 0; sl <= NH; ++sl) {
            float dq[8], dk[8], db[8], kk[8], bb[8], qq[8];
            if (sl < NH) {
              unpack8(hq[sl], dq);
              unpack8(hk[sl], dk);
              unpack8(hb[sl], db);
            } else {
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                dq[e] = as_stored(A.dq, OT[r * XP + sc + e]);
                dk[e] = as_stored(A.dk, OT[OTS + r * XP + sc + e]);
                db[e] = as_stored(A.db, OT[2 * OTS + r * XP + sc + e]);
              }
            }
            if (live) {
              if (sl < NH) {
                unpack8(lk[sl], kk);
                unpack8(lb[sl], bb);
                unpack8(lq[sl], qq);
              } else {
                unpack8(*reinterpret_cast<const uint4*>(ksl + r * QP + sc), kk);
                unpack8(*reinterpret_cast<const uint4*>(bsl + r * QP + sc), bb);
                unpack8(*reinterpret_cast<const uint4*>(qsl + r * QP + sc), qq);
              }
            }
            finish(r * GR + (sl * kSW + sc) / 8, live, dq, dk, db, kk, bb, qq);
          }
        }
        return;
      }
    }
    for (int i0 = tid; i0 < n * GR; i0 += UF * kThreads) {
      float dq[UF][8], dk[UF][8], db[UF][8], kk[UF][8], bb[UF][8], qq[UF][8];
      bool live[UF], done[UF];
#pragma unroll
      for (int u = 0; u < UF; ++u) {
        const int i = i0 + u * kThreads, r = i / GR, c0 = 8 * (i % GR);
        const bool in = i < n * GR, kept = in && c0 >= CL;
        live[u] = in && nnr[in ? r : 0] > 0.f;
        done[u] = live[u] || kept;
        if (!done[u]) continue;
        const int64_t tt = t0 + r;
        if (kept) {
          auto tile = [&](int k, const SeqOut& x, float* o) {
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = as_stored(x, OT[k * OTS + r * XP + c0 - CL + e]);
          };
          tile(0, A.dq, dq[u]);
          tile(1, A.dk, dk[u]);
          tile(2, A.db, db[u]);
        } else {
          ld8o<RAW>(A.dq, brow, tt, h, c0, vout, dq[u]);
          ld8o<RAW>(A.dk, brow, tt, h, c0, vout, dk[u]);
          ld8o<RAW>(A.db, brow, tt, h, c0, vout, db[u]);
        }
        if (!live[u]) continue;
        ld8x<RAW>(A.k, brow, tt, h, c0, vin, kk[u]);
        ld8x<RAW>(A.b, brow, tt, h, c0, vin, bb[u]);
        ld8x<RAW>(A.q, brow, tt, h, c0, vin, qq[u]);
      }
#pragma unroll
      for (int u = 0; u < UF; ++u)
        if (done[u]) finish(i0 + u * kThreads, live[u], dq[u], dk[u], db[u], kk[u], bb[u], qq[u]);
    }
  }
}

template <int K, int V, int W, bool AHEAD, bool RAW>
cudaError_t launch_w(const GradArgs& G, int64_t chunks, cudaStream_t st) {
  using Z = GradSmem<K, V, 2, W>;
  static_assert(Z::total <= 227 * 1024, "grads_kernel: shared memory over the per-block limit");
  constexpr int kThreads = W * 32;
  auto kern = grads_kernel<K, V, 2, W, AHEAD, RAW>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Z::total);
  if (e != cudaSuccess) return e;
  if (chunks == 0 || G.b.H == 0) return cudaSuccess;
  kern<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(G.b.H)), kThreads, Z::total,
         st>>>(G);
  return cudaGetLastError();
}

template <int K, int V>
cudaError_t launch_t(const GradArgs& G, int64_t chunks, cudaStream_t st) {
  // sixteen warps, or inputs or outputs in other layouts: the general kernel; else the RAW one
  // (loading ahead unless QEDCHECK_CHUNKED_GRADS_AHEAD=0)
  if (G.warps == 16) return launch_w<K, V, 16, false, false>(G, chunks, st);
  if (!G.raw) return launch_w<K, V, 8, false, false>(G, chunks, st);
  return G.ahead ? launch_w<K, V, 8, true, true>(G, chunks, st) : launch_w<K, V, 8, false, true>(G, chunks, st);
}

}  // namespace

cudaError_t launch_grads(const GradArgs& G, int64_t chunks, cudaStream_t st) {
  if (G.b.K == 64)
    return G.b.V == 64 ? launch_t<64, 64>(G, chunks, st) : launch_t<64, 128>(G, chunks, st);
  return G.b.V == 64 ? launch_t<128, 64>(G, chunks, st) : launch_t<128, 128>(G, chunks, st);
}

}  // namespace qed::kernels::chunked_bwd
