// Decode step for large batches, laid out for memory bandwidth (issue 5: a decode step is a pass
// over the state pool, 1 GiB at B = 512, H = 16, K = V = 128, so its speed is DRAM's).
//
// The tile kernel (recurrent_forward.cu) gives each warp a 16-column slice of all K rows: every
// state load of a warp touches 8 rows x 64 bytes, and every warp reloads the head's q, k, g, b.
// ncu found it bound by L1/TEX traffic (88%) with DRAM at 62%. Here a warp's load is one
// contiguous stretch of a state row (32 lanes x CPL floats: 256 or 512 bytes), a block holds all
// K rows of BV = 32 * CPL columns, its warps split the rows, and one warp prepares the head's
// vectors once for the whole block while the others' state loads are in flight. Both sums over
// rows come from one pass, u = (D S)^T a and p = (D S)^T (scale q), with o = p + (q^T k) u
// (= S_new^T (scale q)): per-thread partials over its rows, then one sum over warps through
// shared memory in a fixed order. Deterministic, but in a different order from the sequence
// kernel, so this step equals the forward's to rounding, not bitwise (the tile kernel,
// QED_REC_DECODE_KERNEL=tile, is the bitwise one).
//
// Kernels here: "rows" (one block per tile), and the persistent walk over tiles (stream_walk) with
// three ways of filling its shared-memory stages: cp.async ("stream"), one bulk tensor copy per
// tile ("tma", "tmae" refilling a stage early) and bulk copies both ways ("tmas", the default for
// large batches: 3.75 TB/s at B = 512 on the H200, reports/device/recurrent.md run F).
#include <cuda.h>  // CUtensorMap and its enums (types only: nothing links the driver library)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <string>

#include "kernels/api.hpp"
#include "kernels/chunked_common.cuh"  // cp16, cp_commit, cp_wait
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

// This thread's raw v and w (or beta) for its CPL columns from j0; z = w v is their product.
template <int CPL>
__device__ __forceinline__ void load_vw(const RecArgs& A, int64_t n, int64_t h, int64_t j0, float (&vr)[CPL],
                                        float (&wr)[CPL]) {
  const bool has_bw = A.variant == kGdn2 || A.variant == kQed;
  const int64_t ov = seq_off(A.v, n, 0, h), ow = seq_off(A.w, n, 0, h);
  const float bs = has_bw ? 0.f : ldf(A.beta.p, seq_off(A.beta, n, 0, h), A.beta.dt);
#pragma unroll
  for (int e = 0; e < CPL; ++e) {
    wr[e] = has_bw ? ldf(A.w.p, ow + j0 + e, A.w.dt) : bs;
    vr[e] = ldf(A.v.p, ov + j0 + e, A.v.dt);
  }
}

// Warp 0: the head's vectors alpha | a | scale q | k into vec and (scale q)^T k into *qk, summed
// in a fixed order.
template <int K>
__device__ __forceinline__ void prepare_decode(const RecArgs& A, int64_t h, const RawStep<K>& raw, float* vec,
                                               float* qk) {
  prepare_step<K>(A, h, raw, 0, 0, vec, nullptr);
  const int lane = threadIdx.x & 31;
  float s = 0.f;
  for (int c = lane; c < K; c += 32) s = fmaf(vec[2 * K + c], vec[3 * K + c], s);  // this lane's own writes
  s = warp_sum(s);
  if (lane == 0) *qk = s;
}

// One tile's step, the same in both row kernels. This thread holds rows warp + NW i of the state
// (CPL columns from j0) in S. One pass gives the partials of both sums over rows, u = (D S)^T a
// and p = (D S)^T (scale q); one barrier; then S <- D S + k u^T is stored, and
// o = p + ((scale q)^T k) u, which equals S_new^T (scale q) without a second pass and barrier.
// Sums over warps in warp order: deterministic. The caller's next write to red_u / red_o must
// come after a barrier that follows this call.
// Row i of this thread: rows warp + NW i (interleaved), or warp K/NW + i (CONTIG: a warp's rows
// form one box, which the bulk-store kernel writes back with one copy per warp).
template <int K, int NW, bool CONTIG>
__device__ __forceinline__ int tile_row(int warp, int i) {
  return CONTIG ? warp * (K / NW) + i : warp + NW * i;
}

// The state rows go out through `sink(row, S[i])`; the default one stores them to the pool.
// `on_barrier()` runs right after the step's block barrier, when every thread has its rows in
// registers (the early-refill loader issues the next copy into the stage there).
template <int K, int NW, int CPL, bool CONTIG = false, class Sink, class OnBarrier>
__device__ __forceinline__ void decode_tile_step(const RecArgs& A, float (&S)[K / NW][CPL], const float* vec,
                                                 const float* qk, const float (&z)[CPL],
                                                 float (&red_u)[NW][32 * CPL], float (&red_o)[NW][32 * CPL],
                                                 int64_t n, int64_t h, int64_t j0, Sink&& sink, OnBarrier&& on_barrier) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float pa[CPL], pq[CPL];
#pragma unroll
  for (int e = 0; e < CPL; ++e) pa[e] = pq[e] = 0.f;
#pragma unroll
  for (int i = 0; i < K / NW; ++i) {
    const int row = tile_row<K, NW, CONTIG>(warp, i);
    const float al = vec[row], aa = vec[K + row], qq = vec[2 * K + row];
#pragma unroll
    for (int e = 0; e < CPL; ++e) {
      S[i][e] *= al;
      pa[e] = fmaf(aa, S[i][e], pa[e]);
      pq[e] = fmaf(qq, S[i][e], pq[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < CPL; ++e) {
    red_u[warp][lane * CPL + e] = pa[e];
    red_o[warp][lane * CPL + e] = pq[e];
  }
  __syncthreads();
  on_barrier();
  float u[CPL];
#pragma unroll
  for (int e = 0; e < CPL; ++e) u[e] = z[e] - sum_over_warps(red_u, lane * CPL + e);
  if (A.ht.p) {
#pragma unroll
    for (int i = 0; i < K / NW; ++i) {
      const int row = tile_row<K, NW, CONTIG>(warp, i);
      const float kk = vec[3 * K + row];
#pragma unroll
      for (int e = 0; e < CPL; ++e) S[i][e] = fmaf(kk, u[e], S[i][e]);
      sink(row, S[i]);
    }
  }
  if (warp == 0 && A.o.p) {
    const int64_t oo = seq_off(A.o, n, 0, h);
    const float c = *qk;
#pragma unroll
    for (int e = 0; e < CPL; ++e) stf(A.o.p, oo + j0 + e, A.o.dt, fmaf(c, u[e], sum_over_warps(red_o, lane * CPL + e)));
  }
}

// The default sink: row `row` of this thread's columns straight to the pool (streaming stores).
template <int CPL>
__device__ __forceinline__ auto pool_sink(const RecArgs& A, int64_t slot, int64_t h, int64_t j0) {
  float* out = A.ht.p + slot * A.ht.sn + h * A.ht.sh + j0;
  const int64_t sk = A.ht.sk;
  return [out, sk](int row, const float (&x)[CPL]) { Cols<CPL>::store(out + row * sk, x); };
}

// Tile t of the decode: (sequence n, head h, value block vz) and its state slot (-1: padding).
// 32-bit arithmetic (both launches keep tile numbers below 2^31): a persistent block decodes two
// tiles per step, and 64-bit divisions there cost as much as the step's arithmetic.
struct DecodeTile {
  int64_t n, h, vz, slot;
};
__device__ __forceinline__ DecodeTile decode_tile(const RecArgs& A, uint32_t t, uint32_t nz, uint32_t tiles) {
  DecodeTile d;
  if (t >= tiles) return {0, 0, 0, -1};  // past the end: nothing to read
  const uint32_t nh = t / nz;
  d.vz = t - nh * nz;
  d.n = nh / static_cast<uint32_t>(A.H);
  d.h = nh - static_cast<uint32_t>(d.n) * static_cast<uint32_t>(A.H);
  d.slot = d.n;
  if (A.slots) {
    d.slot = A.slots[d.n];
    if (d.slot < 0 || d.slot >= A.nslots) d.slot = -1;
  }
  return d;
}

// K rows, NW warps (warp w owns rows w, w + NW, ...), CPL columns per lane.
template <int K, int NW, int CPL>
__global__ void __launch_bounds__(NW * 32) rec_decode_rows_kernel(RecArgs A) {
  constexpr int RPT = K / NW;     // rows per thread
  constexpr int BV = 32 * CPL;    // columns per block
  using C = Cols<CPL>;
  __shared__ __align__(16) float vec[4 * K];       // alpha | a | scale q | k
  __shared__ __align__(16) float red_u[NW][BV];    // per-warp partial sums of u
  __shared__ __align__(16) float red_o[NW][BV];    // per-warp partial sums of (D S)^T (scale q)
  __shared__ float qk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const DecodeTile d = decode_tile(A, blockIdx.x, static_cast<uint32_t>(A.V / BV), gridDim.x);
  if (d.slot < 0) return;  // padding entry: the whole block leaves
  const int64_t n = d.n, h = d.h, slot = d.slot;
  const int64_t j0 = d.vz * BV + lane * CPL;

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
  float z[CPL], vr[CPL], wr[CPL];
  load_vw<CPL>(A, n, h, j0, vr, wr);
#pragma unroll
  for (int e = 0; e < CPL; ++e) z[e] = wr[e] * vr[e];
  if (warp == 0) {
    RawStep<K> raw;
    load_raw<K>(A, n, 0, h, true, 0, 0, raw);
    prepare_decode<K>(A, h, raw, vec, &qk);
  }
  __syncthreads();
  // 3. The step.
  decode_tile_step<K, NW, CPL>(A, S, vec, &qk, z, red_u, red_o, n, h, j0, pool_sink<CPL>(A, slot, h, j0), [] {});
}

// ---- the pipelined row kernel ("stream") ----
// The row kernel above loads, waits, computes and stores, one (sequence, head, value block) per
// block: the DRAM pipe idles while a block reduces (3.25 to 3.44 TB/s on the H200 at B = 512).
// Here a persistent block walks its tiles t = blockIdx.x, + gridDim.x, ... and the state of the
// next ST - 1 tiles is already on its way into shared memory (cp.async, 16 bytes per thread and
// copy, one commit group per tile), so that the loads of later tiles overlap the sums and stores
// of this one. (A first version brought each state row in with one cp.async.bulk copy of 256
// bytes: 2.27 TB/s, the copy engine's rate for such small copies.) Per tile: warp 0 prepares the
// head's vectors from raw inputs it loaded during the previous tile, every thread waits for its
// stage, then the row kernel's step (decode_tile_step: the two kernels agree bitwise). Stores go
// straight from registers (__stcs).

// How a stage is filled and awaited; the body below is the same for both.
// CpAsyncLoader: every thread copies 16-byte pieces of the tile (cp.async) and closes one commit
// group per tile (an empty one where there is nothing to copy, so that "the group of tile it" is
// always the (it)-th); waiting = cp.async.wait_group ST - 1.
template <int K, int NW, int CPL, int ST>
struct CpAsyncLoader {
  static constexpr int BV = 32 * CPL;
  static constexpr int kChunks = K * BV / 4;  // 16-byte copies per tile
  static constexpr bool kContig = false;      // interleaved rows (tile_row)
  static constexpr int kRefill = 0;           // see stream_walk
  const RecArgs& A;
  float* stage;
  __device__ void init() {}
  __device__ auto sink(const DecodeTile& d, int) const { return pool_sink<CPL>(A, d.slot, d.h, d.vz * BV + (threadIdx.x & 31) * CPL); }
  __device__ void after_step(const DecodeTile&, int) {}
  __device__ void issue(const DecodeTile& d, int s) {
    if (A.h0.p && d.slot >= 0) {
      const float* src = A.h0.p + d.slot * A.h0.sn + d.h * A.h0.sh + d.vz * BV;
      float* dst = stage + static_cast<size_t>(s) * K * BV;
#pragma unroll
      for (int c = threadIdx.x; c < kChunks; c += NW * 32) {
        const int row = c / (BV / 4), col = (c % (BV / 4)) * 4;
        chunked::cp16(dst + row * BV + col, src + row * A.h0.sk + col);
      }
    }
    chunked::cp_commit();
  }
  __device__ void wait(const DecodeTile&, int) { chunked::cp_wait<ST - 1>(); }
  __device__ void finish() { chunked::cp_wait<0>(); }  // nothing may still land when the block leaves
};

// TmaLoader: thread 0 brings the whole K x BV tile in with one bulk tensor copy (the pool's
// tensor map, coordinates (column, row, head, slot)) completing on the stage's mbarrier; waiting
// = the barrier's phase. A stage's phase advances only when a copy was issued into it (padding
// entries issue none), so every thread keeps the same phase bits.
struct TmaShared {
  uint64_t bar[4];
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int K, int NW, int CPL, int ST>
struct TmaLoader {
  static constexpr int BV = 32 * CPL;
  static constexpr uint32_t kBytes = K * BV * 4;
  static constexpr bool kContig = false;
  static constexpr int kRefill = 0;
  const RecArgs& A;
  float* stage;
  const CUtensorMap* map;
  TmaShared* sh;
  uint32_t phase = 0;  // bit s: parity of stage s's next completion
  int l2hint = 0;      // copies carry an L2 evict-first policy (the state is read and written once)
  uint64_t policy = 0;
  __device__ auto sink(const DecodeTile& d, int) const { return pool_sink<CPL>(A, d.slot, d.h, d.vz * BV + (threadIdx.x & 31) * CPL); }
  __device__ void after_step(const DecodeTile&, int) {}
  __device__ void init() {
    if (l2hint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < ST; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(&sh->bar[s])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
  }
  __device__ void issue(const DecodeTile& d, int s) {
    if (d.slot < 0 || threadIdx.x != 0) return;
    const uint32_t bar = smem_addr(&sh->bar[s]);
    const uint32_t dst = smem_addr(stage + static_cast<size_t>(s) * K * BV);
    // Generic-proxy reads of this stage (the previous tile's) are ordered before the copy by the
    // block barrier the caller passed; the fence orders them against the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(kBytes) : "memory");
    if (l2hint)
      asm volatile(
          "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n"
          ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(static_cast<int>(d.vz * BV)), "r"(0),
          "r"(static_cast<int>(d.h)), "r"(static_cast<int>(d.slot)), "r"(bar), "l"(policy)
          : "memory");
    else
      asm volatile(
          "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
          ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(static_cast<int>(d.vz * BV)), "r"(0),
          "r"(static_cast<int>(d.h)), "r"(static_cast<int>(d.slot)), "r"(bar)
          : "memory");
  }
  __device__ void wait(const DecodeTile& d, int s) {
    if (d.slot < 0) return;
    const uint32_t bar = smem_addr(&sh->bar[s]);
    const uint32_t par = (phase >> s) & 1u;
    asm volatile(
        "{\n\t.reg .pred p;\n"
        "TMA_WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
        "@!p bra TMA_WAIT;\n\t}\n" ::"r"(bar), "r"(par)
        : "memory");
    phase ^= 1u << s;
  }
  __device__ void finish() {}  // every issued copy was waited for by the step that used it
};

// TmaStoreLoader: loads as TmaLoader, and the new state goes back the same way: each thread
// writes its rows of the tile into the stage it read them from, and lane 0 of each warp stores the
// warp's K/NW contiguous rows (kContig) with one bulk tensor copy (the second map's box), waiting
// only until the copy has read shared memory. The next load into that stage is issued after the
// following block barrier (kRefill = 1), so it cannot overwrite rows still being stored.
template <int K, int NW, int CPL, int ST>
struct TmaStoreLoader : TmaLoader<K, NW, CPL, ST> {
  using Base = TmaLoader<K, NW, CPL, ST>;
  static constexpr int BV = Base::BV;
  static constexpr bool kContig = true;
  static constexpr int kRefill = 1;
  const CUtensorMap* store_map;
  __device__ auto sink(const DecodeTile&, int s) const {
    float* st = this->stage + static_cast<size_t>(s) * K * BV + (threadIdx.x & 31) * CPL;
    return [st](int row, const float (&x)[CPL]) {
      float* p = st + row * BV;
#pragma unroll
      for (int e = 0; e < CPL; ++e) p[e] = x[e];
    };
  }
  __device__ void after_step(const DecodeTile& d, int s) {
    if (d.slot < 0 || !this->A.ht.p) return;
    const int warp = threadIdx.x >> 5;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // this thread's writes, to the copy
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
      const uint32_t src = smem_addr(this->stage + static_cast<size_t>(s) * K * BV + warp * (K / NW) * BV);
      if (this->l2hint)
        asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%1, %2, %3, %4}], [%5], %6;\n"
                     ::"l"(reinterpret_cast<uint64_t>(store_map)), "r"(static_cast<int>(d.vz * BV)),
                     "r"(warp * (K / NW)), "r"(static_cast<int>(d.h)), "r"(static_cast<int>(d.slot)), "r"(src),
                     "l"(this->policy)
                     : "memory");
      else
        asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                     ::"l"(reinterpret_cast<uint64_t>(store_map)), "r"(static_cast<int>(d.vz * BV)),
                     "r"(warp * (K / NW)), "r"(static_cast<int>(d.h)), "r"(static_cast<int>(d.slot)), "r"(src)
                     : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
  }
  __device__ void finish() {
    if ((threadIdx.x & 31) == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
};

// TmaEarlyLoader: loads as TmaLoader, stores from registers, and refills a stage as soon as every
// thread has read it (kRefill = 2: inside the step, after its barrier), with the tile ST steps
// ahead: ST copies can be in flight per block instead of ST - 1.
template <int K, int NW, int CPL, int ST>
struct TmaEarlyLoader : TmaLoader<K, NW, CPL, ST> {
  static constexpr int kRefill = 2;
};

// The walk over tiles, for every loader. Where a stage is refilled (Loader::kRefill): 0, at the
// top of step it with tile it + ST - 1 (into the stage of step it - 1, read before that step's
// barrier); 1, the same after this step's wait barrier; 2, with tile it + ST into this step's own
// stage once the step's barrier shows that every thread has read it.
template <int K, int NW, int CPL, int ST, class Loader>
__device__ __forceinline__ void stream_walk(const RecArgs& A, uint32_t tiles, Loader& L, float* stage,
                                            float (&vec)[2][4 * K], float (&red_u)[NW][32 * CPL],
                                            float (&red_o)[NW][32 * CPL], float (&qk)[2]) {
  constexpr int RPT = K / NW;
  constexpr int BV = 32 * CPL;
  using C = Cols<CPL>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t nz = static_cast<uint32_t>(A.V / BV), G = gridDim.x;
  const bool ld = A.h0.p != nullptr;
  L.init();
  constexpr int kAhead = Loader::kRefill == 2 ? ST : ST - 1;  // tiles issued before the first step
#pragma unroll 1
  for (int s = 0; s < kAhead; ++s) L.issue(decode_tile(A, blockIdx.x + s * G, nz, tiles), s);
  DecodeTile d = decode_tile(A, blockIdx.x, nz, tiles);  // this step's tile; the next one's is decoded below
  RawStep<K> raw;  // warp 0: the raw inputs of tile d, loaded one step ahead
  float vr[CPL], wr[CPL];  // this thread's v and w (or beta) of tile d, likewise
  if (d.slot >= 0) {
    if (warp == 0) load_raw<K>(A, d.n, 0, d.h, true, 0, 0, raw);
    load_vw<CPL>(A, d.n, d.h, d.vz * BV + lane * CPL, vr, wr);
  }
  uint32_t it = 0;
#pragma unroll 1
  for (uint32_t t = blockIdx.x; t < tiles; t += G, ++it) {
    const int s = static_cast<int>(it % ST), b = static_cast<int>(it & 1);
    const DecodeTile dn = decode_tile(A, t + G, nz, tiles);
    // The tile that refills a stage in this step, and the stage (see above).
    const DecodeTile dl = Loader::kRefill == 2 ? decode_tile(A, t + ST * G, nz, tiles)
                                               : (ST == 2 ? dn : decode_tile(A, t + (ST - 1) * G, nz, tiles));
    const int sl = Loader::kRefill == 2 ? s : static_cast<int>((it + ST - 1) % ST);
    if constexpr (Loader::kRefill == 0) L.issue(dl, sl);
    if (d.slot >= 0 && warp == 0) prepare_decode<K>(A, d.h, raw, vec[b], &qk[b]);
    float z[CPL];
#pragma unroll
    for (int e = 0; e < CPL; ++e) z[e] = wr[e] * vr[e];
    if (dn.slot >= 0) {  // the next tile's inputs, in flight during this step
      if (warp == 0) load_raw<K>(A, dn.n, 0, dn.h, true, 0, 0, raw);
      load_vw<CPL>(A, dn.n, dn.h, dn.vz * BV + lane * CPL, vr, wr);
    }
    L.wait(d, s);     // this tile's stage has landed (for this thread)
    __syncthreads();  // ... for every thread; vec[b] is ready
    if constexpr (Loader::kRefill == 1) L.issue(dl, sl);
    if constexpr (Loader::kRefill == 2)
      if (d.slot < 0) L.issue(dl, sl);  // a padding entry read nothing: the stage is free now
    if (d.slot >= 0) {  // (not a padding entry: uniform over the block)
      const float* St = stage + static_cast<size_t>(s) * K * BV + lane * CPL;
      float S[RPT][CPL];
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        if (ld) C::unpack(*reinterpret_cast<const typename C::vec*>(St + tile_row<K, NW, Loader::kContig>(warp, i) * BV), S[i]);
        else
#pragma unroll
          for (int e = 0; e < CPL; ++e) S[i][e] = 0.f;
      }
      decode_tile_step<K, NW, CPL, Loader::kContig>(A, S, vec[b], &qk[b], z, red_u, red_o, d.n, d.h,
                                                    d.vz * BV + lane * CPL, L.sink(d, s), [&] {
                                                      if constexpr (Loader::kRefill == 2) L.issue(dl, sl);
                                                    });
      L.after_step(d, s);
    }
    d = dn;
  }
  L.finish();
}

template <int K, int NW, int CPL, int ST>
__global__ void __launch_bounds__(NW * 32) rec_decode_stream_kernel(RecArgs A, uint32_t tiles) {
  extern __shared__ __align__(128) float stage[];  // ST x K x BV
  __shared__ __align__(16) float vec[2][4 * K];     // two tiles' vectors: warp 0 prepares the next
  __shared__ __align__(16) float red_u[NW][32 * CPL];  // while the others still read this one
  __shared__ __align__(16) float red_o[NW][32 * CPL];
  __shared__ float qk[2];
  CpAsyncLoader<K, NW, CPL, ST> L{A, stage};
  stream_walk<K, NW, CPL, ST>(A, tiles, L, stage, vec, red_u, red_o, qk);
}

// The same walk with the tile brought in by the tensor-memory-access engine (QED_REC_DECODE_KERNEL=tma).
// Blocks per multiprocessor that shared memory allows for the 8x2 shapes at K <= 128 (three of
// two 32 KB stages, two of three), asked of the register allocator (at most 80 or 128 per thread).
template <int K, int NW, int CPL, int ST>
constexpr int tma_min_blocks() {
  return K <= 128 && NW == 8 && CPL == 2 ? (ST == 2 ? 3 : (ST == 3 ? 2 : 1)) : 1;
}

template <int K, int NW, int CPL, int ST, bool EARLY>
__global__ void __launch_bounds__(NW * 32, tma_min_blocks<K, NW, CPL, ST>()) rec_decode_tma_kernel(RecArgs A, uint32_t tiles,
                                                                 const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(128) float stage[];  // ST x K x BV
  __shared__ __align__(16) float vec[2][4 * K];
  __shared__ __align__(16) float red_u[NW][32 * CPL];
  __shared__ __align__(16) float red_o[NW][32 * CPL];
  __shared__ float qk[2];
  __shared__ TmaShared sh;
  if constexpr (EARLY) {
    TmaEarlyLoader<K, NW, CPL, ST> L{{A, stage, &map, &sh}};
    stream_walk<K, NW, CPL, ST>(A, tiles, L, stage, vec, red_u, red_o, qk);
  } else {
    TmaLoader<K, NW, CPL, ST> L{A, stage, &map, &sh};
    stream_walk<K, NW, CPL, ST>(A, tiles, L, stage, vec, red_u, red_o, qk);
  }
}

// The launch shape: (warps per block, columns per lane). Tuning override for the side-by-side
// table of bench/bench_recurrent.py: QED_REC_DECODE_ROWS=NWxCPL, one of 4x2, 8x2, 16x2, 8x4, 16x4.
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
    else if (v == "16x4") s = {16, 4};
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
  if (s.nw == 16) return launch_rows<K, 16, 4>(fn, A, stream);
  return launch_rows<K, 8, 4>(fn, A, stream);
}

// The pipelined kernel's shapes: QED_REC_DECODE_STREAM=NWxCPLxST, one of 8x2x2 (the default:
// 3.61 TB/s on the H200 at B = 512, H = 16, K = V = 128), 8x2x3, 8x2x4, 4x2x3, 8x4x2 (K = 256:
// 8x2x2 always, its stages being 64 KB).
struct StreamShape {
  int nw = 8, cpl = 2, st = 2;
};

StreamShape stream_shape() {
  StreamShape s;
  if (const char* e = std::getenv("QED_REC_DECODE_STREAM")) {
    const std::string v(e);
    if (v == "8x2x2") s = {8, 2, 2};
    else if (v == "8x2x3") s = {8, 2, 3};
    else if (v == "8x2x4") s = {8, 2, 4};
    else if (v == "4x2x3") s = {4, 2, 3};
    else if (v == "8x4x2") s = {8, 4, 2};
  }
  return s;
}

// The bulk-copy kernel's shapes: QED_REC_DECODE_TMA=NWxCPLxST, one of 8x2x3 (the default), 8x2x2,
// 8x2x4, 16x4x2 (K = 256: 8x2x2).
StreamShape tma_shape() {
  StreamShape s{8, 2, 3};
  if (const char* e = std::getenv("QED_REC_DECODE_TMA")) {
    const std::string v(e);
    if (v == "8x2x2") s = {8, 2, 2};
    else if (v == "8x2x4") s = {8, 2, 4};
    else if (v == "16x4x2") s = {16, 4, 2};
  }
  return s;
}

// The launch of a persistent walk over tiles of 32 CPL columns (stream, tma, tmae, tmas kernels):
// once per kernel instance the shared-memory opt-in and how many blocks fit on a multiprocessor;
// then the tile count (below 2^31: the walk decodes tiles in 32 bits) and the grid, at most one
// full wave (tests cap it with QED_REC_DECODE_STREAM_BLOCKS so that one block walks many tiles).
struct WalkLaunch {
  uint32_t tiles = 0;
  unsigned grid = 0;
};

template <auto Kern>
Status walk_launch(const char* fn, const RecArgs& A, int threads, size_t smem, int CPL, WalkLaunch* out) {
  static const std::pair<cudaError_t, int> setup = [&] {
    cudaError_t e = cudaFuncSetAttribute(Kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    int per_sm = 0;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kern, threads, smem);
    return std::make_pair(e, per_sm);
  }();
  if (setup.first != cudaSuccess) return cuda_status(fn, "decode kernel set-up", setup.first);
  if (setup.second < 1)
    return {StatusCode::unsupported, std::string(fn) + ": decode kernel does not fit a multiprocessor"};
  const int64_t tiles = A.N * A.H * (A.V / (32 * CPL));
  if (tiles > (int64_t{1} << 31) - 1)
    return {StatusCode::unsupported, std::string(fn) + ": N * H * value blocks exceeds 2^31 - 1"};
  int64_t grid = std::min<int64_t>(tiles, int64_t{setup.second} * num_sms());
  if (const char* e = std::getenv("QED_REC_DECODE_STREAM_BLOCKS")) grid = std::clamp<int64_t>(std::atoll(e), 1, grid);
  out->tiles = static_cast<uint32_t>(tiles);
  out->grid = static_cast<unsigned>(grid);
  return {};
}

template <int K, int NW, int CPL, int ST>
Status launch_stream(const char* fn, const RecArgs& A, cudaStream_t stream) {
  constexpr size_t smem = size_t{ST} * K * 32 * CPL * 4;
  WalkLaunch w;
  if (Status st = walk_launch<rec_decode_stream_kernel<K, NW, CPL, ST>>(fn, A, NW * 32, smem, CPL, &w); !st.ok())
    return st;
  rec_decode_stream_kernel<K, NW, CPL, ST><<<w.grid, NW * 32, smem, stream>>>(A, w.tiles);
  return cuda_status(fn, "decode kernel launch", cudaGetLastError());
}

// The walk with bulk tensor copies both ways (QED_REC_DECODE_KERNEL=tmas): `map` loads K x BV
// tiles, `store_map` stores K/NW x BV boxes.
template <int K, int NW, int CPL, int ST>
__global__ void __launch_bounds__(NW * 32, tma_min_blocks<K, NW, CPL, ST>()) rec_decode_tmas_kernel(RecArgs A, uint32_t tiles,
                                                                  const __grid_constant__ CUtensorMap map,
                                                                  const __grid_constant__ CUtensorMap store_map,
                                                                  int l2hint) {
  extern __shared__ __align__(128) float stage[];  // ST x K x BV
  __shared__ __align__(16) float vec[2][4 * K];
  __shared__ __align__(16) float red_u[NW][32 * CPL];
  __shared__ __align__(16) float red_o[NW][32 * CPL];
  __shared__ float qk[2];
  __shared__ TmaShared sh;
  TmaStoreLoader<K, NW, CPL, ST> L{{A, stage, &map, &sh, 0, l2hint}, &store_map};
  stream_walk<K, NW, CPL, ST>(A, tiles, L, stage, vec, red_u, red_o, qk);
}

// The pool as a 4-D tensor (columns, rows, heads, slots) for the bulk tensor copies: its map is
// encoded on the host through the driver's cuTensorMapEncodeTiled, found by the runtime (no link
// against the driver library). Box: BV columns x K rows of one (slot, head).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return EncodeTiled{nullptr};
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

Status pool_map(const char* fn, const RecArgs& A, int K, int BV, int rows, CUtensorMap* map) {
  const EncodeTiled enc = encode_tiled();
  if (!enc) return {StatusCode::unsupported, std::string(fn) + ": cuTensorMapEncodeTiled is not available"};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(A.V), static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(A.H),
                              static_cast<cuuint64_t>(A.nslots)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(A.h0.sk) * 4, static_cast<cuuint64_t>(A.h0.sh) * 4,
                                 static_cast<cuuint64_t>(A.h0.sn) * 4};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(BV), static_cast<cuuint32_t>(rows), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, const_cast<float*>(A.h0.p), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return {StatusCode::unsupported, std::string(fn) + ": cuTensorMapEncodeTiled refused the state pool (error " +
                                         std::to_string(static_cast<int>(r)) + ")"};
  return {};
}

template <int K, int NW, int CPL, int ST, bool EARLY = false>
Status launch_tma(const char* fn, const RecArgs& A, cudaStream_t stream) {
  constexpr size_t smem = size_t{ST} * K * 32 * CPL * 4;
  static_assert(ST <= 4, "TmaShared holds four barriers");
  WalkLaunch w;
  if (Status st = walk_launch<rec_decode_tma_kernel<K, NW, CPL, ST, EARLY>>(fn, A, NW * 32, smem, CPL, &w); !st.ok())
    return st;
  CUtensorMap map;
  if (Status st = pool_map(fn, A, K, 32 * CPL, K, &map); !st.ok()) return st;
  rec_decode_tma_kernel<K, NW, CPL, ST, EARLY><<<w.grid, NW * 32, smem, stream>>>(A, w.tiles, map);
  return cuda_status(fn, "decode kernel launch", cudaGetLastError());
}

template <int K, int NW, int CPL, int ST>
Status launch_tmas(const char* fn, const RecArgs& A, cudaStream_t stream) {
  constexpr size_t smem = size_t{ST} * K * 32 * CPL * 4;
  static_assert(ST <= 4, "TmaShared holds four barriers");
  WalkLaunch w;
  if (Status st = walk_launch<rec_decode_tmas_kernel<K, NW, CPL, ST>>(fn, A, NW * 32, smem, CPL, &w); !st.ok())
    return st;
  CUtensorMap map, store_map;
  if (Status st = pool_map(fn, A, K, 32 * CPL, K, &map); !st.ok()) return st;
  if (Status st = pool_map(fn, A, K, 32 * CPL, K / NW, &store_map); !st.ok()) return st;
  // Tuning: QED_REC_DECODE_L2HINT=1 gives the copies an L2 evict-first policy.
  const char* hint = std::getenv("QED_REC_DECODE_L2HINT");
  const int l2hint = hint && std::strcmp(hint, "1") == 0 ? 1 : 0;
  rec_decode_tmas_kernel<K, NW, CPL, ST><<<w.grid, NW * 32, smem, stream>>>(A, w.tiles, map, store_map, l2hint);
  return cuda_status(fn, "decode kernel launch", cudaGetLastError());
}

template <int K>
Status launch_tmas_k(const char* fn, const RecArgs& A, StreamShape s, cudaStream_t stream) {
  if (s.cpl == 4 && A.V % 128 != 0) s = {8, 2, 2};
  if (s.cpl == 4) return launch_tmas<K, 16, 4, 2>(fn, A, stream);
  if (s.st == 3) return launch_tmas<K, 8, 2, 3>(fn, A, stream);
  return launch_tmas<K, 8, 2, 2>(fn, A, stream);
}

template <int K, bool EARLY>
Status launch_tma_k(const char* fn, const RecArgs& A, StreamShape s, cudaStream_t stream) {
  if (s.cpl == 4 && A.V % 128 != 0) s = {8, 2, 2};
  if (s.cpl == 4) return launch_tma<K, 16, 4, 2, EARLY>(fn, A, stream);
  if (s.st == 2) return launch_tma<K, 8, 2, 2, EARLY>(fn, A, stream);
  if (s.st == 4) return launch_tma<K, 8, 2, 4, EARLY>(fn, A, stream);
  return launch_tma<K, 8, 2, 3, EARLY>(fn, A, stream);
}

template <int K>
Status launch_stream_k(const char* fn, const RecArgs& A, StreamShape s, cudaStream_t stream) {
  if (s.cpl == 4 && A.V % 128 != 0) s = {8, 2, 2};
  if (s.cpl == 4) return launch_stream<K, 8, 4, 2>(fn, A, stream);
  if (s.nw == 4) return launch_stream<K, 4, 2, 3>(fn, A, stream);
  if (s.st == 2) return launch_stream<K, 8, 2, 2>(fn, A, stream);
  if (s.st == 4) return launch_stream<K, 8, 2, 4>(fn, A, stream);
  return launch_stream<K, 8, 2, 3>(fn, A, stream);
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

Status launch_rec_decode_stream(const char* fn, const RecArgs& A, cudaStream_t stream) {
  if (A.N == 0) return {};
  const StreamShape s = stream_shape();
  switch (A.K) {
    case 64: return launch_stream_k<64>(fn, A, s, stream);
    case 128: return launch_stream_k<128>(fn, A, s, stream);
    case 256: return launch_stream<256, 8, 2, 2>(fn, A, stream);
  }
  return {StatusCode::unsupported, std::string(fn) + ": K not built for the pipelined decode kernel"};
}

// The bulk-tensor-copy variant: the pool must be read and written in place (one tensor map) and
// have fewer than 2^31 slots.
bool decode_tma_eligible(const RecArgs& A) {
  return decode_rows_eligible(A) && A.h0.p && A.h0.p == A.ht.p && A.h0.sn == A.ht.sn && A.h0.sh == A.ht.sh &&
         A.h0.sk == A.ht.sk && A.nslots >= 1 && A.nslots < (int64_t{1} << 31) && A.K <= 256;
}

Status launch_rec_decode_tma(const char* fn, const RecArgs& A, bool early, cudaStream_t stream) {
  if (A.N == 0) return {};
  const StreamShape s = tma_shape();
  switch (A.K) {
    case 64: return early ? launch_tma_k<64, true>(fn, A, s, stream) : launch_tma_k<64, false>(fn, A, s, stream);
    case 128: return early ? launch_tma_k<128, true>(fn, A, s, stream) : launch_tma_k<128, false>(fn, A, s, stream);
    case 256: return early ? launch_tma<256, 8, 2, 2, true>(fn, A, stream) : launch_tma<256, 8, 2, 2>(fn, A, stream);
  }
  return {StatusCode::unsupported, std::string(fn) + ": K not built for the bulk-copy decode kernel"};
}

// Loads and stores by bulk tensor copies (QED_REC_DECODE_KERNEL=tmas; shapes of QED_REC_DECODE_TMA:
// 8x2x2, the default here, 8x2x3, 16x4x2).
Status launch_rec_decode_tmas(const char* fn, const RecArgs& A, cudaStream_t stream) {
  if (A.N == 0) return {};
  StreamShape s{8, 2, 2};
  if (std::getenv("QED_REC_DECODE_TMA")) s = tma_shape();
  switch (A.K) {
    case 64: return launch_tmas_k<64>(fn, A, s, stream);
    case 128: return launch_tmas_k<128>(fn, A, s, stream);
    case 256: return launch_tmas<256, 8, 2, 2>(fn, A, stream);
  }
  return {StatusCode::unsupported, std::string(fn) + ": K not built for the bulk-copy decode kernel"};
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
