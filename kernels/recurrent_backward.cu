// Recurrent backward (MATH.md §5): the adjoint sweep of §5.1 and the erase-vector VJP of §5.2.
// 1. The forward kernel stores the state before every chunk of Tc steps (checkpoints).
// 2. rec_backward_kernel walks the chunks in reverse. Per chunk it recomputes the pseudo-values
//    u_t from the checkpoint, then for each step (last first) recomputes S_{t-1} from the
//    checkpoint (never by inverting a step), updates the adjoint state in registers, writes
//    ubar_t, and reduces the four per-row sums over its value columns (s S_t do, Sh u, S ubar,
//    rowsum(Pbar . S)) through shuffles and shared memory in a fixed order.
// 3. rec_backward_epilogue sums the value-block partials (fixed order) and applies the token-level
//    VJPs: gates, erase vector, variant mapping. 4. Per-head sums (dlambda, dr) in fixed order.
// No atomics anywhere: results are bitwise reproducible.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/api.hpp"
#include "kernels/recurrent_common.cuh"
#include "kernels/recurrent_launch.cuh"

namespace qed::kernels::detail {

namespace {

__host__ __device__ constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x / 2); }

template <int K>
__device__ __forceinline__ void load_tile(float (&S)[Tile<K>::NR][4], const float* base,
                                          int64_t rstride, bool ok, int r) {
  using Tl = Tile<K>;
  // Predicated loads, no branch: all in flight together.
#pragma unroll
  for (int i = 0; i < Tl::NR; ++i) {
    const float4 x = ld4_if(ok ? base + Tl::row(r, i) * rstride : base, ok);
    S[i][0] = x.x; S[i][1] = x.y; S[i][2] = x.z; S[i][3] = x.w;
  }
}

// Sums v (one value per owned row) over the warp's column quads and stores the warp's sums at
// red[row]. Reduce-scatter on the high lane bits while values remain to split, then all-reduce;
// one lane per group writes. Fixed order: deterministic.
template <int K>
__device__ __forceinline__ void reduce_rows(float (&v)[Tile<K>::NR], float* red, int lane, int r) {
  using Tl = Tile<K>;
  constexpr int L = ilog2(Tl::NCQ);
  constexpr int LS = L < ilog2(Tl::NR) ? L : ilog2(Tl::NR);
  constexpr int FIN = Tl::NR >> LS;
  int off = 0;
#pragma unroll
  for (int l = 0; l < LS; ++l) {
    const int m = 16 >> l;
    const int hsz = Tl::NR >> (l + 1);
    const bool bit = (lane & m) != 0;
#pragma unroll
    for (int k = 0; k < Tl::NR / 2; ++k) {
      if (k < hsz) {
        const float send = bit ? v[k] : v[k + hsz];
        const float keep = bit ? v[k + hsz] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, m);
      }
    }
    if (bit) off += hsz;
  }
#pragma unroll
  for (int l = LS; l < L; ++l) {
    const int m = 16 >> l;
#pragma unroll
    for (int k = 0; k < FIN; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], m);
  }
  const int arbits = (lane >> ilog2(Tl::R)) & ((1 << (L - LS)) - 1);
  if (arbits == 0) {
#pragma unroll
    for (int k = 0; k < FIN; ++k) red[Tl::row(r, off + k)] = v[k];
  }
}

template <int K>
__global__ void __launch_bounds__(256) rec_backward_kernel(RecArgs A) {
  using Tl = Tile<K>;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  const int nw = A.nwarps;
  const int Tc = nw;
  const int BV = nw * Tl::CPW;
  const int stepf = 4 * K + BV;
  float* vecs = sm;
  float* dob = vecs + Tc * stepf;
  float* ub = dob + Tc * BV;
  float* red = ub + Tc * BV;  // [2][nw][4K]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane % Tl::R, cq = lane / Tl::R;
  const int64_t n = blockIdx.x, h = blockIdx.y;
  const int64_t vb = blockIdx.z;
  const int vbase = static_cast<int>(vb) * BV;
  const int jloc = warp * Tl::CPW + cq * 4;
  const int64_t j0 = vbase + jloc;
  const bool colok = j0 < A.V;
  const SeqSpan sp = seq_span(A, n);
  const int64_t len = sp.eos - sp.bos;
  const int64_t BT = A.B * A.T;
  const int64_t nch = (len + Tc - 1) / Tc;

  float Sh[Tl::NR][4];
  load_tile<K>(Sh, A.dht.p ? A.dht.p + n * A.dht.sn + h * A.dht.sh + j0 : nullptr, A.dht.sk,
               A.dht.p && colok, r);

  int par = 0;
  for (int64_t c = nch - 1; c >= 0; --c) {
    const int64_t t0 = c * Tc;
    const int steps = static_cast<int>(len - t0 < Tc ? len - t0 : Tc);
    {
      RawStep<K> raw;
      const bool valid = warp < steps;
      const int64_t tok = sp.bos + t0 + warp;
      load_raw<K>(A, sp.b, tok, h, valid, vbase, BV, raw);
      uint32_t dov[Tl::VL];
      const int64_t od = seq_off(A.dout, sp.b, tok, h);
#pragma unroll
      for (int i = 0; i < Tl::VL; ++i) {
        const int jl = lane + 32 * i;
        dov[i] = ld_bits(A.dout.p, od + vbase + jl, A.dout.dt, valid && jl < BV && vbase + jl < A.V);
      }
      prepare_step<K>(A, h, raw, vbase, BV, vecs + warp * stepf, vecs + warp * stepf + 4 * K);
#pragma unroll
      for (int i = 0; i < Tl::VL; ++i) {
        const int jl = lane + 32 * i;
        if (valid && jl < BV) dob[warp * BV + jl] = bits_to_float(dov[i], A.dout.dt);
      }
    }
    __syncthreads();

    const float* ck = A.ckpt + (ckpt_index(A, n, sp.bos, c) * A.H + h) * K * A.V + j0;
    float S[Tl::NR][4];
    // Pass A: the chunk's pseudo-values u_t, kept in shared memory for the reverse walk.
    load_tile<K>(S, ck, A.V, colok, r);
    for (int s = 0; s < steps; ++s) {
      const float* vec = vecs + s * stepf;
      const float4 zq = *reinterpret_cast<const float4*>(vec + 4 * K + jloc);
      float u[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int f = 0; f < Tl::NQ; ++f) {
        const int rb = (f * Tl::R + r) * 4;
        const float4 al = *reinterpret_cast<const float4*>(vec + rb);
        const float4 aa = *reinterpret_cast<const float4*>(vec + K + rb);
        const float alv[4] = {al.x, al.y, al.z, al.w};
        const float aav[4] = {aa.x, aa.y, aa.z, aa.w};
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            S[f * 4 + e2][e] *= alv[e2];
            u[e] = fmaf(aav[e2], S[f * 4 + e2][e], u[e]);
          }
      }
      const float zv[4] = {zq.x, zq.y, zq.z, zq.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) u[e] = zv[e] - allreduce_r<Tl::R>(u[e]);
#pragma unroll
      for (int f = 0; f < Tl::NQ; ++f) {
        const int rb = (f * Tl::R + r) * 4;
        const float4 kk = *reinterpret_cast<const float4*>(vec + 3 * K + rb);
        const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[f * 4 + e2][e] = fmaf(kv[e2], u[e], S[f * 4 + e2][e]);
      }
      if (r == 0) *reinterpret_cast<float4*>(ub + s * BV + jloc) = make_float4(u[0], u[1], u[2], u[3]);
    }
    __syncwarp();

    for (int s = steps - 1; s >= 0; --s) {
      // S <- S_{t-1}: replay steps 0..s-1 of the chunk from its checkpoint.
      load_tile<K>(S, ck, A.V, colok, r);
      for (int s2 = 0; s2 < s; ++s2) {
        const float* vec = vecs + s2 * stepf;
        const float4 u4 = *reinterpret_cast<const float4*>(ub + s2 * BV + jloc);
        const float uv[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
        for (int f = 0; f < Tl::NQ; ++f) {
          const int rb = (f * Tl::R + r) * 4;
          const float4 al = *reinterpret_cast<const float4*>(vec + rb);
          const float4 kk = *reinterpret_cast<const float4*>(vec + 3 * K + rb);
          const float alv[4] = {al.x, al.y, al.z, al.w};
          const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
          for (int e2 = 0; e2 < 4; ++e2)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              S[f * 4 + e2][e] = fmaf(kv[e2], uv[e], S[f * 4 + e2][e] * alv[e2]);
        }
      }
      const float* vec = vecs + s * stepf;
      const float4 d4 = *reinterpret_cast<const float4*>(dob + s * BV + jloc);
      const float4 u4 = *reinterpret_cast<const float4*>(ub + s * BV + jloc);
      const float dv[4] = {d4.x, d4.y, d4.z, d4.w};
      const float uv[4] = {u4.x, u4.y, u4.z, u4.w};
      float* redw = red + (par * nw + warp) * 4 * K;
      float val[Tl::NR];
      // (0) Sh += s q do^T; row sums of S_t do (scaled by s in the epilogue).
#pragma unroll
      for (int f = 0; f < Tl::NQ; ++f) {
        const int rb = (f * Tl::R + r) * 4;
        const float4 al = *reinterpret_cast<const float4*>(vec + rb);
        const float4 qq = *reinterpret_cast<const float4*>(vec + 2 * K + rb);
        const float4 kk = *reinterpret_cast<const float4*>(vec + 3 * K + rb);
        const float alv[4] = {al.x, al.y, al.z, al.w};
        const float qv[4] = {qq.x, qq.y, qq.z, qq.w};
        const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          float acc = 0.f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = f * 4 + e2;
            Sh[i][e] = fmaf(qv[e2], dv[e], Sh[i][e]);
            const float st = fmaf(kv[e2], uv[e], S[i][e] * alv[e2]);
            acc = fmaf(st, dv[e], acc);
          }
          val[f * 4 + e2] = acc;
        }
      }
      reduce_rows<K>(val, redw, lane, r);
      // (1) ubar = Sh^T k; row sums of Sh u (direct dk).
      float ubp[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int f = 0; f < Tl::NQ; ++f) {
        const int rb = (f * Tl::R + r) * 4;
        const float4 kk = *reinterpret_cast<const float4*>(vec + 3 * K + rb);
        const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          float acc = 0.f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = f * 4 + e2;
            acc = fmaf(Sh[i][e], uv[e], acc);
            ubp[e] = fmaf(Sh[i][e], kv[e2], ubp[e]);
          }
          val[f * 4 + e2] = acc;
        }
      }
      reduce_rows<K>(val, redw + K, lane, r);
      float ubar[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ubar[e] = allreduce_r<Tl::R>(ubp[e]);
      const int64_t bt = sp.b * A.T + sp.bos + t0 + s;
      if (r == 0 && colok)
        *reinterpret_cast<float4*>(A.ubar + (bt * A.H + h) * A.V + j0) =
            make_float4(ubar[0], ubar[1], ubar[2], ubar[3]);
      // (2) row sums of S_{t-1} ubar (abar = -alpha * this, in the epilogue).
#pragma unroll
      for (int i = 0; i < Tl::NR; ++i) {
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc = fmaf(S[i][e], ubar[e], acc);
        val[i] = acc;
      }
      reduce_rows<K>(val, redw + 2 * K, lane, r);
      // (3) Pbar = Sh - a ubar^T; rowsum(Pbar . S_{t-1}); Sh <- D Pbar.
#pragma unroll
      for (int f = 0; f < Tl::NQ; ++f) {
        const int rb = (f * Tl::R + r) * 4;
        const float4 al = *reinterpret_cast<const float4*>(vec + rb);
        const float4 aa = *reinterpret_cast<const float4*>(vec + K + rb);
        const float alv[4] = {al.x, al.y, al.z, al.w};
        const float aav[4] = {aa.x, aa.y, aa.z, aa.w};
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          float acc = 0.f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = f * 4 + e2;
            Sh[i][e] = fmaf(-aav[e2], ubar[e], Sh[i][e]);
            acc = fmaf(Sh[i][e], S[i][e], acc);
            Sh[i][e] *= alv[e2];
          }
          val[f * 4 + e2] = acc;
        }
      }
      reduce_rows<K>(val, redw + 3 * K, lane, r);
      __syncthreads();
      float* dst = A.part + ((vb * BT + bt) * A.H + h) * 4 * K;
      const float* src = red + par * nw * 4 * K;
      for (int idx = threadIdx.x; idx < 4 * K; idx += blockDim.x) {
        float acc = 0.f;
        for (int w = 0; w < nw; ++w) acc += src[w * 4 * K + idx];
        dst[idx] = acc;
      }
      par ^= 1;
    }
  }

  if (colok) {
    float* base = A.dh0.p + n * A.dh0.sn + h * A.dh0.sh + j0;
#pragma unroll
    for (int i = 0; i < Tl::NR; ++i)
      *reinterpret_cast<float4*>(base + Tl::row(r, i) * A.dh0.sk) =
          make_float4(Sh[i][0], Sh[i][1], Sh[i][2], Sh[i][3]);
  }
}

struct EpiArgs {
  SeqOutArg dq, dk, dv, dg, db, dw, dbeta;
  float* dlam_tok = nullptr;  // [B*T, H]
  float* dr_tok = nullptr;    // [B*T, H, K]
  int64_t nvblk = 1;
};

// One warp per (token, head): the token-level part of the adjoint.
template <int K>
__global__ void __launch_bounds__(256) rec_backward_epilogue(RecArgs A, EpiArgs E) {
  using Tl = Tile<K>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t BT = A.B * A.T;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (item >= BT * A.H) return;
  const int64_t bt = item / A.H, h = item % A.H;
  const int64_t brow = bt / A.T, t = bt % A.T;

  float qo[Tl::KL], kd[Tl::KL], ar[Tl::KL], alb[Tl::KL];
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) qo[i] = kd[i] = ar[i] = alb[i] = 0.f;
  for (int64_t vb = 0; vb < E.nvblk; ++vb) {
    const float* base = A.part + ((vb * BT + bt) * A.H + h) * 4 * K;
#pragma unroll
    for (int i = 0; i < Tl::KL; ++i) {
      const int c = lane + 32 * i;
      if (c < K) {
        qo[i] += base[c];
        kd[i] += base[K + c];
        ar[i] += base[2 * K + c];
        alb[i] += base[3 * K + c];
      }
    }
  }
  RawStep<K> rw;
  load_raw<K>(A, brow, t, h, true, 0, 0, rw);
  StepValues<K> raw;
  convert_raw<K>(A, rw, raw);
  const bool qed = A.variant == kQed;
  const bool projected = qed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  const float lam = qed ? A.lambda[h] : 0.f;
  float m[Tl::KL], abar[Tl::KL], dq[Tl::KL], dk[Tl::KL], db[Tl::KL], dgc[Tl::KL];
  float kk = 0.f, km = 0.f, ee = 0.f, dl = 0.f, dbsum = 0.f, dgsum = 0.f;
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    const int c = lane + 32 * i;
    m[i] = abar[i] = dq[i] = dk[i] = db[i] = dgc[i] = 0.f;
    if (c < K) {
      const float alpha = expf(raw.g[i]);
      abar[i] = -alpha * ar[i];
      dgc[i] = alpha * alb[i];
      dq[i] = A.scale * qo[i];
      dk[i] = kd[i] + abar[i] * raw.b[i];
      db[i] = abar[i] * raw.k[i];
      if (qed) {
        if (A.arm == kArmFull) m[i] = raw.b[i] * raw.q[i];
        else if (A.arm == kArmRand) m[i] = raw.b[i] * A.r[h * K + c];
        else m[i] = raw.q[i];
        kk += raw.k[i] * raw.k[i];
        km += raw.k[i] * m[i];
        ee += raw.k[i] * abar[i];
      }
    }
  }
  if (qed) {
    kk = warp_sum(kk);
    km = warp_sum(km);
    ee = warp_sum(ee);
    const float f = projected && kk != 0.f ? km / kk : 0.f;
#pragma unroll
    for (int i = 0; i < Tl::KL; ++i) {
      const int c = lane + 32 * i;
      if (c < K) {
        const float p = m[i] - f * raw.k[i];
        dl += abar[i] * p;
        float mbar = lam * abar[i];
        if (projected && kk != 0.f) {
          mbar = lam * (abar[i] - raw.k[i] * ee / kk);
          dk[i] -= lam * (km / kk * abar[i] + ee / kk * m[i] - 2.f * km * ee / (kk * kk) * raw.k[i]);
        }
        if (A.arm == kArmFull) {
          dq[i] += mbar * raw.b[i];
          db[i] += mbar * raw.q[i];
        } else if (A.arm == kArmRand) {
          db[i] += mbar * A.r[h * K + c];
          E.dr_tok[(bt * A.H + h) * K + c] = mbar * raw.b[i];
        } else {
          dq[i] += mbar;
        }
      }
    }
    dl = warp_sum(dl);
    if (lane == 0) E.dlam_tok[bt * A.H + h] = dl;
  }
  const bool chan_g = A.variant == kGdn2 || A.variant == kQed || A.variant == kKda;
  const bool has_bw = A.variant == kGdn2 || A.variant == kQed;
#pragma unroll
  for (int i = 0; i < Tl::KL; ++i) {
    const int c = lane + 32 * i;
    if (c < K) {
      stf(E.dq.p, seq_off(E.dq, brow, t, h) + c, E.dq.dt, dq[i]);
      stf(E.dk.p, seq_off(E.dk, brow, t, h) + c, E.dk.dt, dk[i]);
      if (chan_g) stf(E.dg.p, seq_off(E.dg, brow, t, h) + c, E.dg.dt, dgc[i]);
      if (has_bw) stf(E.db.p, seq_off(E.db, brow, t, h) + c, E.db.dt, db[i]);
      dbsum += db[i];
      dgsum += dgc[i];
    }
  }
  if (A.variant == kGdn) {
    dgsum = warp_sum(dgsum);
    if (lane == 0) stf(E.dg.p, seq_off(E.dg, brow, t, h), E.dg.dt, dgsum);
  }
  const float* ubr = A.ubar + (bt * A.H + h) * A.V;
  const int64_t ov = seq_off(A.v, brow, t, h);
  float svu = 0.f;
  const float beta = has_bw ? 0.f : raw.b[0];  // kda, gdn, deltanet: b = beta on every channel
  for (int64_t j = lane; j < A.V; j += 32) {
    const float u = ubr[j];
    const float vv = ldf(A.v.p, ov + j, A.v.dt);
    if (has_bw) {
      const float ww = ldf(A.w.p, seq_off(A.w, brow, t, h) + j, A.w.dt);
      stf(E.dv.p, seq_off(E.dv, brow, t, h) + j, E.dv.dt, ww * u);
      stf(E.dw.p, seq_off(E.dw, brow, t, h) + j, E.dw.dt, vv * u);
    } else {
      stf(E.dv.p, seq_off(E.dv, brow, t, h) + j, E.dv.dt, beta * u);
      svu += vv * u;
    }
  }
  if (!has_bw) {
    const float d = warp_sum(dbsum) + warp_sum(svu);
    if (lane == 0) stf(E.dbeta.p, seq_off(E.dbeta, brow, t, h), E.dbeta.dt, d);
  }
}

// out[h*D + c] = sum over tokens of tok[(bt*H + h)*D + c], in a fixed order.
__global__ void __launch_bounds__(256) head_reduce(const float* tok, int64_t BT, int64_t H, int D,
                                                   float* out) {
  __shared__ float acc[256];
  const int h = blockIdx.x;
  const int G = 256 / D;
  const int g = threadIdx.x / D, c = threadIdx.x % D;
  float a = 0.f;
  if (g < G)
    for (int64_t bt = g; bt < BT; bt += G) a += tok[(bt * H + h) * D + c];
  acc[threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.x < D) {
    float s = 0.f;
    for (int gg = 0; gg < G; ++gg) s += acc[gg * D + threadIdx.x];
    out[h * D + threadIdx.x] = s;
  }
}

struct BwdLayout {
  int nw = 4;
  int64_t nvblk = 1, ckpt_slots = 0;
  size_t ckpt = 0, ubar = 0, part = 0, dlam = 0, dr = 0, total = 0;
};

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

BwdLayout layout_for(const Problem& p) {
  BwdLayout L;
  const int cpw = columns_per_warp(p.K);
  L.nw = static_cast<int>(std::clamp<int64_t>((p.V + cpw - 1) / cpw, 4, 8));
  const int64_t BV = L.nw * cpw;
  L.nvblk = (p.V + BV - 1) / BV;
  const int64_t Tc = L.nw, N = p.sequences(), BT = p.B * p.T;
  L.ckpt_slots = p.cu_seqlens ? N + p.T / Tc + 1 : N * ((p.T + Tc - 1) / Tc);
  const reference::Layout lay = reference::layout_of(p.variant, p.arm);
  size_t off = 0;
  L.ckpt = off;
  off = align_up(off + sizeof(float) * L.ckpt_slots * p.H * p.K * p.V);
  L.ubar = off;
  off = align_up(off + sizeof(float) * BT * p.H * p.V);
  L.part = off;
  off = align_up(off + sizeof(float) * L.nvblk * BT * p.H * 4 * p.K);
  L.dlam = off;
  if (lay.has_lambda) off = align_up(off + sizeof(float) * BT * p.H);
  L.dr = off;
  if (lay.has_r) off = align_up(off + sizeof(float) * BT * p.H * p.K);
  L.total = off;
  return L;
}

template <int K>
Status launch_backward_k(const char* fn, RecArgs A, const EpiArgs& E, const BwdLayout& L,
                         cudaStream_t stream) {
  using Tl = Tile<K>;
  const int nw = L.nw;
  const int BV = nw * Tl::CPW;
  const size_t smem = sizeof(float) * (nw * (4 * K + BV) + 2 * nw * BV + 2 * nw * 4 * K);
  static bool attr_set = false;
  if (!attr_set) {
    Status s = cuda_status(fn, "cudaFuncSetAttribute",
                           cudaFuncSetAttribute(rec_backward_kernel<K>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                160 * 1024));
    if (!s.ok()) return s;
    attr_set = true;
  }
  A.nwarps = nw;
  if (A.N > 0) {
    dim3 grid(static_cast<unsigned>(A.N), static_cast<unsigned>(A.H),
              static_cast<unsigned>(L.nvblk));
    rec_backward_kernel<K><<<grid, nw * 32, smem, stream>>>(A);
    Status s = cuda_status(fn, "backward kernel launch", cudaGetLastError());
    if (!s.ok()) return s;
  }
  const int64_t items = A.B * A.T * A.H;
  if (items > 0) {
    rec_backward_epilogue<K><<<static_cast<unsigned>((items + 7) / 8), 256, 0, stream>>>(A, E);
    Status s = cuda_status(fn, "epilogue launch", cudaGetLastError());
    if (!s.ok()) return s;
  }
  return {};
}

}  // namespace

}  // namespace qed::kernels::detail

namespace qed::kernels {

namespace {

Status check_backward(const char* fn, const RecurrentBackwardParams& p) {
  Status s;
  if (!(s = validate_problem(fn, p.problem)).ok()) return s;
  if (!(s = validate_inputs(fn, p.problem, p.in)).ok()) return s;
  if (!(s = validate_grads(fn, p.problem, p.grads)).ok()) return s;
  if (!p.do_.data) return {StatusCode::invalid_argument, std::string(fn) + ": do_ is required"};
  SeqTensorOut d{const_cast<void*>(p.do_.data), p.do_.dtype, p.do_.stride_b, p.do_.stride_t,
                 p.do_.stride_h};
  if (!(s = validate_output(fn, "do_", p.problem, d)).ok()) return s;
  return validate_state(fn, "dht", p.dht);
}

}  // namespace

Status recurrent_backward_workspace(const RecurrentBackwardParams& p, size_t* bytes) {
  const char* fn = "recurrent_backward_workspace";
  Status s = validate_problem(fn, p.problem);
  if (!s.ok()) return s;
  if (!bytes) return {StatusCode::invalid_argument, std::string(fn) + ": bytes is nullptr"};
  *bytes = detail::layout_for(p.problem).total;
  return {};
}

Status recurrent_backward(const RecurrentBackwardParams& p) {
  const char* fn = "recurrent_backward";
  Status s = check_backward(fn, p);
  if (!s.ok()) return s;
  if (!(s = detail::cached_device_status()).ok()) return s;
  const Problem& pr = p.problem;
  const detail::BwdLayout L = detail::layout_for(pr);
  cudaStream_t stream = pr.stream;
  char* ws = static_cast<char*>(p.workspace);
  const bool own = ws == nullptr;
  if (!own && p.workspace_bytes < L.total)
    return {StatusCode::invalid_argument,
            std::string(fn) + ": workspace_bytes = " + std::to_string(p.workspace_bytes) +
                " is smaller than the " + std::to_string(L.total) +
                " bytes recurrent_backward_workspace asks for"};
  if (own && L.total > 0) {
    void* m = nullptr;
    s = detail::cuda_status(fn, "cudaMallocAsync (workspace)", cudaMallocAsync(&m, L.total, stream));
    if (!s.ok()) return s;
    ws = static_cast<char*>(m);
  }
  detail::RecArgs A = detail::make_args(pr, p.in);
  A.ckpt = reinterpret_cast<float*>(ws + L.ckpt);
  A.ubar = reinterpret_cast<float*>(ws + L.ubar);
  A.part = reinterpret_cast<float*>(ws + L.part);
  A.dout = detail::seq_arg(p.do_);
  A.dht = detail::state_arg(p.dht);
  A.dh0 = detail::state_out_arg(p.grads.dh0);
  detail::EpiArgs E;
  E.dq = detail::seq_out_arg(p.grads.dq);
  E.dk = detail::seq_out_arg(p.grads.dk);
  E.dv = detail::seq_out_arg(p.grads.dv);
  E.dg = detail::seq_out_arg(p.grads.dg);
  E.db = detail::seq_out_arg(p.grads.db);
  E.dw = detail::seq_out_arg(p.grads.dw);
  E.dbeta = detail::seq_out_arg(p.grads.dbeta);
  E.dlam_tok = reinterpret_cast<float*>(ws + L.dlam);
  E.dr_tok = reinterpret_cast<float*>(ws + L.dr);
  E.nvblk = L.nvblk;

  s = detail::launch_rec_forward(fn, A, L.nw, stream);  // checkpoints only: o, ht absent
  if (s.ok()) {
    switch (pr.K) {
      case 16: s = detail::launch_backward_k<16>(fn, A, E, L, stream); break;
      case 32: s = detail::launch_backward_k<32>(fn, A, E, L, stream); break;
      case 64: s = detail::launch_backward_k<64>(fn, A, E, L, stream); break;
      case 128: s = detail::launch_backward_k<128>(fn, A, E, L, stream); break;
      default: s = detail::launch_backward_k<256>(fn, A, E, L, stream); break;
    }
  }
  const int64_t BT = pr.B * pr.T;
  if (s.ok() && p.grads.dlambda) {
    if (BT > 0) {
      detail::head_reduce<<<static_cast<unsigned>(pr.H), 256, 0, stream>>>(E.dlam_tok, BT, pr.H,
                                                                          1, p.grads.dlambda);
    } else {
      cudaMemsetAsync(p.grads.dlambda, 0, sizeof(float) * pr.H, stream);
    }
    s = detail::cuda_status(fn, "dlambda reduction", cudaGetLastError());
  }
  if (s.ok() && p.grads.dr) {
    if (BT > 0) {
      detail::head_reduce<<<static_cast<unsigned>(pr.H), 256, 0, stream>>>(
          E.dr_tok, BT, pr.H, static_cast<int>(pr.K), p.grads.dr);
    } else {
      cudaMemsetAsync(p.grads.dr, 0, sizeof(float) * pr.H * pr.K, stream);
    }
    s = detail::cuda_status(fn, "dr reduction", cudaGetLastError());
  }
  if (own && ws) {
    Status f = detail::cuda_status(fn, "cudaFreeAsync (workspace)", cudaFreeAsync(ws, stream));
    if (s.ok()) s = f;
  }
  return s;
}

}  // namespace qed::kernels
