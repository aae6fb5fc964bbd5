// Decode step for large batches, laid out for memory bandwidth (issue 5: a decode step is a pass
// over the state pool, 1 GiB at B = 512, H = 16, K = V = 128, so its speed is DRAM's).
//
// The tile kernel (recurrent_forward.cu) gives each warp a 16-column slice of all K rows: every
// state load of a warp touches 8 rows x 64 bytes, and every warp reloads the head's q, k, g, b.
// ncu found it bound by L1/TEX traffic (88%) with DRAM at 62%. Here a warp's load is one
// contiguous stretch of a state row (32 lanes x CPL floats: 256 or 512 bytes), a block holds all
// K rows of BV = 32 * CPL columns, its warps split the rows, and one warp prepares the head's
// vectors once for the whole block while the others' state loads are in flight. The two sums
// over rows (u = (D S)^T a and o = S^T q) are per-thread partials over its rows, then a sum over
// warps through shared memory in a fixed order: deterministic, but in a different order from the
// sequence kernel, so this step equals the forward's to rounding, not bitwise (the tile kernel,
// QED_REC_DECODE_KERNEL=tile, is the bitwise one).
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "kernels/api.hpp"
#include "kernels/recurrent_common.cuh"
#include "kernels/recurrent_launch.cuh"

namespace qed::kernels::detail {
namespace {

template <int CPL>
struct Cols;
template <>
struct Cols<2> {
  using vec = float2;
  __device__ static vec load(const float* p) { return __ldcs(reinterpret_cast<const float2*>(p)); }
  __device__ static void store(float* p, const float (&x)[2]) {
    __stcs(reinterpret_cast<float2*>(p), make_float2(x[0], x[1]));
  }
  __device__ static void unpack(const vec& v, float (&x)[2]) { x[0] = v.x, x[1] = v.y; }
};
template <>
struct Cols<4> {
  using vec = float4;
  __device__ static vec load(const float* p) { return __ldcs(reinterpret_cast<const float4*>(p)); }
  __device__ static void store(float* p, const float (&x)[4]) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
  }
  __device__ static void unpack(const vec& v, float (&x)[4]) { x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w; }
};

// Column c's sum over the NW warps' partials, in warp order (the same order in every thread).
template <int NW, int BV>
__device__ __forceinline__ float sum_over_warps(const float (&part)[NW][BV], int c) {
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < NW; ++w) s += part[w][c];
  return s;
}

// K rows, NW warps (warp w owns rows w, w + NW, ...), CPL columns per lane.
template <int K, int NW, int CPL>
__global__ void __launch_bounds__(NW * 32) rec_decode_rows_kernel(RecArgs A) {
  constexpr int RPT = K / NW;     // rows per thread
  constexpr int BV = 32 * CPL;    // columns per block
  using C = Cols<CPL>;
  __shared__ __align__(16) float vec[4 * K];       // alpha | a | scale q | k
  __shared__ __align__(16) float red_u[NW][BV];    // per-warp partial sums of u
  __shared__ __align__(16) float red_o[NW][BV];    // per-warp partial sums of o
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t nz = A.V / BV;
  const int64_t vz = blockIdx.x % nz, h = blockIdx.x / nz % A.H, n = blockIdx.x / nz / A.H;
  int64_t slot = n;
  if (A.slots) {
    slot = A.slots[n];
    if (slot < 0 || slot >= A.nslots) return;  // padding entry: the whole block leaves
  }
  const int64_t j0 = vz * BV + lane * CPL;

  // 1. The state rows, all loads in flight at once (streaming: read once, written once).
  float S[RPT][CPL];
  {
    const bool ld = A.h0.p != nullptr;
    typename C::vec raw[RPT];
    const float* base = A.h0.p + (ld ? slot * A.h0.sn + h * A.h0.sh + j0 : 0);
#pragma unroll
    for (int i = 0; i < RPT; ++i)
      if (ld) raw[i] = C::load(base + (warp + NW * i) * A.h0.sk);
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      if (ld) C::unpack(raw[i], S[i]);
      else
#pragma unroll
        for (int e = 0; e < CPL; ++e) S[i][e] = 0.f;
    }
  }
  // 2. This thread's z = w v (or beta v) for its columns; warp 0 prepares the head's vectors.
  float z[CPL];
  {
    const bool has_bw = A.variant == kGdn2 || A.variant == kQed;
    const int64_t ov = seq_off(A.v, n, 0, h), ow = seq_off(A.w, n, 0, h);
    const float bs = has_bw ? 0.f : ldf(A.beta.p, seq_off(A.beta, n, 0, h), A.beta.dt);
#pragma unroll
    for (int e = 0; e < CPL; ++e) {
      const float wv = has_bw ? ldf(A.w.p, ow + j0 + e, A.w.dt) : bs;
      z[e] = wv * ldf(A.v.p, ov + j0 + e, A.v.dt);
    }
  }
  if (warp == 0) {
    RawStep<K> raw;
    load_raw<K>(A, n, 0, h, true, 0, 0, raw);
    prepare_step<K>(A, h, raw, 0, 0, vec, nullptr);
  }
  __syncthreads();

  // 3. D S and this thread's partial of u = (D S)^T a.
  float part[CPL];
#pragma unroll
  for (int e = 0; e < CPL; ++e) part[e] = 0.f;
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int row = warp + NW * i;
    const float al = vec[row], aa = vec[K + row];
#pragma unroll
    for (int e = 0; e < CPL; ++e) {
      S[i][e] *= al;
      part[e] = fmaf(aa, S[i][e], part[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < CPL; ++e) red_u[warp][lane * CPL + e] = part[e];
  __syncthreads();
  float u[CPL];
#pragma unroll
  for (int e = 0; e < CPL; ++e) u[e] = z[e] - sum_over_warps(red_u, lane * CPL + e);

  // 4. S <- D S + k u^T, written back at once; this thread's partial of o = S^T (scale q).
  float* out = A.ht.p + slot * A.ht.sn + h * A.ht.sh + j0;
#pragma unroll
  for (int e = 0; e < CPL; ++e) part[e] = 0.f;
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int row = warp + NW * i;
    const float qq = vec[2 * K + row], kk = vec[3 * K + row];
#pragma unroll
    for (int e = 0; e < CPL; ++e) {
      S[i][e] = fmaf(kk, u[e], S[i][e]);
      part[e] = fmaf(qq, S[i][e], part[e]);
    }
    if (A.ht.p) C::store(out + row * A.ht.sk, S[i]);
  }
#pragma unroll
  for (int e = 0; e < CPL; ++e) red_o[warp][lane * CPL + e] = part[e];
  __syncthreads();
  if (warp == 0 && A.o.p) {
    const int64_t oo = seq_off(A.o, n, 0, h);
#pragma unroll
    for (int e = 0; e < CPL; ++e) stf(A.o.p, oo + j0 + e, A.o.dt, sum_over_warps(red_o, lane * CPL + e));
  }
}

// The launch shape: (warps per block, columns per lane). Tuning override for the side-by-side
// table of bench/bench_recurrent.py: QED_REC_DECODE_ROWS=NWxCPL, one of 4x2, 8x2, 16x2, 8x4.
struct RowsShape {
  int nw = 8, cpl = 2;
};

RowsShape rows_shape() {
  RowsShape s;
  if (const char* e = std::getenv("QED_REC_DECODE_ROWS")) {
    const std::string v(e);
    if (v == "4x2") s = {4, 2};
    else if (v == "8x2") s = {8, 2};
    else if (v == "16x2") s = {16, 2};
    else if (v == "8x4") s = {8, 4};
  }
  return s;
}

template <int K, int NW, int CPL>
Status launch_rows(const char* fn, const RecArgs& A, cudaStream_t stream) {
  const int64_t blocks = A.N * A.H * (A.V / (32 * CPL));
  if (blocks > (int64_t{1} << 31) - 1)
    return {StatusCode::unsupported, std::string(fn) + ": N * H * value blocks exceeds 2^31 - 1"};
  rec_decode_rows_kernel<K, NW, CPL><<<static_cast<unsigned>(blocks), NW * 32, 0, stream>>>(A);
  return cuda_status(fn, "decode kernel launch", cudaGetLastError());
}

template <int K>
Status launch_rows_k(const char* fn, const RecArgs& A, RowsShape s, cudaStream_t stream) {
  if (s.cpl == 4 && A.V % 128 != 0) s.cpl = 2;
  if (s.cpl == 2) {
    if (s.nw == 4) return launch_rows<K, 4, 2>(fn, A, stream);
    if (s.nw == 16) return launch_rows<K, 16, 2>(fn, A, stream);
    return launch_rows<K, 8, 2>(fn, A, stream);
  }
  return launch_rows<K, 8, 4>(fn, A, stream);
}

}  // namespace

bool decode_rows_eligible(const RecArgs& A) {
  if (A.cu || A.T != 1 || A.V % 64 != 0) return false;
  if (A.K != 64 && A.K != 128 && A.K != 256) return false;
  // Vector access of the state: 16-byte aligned rows serve both two and four columns per lane.
  auto aligned = [](const void* p, int64_t sn, int64_t sh, int64_t sk) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && sn % 4 == 0 && sh % 4 == 0 && sk % 4 == 0;
  };
  if (A.h0.p && !aligned(A.h0.p, A.h0.sn, A.h0.sh, A.h0.sk)) return false;
  if (A.ht.p && !aligned(A.ht.p, A.ht.sn, A.ht.sh, A.ht.sk)) return false;
  return true;
}

Status launch_rec_decode_rows(const char* fn, const RecArgs& A, cudaStream_t stream) {
  if (A.N == 0) return {};
  const RowsShape s = rows_shape();
  switch (A.K) {
    case 64: return launch_rows_k<64>(fn, A, s, stream);
    case 128: return launch_rows_k<128>(fn, A, s, stream);
    case 256: return launch_rows<256, 16, 2>(fn, A, stream);  // 16 rows per thread, as at K = 128
  }
  return {StatusCode::unsupported, std::string(fn) + ": K not built for the row decode kernel"};
}

}  // namespace qed::kernels::detail
