// Reverse sweep of the chunked backward (MATH.md §6.1): one block per (sequence, head, tile of
// 16*MT value columns) walks the chunks from the last to the first, carrying the transposed state
// adjoint Ŝᵀ in fp32 registers. With Ŝ' the adjoint of a chunk's end state and Ŝ that of its start,
//   Ūᵀ = Ŝ'ᵀ K̂ᵀ + Ōᵀ (s M),      Ŝᵀ = Ŝ'ᵀ Diag(γ_C) + Ūᵀ (−W_a) + Ōᵀ (s Q̃),
// the second from §6.1's Ŝ = s Q̃ᵀ Ō + Diag(γ) Ŝ' − Ãᵀ Ȳ with Ãᵀ Ȳ = Ãᵀ Lᵀ Ū = W_aᵀ Ū.
// Every chunk's Ŝ' (fp32 [chunk][H][K][V]) and Ū (fp32 [chunk][H][kC][V]) go to the workspace for
// the chunk-parallel gradient pass (chunked_bwd_grads.cu); Ŝ of the first chunk is dh0.
// It is the forward's state pass (chunked_state.cu) run backwards: the same warp shares and the
// same staging of Ŝᵀ and Ūᵀ as A operands through shared memory (two barriers per chunk), the
// backward's blob (BwdLayout: K̂ᵀ in W_aᵀ's place, -W_a and s Q̃ in K̂'s, s M for Mᵀ) and the chunk
// decay of the forward's blob, streamed by cp.async one phase ahead; Ōᵀ comes from a tile of do per
// chunk (ldmatrix.trans), loaded a whole chunk ahead into one of two buffers.
#include <cstdlib>

#include "kernels/chunked_common.cuh"
#include "kernels/chunked_stream.cuh"

namespace qed::kernels::chunked {
namespace {

constexpr int kSweepWarps = 4;

template <class InT, int K, int MT, int NT>
struct SweepSizes {
  using Sh = WarpShare<K, kSweepWarps>;
  static constexpr int NO = sizeof(InT) == 4 ? 3 : 1;  // split terms of Ō (bf16 do is exact)
  static constexpr int FB = 32 * NT * 8;               // bytes of one fragment slot row
  static constexpr int aKT = (K / 16) * Sh::RT * FB;
  static constexpr int aMN = 4 * Sh::RT * FB;
  static constexpr int bufA = aKT + aMN;
  static constexpr int bWN = 4 * Sh::NNW * FB;
  static constexpr int bGC = Sh::KW * 4;
  static constexpr int bufB = 2 * bWN + bGC;  // -W_a, s Q̃, γ
  static constexpr int sbuf = MT * (K / 16) * NT * 32 * 16;
  static constexpr int ubuf = MT * 4 * NT * 32 * 16;
  static constexpr int DP =
      16 * MT + 16 / static_cast<int>(sizeof(InT));  // do tile pitch: +16 bytes
  static constexpr int dtile = kC * DP * static_cast<int>(sizeof(InT));
  static constexpr int total = kSweepWarps * (bufA + bufB) + sbuf + ubuf + 2 * dtile;
};

template <class InT, int K, int MT, int NT, int NTQ>
__global__ void __launch_bounds__(kSweepWarps * 32) sweep_kernel(const Args A) {
  using Lw = WsLayout<K, NT, NTQ>;
  using Lb = BwdLayout<K, NT>;
  using Z = SweepSizes<InT, K, MT, NT>;
  using Sh = WarpShare<K, kSweepWarps>;
  constexpr int KW = Sh::KW, NKB = K / 16, NN = Sh::NNW, RT = Sh::RT, NO = Z::NO, FB = Z::FB,
                DP = Z::DP;
  constexpr int NTH = kSweepWarps * 32;
  extern __shared__ __align__(16) unsigned char sm[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int rb = Sh::rb(warp), nt0 = Sh::nt0(warp), qs = Sh::qs(warp), nq0 = Sh::nq0(warp);
  const int64_t seq = blockIdx.x, h = blockIdx.y;
  const int vt = blockIdx.z, v0 = vt * 16 * MT;
  const Span sp = seq_span(A, seq);
  const int64_t c0 = first_chunk(A, seq);
  int64_t nch = (sp.len + kC - 1) / kC;
  if (c0 + nch > A.chunk_bound) nch = A.chunk_bound - c0 > 0 ? A.chunk_bound - c0 : 0;

  char* bufA = reinterpret_cast<char*>(sm) + warp * Z::bufA;
  char* bufB = reinterpret_cast<char*>(sm) + kSweepWarps * Z::bufA + warp * Z::bufB;
  uint4* Sbuf = reinterpret_cast<uint4*>(sm + kSweepWarps * (Z::bufA + Z::bufB));
  uint4* Ubuf = reinterpret_cast<uint4*>(sm + kSweepWarps * (Z::bufA + Z::bufB) + Z::sbuf);
  InT* dtiles = reinterpret_cast<InT*>(sm + kSweepWarps * (Z::bufA + Z::bufB) + Z::sbuf + Z::ubuf);

  auto bblob = [&](int64_t ci) { return A.bws + ((c0 + ci) * A.H + h) * A.bblob; };
  // This warp's fragments: K̂ᵀ slots [rb][kb][nt0..], s M slots [rb][kb >= rb][nt0..] (phase A);
  // -W_a and s Q̃ slots [qs][kb][nq0..] and the decay of its channels (phase B).
  auto loadA = [&](int64_t ci) {
    const char* bb = bblob(ci);
    warp_copy_segs(bufA, bb + Lb::kKT + (rb * NKB * 2 + nt0) * FB, NKB, RT * FB, 2 * FB, lane);
    warp_copy_segs(bufA + Z::aKT, bb + Lb::kMN + ((rb * 4 + rb) * 2 + nt0) * FB, 4 - rb, RT * FB,
                   2 * FB, lane);
  };
  auto loadB = [&](int64_t ci) {
    const char* bb = bblob(ci);
    warp_copy_segs(bufB, bb + Lb::kWN + (qs * 4 * Sh::NQ4 + nq0) * FB, 4, NN * FB, Sh::NQ4 * FB,
                   lane);
    warp_copy_segs(bufB + Z::bWN, bb + Lb::kQN + (qs * 4 * Sh::NQ4 + nq0) * FB, 4, NN * FB,
                   Sh::NQ4 * FB, lane);
    warp_copy(bufB + 2 * Z::bWN, blob_ptr(A, c0 + ci, h) + Lw::kGC + warp * KW * 4, KW * 4, lane);
  };
  // The chunk's rows of do, columns v0.., into tile buffer `buf` (rows past the chunk: zeros).
  auto load_do = [&](int64_t ci, int buf) {
    InT* dt = dtiles + buf * kC * DP;
    const int64_t rem = sp.len - ci * kC;
    const int Cn = rem < kC ? static_cast<int>(rem) : kC;
    const int64_t t0 = sp.bos + ci * kC;
    constexpr int VE = 16 / static_cast<int>(sizeof(InT));
    constexpr int PR = 16 * MT / VE;  // 16-byte pieces per row
    const InT* dp = static_cast<const InT*>(A.dout.p);
    for (int i = tid; i < kC * PR; i += NTH) {
      const int r = i / PR, c = (i % PR) * VE;
      InT* dst = dt + r * DP + c;
      if (r >= Cn) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        continue;
      }
      const InT* src = dp + sp.brow * A.dout.sb + (t0 + r) * A.dout.st + h * A.dout.sh + v0 + c;
      if (A.vec_do) {
        cp16(dst, src);
      } else {
#pragma unroll
        for (int e = 0; e < VE; ++e) dst[e] = src[e];
      }
    }
  };
  // Ōᵀ as the A operand (m: value columns 16m.., k: chunk rows 16kb..) from a do tile.
  auto frag_o = [&](const InT* dt, int m, int kb, uint32_t* a) {
    if constexpr (NO == 1) {
      ldsm_x4_t(a, dt + (16 * kb + (lane & 7) + 8 * ((lane >> 4) & 1)) * DP + 16 * m +
                       8 * ((lane >> 3) & 1));
    } else {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const int v = 16 * m + g + 8 * (reg & 1), j = 16 * kb + 2 * t + 8 * (reg >> 1);
        uint32_t x[NO];
        split2<NO>(to_f(dt[j * DP + v]), to_f(dt[(j + 1) * DP + v]), x);
#pragma unroll
        for (int i = 0; i < NO; ++i) a[4 * i + reg] = x[i];
      }
    }
  };
  auto vcol = [&](int m, int e) { return v0 + 16 * m + g + 8 * (e >> 1); };
  auto kch = [&](int n, int e) { return warp * KW + 8 * n + 2 * t + (e & 1); };

  float accS[MT][NN][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        accS[m][n][e] =
            A.dht ? A.dht[seq * A.dht_sn + h * A.dht_sh + kch(n, e) * A.dht_sk + vcol(m, e)] : 0.f;
  auto writeS = [&]() { store_state_frags<MT, NN, NT, KW, NKB>(accS, Sbuf, warp, lane); };
  writeS();
  if (nch > 0) {
    loadA(nch - 1);
    load_do(nch - 1, static_cast<int>((nch - 1) & 1));
  }
  cp_commit();
  cp_wait<0>();
  __syncthreads();

  for (int64_t ci = nch - 1; ci >= 0; --ci) {
    const int64_t gc = c0 + ci;
    {  // Ŝ' of this chunk for the gradient pass
      float* ds = A.ds + (gc * A.H + h) * K * A.V;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) ds[kch(n, e) * A.V + vcol(m, e)] = accS[m][n][e];
    }
    const InT* dcur = dtiles + (ci & 1) * kC * DP;
    loadB(ci);
    if (ci > 0) load_do(ci - 1, static_cast<int>((ci - 1) & 1));
    cp_commit();
    cp_wait<1>();
    __syncwarp();

    // ---- phase A: Ūᵀ of this warp's chunk rows ----
    {
      float accU[MT][RT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < RT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) accU[m][nt][e] = 0.f;
#pragma unroll
      for (int kb = 0; kb < NKB; ++kb) {
        uint32_t aS[MT][NT * 4];
        load_a_tiles<MT, NT, NKB>(Sbuf, kb, lane, aS);
#pragma unroll
        for (int nt = 0; nt < RT; ++nt) {
          uint32_t bk[NT * 2];
          load_b<NT>(bufA + ((kb * RT + nt) * 32 + lane) * NT * 8, bk);
#pragma unroll
          for (int m = 0; m < MT; ++m) mma_split<NT, NT>(accU[m][nt], aS[m], bk);
        }
      }
      // s M is zero above its diagonal: rows kb >= rb of M meet this warp's columns.
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        if (kb < rb) continue;
        uint32_t aO[MT][NO * 4];
#pragma unroll
        for (int m = 0; m < MT; ++m) frag_o(dcur, m, kb, aO[m]);
#pragma unroll
        for (int nt = 0; nt < RT; ++nt) {
          uint32_t bm[NT * 2];
          load_b<NT>(bufA + Z::aKT + (((kb - rb) * RT + nt) * 32 + lane) * NT * 8, bm);
#pragma unroll
          for (int m = 0; m < MT; ++m) mma_split<NO, NT>(accU[m][nt], aO[m], bm);
        }
      }
      float* ub = A.ubar + (gc * A.H + h) * kC * A.V;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < RT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            ub[(16 * rb + 8 * (nt0 + nt) + 2 * t + (e & 1)) * A.V + vcol(m, e)] = accU[m][nt][e];
          uint32_t r0[NT], r1[NT];
          split2<NT>(accU[m][nt][0], accU[m][nt][1], r0);
          split2<NT>(accU[m][nt][2], accU[m][nt][3], r1);
#pragma unroll
          for (int i = 0; i < NT; ++i)
            reinterpret_cast<uint2*>(Ubuf)[(((m * 4 + rb) * NT + i) * 32 + lane) * 2 + nt0 + nt] =
                make_uint2(r0[i], r1[i]);
        }
    }
    __syncthreads();
    if (ci > 0) loadA(ci - 1);
    cp_commit();
    cp_wait<1>();
    __syncwarp();

    // ---- phase B: Ŝᵀ of this warp's channels ----
    {
      const float* gcs = reinterpret_cast<const float*>(bufB + 2 * Z::bWN);
#pragma unroll
      for (int n = 0; n < NN; ++n) {
        const float ga = gcs[8 * n + 2 * t], gb = gcs[8 * n + 2 * t + 1];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          accS[m][n][0] *= ga;
          accS[m][n][1] *= gb;
          accS[m][n][2] *= ga;
          accS[m][n][3] *= gb;
        }
      }
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t aU[MT][NT * 4], aO[MT][NO * 4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
          for (int i = 0; i < NT; ++i) {
            const uint4 x = Ubuf[((m * 4 + kb) * NT + i) * 32 + lane];
            aU[m][4 * i] = x.x;
            aU[m][4 * i + 1] = x.y;
            aU[m][4 * i + 2] = x.z;
            aU[m][4 * i + 3] = x.w;
          }
          frag_o(dcur, m, kb, aO[m]);
        }
#pragma unroll
        for (int n = 0; n < NN; ++n) {
          uint32_t bw[NT * 2], bq[NT * 2];
          load_b<NT>(bufB + ((kb * NN + n) * 32 + lane) * NT * 8, bw);
          load_b<NT>(bufB + Z::bWN + ((kb * NN + n) * 32 + lane) * NT * 8, bq);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_split<NT, NT>(accS[m][n], aU[m], bw);
            mma_split<NO, NT>(accS[m][n], aO[m], bq);
          }
        }
      }
      writeS();
    }
    __syncthreads();
  }
  cp_wait<0>();
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        A.dh0[seq * A.dh0_sn + h * A.dh0_sh + kch(n, e) * A.dh0_sk + vcol(m, e)] = accS[m][n][e];
}

template <class InT, int K, int MT, int NT, int NTQ>
cudaError_t launch_sweep_t(const Args& A, cudaStream_t st) {
  using Z = SweepSizes<InT, K, MT, NT>;
  static_assert(Z::total <= 227 * 1024, "sweep_kernel: shared memory over the per-block limit");
  auto kern = sweep_kernel<InT, K, MT, NT, NTQ>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Z::total);
  if (e != cudaSuccess) return e;
  const int64_t vt = A.V / (16 * MT);
  if (A.N == 0 || A.H == 0) return cudaSuccess;
  kern<<<dim3(static_cast<unsigned>(A.N), static_cast<unsigned>(A.H), static_cast<unsigned>(vt)),
         kSweepWarps * 32, Z::total, st>>>(A);
  return cudaGetLastError();
}

template <class InT, int K, int NT, int NTQ>
cudaError_t launch_sweep_k(const Args& A, int MT, cudaStream_t st) {
  if constexpr (sizeof(InT) == 2) {
    if (MT == 4) return launch_sweep_t<InT, K, 4, NT, NTQ>(A, st);
    if (MT == 2) return launch_sweep_t<InT, K, 2, NT, NTQ>(A, st);
  }
  if (MT == 1) return launch_sweep_t<InT, K, 1, NT, NTQ>(A, st);
  return cudaErrorInvalidValue;
}

}  // namespace

// bf16 inputs: value tiles of 16, 32 or 64 columns; fp32 inputs (three-term fragments): 16.
cudaError_t launch_sweep(const Args& A, Mode m, int MT, cudaStream_t st) {
  switch (m) {
    case Mode::bf16:
      return A.K == 64 ? launch_sweep_k<__nv_bfloat16, 64, 2, 1>(A, MT, st)
                       : launch_sweep_k<__nv_bfloat16, 128, 2, 1>(A, MT, st);
    case Mode::fp32:
      return A.K == 64 ? launch_sweep_k<float, 64, 3, 3>(A, MT, st)
                       : launch_sweep_k<float, 128, 3, 3>(A, MT, st);
    case Mode::bf16_single:
      return A.K == 64 ? launch_sweep_k<__nv_bfloat16, 64, 1, 1>(A, MT, st)
                       : launch_sweep_k<__nv_bfloat16, 128, 1, 1>(A, MT, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace qed::kernels::chunked
