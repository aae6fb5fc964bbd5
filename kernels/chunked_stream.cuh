// Device pieces shared by the two sequential chunked passes, the forward's state pass
// (chunked_state.cu) and the backward's reverse sweep (chunked_bwd_sweep.cu): how a block's warps
// share chunk rows and key channels, and how a warp streams its fragments of a chunk's workspace
// blob into shared memory (cp.async or bulk copies completing on an mbarrier).
#pragma once

#include <cstdint>

#include "kernels/chunked_common.cuh"

namespace qed::kernels::chunked {

// Per-warp shares of the work for NW warps (4, or 8 at K = 128): chunk rows 64/NW from row block
// RB (16 rows) and its n-tile NT0 (RT n-tiles of 8 rows), and key channels K/NW of the blob's
// channel quarter QS (K/4 channels) from its n-tile NQ0 (NNW n-tiles of 8 channels).
template <int K, int NW>
struct WarpShare {
  static constexpr int RT = 8 / NW;   // row n-tiles per warp (2 or 1)
  static constexpr int KW = K / NW;   // key channels per warp
  static constexpr int NNW = KW / 8;  // channel n-tiles per warp
  static constexpr int NQ4 = K / 32;  // channel n-tiles per blob quarter
  static_assert(NW == 4 || (NW == 8 && K == 128), "state pass: 4 warps, or 8 at K = 128");
  __device__ static int rb(int warp) { return warp * RT / 2; }
  __device__ static int nt0(int warp) { return (warp * RT) % 2; }
  __device__ static int qs(int warp) { return warp * KW / (K / 4); }
  __device__ static int nq0(int warp) { return (warp * KW) % (K / 4) / 8; }
};

template <int NT>
__device__ __forceinline__ void load_b(const char* p, uint32_t* b) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const uint2 x = reinterpret_cast<const uint2*>(p)[i];
    b[2 * i] = x.x;
    b[2 * i + 1] = x.y;
  }
}

// The A operand (MT value tiles, NT split terms) of key block kb from a split-bf16 copy of Sᵀ
// (NB = K / 16 blocks) or Uᵀ (NB = 4) in shared memory: for value tile m, block kb and term i, one
// uint4 per lane at ((m NB + kb) NT + i) 32 + lane (store_state_frags below writes Sᵀ so).
template <int MT, int NT, int NB>
__device__ __forceinline__ void load_a_tiles(const uint4* buf, int kb, int lane, uint32_t (&a)[MT][NT * 4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const uint4 x = buf[((m * NB + kb) * NT + i) * 32 + lane];
      a[m][4 * i] = x.x;
      a[m][4 * i + 1] = x.y;
      a[m][4 * i + 2] = x.z;
      a[m][4 * i + 3] = x.w;
    }
}

// One warp copies `count` segments of `seg` bytes, `stride` bytes apart in global memory, to
// consecutive places in shared memory (one contiguous copy when seg == stride).
__device__ __forceinline__ void warp_copy_segs(char* dst, const char* src, int count, int seg,
                                               int stride, int lane) {
  if (seg == stride) {
    warp_copy(dst, src, count * seg, lane);
    return;
  }
  for (int c = 0; c < count; ++c) warp_copy(dst + c * seg, src + c * stride, seg, lane);
}

// Bulk copies (cp.async.bulk, the copy engine) completing on an mbarrier: one instruction per
// contiguous segment instead of one cp.async of 16 bytes per lane and step of a loop.
__device__ __forceinline__ uint32_t sh_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(sh_addr(dst)),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// This warp's part of one load: `count` segments of `seg` bytes, `stride` apart in global memory,
// to consecutive places in shared memory (one segment when they are contiguous), spread over the
// lanes from lane `base` on (base counts the segments of the load's earlier groups).
__device__ __forceinline__ void bulk_segs(char* dst, const char* src, int count, int seg,
                                          int stride, int lane, int& base, uint32_t bar) {
  if (seg == stride) seg *= count, count = 1;
  for (int j = (lane - base) & 31; j < count; j += 32)
    bulk_copy(dst + j * seg, src + static_cast<int64_t>(j) * stride, seg, bar);
  base += count;
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred p;\n"
      "STATE_BAR_WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra STATE_BAR_WAIT;\n\t}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// The fp32 state a warp holds in accumulator layout (accS[m][n]: value tile m, key n-tile n of
// this warp's KW channels) as split-bf16 B fragments in Sbuf, the layout both the forward's state
// pass and the backward's reverse sweep read the state from: for value tile m, key block kbg and
// term i, one uint4 per lane at ((m NKB + kbg) NT + i) 32 + lane.
template <int MT, int NN, int NT, int KW, int NKB>
__device__ __forceinline__ void store_state_frags(const float (&accS)[MT][NN][4], uint4* Sbuf,
                                                  int warp, int lane) {
#pragma unroll
  for (int kb2 = 0; kb2 < KW / 16; ++kb2) {
    const int kbg = warp * (KW / 16) + kb2;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint32_t r0[NT], r1[NT], r2[NT], r3[NT];
      split2<NT>(accS[m][2 * kb2][0], accS[m][2 * kb2][1], r0);
      split2<NT>(accS[m][2 * kb2][2], accS[m][2 * kb2][3], r1);
      split2<NT>(accS[m][2 * kb2 + 1][0], accS[m][2 * kb2 + 1][1], r2);
      split2<NT>(accS[m][2 * kb2 + 1][2], accS[m][2 * kb2 + 1][3], r3);
#pragma unroll
      for (int i = 0; i < NT; ++i)
        Sbuf[((m * NKB + kbg) * NT + i) * 32 + lane] = make_uint4(r0[i], r1[i], r2[i], r3[i]);
    }
  }
}

}  // namespace qed::kernels::chunked
