// Device-side pieces shared by the recurrent forward, decode and backward kernels: the launch
// arguments, dtype-generic loads and stores, the thread layout of a state tile, and the per-step
// vector preparation (decay, erase vector a_t of MATH.md §2, scaled query, write value z_t).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/api.hpp"

namespace qed::kernels::detail {

// ---- launch arguments (plain values; every kernel takes one by value) ----

struct SeqArg {
  const void* p = nullptr;
  int64_t sb = 0, st = 0, sh = 0;
  int dt = 0;  // DType as int
};

struct SeqOutArg {
  void* p = nullptr;
  int64_t sb = 0, st = 0, sh = 0;
  int dt = 0;
};

struct StateArg {
  const float* p = nullptr;
  int64_t sn = 0, sh = 0, sk = 0;
};

struct StateOutArg {
  float* p = nullptr;
  int64_t sn = 0, sh = 0, sk = 0;
};

enum : int { kGdn2 = 0, kQed = 1, kKda = 2, kGdn = 3, kDeltanet = 4 };
enum : int { kArmNone = 0, kArmFull = 1, kArmNogate = 2, kArmNoproj = 3, kArmRand = 4 };

struct RecArgs {
  int variant = 0, arm = 0;
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0;
  float scale = 1.f;
  const int64_t* cu = nullptr;
  int64_t N = 0;
  SeqArg q, k, v, g, b, w, beta;
  const float* lambda = nullptr;
  const float* r = nullptr;
  StateArg h0;
  // forward
  SeqOutArg o;
  StateOutArg ht;
  const int32_t* slots = nullptr;
  int64_t nslots = 0;
  float* ckpt = nullptr;  // checkpoint mode: state before every chunk, see ckpt_index
  // backward
  SeqArg dout;
  StateArg dht;
  StateOutArg dh0;
  float* ubar = nullptr;  // [B*T, H, V] fp32
  float* part = nullptr;  // [nvblk, B*T, H, 4, K] fp32: V-block partial sums
  int nwarps = 1;         // warps per block = steps per chunk (Tc)
};

// ---- dtype-generic element access ----

__device__ __forceinline__ float ldf(const void* p, int64_t i, int dt) {
  if (dt == static_cast<int>(DType::fp32)) return static_cast<const float*>(p)[i];
  if (dt == static_cast<int>(DType::bf16))
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void stf(void* p, int64_t i, int dt, float x) {
  if (dt == static_cast<int>(DType::fp32)) {
    static_cast<float*>(p)[i] = x;
  } else if (dt == static_cast<int>(DType::bf16)) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  }
}

__device__ __forceinline__ int64_t seq_off(const SeqArg& a, int64_t b, int64_t t, int64_t h) {
  return b * a.sb + t * a.st + h * a.sh;
}
__device__ __forceinline__ int64_t seq_off(const SeqOutArg& a, int64_t b, int64_t t, int64_t h) {
  return b * a.sb + t * a.st + h * a.sh;
}

// Tokens of sequence n: batch row `b`, positions [bos, eos). Offsets are clamped into [0, T]
// so that malformed cu_seqlens never index out of bounds.
struct SeqSpan {
  int64_t b, bos, eos;
};

__device__ __forceinline__ SeqSpan seq_span(const RecArgs& A, int64_t n) {
  if (!A.cu) return {n, 0, A.T};
  int64_t s = A.cu[n], e = A.cu[n + 1];
  s = s < 0 ? 0 : (s > A.T ? A.T : s);
  e = e < s ? s : (e > A.T ? A.T : e);
  return {0, s, e};
}

// Index of the checkpoint taken before chunk c of sequence n (chunks of Tc steps). Packed so
// that sequences never overlap: see checkpoint_slots() on the host.
__device__ __forceinline__ int64_t ckpt_index(const RecArgs& A, int64_t n, int64_t bos,
                                              int64_t c) {
  const int64_t Tc = A.nwarps;
  if (!A.cu) return n * ((A.T + Tc - 1) / Tc) + c;
  return n + bos / Tc + c;
}

// ---- thread layout of a state tile ----
// A block covers all K rows and BV = nwarps * CPW columns of one (sequence, head). In a warp,
// lane = cq * R + r: R threads share a quad of 4 columns and split the rows, thread r owning the
// NR rows row(r, i) = ((i / 4) * R + r) * 4 + i % 4 (interleaved in fours, so that the R
// threads' 16-byte shared-memory reads fall in distinct banks).
template <int K_>
struct Tile {
  static constexpr int K = K_;
  static constexpr int R = K == 16 ? 4 : (K == 256 ? 16 : 8);
  static constexpr int NR = K / R;
  static constexpr int NQ = NR / 4;         // float4 row blocks per thread
  static constexpr int NCQ = 32 / R;        // column quads per warp
  static constexpr int CPW = NCQ * 4;       // columns per warp
  static constexpr int KL = (K + 31) / 32;  // K-vector elements per lane (preparation)
  static constexpr int MAXW = 8;            // warps per block at most
  static constexpr int VL = (MAXW * CPW + 31) / 32;
  static_assert(NR % 4 == 0, "Tile: rows per thread must be a multiple of 4");
  static_assert(R * NR == K, "Tile: R * NR must equal K");

  __device__ static int row(int r, int i) { return ((i >> 2) * R + r) * 4 + (i & 3); }
};

template <int R>
__device__ __forceinline__ float allreduce_r(float x) {
#pragma unroll
  for (int m = 1; m < R; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// ---- per-step vector preparation ----
// Shared-memory vectors of one step: alpha, a, k, scale*q (K each), z = w*v for the block's
// columns (BV). A warp prepares one step: raw values are loaded into registers first (so that a
// caller can issue the loads early) and turned into the vectors later.

template <int K>
struct RawStep {
  using Tl = Tile<K>;
  float q[Tl::KL], k[Tl::KL], g[Tl::KL], b[Tl::KL];
  float v[Tl::VL], w[Tl::VL];
  bool valid;
  int64_t b_row, t;
};

template <int K>
__device__ __forceinline__ void load_raw(const RecArgs& A, int64_t brow, int64_t t, int64_t h,
                                         bool valid, int vbase, int BV, RawStep<K>& R) {
  using Tl = Tile<K>;
  const int lane = threadIdx.x & 31;
  R.valid = valid;
  R.b_row = brow;
  R.t = t;
  if (!valid) return;
  const int64_t oq = seq_off(A.q, brow, t, h), ok = seq_off(A.k, brow, t, h);
  const bool chan_g = A.variant == kGdn2 || A.variant == kQed || A.variant == kKda;
  const bool has_bw = A.variant == kGdn2 || A.variant == kQed;
  float gs = 0.f, bs = 0.f;
  if (A.variant == kGdn) gs = ldf(A.g.p, seq_off(A.g, brow, t, h), A.g.dt);
  if (!has_bw) bs = ldf(A.beta.p, seq_off(A.beta, brow, t, h), A.beta.dt);
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    const int c = lane + 32 * i;
    if (c < K) {
      R.q[i] = ldf(A.q.p, oq + c, A.q.dt);
      R.k[i] = ldf(A.k.p, ok + c, A.k.dt);
      R.g[i] = chan_g ? ldf(A.g.p, seq_off(A.g, brow, t, h) + c, A.g.dt) : gs;
      R.b[i] = has_bw ? ldf(A.b.p, seq_off(A.b, brow, t, h) + c, A.b.dt) : bs;
    }
  }
  const int64_t ov = seq_off(A.v, brow, t, h);
#pragma unroll
  for (int i = 0; i < Tl::VL; ++i) {
    const int jl = lane + 32 * i;
    const int j = vbase + jl;
    if (jl < BV && j < A.V) {
      R.v[i] = ldf(A.v.p, ov + j, A.v.dt);
      R.w[i] = has_bw ? ldf(A.w.p, seq_off(A.w, brow, t, h) + j, A.w.dt) : bs;
    }
  }
}

// Writes alpha | a | scale*q | k (each K floats) at vec and z (BV floats) at z.
template <int K>
__device__ __forceinline__ void prepare_step(const RecArgs& A, int64_t h, const RawStep<K>& R,
                                             int vbase, int BV, float* vec, float* z) {
  using Tl = Tile<K>;
  const int lane = threadIdx.x & 31;
  if (!R.valid) return;
  const bool qed = A.variant == kQed;
  const bool projected = qed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  const float lam = qed ? A.lambda[h] : 0.f;
  float m[Tl::KL];
  float kk = 0.f, km = 0.f;
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    const int c = lane + 32 * i;
    m[i] = 0.f;
    if (c < K && qed) {
      if (A.arm == kArmFull) m[i] = R.b[i] * R.q[i];
      else if (A.arm == kArmRand) m[i] = R.b[i] * A.r[h * K + c];
      else m[i] = R.q[i];
      kk += R.k[i] * R.k[i];
      km += R.k[i] * m[i];
    }
  }
  float f = 0.f;
  if (projected) {
    kk = warp_sum(kk);
    km = warp_sum(km);
    f = kk != 0.f ? km / kk : 0.f;  // P(0) = I
  }
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    const int c = lane + 32 * i;
    if (c < K) {
      float a = R.b[i] * R.k[i];
      if (qed) a += lam * (m[i] - f * R.k[i]);
      vec[c] = expf(R.g[i]);  // deltanet: g = 0, alpha = 1 exactly
      vec[K + c] = a;
      vec[2 * K + c] = A.scale * R.q[i];
      vec[3 * K + c] = R.k[i];
    }
  }
#pragma unroll
  for (int i = 0; i < Tl::VL; ++i) {
    const int jl = lane + 32 * i;
    if (jl < BV) z[jl] = (vbase + jl < A.V) ? R.w[i] * R.v[i] : 0.f;
  }
}

}  // namespace qed::kernels::detail
