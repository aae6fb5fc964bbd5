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
  bool decode_flat = true;  // decode grid: flat (value blocks fastest) or (N, H, value blocks)
};

// ---- dtype-generic element access ----
// A load and the conversion of what it loaded are kept apart: ld_bits issues a predicated load of
// the raw bits (no branch), and bits_to_float converts later. A branch per dtype with the
// conversion inside it makes the compiler wait for each load in turn (measured: the
// preparation's loads went one memory round trip at a time, 8 us per decode step), and a
// conversion right after the load would stop a prefetch from hiding behind the recurrence.

__device__ __forceinline__ uint32_t ld_bits(const void* p, int64_t i, int dt, bool pred) {
  uint32_t bits = 0;
  const uint64_t a32 = reinterpret_cast<uint64_t>(p) + static_cast<uint64_t>(i) * 4u;
  const uint64_t a16 = reinterpret_cast<uint64_t>(p) + static_cast<uint64_t>(i) * 2u;
  const int p32 = pred && dt == 0, p16 = pred && dt != 0;
  asm("{\n\t.reg .pred q32, q16;\n\t"
      "setp.ne.s32 q32, %1, 0;\n\t"
      "setp.ne.s32 q16, %2, 0;\n\t"
      "@q32 ld.global.nc.b32 %0, [%3];\n\t"
      "@q16 ld.global.nc.u16 %0, [%4];\n\t}"
      : "+r"(bits)
      : "r"(p32), "r"(p16), "l"(a32), "l"(a16));
  return bits;
}

__device__ __forceinline__ float bits_to_float(uint32_t bits, int dt) {
  const float f32 = __uint_as_float(bits);
  const float fb = __uint_as_float(bits << 16);
  const float fh = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  return dt == 0 ? f32 : (dt == 1 ? fb : fh);
}

// Predicated 16-byte state load (zeros when !pred), again without a branch around it.
__device__ __forceinline__ float4 ld4_if(const float* p, bool pred) {
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
  asm("{\n\t.reg .pred q;\n\t"
      "setp.ne.s32 q, %4, 0;\n\t"
      "@q ld.global.v4.f32 {%0, %1, %2, %3}, [%5];\n\t}"
      : "+f"(x.x), "+f"(x.y), "+f"(x.z), "+f"(x.w)
      : "r"(static_cast<int>(pred)), "l"(p));
  return x;
}

__device__ __forceinline__ float ldf(const void* p, int64_t i, int dt) {
  return bits_to_float(ld_bits(p, i, dt, true), dt);
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
  uint32_t q[Tl::KL], k[Tl::KL], g[Tl::KL], b[Tl::KL], r[Tl::KL];  // raw bits (ld_bits)
  uint32_t v[Tl::VL], w[Tl::VL];
  uint32_t gs, bs;  // scalar g (gdn) and beta (kda, gdn, deltanet)
  float lam;
  bool valid;
};

// Issues the loads of one step's inputs; nothing here waits for them.
template <int K>
__device__ __forceinline__ void load_raw(const RecArgs& A, int64_t brow, int64_t t, int64_t h,
                                         bool valid, int vbase, int BV, RawStep<K>& R) {
  using Tl = Tile<K>;
  const int lane = threadIdx.x & 31;
  R.valid = valid;
  const bool chan_g = A.variant == kGdn2 || A.variant == kQed || A.variant == kKda;
  const bool has_bw = A.variant == kGdn2 || A.variant == kQed;
  const bool rand = A.variant == kQed && A.arm == kArmRand;
  const int64_t oq = seq_off(A.q, brow, t, h), ok = seq_off(A.k, brow, t, h);
  const int64_t og = seq_off(A.g, brow, t, h), ob = seq_off(A.b, brow, t, h);
  R.gs = ld_bits(A.g.p, og, A.g.dt, valid && A.variant == kGdn);
  R.bs = ld_bits(A.beta.p, seq_off(A.beta, brow, t, h), A.beta.dt, valid && !has_bw);
  R.lam = __uint_as_float(ld_bits(A.lambda, h, 0, valid && A.variant == kQed));
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    const int c = lane + 32 * i;
    const bool in = valid && c < K;
    R.q[i] = ld_bits(A.q.p, oq + c, A.q.dt, in);
    R.k[i] = ld_bits(A.k.p, ok + c, A.k.dt, in);
    R.g[i] = ld_bits(A.g.p, og + c, A.g.dt, in && chan_g);
    R.b[i] = ld_bits(A.b.p, ob + c, A.b.dt, in && has_bw);
    R.r[i] = ld_bits(A.r, h * K + c, 0, in && rand);
  }
  const int64_t ov = seq_off(A.v, brow, t, h), ow = seq_off(A.w, brow, t, h);
#pragma unroll
  for (int i = 0; i < Tl::VL; ++i) {
    const int jl = lane + 32 * i;
    const int64_t j = vbase + jl;
    const bool in = valid && jl < BV && j < A.V;
    R.v[i] = ld_bits(A.v.p, ov + j, A.v.dt, in);
    R.w[i] = ld_bits(A.w.p, ow + j, A.w.dt, in && has_bw);
  }
}

// One step's inputs as floats, in the general GDN-2/QED form (lane channel i).
template <int K>
struct StepValues {
  using Tl = Tile<K>;
  float q[Tl::KL], k[Tl::KL], g[Tl::KL], b[Tl::KL], r[Tl::KL];
  float lam;
};

template <int K>
__device__ __forceinline__ void convert_raw(const RecArgs& A, const RawStep<K>& R,
                                            StepValues<K>& X) {
  using Tl = Tile<K>;
  const bool chan_g = A.variant == kGdn2 || A.variant == kQed || A.variant == kKda;
  const bool has_bw = A.variant == kGdn2 || A.variant == kQed;
  const float gs = A.variant == kGdn ? bits_to_float(R.gs, A.g.dt) : 0.f;
  const float bs = has_bw ? 0.f : bits_to_float(R.bs, A.beta.dt);
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    X.q[i] = bits_to_float(R.q[i], A.q.dt);
    X.k[i] = bits_to_float(R.k[i], A.k.dt);
    X.g[i] = chan_g ? bits_to_float(R.g[i], A.g.dt) : gs;
    X.b[i] = has_bw ? bits_to_float(R.b[i], A.b.dt) : bs;
    X.r[i] = __uint_as_float(R.r[i]);
  }
  X.lam = R.lam;
}

// Writes alpha | a | scale*q | k (each K floats) at vec and z (BV floats) at z.
template <int K>
__device__ __forceinline__ void prepare_step(const RecArgs& A, int64_t h, const RawStep<K>& R,
                                             int vbase, int BV, float* vec, float* z) {
  using Tl = Tile<K>;
  (void)h;
  const int lane = threadIdx.x & 31;
  if (!R.valid) return;
  StepValues<K> X;
  convert_raw<K>(A, R, X);
  const bool qed = A.variant == kQed;
  const bool projected = qed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  const bool has_bw = A.variant == kGdn2 || A.variant == kQed;
  const float lam = qed ? X.lam : 0.f;
  float m[Tl::KL];
  float kk = 0.f, km = 0.f;
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    const int c = lane + 32 * i;
    m[i] = 0.f;
    if (c < K && qed) {
      if (A.arm == kArmFull) m[i] = X.b[i] * X.q[i];
      else if (A.arm == kArmRand) m[i] = X.b[i] * X.r[i];
      else m[i] = X.q[i];
      kk += X.k[i] * X.k[i];
      km += X.k[i] * m[i];
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
      float a = X.b[i] * X.k[i];
      if (qed) a += lam * (m[i] - f * X.k[i]);
      vec[c] = expf(X.g[i]);  // deltanet: g = 0, alpha = 1 exactly
      vec[K + c] = a;
      vec[2 * K + c] = A.scale * X.q[i];
      vec[3 * K + c] = X.k[i];
    }
  }
  const float bs = has_bw ? 0.f : bits_to_float(R.bs, A.beta.dt);
#pragma unroll
  for (int i = 0; i < Tl::VL; ++i) {
    const int jl = lane + 32 * i;
    if (jl < BV) {
      const float wv = has_bw ? bits_to_float(R.w[i], A.w.dt) : bs;
      z[jl] = (vbase + jl < A.V) ? wv * bits_to_float(R.v[i], A.v.dt) : 0.f;
    }
  }
}

}  // namespace qed::kernels::detail
