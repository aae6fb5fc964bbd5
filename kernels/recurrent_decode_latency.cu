// Decode step for small batches, laid out for latency (issue 5: at B = 1, H = 16, K = V = 128 the
// whole state is 1 MiB and sits in L2 under graph replay, so a step costs its launch and its
// chain of dependent operations, not bandwidth).
//
// The tile kernel (recurrent_forward.cu) runs one warp per 16 columns of all K rows at small
// batches: each thread loads and reduces 64 state values, and each warp first builds the head's
// vectors (alpha, a, scale q, k) for all K channels in shared memory, with two warp-wide sums for
// the QED projection, before its step can start. Here a block of NW warps covers BV columns of all
// K rows, each thread RPT rows x 4 columns (16 values at the default 4 warps x 16 columns), and a
// thread needs the vectors of its own rows only: the projection's scalar f = k^T m / k^T k enters
// through one more sum over rows instead of being known first,
//   u = z - (D S)^T a = z - P1 + lambda f P2,   P1 = (D S)^T (b k + lambda m),  P2 = (D S)^T k,
//   o = S_new^T (scale q) = P3 + ((scale q)^T k) u,   P3 = (D S)^T (scale q),
// so the step is: loads (slot, inputs, then state), per-thread partial sums of P1, P2, P3 and of
// the scalars k^T k, k^T m, (scale q)^T k, shuffles over the warp's row groups, one exchange over
// warps through shared memory (summed in warp order: deterministic), the update and the stores.
// The kernel takes a compact argument struct (DecArgs, 32-bit strides) instead of RecArgs (624
// bytes). Equal to the forward's step to rounding (other summation order), like the row kernels.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "kernels/api.hpp"
#include "kernels/recurrent_common.cuh"
#include "kernels/recurrent_launch.cuh"

namespace qed::kernels::detail {
namespace {

// One token per sequence: every sequence tensor needs only its batch and head strides.
struct DecSeq {
  const void* p;
  int32_t sb, sh;
};

struct DecArgs {
  DecSeq q, k, v, g, b, w, beta;
  void* o;
  const float* lambda;
  const float* r;
  const int32_t* slots;
  float* state;     // read and written in place
  int64_t s_sn;     // state slot stride (64-bit: pools can exceed 2^31 elements)
  int32_t s_sh, s_sk;
  int32_t o_sb, o_sh;
  int32_t H, V, nslots;
  float scale;
  uint8_t variant, arm, dq, dk, dv, dg, db, dw, dbeta, dout;
};

// K rows, NW warps, BV columns per block; PROJ: the QED arms whose erase vector is projected.
template <int K, int NW, int BV, bool PROJ>
__global__ void __launch_bounds__(NW * 32) rec_decode_lat_kernel(const DecArgs A) {
  constexpr int NQ = BV / 4;           // column quads per block (one per lane of a row group)
  constexpr int RG = 32 / NQ;          // row groups per warp
  constexpr int RPT = K / (NW * RG);   // rows per thread
  constexpr int NS = 12 + 3;           // values summed per thread: P1, P2, P3 (4 columns) + 3 scalars
  static_assert(RPT >= 1 && RPT * NW * RG == K, "rec_decode_lat_kernel: shape does not tile K");
  __shared__ __align__(16) float4 red[NW][NQ][4];  // the NS sums (padded to 16) of each warp
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cq = lane % NQ, rg = lane / NQ;
  const uint32_t nz = static_cast<uint32_t>(A.V / BV);
  const uint32_t nh = blockIdx.x / nz, vz = blockIdx.x - nh * nz;
  const uint32_t n = nh / static_cast<uint32_t>(A.H), h = nh - n * static_cast<uint32_t>(A.H);
  const int r0 = (warp * RG + rg) * RPT;  // this thread's first row (channel)
  const int j0 = static_cast<int>(vz) * BV + cq * 4;

  // 1. The slot first (the state loads wait for it: the longest chain), then the inputs of this
  // thread's RPT channels and 4 columns, all issued before any is used.
  const int64_t slot = A.slots ? int64_t{__ldg(A.slots + n)} : int64_t{n};
  const bool qed = A.variant == kQed;
  const bool chan_g = A.variant == kGdn2 || qed || A.variant == kKda;
  const bool has_bw = A.variant == kGdn2 || qed;
  const bool rand = qed && A.arm == kArmRand;
  const int64_t oq = int64_t{n} * A.q.sb + int64_t{h} * A.q.sh, ok = int64_t{n} * A.k.sb + int64_t{h} * A.k.sh;
  const int64_t og = int64_t{n} * A.g.sb + int64_t{h} * A.g.sh, ob = int64_t{n} * A.b.sb + int64_t{h} * A.b.sh;
  uint32_t rq[RPT], rk[RPT], rgg[RPT], rb[RPT], rr[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int c = r0 + i;
    rq[i] = ld_bits(A.q.p, oq + c, A.dq, true);
    rk[i] = ld_bits(A.k.p, ok + c, A.dk, true);
    rgg[i] = ld_bits(A.g.p, og + c, A.dg, chan_g);
    rb[i] = ld_bits(A.b.p, ob + c, A.db, has_bw);
    rr[i] = ld_bits(A.r, int64_t{h} * K + c, 0, rand);
  }
  const uint32_t gsb = ld_bits(A.g.p, og, A.dg, A.variant == kGdn);
  const uint32_t betab =
      ld_bits(A.beta.p, int64_t{n} * A.beta.sb + int64_t{h} * A.beta.sh, A.dbeta, !has_bw);
  const float lam = __uint_as_float(ld_bits(A.lambda, h, 0, qed));  // 0 bits when not QED
  uint32_t rv[4], rw[4];
  {
    const int64_t ov = int64_t{n} * A.v.sb + int64_t{h} * A.v.sh + j0;
    const int64_t ow = int64_t{n} * A.w.sb + int64_t{h} * A.w.sh + j0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      rv[e] = ld_bits(A.v.p, ov + e, A.dv, true);
      rw[e] = ld_bits(A.w.p, ow + e, A.dw, has_bw);
    }
  }
  if (A.slots && (slot < 0 || slot >= A.nslots)) return;  // padding entry: the block leaves, writes nothing
  float* const sp = A.state + slot * A.s_sn + int64_t{h} * A.s_sh + j0;
  float4 S[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) S[i] = *reinterpret_cast<const float4*>(sp + (r0 + i) * A.s_sk);

  // 2. This thread's vectors and partial sums over its rows.
  const float gs = A.variant == kGdn ? bits_to_float(gsb, A.dg) : 0.f;  // deltanet: g = 0, alpha = 1
  const float bs = has_bw ? 0.f : bits_to_float(betab, A.dbeta);
  float al[RPT], kv[RPT];
  float acc[NS];
#pragma unroll
  for (int s = 0; s < NS; ++s) acc[s] = 0.f;
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const float qf = bits_to_float(rq[i], A.dq), kf = bits_to_float(rk[i], A.dk);
    const float bf = has_bw ? bits_to_float(rb[i], A.db) : bs;
    float m = 0.f;
    if (qed) m = A.arm == kArmFull ? bf * qf : (A.arm == kArmRand ? bf * __uint_as_float(rr[i]) : qf);
    al[i] = expf(chan_g ? bits_to_float(rgg[i], A.dg) : gs);
    kv[i] = kf;
    const float e = fmaf(lam, m, bf * kf);  // b k + lambda m
    const float sq = A.scale * qf;
    const float x[4] = {S[i].x * al[i], S[i].y * al[i], S[i].z * al[i], S[i].w * al[i]};
    S[i] = make_float4(x[0], x[1], x[2], x[3]);  // D S
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      acc[c] = fmaf(e, x[c], acc[c]);
      if (PROJ) acc[4 + c] = fmaf(kf, x[c], acc[4 + c]);
      acc[8 + c] = fmaf(sq, x[c], acc[8 + c]);
    }
    if (PROJ) {
      acc[12] = fmaf(kf, kf, acc[12]);
      acc[13] = fmaf(kf, m, acc[13]);
    }
    acc[14] = fmaf(sq, kf, acc[14]);
  }
  // 3. Sums over the warp's row groups (lanes cq, cq + NQ, ...), then over warps in warp order.
#pragma unroll
  for (int m = NQ; m < 32; m <<= 1)
#pragma unroll
    for (int s = 0; s < NS; ++s) acc[s] += __shfl_xor_sync(0xffffffffu, acc[s], m);
  if (rg == 0)
#pragma unroll
    for (int v = 0; v < 4; ++v)
      red[warp][cq][v] = make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], v < 3 ? acc[4 * v + 3] : 0.f);
  __syncthreads();
  {
    float4 t[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) t[v] = red[0][cq][v];
#pragma unroll
    for (int w = 1; w < NW; ++w)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const float4 x = red[w][cq][v];
        t[v].x += x.x, t[v].y += x.y, t[v].z += x.z, t[v].w += x.w;
      }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      acc[4 * v] = t[v].x, acc[4 * v + 1] = t[v].y, acc[4 * v + 2] = t[v].z;
      if (v < 3) acc[4 * v + 3] = t[v].w;
    }
  }
  const float f = PROJ ? (acc[12] != 0.f ? acc[13] / acc[12] : 0.f) : 0.f;  // P(0) = I
  float u[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float wv = has_bw ? bits_to_float(rw[c], A.dw) : bs;
    const float z = wv * bits_to_float(rv[c], A.dv);
    const float pa = PROJ ? fmaf(-lam * f, acc[4 + c], acc[c]) : acc[c];
    u[c] = z - pa;
  }
  // 4. S <- D S + k u^T, and o = P3 + ((scale q)^T k) u from one lane per column quad.
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const float4 x = S[i];
    *reinterpret_cast<float4*>(sp + (r0 + i) * A.s_sk) =
        make_float4(fmaf(kv[i], u[0], x.x), fmaf(kv[i], u[1], x.y), fmaf(kv[i], u[2], x.z), fmaf(kv[i], u[3], x.w));
  }
  if (warp == 0 && rg == 0 && A.o) {
    const int64_t oo = int64_t{n} * A.o_sb + int64_t{h} * A.o_sh + j0;
#pragma unroll
    for (int c = 0; c < 4; ++c) stf(A.o, oo + c, A.dout, fmaf(acc[14], u[c], acc[8 + c]));
  }
}

// The launch shape: NW warps x BV columns. Default 4x16 (four rows of 4 columns per thread at
// K = 128); measured on the H200 at B = 1, H = 16, K = V = 128, per step in a graph of 16 steps,
// three runs of this kernel (reports/device/recurrent.md run F): 4x16 2.87-2.91 us, 8x16
// 3.35-3.40, 4x8 3.21-3.24, 2x8 3.25-3.29, 8x8 3.77-3.83, 16x16 5.35-5.38 (tile kernel 3.91-3.93,
// the peer 3.09-3.10). QED_REC_DECODE_LAT=NWxBV overrides, for the side-by-side table of
// bench/bench_recurrent.py.
struct LatShape {
  int nw = 4, bv = 16;
};

LatShape lat_shape() {
  LatShape s;
  if (const char* e = std::getenv("QED_REC_DECODE_LAT")) {
    const std::string v(e);
    if (v == "8x16") s = {8, 16};
    else if (v == "4x8") s = {4, 8};
    else if (v == "2x16") s = {2, 16};
    else if (v == "2x8") s = {2, 8};
    else if (v == "8x8") s = {8, 8};
    else if (v == "16x16") s = {16, 16};
  }
  return s;
}

bool fits32(int64_t x) { return x >= 0 && x <= std::numeric_limits<int32_t>::max(); }

// Compact arguments from RecArgs; false when a stride or offset does not fit 32 bits (the caller
// then keeps the tile kernel).
bool make_dec_args(const RecArgs& A, DecArgs* D) {
  auto seq = [&](const SeqArg& s, int64_t dim, DecSeq* out) {
    out->p = s.p;
    out->sb = static_cast<int32_t>(s.sb);
    out->sh = static_cast<int32_t>(s.sh);
    if (!s.p) return true;
    return fits32(s.sb) && fits32(s.sh) && fits32((A.N - 1) * s.sb + (A.H - 1) * s.sh + dim);
  };
  bool ok = seq(A.q, A.K, &D->q) && seq(A.k, A.K, &D->k) && seq(A.v, A.V, &D->v) && seq(A.g, A.K, &D->g) &&
            seq(A.b, A.K, &D->b) && seq(A.w, A.V, &D->w) && seq(A.beta, 1, &D->beta);
  D->o = A.o.p;
  D->o_sb = static_cast<int32_t>(A.o.sb);
  D->o_sh = static_cast<int32_t>(A.o.sh);
  ok = ok && (!A.o.p || (fits32(A.o.sb) && fits32(A.o.sh) && fits32((A.N - 1) * A.o.sb + (A.H - 1) * A.o.sh + A.V)));
  D->lambda = A.lambda;
  D->r = A.r;
  D->slots = A.slots;
  D->state = A.ht.p;
  D->s_sn = A.ht.sn;
  D->s_sh = static_cast<int32_t>(A.ht.sh);
  D->s_sk = static_cast<int32_t>(A.ht.sk);
  ok = ok && fits32(A.ht.sh) && fits32(A.ht.sk) && fits32((A.H - 1) * A.ht.sh + (A.K - 1) * A.ht.sk + A.V);
  ok = ok && A.h0.p == A.ht.p && A.h0.sn == A.ht.sn && A.h0.sh == A.ht.sh && A.h0.sk == A.ht.sk;
  D->H = static_cast<int32_t>(A.H);
  D->V = static_cast<int32_t>(A.V);
  D->nslots = static_cast<int32_t>(A.nslots > std::numeric_limits<int32_t>::max() ? std::numeric_limits<int32_t>::max()
                                                                                 : A.nslots);
  D->scale = A.scale;
  D->variant = static_cast<uint8_t>(A.variant);
  D->arm = static_cast<uint8_t>(A.arm);
  D->dq = static_cast<uint8_t>(A.q.dt);
  D->dk = static_cast<uint8_t>(A.k.dt);
  D->dv = static_cast<uint8_t>(A.v.dt);
  D->dg = static_cast<uint8_t>(A.g.dt);
  D->db = static_cast<uint8_t>(A.b.dt);
  D->dw = static_cast<uint8_t>(A.w.dt);
  D->dbeta = static_cast<uint8_t>(A.beta.dt);
  D->dout = static_cast<uint8_t>(A.o.dt);
  return ok;
}

template <int K, int NW, int BV>
Status launch_lat(const char* fn, const RecArgs& A, const DecArgs& D, cudaStream_t stream) {
  const bool proj = A.variant == kQed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  const int64_t blocks = A.N * A.H * (A.V / BV);
  if (blocks > (int64_t{1} << 31) - 1)
    return {StatusCode::unsupported, std::string(fn) + ": N * H * value blocks exceeds 2^31 - 1"};
  if (proj)
    rec_decode_lat_kernel<K, NW, BV, true><<<static_cast<unsigned>(blocks), NW * 32, 0, stream>>>(D);
  else
    rec_decode_lat_kernel<K, NW, BV, false><<<static_cast<unsigned>(blocks), NW * 32, 0, stream>>>(D);
  return cuda_status(fn, "decode kernel launch", cudaGetLastError());
}

template <int K>
Status launch_lat_k(const char* fn, const RecArgs& A, const DecArgs& D, LatShape s, cudaStream_t stream) {
  // A shape needs NW x (32 / (BV / 4)) <= K row groups; smaller K fall back to fewer warps.
  if (s.bv == 8 && A.V % 8 == 0) {
    if constexpr (K >= 128)
      if (s.nw == 8) return launch_lat<K, 8, 8>(fn, A, D, stream);
    if constexpr (K >= 64)
      if (s.nw >= 4) return launch_lat<K, 4, 8>(fn, A, D, stream);
    return launch_lat<K, 2, 8>(fn, A, D, stream);
  }
  if constexpr (K >= 128)
    if (s.nw == 16) return launch_lat<K, 16, 16>(fn, A, D, stream);
  if constexpr (K >= 64)
    if (s.nw >= 8) return launch_lat<K, 8, 16>(fn, A, D, stream);
  if (s.nw == 2) return launch_lat<K, 2, 16>(fn, A, D, stream);
  return launch_lat<K, 4, 16>(fn, A, D, stream);
}

}  // namespace

bool decode_lat_eligible(const RecArgs& A) {
  if (A.cu || A.T != 1 || A.V % 16 != 0) return false;
  if (A.K != 32 && A.K != 64 && A.K != 128 && A.K != 256) return false;
  auto aligned = [](const void* p, int64_t sn, int64_t sh, int64_t sk) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && sn % 4 == 0 && sh % 4 == 0 && sk % 4 == 0;
  };
  if (!A.ht.p || !aligned(A.ht.p, A.ht.sn, A.ht.sh, A.ht.sk)) return false;
  DecArgs D{};
  return make_dec_args(A, &D);
}

Status launch_rec_decode_lat(const char* fn, const RecArgs& A, cudaStream_t stream) {
  if (A.N == 0) return {};
  DecArgs D{};
  if (!make_dec_args(A, &D))
    return {StatusCode::unsupported, std::string(fn) + ": strides too large for the small-batch decode kernel"};
  const LatShape s = lat_shape();
  switch (A.K) {
    case 32: return launch_lat_k<32>(fn, A, D, s, stream);
    case 64: return launch_lat_k<64>(fn, A, D, s, stream);
    case 128: return launch_lat_k<128>(fn, A, D, s, stream);
    case 256: return launch_lat_k<256>(fn, A, D, s, stream);
  }
  return {StatusCode::unsupported, std::string(fn) + ": K not built for the small-batch decode kernel"};
}

}  // namespace qed::kernels::detail
