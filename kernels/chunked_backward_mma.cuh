// Block-wide tensor-core products for the chunked backward (device only): D = A B with fp32
// operands read through accessors (shared or global memory, with the bounds and transposes folded
// into the accessor), each operand split into NT bf16 terms (kernels/chunked_common.cuh: split2,
// mma_split; NT = 3 keeps all 24 bits of fp32, so the products match fp32 loops to rounding) and
// fp32 accumulation. The backward's CPU emulation keeps the scalar loops of
// chunked_backward_tile.hpp; these products replace them on the GPU where they are plain
// matrix products.
#pragma once

#include <cstdint>

#include "kernels/chunked_common.cuh"

namespace qed::kernels::chunked_bwd::tc {

// mma.sync m16n8k16 fragments, lane = 4g + t:
//  A (16 x 16, row): reg 0 (g, 2t..2t+1), 1 (g+8, 2t..), 2 (g, 2t+8..), 3 (g+8, 2t+8..)
//  B (16 x 8, col):  reg 0 (k 2t..2t+1, n g), 1 (k 2t+8..2t+9, n g)
//  D (16 x 8):       d0 (g, 2t), d1 (g, 2t+1), d2 (g+8, 2t), d3 (g+8, 2t+1)
// Split term i of register r sits at a[4i + r] (A) and b[2i + r] (B), as mma_split expects.
template <int NT, class F>
__device__ __forceinline__ void frag_a(uint32_t* a, const F& f, int m0, int k0, int g, int t) {
  uint32_t x[NT];
  const int rr[4] = {m0 + g, m0 + g + 8, m0 + g, m0 + g + 8};
  const int kk[4] = {k0 + 2 * t, k0 + 2 * t, k0 + 2 * t + 8, k0 + 2 * t + 8};
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    chunked::split2<NT>(f(rr[r], kk[r]), f(rr[r], kk[r] + 1), x);
#pragma unroll
    for (int i = 0; i < NT; ++i) a[4 * i + r] = x[i];
  }
}
template <int NT, class F>
__device__ __forceinline__ void frag_b(uint32_t* b, const F& f, int k0, int n0, int g, int t) {
  uint32_t x[NT];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int k = k0 + 2 * t + 8 * r;
    chunked::split2<NT>(f(k, n0 + g), f(k + 1, n0 + g), x);
#pragma unroll
    for (int i = 0; i < NT; ++i) b[2 * i + r] = x[i];
  }
}

// acc += A B for one k step of 16: the split products go into a zeroed accumulator that is then
// added to acc with ordinary (round-to-nearest) fp32 additions. The tensor cores' own fp32
// accumulation truncates the bits of small addends; accumulating a long k range in one mma
// accumulator biased the sum (measured: dlambda 1.6e-5 relative at T = 1000, 12x the fp32
// recurrence; properties/test_gpu_chunked_backward.cpp RegimesFp32T1000).
template <int NT>
__device__ __forceinline__ void step(float* acc, const uint32_t* a, const uint32_t* b) {
  float p[4] = {0.f, 0.f, 0.f, 0.f};
  chunked::mma_split<NT, NT>(p, a, b);
  acc[0] += p[0], acc[1] += p[1], acc[2] += p[2], acc[3] += p[3];
}

// D (rows x cols, multiples of 16 and 8 NN) = sum over k of fa(row, k) fb(k, col), computed in
// tasks of 16 x 8NN spread over the block's warps. kr(m0, k_lo, k_hi) gives the k range of the
// task at rows m0.. (multiples of 16; the accessors return 0 wherever the product's operands
// are structurally zero, so the range only skips work). ep(row, col, value) takes every result.
template <int NT, int NN, class KR, class FA, class FB, class EP>
__device__ __forceinline__ void block_gemm(int rows, int cols, const KR& kr, const FA& fa, const FB& fb,
                                           const EP& ep) {
  const int warp = static_cast<int>(threadIdx.x >> 5), nw = static_cast<int>(blockDim.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int mt = rows / 16, nt = cols / (8 * NN);
  for (int task = warp; task < mt * nt; task += nw) {
    const int m0 = (task / nt) * 16, n0 = (task % nt) * 8 * NN;
    float acc[NN][4];
#pragma unroll
    for (int j = 0; j < NN; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    int k_lo = 0, k_hi = 0;
    kr(m0, k_lo, k_hi);
    for (int k0 = k_lo; k0 < k_hi; k0 += 16) {
      uint32_t a[4 * NT];
      frag_a<NT>(a, fa, m0, k0, g, t);
#pragma unroll
      for (int j = 0; j < NN; ++j) {
        uint32_t b[2 * NT];
        frag_b<NT>(b, fb, k0, n0 + 8 * j, g, t);
        step<NT>(acc[j], a, b);
      }
    }
#pragma unroll
    for (int j = 0; j < NN; ++j) {
      const int c = n0 + 8 * j + 2 * t;
      ep(m0 + g, c, acc[j][0]);
      ep(m0 + g, c + 1, acc[j][1]);
      ep(m0 + g + 8, c, acc[j][2]);
      ep(m0 + g + 8, c + 1, acc[j][3]);
    }
  }
}

}  // namespace qed::kernels::chunked_bwd::tc
