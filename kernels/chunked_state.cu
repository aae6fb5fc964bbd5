// Sequential pass of the chunked forward (MATH.md (4.3)-(4.5)): one block per (sequence, head,
// tile of 16*MT value columns) walks the chunks in order, carrying Sᵀ in fp32 registers:
//   Uᵀ = W_zᵀ - Sᵀ W_aᵀ,  Oᵀ = s (Sᵀ Q̃ᵀ + Uᵀ Mᵀ),  S'ᵀ = Sᵀ Diag(γ_C) + Uᵀ K̂.
// With NW warps (4, or 8 at K = 128 where the plan or a knob asks; the 128-column tile, MT = 8, on
// eight only), warp w owns chunk rows 64w/NW.. for U and O and key
// channels wK/NW.. of the state (WarpShare); the split-bf16
// copies of Sᵀ and Uᵀ pass between warps through shared memory (two barriers per chunk). The
// workspace fragments stream in one phase ahead of their use, by bulk copies (one instruction per
// contiguous segment, completing on the warp's mbarrier; ncu found the cp.async loop's address
// arithmetic and issue a fifth of the pass's stall samples at [1,65536,8,128]; the default with
// four warps) or 16 bytes per lane by cp.async (the default with eight; see state_warps()).
#include <cstdlib>
#include <cstring>

#include "kernels/chunked_common.cuh"
#include "kernels/chunked_stream.cuh"

namespace qed::kernels::chunked {
namespace {

// Shared memory of one block. OUT = false: the walking warps hold no read-out fragments (Q̃ᵀ,
// Mᵀ). SPLIT (the read-out warps, below): Sᵀ and Uᵀ twice (even and odd chunks), and per
// read-out warp its rows' Q̃ᵀ and Mᵀ fragments (rq, rm bytes) and two mbarriers.
template <int K, int MT, int NT, int NTQ, int NW, bool OUT = true, bool SPLIT = false>
struct StateSizes {
  using Sh = WarpShare<K, NW>;
  static constexpr int aWA = (K / 16) * Sh::RT * 32 * NT * 8;
  static constexpr int aQT = OUT ? (K / 16) * Sh::RT * 32 * NTQ * 8 : 0;
  static constexpr int aWZ = MT * Sh::RT * 32 * 16;
  static constexpr int bufA = aWA + aQT + aWZ;
  static constexpr int bKH = 4 * Sh::NNW * 32 * NT * 8;
  static constexpr int bMM = OUT ? 4 * Sh::RT * 32 * NTQ * 8 : 0;
  static constexpr int bGC = Sh::KW * 4;
  static constexpr int bufB = bKH + bMM + bGC;
  static constexpr int sbuf = MT * (K / 16) * NT * 32 * 16;
  static constexpr int ubuf = MT * 4 * NT * 32 * 16;
  static constexpr int copies = SPLIT ? 2 : 1;  // of Sᵀ and Uᵀ
  static constexpr int rq = SPLIT ? (K / 16) * Sh::RT * 32 * NTQ * 8 : 0;
  static constexpr int rm = SPLIT ? 4 * Sh::RT * 32 * NTQ * 8 : 0;
  static constexpr int readers = SPLIT ? NW : 0;
  static constexpr int bars = (NW + readers) * 2 * 8;  // two mbarriers per warp (the bulk-copy loads)
  static constexpr int total = NW * bufA + NW * bufB + copies * (sbuf + ubuf) + readers * (rq + rm) + bars;
};

// The block's named barriers with read-out warps (SPLIT): the walking warps among themselves, and
// between the two roles for chunk ci: its Uᵀ written (the walkers arrive, the readers wait) and its
// read-out done (the readers arrive, the walkers wait before they overwrite that chunk's copies of
// Sᵀ and Uᵀ). Each of the two kinds alternates between two ids by chunk parity, so that one role
// can never arrive twice at an id before the other has waited there once.
enum : int { kBarWalk = 1, kBarUReady = 2, kBarReadDone = 4 };
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Accumulator sets: every element zero; the sets c = 1.. added into set 0 in that order.
template <int N>
__device__ __forceinline__ void zero_acc(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) a[i] = 0.f;
}
template <class T, int N>
__device__ __forceinline__ void zero_acc(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero_acc(a[i]);
}
template <int NC, int MT, int RT>
__device__ __forceinline__ void fold_acc(float (&a)[NC][MT][RT][4]) {
#pragma unroll
  for (int c = 1; c < NC; ++c)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int nt = 0; nt < RT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[0][m][nt][e] += a[c][m][nt][e];
}

__device__ __forceinline__ void store_out(const Args& A, int64_t idx, float x) {
  if (A.o_dt == 0)
    static_cast<float*>(A.o)[idx] = x;
  else
    static_cast<__nv_bfloat16*>(A.o)[idx] = __float2bfloat16_rn(x);
}

// Oᵀ of one warp's chunk rows in accumulator layout (value column v0 + 16 m + g (+ 8), chunk row
// 16 rb + 8 (nt0 + nt) + 2 t (+ 1)), scaled, into o for the chunk's rows below Cn.
template <int MT, int RT>
__device__ __forceinline__ void store_o_rows(const Args& A, const float (&acc)[MT][RT][4], const Span& sp,
                                             int64_t ci, int Cn, int64_t h, int v0, int rb, int nt0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int64_t tok0 = sp.bos + ci * kC;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int nt = 0; nt < RT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 16 * rb + 8 * (nt0 + nt) + 2 * t + (e & 1);
        if (row < Cn)
          store_out(A, sp.brow * A.o_sb + (tok0 + row) * A.o_st + h * A.o_sh + v0 + 16 * m + g + 8 * (e >> 1),
                    A.scale * acc[m][nt][e]);
      }
}

// A read-out warp of the SPLIT instance (reader r of NW; its chunk rows are those walking warp r
// has in the other instances): for every chunk, once the walkers have written that chunk's Uᵀ,
// Oᵀ = s (Sᵀ Q̃ᵀ + Uᵀ Mᵀ) from the block's copies of Sᵀ and Uᵀ for the chunk's parity and its own
// Q̃ᵀ and Mᵀ fragments (bulk copies on two mbarriers, the next chunk's issued as soon as this
// chunk's products have read them). The products and their order are those of the walking warps'
// read-out in the ILP instance, so the output is bitwise the same.
template <int K, int MT, int NT, int NTQ, int NW, bool ILP>
__device__ __forceinline__ void state_read_out(const Args& A, int r, int lane, int64_t h, int64_t c0,
                                               int64_t nch, const Span& sp, int v0, const uint4* Sbuf,
                                               const uint4* Ubuf, char* qbuf, char* mbuf, uint64_t* bars) {
  using Lw = WsLayout<K, NT, NTQ>;
  using Sh = WarpShare<K, NW>;
  using Z = StateSizes<K, MT, NT, NTQ, NW, false, true>;
  constexpr int NKB = K / 16, RT = Sh::RT, FQ = 32 * NTQ * 8;
  constexpr int NC = ILP ? 4 : (MT <= 2 ? 2 : 1);
  constexpr int SE = Z::sbuf / 16, UE = Z::ubuf / 16;  // uint4s of one copy of Sᵀ, Uᵀ
  const int rb = Sh::rb(r), nt0 = Sh::nt0(r);
  const uint32_t barQ = sh_addr(bars), barM = sh_addr(bars + 1);
  if (lane == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barQ) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barM) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  auto load = [&](int64_t ci) {
    if (A.ready && !A.ready_mutant) ready_wait(A.ready + (c0 + ci) * A.H + h, lane);
    const char* bl = blob_ptr(A, c0 + ci, h);
    if (lane == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barQ), "r"(NKB * RT * FQ)
                   : "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barM), "r"((rb + 1) * RT * FQ)
                   : "memory");
    }
    __syncwarp();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    int base = 0;
    bulk_segs(qbuf, bl + Lw::kQT + (rb * NKB * 2 + nt0) * FQ, NKB, RT * FQ, 2 * FQ, lane, base, barQ);
    bulk_segs(mbuf, bl + Lw::kMM + (rb * 4 * 2 + nt0) * FQ, rb + 1, RT * FQ, 2 * FQ, lane, base, barM);
  };
  if (nch > 0) load(0);
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int par = static_cast<int>(ci & 1);
    const int rd = A.split_mutant ? 1 - par : par;  // testing hook: the other chunk's copies
    const uint4* Sb = Sbuf + rd * SE;
    const uint4* Ub = Ubuf + rd * UE;
    named_sync(kBarUReady + par, 2 * NW * 32);  // this chunk's Sᵀ and Uᵀ are written
    bar_wait(barQ, static_cast<uint32_t>(par));
    float accP[NC][MT][RT][4];
    zero_acc(accP);
#pragma unroll
    for (int kb = 0; kb < NKB; ++kb) {
      uint32_t aS[MT][NT * 4];
      load_a_tiles<MT, NT, NKB>(Sb, kb, lane, aS);
#pragma unroll
      for (int nt = 0; nt < RT; ++nt) {
        uint32_t bq[NTQ * 2];
        load_b<NTQ>(qbuf + ((kb * RT + nt) * 32 + lane) * NTQ * 8, bq);
#pragma unroll
        for (int m = 0; m < MT; ++m) mma_split<NT, NTQ>(accP[kb % NC][m][nt], aS[m], bq);
      }
    }
    fold_acc(accP);
    float (&aP0)[MT][RT][4] = accP[0];
    bar_wait(barM, static_cast<uint32_t>(par));
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      if (kb > rb) continue;
      uint32_t aU[MT][NT * 4];
      load_a_tiles<MT, NT, 4>(Ub, kb, lane, aU);
#pragma unroll
      for (int nt = 0; nt < RT; ++nt) {
        uint32_t bm[NTQ * 2];
        load_b<NTQ>(mbuf + ((kb * RT + nt) * 32 + lane) * NTQ * 8, bm);
#pragma unroll
        for (int m = 0; m < MT; ++m) mma_split<NT, NTQ>(aP0[m][nt], aU[m], bm);
      }
    }
    __syncwarp();
    named_arrive(kBarReadDone + par, 2 * NW * 32);  // done with this chunk's copies of Sᵀ and Uᵀ
    if (ci + 1 < nch) load(ci + 1);
    const int64_t rem = sp.len - ci * kC;
    const int Cn = rem < kC ? static_cast<int>(rem) : kC;
    store_o_rows<MT, RT>(A, aP0, sp, ci, Cn, h, v0, rb, nt0, lane);
  }
}

// LD: how the fragments come in: 0 cp.async (16 bytes per lane and instruction, waited for by
// commit groups), 1 bulk copies on two mbarriers per warp (the default; bitwise the same data).
// ILP (MT = 1 only; the default there, QEDCHECK_CHUNKED_STATE_ILP=0 turns it off): shorter
// dependent mma chains for the few-block shapes, where one warp per scheduler walks the chunks
// and every chunk step waits on its chains: four accumulator sets instead of two in phase A, and
// in phase B the products into two accumulators of their own (even and odd chunk-row blocks)
// added to the decayed state after the loop. Other rounding order than ILP = false (not bitwise
// the same).
// OUT = false (benchmark hook QEDCHECK_CHUNKED_STATE_NOOUT=1 only): the state alone, without the
// read-out (no Q̃ᵀ, Mᵀ loads or products, o not written), to time what the o path costs a step.
// SPLIT (with OUT = false): NW more warps do the read-out (state_read_out), one chunk behind the
// NW walking warps, which then carry only Uᵀ and the state from chunk to chunk: the read-out
// leaves the walk's critical path (where few blocks walk long sequences, a step's latency is the
// pass's time). Bitwise the same output as the ILP instance.
template <int K, int MT, int NT, int NTQ, int NW, int LD, bool ILP = false, bool OUT = true, bool SPLIT = false>
// Launch bounds: SPLIT asks for two blocks a multiprocessor (at most 128 registers a thread), so
// that a prep block fits beside it in the overlapped forward. The other instances give no minimum
// (0 emits no .minnctapersm): an explicit minimum of one block lets ptxas spend up to 48 more
// registers a thread, which took the overlapped eight-warp instance from 128 to 162 registers and
// so kept every prep block off its multiprocessor ([1,65536,8,128]: 3.44-3.51 ms against 2.69-2.76,
// reports/device/chunked.md run 28).
__global__ void __launch_bounds__((SPLIT ? 2 : 1) * NW * 32, SPLIT ? 2 : 0) state_kernel(const Args A) {
  static_assert(!ILP || MT == 1, "state_kernel: ILP is for one value tile");
  static_assert(OUT || LD == 1, "state_kernel: the state-only instance loads by bulk copies");
  static_assert(!SPLIT || (!OUT && MT == 1), "state_kernel: the read-out warps take the walkers' o path");
  using Lw = WsLayout<K, NT, NTQ>;
  using Z = StateSizes<K, MT, NT, NTQ, NW, OUT, SPLIT>;
  using Sh = WarpShare<K, NW>;
  constexpr int KW = Sh::KW, NKB = K / 16, NN = Sh::NNW, RT = Sh::RT;
  constexpr int FB = 32 * NT * 8, FQ = 32 * NTQ * 8;  // bytes of one B-fragment slot row (32 lanes)
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
  char* bufB = reinterpret_cast<char*>(sm) + NW * Z::bufA + warp * Z::bufB;
  uint4* Sbuf = reinterpret_cast<uint4*>(sm + NW * Z::bufA + NW * Z::bufB);
  uint4* Ubuf = reinterpret_cast<uint4*>(sm + NW * Z::bufA + NW * Z::bufB + Z::copies * Z::sbuf);
  char* rbuf = reinterpret_cast<char*>(sm) + NW * Z::bufA + NW * Z::bufB + Z::copies * (Z::sbuf + Z::ubuf);
  // LD = 1: this warp's mbarriers for its A and B fragments (each completes once per chunk, so
  // chunk ci waits for parity ci & 1 on both).
  uint64_t* bars = reinterpret_cast<uint64_t*>(rbuf + Z::readers * (Z::rq + Z::rm));
  if constexpr (SPLIT) {
    if (warp >= NW) {
      const int r = warp - NW;
      state_read_out<K, MT, NT, NTQ, NW, ILP>(A, r, lane, h, c0, nch, sp, v0, Sbuf, Ubuf,
                                              rbuf + r * (Z::rq + Z::rm), rbuf + r * (Z::rq + Z::rm) + Z::rq,
                                              bars + 2 * warp);
      return;
    }
  }
  // the walkers' barrier: the whole block, or (SPLIT) the walking warps alone
  auto sync_walkers = [&]() {
    if constexpr (SPLIT)
      named_sync(kBarWalk, NW * 32);
    else
      __syncthreads();
  };
  constexpr int SE = Z::sbuf / 16, UE = Z::ubuf / 16;  // uint4s of one copy of Sᵀ, Uᵀ
  const uint32_t barA = sh_addr(bars + 2 * warp), barB = sh_addr(bars + 2 * warp + 1);
  if (LD == 1 && lane == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barA) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barB) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  // This warp's fragments of the blob (layouts in chunked_common.cuh): -W_aᵀ and Q̃ᵀ slots
  // [rb][kb][nt0..][lane], W_zᵀ tiles [vb][rb][nt0..][lane]; K̂ slots [qs][kb][nq0..][lane],
  // Mᵀ slots [rb][kb <= rb][nt0..][lane], and the decay of its channels.
  // LD = 1: lane 0 announces the bytes, then every lane issues its segments (after a proxy fence:
  // the buffer's last generic reads, ordered by the block barrier before every load, come first).
  constexpr int kBytesA = NKB * RT * (FB + (OUT ? FQ : 0)) + MT * RT * 512;
  auto loadA_bulk = [&](int64_t ci) {
    const char* bl = blob_ptr(A, c0 + ci, h);
    if (lane == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barA), "r"(kBytesA) : "memory");
    __syncwarp();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    int base = 0;
    bulk_segs(bufA, bl + Lw::kWA + (rb * NKB * 2 + nt0) * FB, NKB, RT * FB, 2 * FB, lane, base, barA);
    if (OUT) bulk_segs(bufA + Z::aWA, bl + Lw::kQT + (rb * NKB * 2 + nt0) * FQ, NKB, RT * FQ, 2 * FQ, lane, base, barA);
    bulk_segs(bufA + Z::aWA + Z::aQT, bl + Lw::kWZ + (((vt * MT) * 4 + rb) * 2 + nt0) * 512, MT, RT * 512, 4 * 2 * 512,
              lane, base, barA);
  };
  auto loadB_bulk = [&](int64_t ci) {
    const char* bl = blob_ptr(A, c0 + ci, h);
    const int bytes = 4 * NN * FB + (OUT ? (rb + 1) * RT * FQ : 0) + (A.load_mutant ? 0 : KW * 4);
    if (lane == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barB), "r"(bytes) : "memory");
    __syncwarp();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    int base = 0;
    bulk_segs(bufB, bl + Lw::kKH + (qs * 4 * Sh::NQ4 + nq0) * FB, 4, NN * FB, Sh::NQ4 * FB, lane, base, barB);
    if (OUT) bulk_segs(bufB + Z::bKH, bl + Lw::kMM + (rb * 4 * 2 + nt0) * FQ, rb + 1, RT * FQ, 2 * FQ, lane, base, barB);
    if (!A.load_mutant)  // testing hook: the decay of this warp's channels is never loaded
      bulk_segs(bufB + Z::bKH + Z::bMM, bl + Lw::kGC + warp * KW * 4, 1, KW * 4, KW * 4, lane, base, barB);
  };
  auto loadA = [&](int64_t ci) {
    // the overlapped forward: chunk ci's blob may still be in the making (loadB(ci) follows
    // loadA(ci) and needs no second wait)
    if (A.ready && !A.ready_mutant) ready_wait(A.ready + (c0 + ci) * A.H + h, lane);
    if constexpr (LD == 1) {
      loadA_bulk(ci);
      return;
    }
    const char* bl = blob_ptr(A, c0 + ci, h);
    warp_copy_segs(bufA, bl + Lw::kWA + (rb * NKB * 2 + nt0) * FB, NKB, RT * FB, 2 * FB, lane);
    warp_copy_segs(bufA + Z::aWA, bl + Lw::kQT + (rb * NKB * 2 + nt0) * FQ, NKB, RT * FQ, 2 * FQ, lane);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int vb = vt * MT + m;
      warp_copy(bufA + Z::aWA + Z::aQT + m * RT * 512, bl + Lw::kWZ + ((vb * 4 + rb) * 2 + nt0) * 512, RT * 512,
                lane);
    }
  };
  auto loadB = [&](int64_t ci) {
    if constexpr (LD == 1) {
      loadB_bulk(ci);
      return;
    }
    const char* bl = blob_ptr(A, c0 + ci, h);
    warp_copy_segs(bufB, bl + Lw::kKH + (qs * 4 * Sh::NQ4 + nq0) * FB, 4, NN * FB, Sh::NQ4 * FB, lane);
    warp_copy_segs(bufB + Z::bKH, bl + Lw::kMM + (rb * 4 * 2 + nt0) * FQ, rb + 1, RT * FQ, 2 * FQ, lane);
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
  auto writeS = [&](uint4* dst) { store_state_frags<MT, NN, NT, KW, NKB>(accS, dst, warp, lane); };
  writeS(Sbuf);
  if (nch > 0) loadA(0);
  if constexpr (LD == 0) cp_commit();
  sync_walkers();

  for (int64_t ci = 0; ci < nch; ++ci) {
    // SPLIT: this chunk's copies of Sᵀ (read here, written by the previous chunk) and Uᵀ
    const int par = SPLIT ? static_cast<int>(ci & 1) : 0;
    const uint4* Scur = Sbuf + par * SE;
    uint4* Ucur = Ubuf + par * UE;
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
    if constexpr (LD == 0) {
      cp_commit();
      cp_wait<1>();
    } else {
      bar_wait(barA, static_cast<uint32_t>(ci & 1));
    }
    __syncwarp();

    // ---- phase A: Uᵀ and Sᵀ Q̃ᵀ for this warp's chunk rows ----
    // Two accumulator sets (even and odd key blocks) halve the dependent mma chains when the
    // registers allow it.
    constexpr int NC = ILP ? 4 : (MT <= 2 ? 2 : 1);  // a function of MT and ILP: 4 and 8 warps agree bitwise
    float accU[NC][MT][RT][4], accP[NC][MT][RT][4];
    float (&aU0)[MT][RT][4] = accU[0];
    float (&aP0)[MT][RT][4] = accP[0];
    {
      const float4* wz = reinterpret_cast<const float4*>(bufA + Z::aWA + Z::aQT);
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < RT; ++nt) {
          const float4 z = wz[(m * RT + nt) * 32 + lane];
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
        load_a_tiles<MT, NT, NKB>(Scur, kb, lane, aS);
#pragma unroll
        for (int nt = 0; nt < RT; ++nt) {
          const int slot = (kb * RT + nt) * 32 + lane;
          uint32_t bw[NT * 2], bq[NTQ * 2];
          load_b<NT>(bufA + slot * NT * 8, bw);
          if (OUT) load_b<NTQ>(bufA + Z::aWA + slot * NTQ * 8, bq);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_split<NT, NT>(accU[kb % NC][m][nt], aS[m], bw);
            if (OUT) mma_split<NT, NTQ>(accP[kb % NC][m][nt], aS[m], bq);
          }
        }
      }
      fold_acc(accU);
      fold_acc(accP);
      if (A.u_out) {  // the backward's recompute keeps U of every chunk (kernels/chunked_bwd_grads.cu)
        float* uo = A.u_out + ((c0 + ci) * A.H + h) * kC * A.V;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int nt = 0; nt < RT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              uo[(16 * rb + 8 * (nt0 + nt) + 2 * t + (e & 1)) * A.V + vcol(m, e)] = aU0[m][nt][e];
      }
      // Uᵀ as the A operand of phase B (k: chunk rows): one uint4 per 16-row block holds the two
      // n-tiles' halves; with one n-tile per warp, each warp writes its half (a uint2).
#pragma unroll
      for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int nt = 0; nt < RT; ++nt) {
          uint32_t r0[NT], r1[NT];
          split2<NT>(aU0[m][nt][0], aU0[m][nt][1], r0);
          split2<NT>(aU0[m][nt][2], aU0[m][nt][3], r1);
#pragma unroll
          for (int i = 0; i < NT; ++i)
            reinterpret_cast<uint2*>(Ucur)[(((m * 4 + rb) * NT + i) * 32 + lane) * 2 + nt0 + nt] = make_uint2(r0[i], r1[i]);
        }
      }
    }
    if constexpr (SPLIT) named_arrive(kBarUReady + par, 2 * NW * 32);  // the readers may start this chunk
    sync_walkers();
    if (ci + 1 < nch) loadA(ci + 1);
    if constexpr (LD == 0) {
      cp_commit();
      cp_wait<1>();
    } else {
      bar_wait(barB, static_cast<uint32_t>(ci & 1));
    }
    __syncwarp();

    // ---- phase B: state update of this warp's channels, and the read-out of its rows ----
    {
      const float* gcs = reinterpret_cast<const float*>(bufB + Z::bKH + Z::bMM);
#pragma unroll
      for (int n = 0; n < NN; ++n) {
        const float ga = gcs[8 * n + 2 * t], gb = gcs[8 * n + 2 * t + 1];
        // The decay as a multiply of its own (__fmul_rn is never contracted): where no branch
        // separates it from the ILP instance's later accS += tS[0] + tS[1] (OUT = false, so the
        // SPLIT walkers), the compiler would otherwise fuse the two into one FFMA, a different
        // rounding of the state than the other instances' FMUL then FADD (run 28: SASS of the
        // SPLIT walkers 16 FFMA, of the ILP instance 0; SplitReadOutAgreesBitwise failed).
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          accS[m][n][0] = __fmul_rn(accS[m][n][0], ga);
          accS[m][n][1] = __fmul_rn(accS[m][n][1], gb);
          accS[m][n][2] = __fmul_rn(accS[m][n][2], ga);
          accS[m][n][3] = __fmul_rn(accS[m][n][3], gb);
        }
      }
      // ILP: the products' own accumulators (even, odd kb), added to the decayed state below
      constexpr int NS = ILP ? 2 : 0;
      float tS[NS > 0 ? NS : 1][MT][NN][4];
      if constexpr (NS > 0) zero_acc(tS);
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t aU[MT][NT * 4];
        load_a_tiles<MT, NT, 4>(Ucur, kb, lane, aU);
#pragma unroll
        for (int n = 0; n < NN; ++n) {
          uint32_t bk[NT * 2];
          load_b<NT>(bufB + ((kb * NN + n) * 32 + lane) * NT * 8, bk);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            if constexpr (ILP)
              mma_split<NT, NT>(tS[kb & 1][m][n], aU[m], bk);
            else
              mma_split<NT, NT>(accS[m][n], aU[m], bk);
          }
        }
        if (OUT && kb <= rb) {
#pragma unroll
          for (int nt = 0; nt < RT; ++nt) {
            uint32_t bm[NTQ * 2];
            load_b<NTQ>(bufB + Z::bKH + ((kb * RT + nt) * 32 + lane) * NTQ * 8, bm);
#pragma unroll
            for (int m = 0; m < MT; ++m) mma_split<NT, NTQ>(aP0[m][nt], aU[m], bm);
          }
        }
      }
      if constexpr (ILP) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int n = 0; n < NN; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) accS[m][n][e] += tS[0][m][n][e] + tS[1][m][n][e];
      }
      if constexpr (OUT) store_o_rows<MT, RT>(A, aP0, sp, ci, Cn, h, v0, rb, nt0, lane);
      // SPLIT: the next state goes to the other copy, which the readers of the previous chunk
      // must have finished with
      if constexpr (SPLIT)
        if (ci > 0) named_sync(kBarReadDone + (1 - par), 2 * NW * 32);
      writeS(Sbuf + (SPLIT ? (1 - par) * SE : 0));
    }
    sync_walkers();
  }
  if constexpr (SPLIT)
    if (nch > 0) named_sync(kBarReadDone + static_cast<int>((nch - 1) & 1), 2 * NW * 32);
  if constexpr (LD == 0) cp_wait<0>();
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

}  // namespace

// Warps per block of the state pass and how its fragments arrive, measured on the H200 with both
// in one call (reports/device/chunked.md run 9, whole forwards): four warps with bulk copies
// 1.676 / 1.781 / 2.977 ms at [8,4096,16,128] / [2,16384,16,128] / [1,65536,8,128], eight warps
// with cp.async 1.800 / 1.772 / 3.125, eight warps with bulk copies 1.714 / 1.941 / 3.699. So
// four warps with bulk copies by default at K = 128, cp.async whenever eight warps are asked for
// (and at K = 64, not timed with bulk copies).
// The overlapped forward (a few walking blocks beside a running prep pass, chunked_forward.cu)
// takes eight warps with cp.async: at [1,65536,8,128] on an H100 2.71 ms against 2.88 with four
// (reports/device/chunked.md run 21).
// QEDCHECK_CHUNKED_STATE_WARPS=4|8 (8 only at K = 128) and QEDCHECK_CHUNKED_STATE_LOAD=bulk|cpasync
// override (side-by-side timing and the bitwise tests).
// The overlapped forward's bf16 state pass at K = 128 and one value tile takes the SPLIT instance
// (four walking warps, four read-out warps): at [1,65536,8,128] on an H100 2.54-2.61 ms against
// 2.69-2.76 for the eight-warp instance (reports/device/chunked.md run 28).
// QEDCHECK_CHUNKED_STATE_SPLIT=0 keeps the eight-warp instance there.
bool state_split() {
  const char* e = std::getenv("QEDCHECK_CHUNKED_STATE_SPLIT");
  return !(e && std::strcmp(e, "0") == 0);
}

int state_warps(int K, bool overlap, bool split_ok) {
  if (K != 128) return 4;
  if (overlap && split_ok && state_split()) return 4;  // four walking warps (and four read-out warps)
  const char* e = std::getenv("QEDCHECK_CHUNKED_STATE_WARPS");
  if (e && std::strcmp(e, "8") == 0) return 8;
  if (e && std::strcmp(e, "4") == 0) return 4;
  return overlap ? 8 : 4;
}

namespace {

// The ILP instance of state_kernel where it exists (one value tile, two-term bf16 products,
// K = 128): the default since run 20 of reports/device/chunked.md (the whole forward at
// [2,16384,16,128] 1.88 ms against 2.13-2.17, [1,65536,8,128] level or 1-2% faster).
// QEDCHECK_CHUNKED_STATE_ILP=0 keeps the former instance (for comparisons and the tests).
bool state_ilp() {
  const char* e = std::getenv("QEDCHECK_CHUNKED_STATE_ILP");
  return !(e && std::strcmp(e, "0") == 0);
}

bool bulk_loads(int K, int warps) {
  const char* e = std::getenv("QEDCHECK_CHUNKED_STATE_LOAD");
  if (e && std::strcmp(e, "bulk") == 0) return true;
  if (e && std::strcmp(e, "cpasync") == 0) return false;
  return K == 128 && warps == 4;  // K = 64 keeps the cp.async loads it was measured with
}

// Whether the launch takes the SPLIT instance (the overlapped forward, bf16, one value tile).
template <int K, int MT, int NT, int NTQ, int NW>
constexpr bool has_split() {
  return MT == 1 && NT == 2 && NTQ == 1 && K == 128 && NW == 4;
}

// Whether the 128-column instance (MT = 8) exists: bf16's two-term state path, K = 128, eight
// warps (one block a multiprocessor: 218 KB of shared memory).
template <int K, int NT, int NTQ, int NW>
constexpr bool has_wide() {
  return K == 128 && NT == 2 && NTQ == 1 && NW == 8;
}

template <int K, int MT, int NT, int NTQ, int NW>
cudaError_t launch_state_t(const Args& A, cudaStream_t st) {
  int smem = StateSizes<K, MT, NT, NTQ, NW>::total, threads = NW * 32;
  auto kern = bulk_loads(K, NW) ? state_kernel<K, MT, NT, NTQ, NW, 1> : state_kernel<K, MT, NT, NTQ, NW, 0>;
  if constexpr (MT == 1 && NT == 2 && K == 128) {
    if (state_ilp())
      kern = bulk_loads(K, NW) ? state_kernel<K, 1, NT, NTQ, NW, 1, true> : state_kernel<K, 1, NT, NTQ, NW, 0, true>;
    if (const char* e = std::getenv("QEDCHECK_CHUNKED_STATE_NOOUT"); e && std::strcmp(e, "1") == 0) {
      kern = state_kernel<K, 1, NT, NTQ, NW, 1, true, false>;
      smem = StateSizes<K, 1, NT, NTQ, NW, false>::total;
    }
  }
  if constexpr (has_split<K, MT, NT, NTQ, NW>()) {
    if (A.ready && state_split()) {
      kern = state_kernel<K, 1, NT, NTQ, NW, 1, true, false, true>;
      smem = StateSizes<K, 1, NT, NTQ, NW, false, true>::total;
      threads = 2 * NW * 32;
    }
  }
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int64_t vt = A.V / (16 * MT);
  if (A.N == 0 || A.H == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(A.N), static_cast<unsigned>(A.H), static_cast<unsigned>(vt));
  if (A.ready) {
    // the overlapped forward: may start while the prep pass runs (it waits on A.ready's flags)
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, A);
  }
  kern<<<grid, threads, smem, st>>>(A);
  return cudaGetLastError();
}

template <int K, int NT, int NTQ, int NW>
cudaError_t launch_state_k(const Args& A, int MT, cudaStream_t st) {
  if constexpr (has_wide<K, NT, NTQ, NW>())
    if (MT == 8) return launch_state_t<K, 8, NT, NTQ, NW>(A, st);
  if (MT == 4 && NT < 3) return launch_state_t<K, 4, NT, NTQ, NW>(A, st);
  if (MT == 2) return launch_state_t<K, 2, NT, NTQ, NW>(A, st);
  if (MT == 1) return launch_state_t<K, 1, NT, NTQ, NW>(A, st);
  return cudaErrorInvalidValue;
}

template <int K, int NW>
cudaError_t launch_state_m(const Args& A, Mode m, int MT, cudaStream_t st) {
  switch (m) {
    case Mode::bf16: return launch_state_k<K, 2, 1, NW>(A, MT, st);
    case Mode::fp32: return launch_state_k<K, 3, 3, NW>(A, MT, st);
    case Mode::bf16_single: return launch_state_k<K, 1, 1, NW>(A, MT, st);
  }
  return cudaErrorInvalidValue;
}

template <int K, int NW>
int state_smem_k(int MT, Mode m, bool split) {
  switch (m) {
    case Mode::bf16:
      if constexpr (has_split<K, 1, 2, 1, NW>())
        if (split && MT == 1) return StateSizes<K, 1, 2, 1, NW, false, true>::total;
      if constexpr (has_wide<K, 2, 1, NW>())
        if (MT == 8) return StateSizes<K, 8, 2, 1, NW>::total;
      return MT == 4 ? StateSizes<K, 4, 2, 1, NW>::total
                     : (MT == 2 ? StateSizes<K, 2, 2, 1, NW>::total : StateSizes<K, 1, 2, 1, NW>::total);
    case Mode::fp32:
      return MT == 4 ? StateSizes<K, 4, 3, 3, NW>::total
                     : (MT == 2 ? StateSizes<K, 2, 3, 3, NW>::total : StateSizes<K, 1, 3, 3, NW>::total);
    case Mode::bf16_single:
      return MT == 4 ? StateSizes<K, 4, 1, 1, NW>::total
                     : (MT == 2 ? StateSizes<K, 2, 1, 1, NW>::total : StateSizes<K, 1, 1, 1, NW>::total);
  }
  return 0;
}

}  // namespace

int state_smem_bytes(int K, int MT, Mode m, bool overlap) {
  if (K == 64) return state_smem_k<64, 4>(MT, m, false);
  const bool split_ok = m == Mode::bf16 && MT == 1;
  const bool split = overlap && split_ok && state_split();
  return state_warps(K, overlap, split_ok) == 8 ? state_smem_k<128, 8>(MT, m, split) : state_smem_k<128, 4>(MT, m, split);
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
  if (A.K == 64) return launch_state_m<64, 4>(A, m, MT, st);
  const int nw = A.state_nw ? A.state_nw : state_warps(128, A.ready != nullptr, m == Mode::bf16 && MT == 1);
  return nw == 8 ? launch_state_m<128, 8>(A, m, MT, st) : launch_state_m<128, 4>(A, m, MT, st);
}

}  // namespace qed::kernels::chunked
