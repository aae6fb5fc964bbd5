// Sequential pass of the chunked forward (MATH.md (4.3)-(4.5)): one block per (sequence, head,
// tile of 16*MT value columns) walks the chunks in order, carrying Sᵀ in fp32 registers:
//   Uᵀ = W_zᵀ - Sᵀ W_aᵀ,  Oᵀ = s (Sᵀ Q̃ᵀ + Uᵀ Mᵀ),  S'ᵀ = Sᵀ Diag(γ_C) + Uᵀ K̂.
// Warp w owns chunk rows 16w.. for U and O, and key channels wK/4.. of the state; the split-bf16
// copies of Sᵀ and Uᵀ pass between warps through shared memory (two barriers per chunk). The
// workspace fragments stream in with cp.async, one phase ahead of their use.
#include "kernels/chunked_common.cuh"

namespace qed::kernels::chunked {
namespace {

template <int K, int MT, int NT, int NTQ>
struct StateSizes {
  static constexpr int aWA = (K / 16) * 2 * 32 * NT * 8;
  static constexpr int aQT = (K / 16) * 2 * 32 * NTQ * 8;
  static constexpr int aWZ = MT * 2 * 32 * 16;
  static constexpr int bufA = aWA + aQT + aWZ;
  static constexpr int bKH = 4 * (K / 32) * 32 * NT * 8;
  static constexpr int bMM = 4 * 2 * 32 * NTQ * 8;
  static constexpr int bGC = K;  // K/4 floats
  static constexpr int bufB = bKH + bMM + bGC;
  static constexpr int sbuf = MT * (K / 16) * NT * 32 * 16;
  static constexpr int ubuf = MT * 4 * NT * 32 * 16;
  static constexpr int total = 4 * bufA + 4 * bufB + sbuf + ubuf;
};

__device__ __forceinline__ void store_out(const Args& A, int64_t idx, float x) {
  if (A.o_dt == 0)
    static_cast<float*>(A.o)[idx] = x;
  else
    static_cast<__nv_bfloat16*>(A.o)[idx] = __float2bfloat16_rn(x);
}

template <int NT>
__device__ __forceinline__ void load_b(const char* p, uint32_t* b) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const uint2 x = reinterpret_cast<const uint2*>(p)[i];
    b[2 * i] = x.x;
    b[2 * i + 1] = x.y;
  }
}

template <int K, int MT, int NT, int NTQ>
__global__ void __launch_bounds__(kThreads) state_kernel(const Args A) {
  using Lw = WsLayout<K, NT, NTQ>;
  using Z = StateSizes<K, MT, NT, NTQ>;
  constexpr int KW = K / 4, NKB = K / 16, NN = KW / 8;
  extern __shared__ __align__(16) unsigned char sm[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t seq = blockIdx.x, h = blockIdx.y;
  const int vt = blockIdx.z, v0 = vt * 16 * MT;
  const Span sp = seq_span(A, seq);
  const int64_t c0 = first_chunk(A, seq);
  int64_t nch = (sp.len + kC - 1) / kC;
  if (c0 + nch > A.chunk_bound) nch = A.chunk_bound - c0 > 0 ? A.chunk_bound - c0 : 0;

  char* bufA = reinterpret_cast<char*>(sm) + warp * Z::bufA;
  char* bufB = reinterpret_cast<char*>(sm) + 4 * Z::bufA + warp * Z::bufB;
  uint4* Sbuf = reinterpret_cast<uint4*>(sm + 4 * Z::bufA + 4 * Z::bufB);
  uint4* Ubuf = reinterpret_cast<uint4*>(sm + 4 * Z::bufA + 4 * Z::bufB + Z::sbuf);

  auto loadA = [&](int64_t ci) {
    const char* bl = blob_ptr(A, c0 + ci, h);
    warp_copy(bufA, bl + Lw::kWA + warp * Z::aWA, Z::aWA, lane);
    warp_copy(bufA + Z::aWA, bl + Lw::kQT + warp * Z::aQT, Z::aQT, lane);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int vb = vt * MT + m;
      warp_copy(bufA + Z::aWA + Z::aQT + m * 1024, bl + Lw::kWZ + (vb * 4 + warp) * 1024, 1024,
                lane);
    }
  };
  auto loadB = [&](int64_t ci) {
    const char* bl = blob_ptr(A, c0 + ci, h);
    warp_copy(bufB, bl + Lw::kKH + warp * Z::bKH, Z::bKH, lane);
    warp_copy(bufB + Z::bKH, bl + Lw::kMM + warp * Z::bMM, (warp + 1) * 2 * 32 * NTQ * 8, lane);
    warp_copy(bufB + Z::bKH + Z::bMM, bl + Lw::kGC + warp * KW * 4, KW * 4, lane);
  };
  // Element (e) of state tile (m, n): value column v, key channel ch.
  auto vcol = [&](int m, int e) { return v0 + 16 * m + g + 8 * (e >> 1); };
  auto kch = [&](int n, int e) { return warp * KW + 8 * n + 2 * t + (e & 1); };

  float accS[MT][NN][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        accS[m][n][e] = A.h0 ? A.h0[seq * A.h0_sn + h * A.h0_sh + kch(n, e) * A.h0_sk + vcol(m, e)]
                             : 0.f;
  auto writeS = [&]() {
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
  };
  writeS();
  if (nch > 0) loadA(0);
  cp_commit();
  __syncthreads();

  for (int64_t ci = 0; ci < nch; ++ci) {
    if (A.cs) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            A.cs[(c0 + ci) * A.cs_sn + h * A.cs_sh + kch(n, e) * A.cs_sk + vcol(m, e)] =
                accS[m][n][e];
    }
    const int64_t rem = sp.len - ci * kC;
    const int Cn = rem < kC ? static_cast<int>(rem) : kC;
    loadB(ci);
    cp_commit();
    cp_wait<1>();
    __syncwarp();

    // ---- phase A: Uᵀ and Sᵀ Q̃ᵀ for chunk rows 16w..16w+15 ----
    // Two accumulator sets (even and odd key blocks) halve the dependent mma chains when the
    // registers allow it.
    constexpr int NC = MT <= 2 ? 2 : 1;
    float accU[NC][MT][2][4], accP[NC][MT][2][4];
    float (&aU0)[MT][2][4] = accU[0];
    float (&aP0)[MT][2][4] = accP[0];
    {
      const float4* wz = reinterpret_cast<const float4*>(bufA + Z::aWA + Z::aQT);
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const float4 z = wz[(m * 2 + nt) * 32 + lane];
          aU0[m][nt][0] = z.x;
          aU0[m][nt][1] = z.y;
          aU0[m][nt][2] = z.z;
          aU0[m][nt][3] = z.w;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            aP0[m][nt][e] = 0.f;
#pragma unroll
            for (int c = 1; c < NC; ++c) accU[c][m][nt][e] = accP[c][m][nt][e] = 0.f;
          }
        }
#pragma unroll
      for (int kb = 0; kb < NKB; ++kb) {
        uint32_t aS[MT][NT * 4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int i = 0; i < NT; ++i) {
            const uint4 x = Sbuf[((m * NKB + kb) * NT + i) * 32 + lane];
            aS[m][4 * i] = x.x;
            aS[m][4 * i + 1] = x.y;
            aS[m][4 * i + 2] = x.z;
            aS[m][4 * i + 3] = x.w;
          }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int slot = (kb * 2 + nt) * 32 + lane;
          uint32_t bw[NT * 2], bq[NTQ * 2];
          load_b<NT>(bufA + slot * NT * 8, bw);
          load_b<NTQ>(bufA + Z::aWA + slot * NTQ * 8, bq);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_split<NT, NT>(accU[kb % NC][m][nt], aS[m], bw);
            mma_split<NT, NTQ>(accP[kb % NC][m][nt], aS[m], bq);
          }
        }
      }
#pragma unroll
      for (int c = 1; c < NC; ++c)
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              aU0[m][nt][e] += accU[c][m][nt][e];
              aP0[m][nt][e] += accP[c][m][nt][e];
            }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        uint32_t r0[NT], r1[NT], r2[NT], r3[NT];
        split2<NT>(aU0[m][0][0], aU0[m][0][1], r0);
        split2<NT>(aU0[m][0][2], aU0[m][0][3], r1);
        split2<NT>(aU0[m][1][0], aU0[m][1][1], r2);
        split2<NT>(aU0[m][1][2], aU0[m][1][3], r3);
#pragma unroll
        for (int i = 0; i < NT; ++i)
          Ubuf[((m * 4 + warp) * NT + i) * 32 + lane] = make_uint4(r0[i], r1[i], r2[i], r3[i]);
      }
    }
    __syncthreads();
    if (ci + 1 < nch) loadA(ci + 1);
    cp_commit();
    cp_wait<1>();
    __syncwarp();

    // ---- phase B: state update of channels wK/4.., and the read-out of rows 16w.. ----
    {
      const float* gcs = reinterpret_cast<const float*>(bufB + Z::bKH + Z::bMM);
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
        uint32_t aU[MT][NT * 4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int i = 0; i < NT; ++i) {
            const uint4 x = Ubuf[((m * 4 + kb) * NT + i) * 32 + lane];
            aU[m][4 * i] = x.x;
            aU[m][4 * i + 1] = x.y;
            aU[m][4 * i + 2] = x.z;
            aU[m][4 * i + 3] = x.w;
          }
#pragma unroll
        for (int n = 0; n < NN; ++n) {
          uint32_t bk[NT * 2];
          load_b<NT>(bufB + ((kb * NN + n) * 32 + lane) * NT * 8, bk);
#pragma unroll
          for (int m = 0; m < MT; ++m) mma_split<NT, NT>(accS[m][n], aU[m], bk);
        }
        if (kb <= warp) {
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t bm[NTQ * 2];
            load_b<NTQ>(bufB + Z::bKH + ((kb * 2 + nt) * 32 + lane) * NTQ * 8, bm);
#pragma unroll
            for (int m = 0; m < MT; ++m) mma_split<NT, NTQ>(aP0[m][nt], aU[m], bm);
          }
        }
      }
      const int64_t tok0 = sp.bos + ci * kC;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = 16 * warp + 8 * nt + 2 * t + (e & 1);
            if (row < Cn)
              store_out(A, sp.brow * A.o_sb + (tok0 + row) * A.o_st + h * A.o_sh + vcol(m, e),
                        A.scale * aP0[m][nt][e]);
          }
      writeS();
    }
    __syncthreads();
  }
  cp_wait<0>();
  if (A.ht) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          A.ht[seq * A.ht_sn + h * A.ht_sh + kch(n, e) * A.ht_sk + vcol(m, e)] = accS[m][n][e];
  }
}

template <int K, int MT, int NT, int NTQ>
cudaError_t launch_state_t(const Args& A, cudaStream_t st) {
  using Z = StateSizes<K, MT, NT, NTQ>;
  auto kern = state_kernel<K, MT, NT, NTQ>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, Z::total);
  if (e != cudaSuccess) return e;
  const int64_t vt = A.V / (16 * MT);
  if (A.N == 0 || A.H == 0) return cudaSuccess;
  kern<<<dim3(static_cast<unsigned>(A.N), static_cast<unsigned>(A.H), static_cast<unsigned>(vt)),
         kThreads, Z::total, st>>>(A);
  return cudaGetLastError();
}

template <int K, int NT, int NTQ>
cudaError_t launch_state_k(const Args& A, int MT, cudaStream_t st) {
  if (MT == 4 && NT < 3) return launch_state_t<K, 4, NT, NTQ>(A, st);
  if (MT == 2) return launch_state_t<K, 2, NT, NTQ>(A, st);
  if (MT == 1) return launch_state_t<K, 1, NT, NTQ>(A, st);
  return cudaErrorInvalidValue;
}

template <int K>
cudaError_t launch_state_m(const Args& A, Mode m, int MT, cudaStream_t st) {
  switch (m) {
    case Mode::bf16: return launch_state_k<K, 2, 1>(A, MT, st);
    case Mode::fp32: return launch_state_k<K, 3, 3>(A, MT, st);
    case Mode::bf16_single: return launch_state_k<K, 1, 1>(A, MT, st);
  }
  return cudaErrorInvalidValue;
}

template <int K>
int state_smem_k(int MT, Mode m) {
  switch (m) {
    case Mode::bf16:
      return MT == 4 ? StateSizes<K, 4, 2, 1>::total
                     : (MT == 2 ? StateSizes<K, 2, 2, 1>::total : StateSizes<K, 1, 2, 1>::total);
    case Mode::fp32:
      return MT == 4 ? StateSizes<K, 4, 3, 3>::total
                     : (MT == 2 ? StateSizes<K, 2, 3, 3>::total : StateSizes<K, 1, 3, 3>::total);
    case Mode::bf16_single:
      return MT == 4 ? StateSizes<K, 4, 1, 1>::total
                     : (MT == 2 ? StateSizes<K, 2, 1, 1>::total : StateSizes<K, 1, 1, 1>::total);
  }
  return 0;
}

}  // namespace

int state_smem_bytes(int K, int MT, Mode m) {
  return K == 64 ? state_smem_k<64>(MT, m) : state_smem_k<128>(MT, m);
}

int64_t blob_bytes(int K, int64_t V, Mode m) {
  switch (m) {
    case Mode::bf16:
      return K == 64 ? WsLayout<64, 2, 1>::blob_bytes(V) : WsLayout<128, 2, 1>::blob_bytes(V);
    case Mode::fp32:
      return K == 64 ? WsLayout<64, 3, 3>::blob_bytes(V) : WsLayout<128, 3, 3>::blob_bytes(V);
    case Mode::bf16_single:
      return K == 64 ? WsLayout<64, 1, 1>::blob_bytes(V) : WsLayout<128, 1, 1>::blob_bytes(V);
  }
  return 0;
}

cudaError_t launch_state(const Args& A, Mode m, int MT, cudaStream_t st) {
  return A.K == 64 ? launch_state_m<64>(A, m, MT, st) : launch_state_m<128>(A, m, MT, st);
}

}  // namespace qed::kernels::chunked
