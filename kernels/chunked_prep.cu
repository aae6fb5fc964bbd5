// Chunk-parallel pass of the chunked forward (MATH.md §4.1-4.4): one block per (chunk, head)
// builds everything that does not depend on the incoming state -- the erase vectors a (fused
// QED prologue), the cumulative decays, T and M with safe pairwise exponents (§4.6),
// L = (I+T)^-1 by forward substitution, W_a = L Ã, W_zᵀ = Zᵀ Lᵀ, K̂, Q̃ and the chunk decay -- and
// writes them in split-bf16 fragment order into the workspace for chunked_state.cu.
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/chunked_common.cuh"

namespace qed::kernels::chunked {
namespace {

template <class InT, int K>
struct alignas(16) PrepSmem {
  static constexpr int P = K + 8;  // row pitch: fragment-pattern reads hit distinct banks
  static constexpr int PV = 128 + 8;
  static constexpr int NTS = sizeof(InT) == 4 ? 3 : 2;  // bf16 terms of L at most (fp32 mode: 3)
  // q, k, b until Ã is formed; then v and w (any V <= 128) for W_z, and the bf16 terms of L.
  union U {
    struct In {
      InT q[kC][P];
      InT k[kC][P];
      InT b[kC][P];
    } in;
    struct VW {
      InT v[kC][PV];
      InT w[kC][PV];
      // L = (I+T)^-1 split once into its NT bf16 terms, pairs of columns per word (row pitch 36
      // words: the fragment reads of W_a and W_z hit distinct banks).
      uint32_t L[NTS][kC][36];
    } vw;
  } u;
  float G[kC][P];   // raw g, then the in-chunk cumulative log2-decay, then Ã = A ⊙ Γ
  float T[kC][72];  // T, then L = (I+T)^-1
  float coef[kC];   // QED: lambda (k.m)/(k.k) for projected arms, else 0
  float wrow[kC];   // scalar write gate (kda, gdn, deltanet)
  float r[K];
  uint32_t umask[4][K / 32];
  int nuns[4];
  uint8_t ulist[4][K];
};

// Which erase vector a phase forms (Ctx::aval_k, chosen by Ctx::by_akind): b k (every variant but
// QED), QED's full arm, or any other QED arm (rand's m from r, the others' from q).
enum : int { kAkPlain = 0, kAkFull = 1, kAkOther = 2 };

template <class InT, int K>
struct Ctx {
  const PrepSmem<InT, K>& s;
  float lam;
  int variant, arm;
  __device__ float kf(int r, int c) const { return to_f(s.u.in.k[r][c]); }
  __device__ float qf(int r, int c) const { return to_f(s.u.in.q[r][c]); }
  __device__ float bf(int r, int c) const { return to_f(s.u.in.b[r][c]); }
  // Erase vector a_rc = b k + lambda (m - (k.m)/(k.k) k) (MATH.md §2), m the arm's query-side
  // vector (b q full, b r rand, q nogate and nogate_noproj), from already loaded k, b, q, the row's
  // coefficient (k.m)/(k.k) in a register and the kind of vector fixed at compile time (AK, chosen
  // once per phase by by_akind): no per-element branch on the variant and arm and no shared load
  // of s.coef in the hot loops of T/M and Ã (as those were, QED's A fragments cost about six times
  // GDN-2's instructions: SASS of run 29).
  template <int AK>
  __device__ float aval_k(float kk, float bb, float qq, float coef, int c) const {
    if constexpr (AK == kAkPlain) {
      return bb * kk;
    } else {
      const float m = AK == kAkFull ? bb * qq : (arm == kArmRand ? bb * s.r[c] : qq);
      return fmaf(bb, kk, fmaf(lam, m, -coef * kk));
    }
  }
  // f(kind) with the erase vector's kind of this block as a compile-time constant.
  template <class F>
  __device__ void by_akind(F&& f) const {
    if (variant != kQed) f(std::integral_constant<int, kAkPlain>{});
    else if (arm == kArmFull) f(std::integral_constant<int, kAkFull>{});
    else f(std::integral_constant<int, kAkOther>{});
  }
  // The same value at element (r, c) of the staged tiles, the kind chosen here (the steep-channel
  // fallback, off the hot paths).
  __device__ float aval(int r, int c) const {
    const float kk = kf(r, c), bb = bf(r, c);
    if (variant != kQed) return aval_k<kAkPlain>(kk, bb, 0.f, 0.f, c);
    if (arm == kArmFull) return aval_k<kAkFull>(kk, bb, qf(r, c), s.coef[r], c);
    return aval_k<kAkOther>(kk, bb, qf(r, c), s.coef[r], c);
  }
  // Channels c, c+1 (c even) of row r: k, b, q by one 32-bit (bf16) or 64-bit (fp32) load each.
  __device__ void pair(int r, int c, float (&k2)[2], float (&b2)[2], float (&q2)[2]) const {
    ld2(&s.u.in.k[r][c], k2);
    ld2(&s.u.in.b[r][c], b2);
    ld2(&s.u.in.q[r][c], q2);
  }
  __device__ static void ld2(const float* p, float (&x)[2]) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x, x[1] = v.y;
  }
  __device__ static void ld2(const __nv_bfloat16* p, float (&x)[2]) {
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    x[0] = v.x, x[1] = v.y;
  }
};

// 2^x by the special-function unit, subnormal results flushed to zero (exp2f adds a rescaling
// around it to keep them; here a result below 2^-126 only ever multiplies an O(1) operand).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int NT>
__device__ __forceinline__ void store_slot(char* dst, const uint32_t* r0, const uint32_t* r1) {
  if constexpr (NT == 2) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(r0[0], r1[0], r0[1], r1[1]);
  } else {
#pragma unroll
    for (int i = 0; i < NT; ++i) reinterpret_cast<uint2*>(dst)[i] = make_uint2(r0[i], r1[i]);
  }
}

// Work items of the T/M products: (row block I, column tile nt) for I = 0..3, nt <= 2I + 1 (20 in
// all). Four warps take five each, two row blocks at most; eight warps take three or two, all of
// one row block, so each warp builds one A fragment per key block.
template <int NW>
__device__ __forceinline__ bool tm_item(int warp, int it, int& I, int& nt) {
  if constexpr (NW == 4) {
    switch (warp) {
      case 0: I = 3; nt = it; break;
      case 1: I = it < 3 ? 3 : 0; nt = it < 3 ? 5 + it : it - 3; break;
      case 2: I = 2; nt = it; break;
      default: I = it == 0 ? 2 : 1; nt = it == 0 ? 5 : it - 1; break;
    }
    return true;
  } else {
    // Row blocks {3,3,2,2,3,1,1,0} and first tiles {0,3,0,3,6,0,2,0} of warps 0..7, packed (2 and
    // 4 bits per warp) so that no table lands in local memory.
    I = (0x17af >> (2 * warp)) & 3;
    nt = ((0x2063030 >> (4 * warp)) & 15) + it;
    return it < (warp < 4 ? 3 : 2);
  }
}

// NW warps per block: 8 for the bf16 modes (two blocks of 8 warps per multiprocessor, the shared
// memory allows no more), 4 for the fp32 mode (its three-term fragments need more registers).
// BWD: the chunked backward's recompute, which also writes the backward's blob (BwdLayout, NT
// terms throughout) from the same values: transposed fragments by movmatrix where the forward's
// come from accumulators (M, W_a), the others computed like their forward twins, and L.
// One (chunk gc, head h) of the pass: every thread of the block calls it (its early returns are
// the same for the whole block).
template <class InT, int K, int NT, int NTQ, int NW, bool BWD, bool RING>
__device__ __forceinline__ void prep_item(const Args& A, int64_t grid_chunks, int64_t gc, int64_t h,
                                          unsigned char* smem_raw) {
  static_assert(NW == 4 || NW == 8, "prep_kernel: 4 or 8 warps");
  constexpr int NTH = NW * 32;
  // QED's projection sums: 4 kC items, two per thread on NTH_SIDE = 128 threads (see proj_sums),
  // beside the decay's running sums when the block has 128 threads that the decay leaves idle.
  constexpr int NTH_SIDE = 128;
  constexpr bool kSideSums = NTH - K >= NTH_SIDE;
  static_assert(4 * kC == 2 * NTH_SIDE, "prep_kernel: the projection sums take two items per thread");
  using Lw = WsLayout<K, NT, NTQ>;
  using Lb = BwdLayout<K, NT>;
  using Sm = PrepSmem<InT, K>;
  Sm& s = *reinterpret_cast<Sm*>(smem_raw);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  // Which sequence and which of its chunks this block is.
  int64_t seq, nloc;
  if (!A.cu) {
    seq = gc / A.chunks_per_seq;
    nloc = gc % A.chunks_per_seq;
    if (seq >= A.N) return;
  } else {
    const int64_t total = A.chunk_base[A.N];
    if (gc >= total || gc >= grid_chunks) return;
    int64_t lo = 0, hi = A.N;
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (A.chunk_base[mid] <= gc) lo = mid; else hi = mid;
    }
    seq = lo;
    nloc = gc - A.chunk_base[lo];
  }
  const Span sp = seq_span(A, seq);
  const int64_t t0 = sp.bos + nloc * kC;
  const int64_t rem = sp.len - nloc * kC;
  if (rem <= 0) return;
  const int Cn = rem < kC ? static_cast<int>(rem) : kC;
  char* blob = blob_ptr(A, gc, h);
  char* bblob = BWD ? A.bws + (gc * A.H + h) * A.bblob : nullptr;
  const bool qed = A.variant == kQed;
  const bool chan_bw = A.variant == kGdn2 || qed;
  auto off = [&](const Seq& x, int r) { return sp.brow * x.sb + (t0 + r) * x.st + h * x.sh; };

  // ---- load q, k, b (b = beta broadcast for scalar-gate variants) and raw g into G ----
  const bool chan_g = A.variant == kGdn2 || qed || A.variant == kKda;
  const bool has_g = A.variant != kDeltanet;
  {
    constexpr int VE = 16 / sizeof(InT);
    constexpr int NV = K / VE;
    const bool gvec = A.vec_g && chan_g;
    const InT* qp = static_cast<const InT*>(A.q.p);
    const InT* kp = static_cast<const InT*>(A.k.p);
    const InT* bp = static_cast<const InT*>(A.b.p);
    const InT* gp = static_cast<const InT*>(A.g.p);
#pragma unroll 2
    for (int i = tid; i < kC * NV; i += NTH) {
      const int r = i / NV, c = (i % NV) * VE;
      uint4 vq = make_uint4(0, 0, 0, 0), vk = vq, vb = vq, vg = vq;
      if (r < Cn) {
        if (A.vec) {
          vq = *reinterpret_cast<const uint4*>(qp + off(A.q, r) + c);
          vk = *reinterpret_cast<const uint4*>(kp + off(A.k, r) + c);
          if (chan_bw) vb = *reinterpret_cast<const uint4*>(bp + off(A.b, r) + c);
        } else {
          InT* eq = reinterpret_cast<InT*>(&vq);
          InT* ek = reinterpret_cast<InT*>(&vk);
          InT* eb = reinterpret_cast<InT*>(&vb);
          for (int e = 0; e < VE; ++e) {
            eq[e] = qp[off(A.q, r) + c + e];
            ek[e] = kp[off(A.k, r) + c + e];
            if (chan_bw) eb[e] = bp[off(A.b, r) + c + e];
          }
        }
        if (gvec) vg = *reinterpret_cast<const uint4*>(gp + off(A.g, r) + c);
      }
      *reinterpret_cast<uint4*>(&s.u.in.q[r][c]) = vq;
      *reinterpret_cast<uint4*>(&s.u.in.k[r][c]) = vk;
      if (chan_bw) *reinterpret_cast<uint4*>(&s.u.in.b[r][c]) = vb;
      if (gvec) {
        const InT* eg = reinterpret_cast<const InT*>(&vg);
#pragma unroll
        for (int e = 0; e < VE; ++e) s.G[r][c + e] = to_f(eg[e]);
      }
    }
    if (!gvec) {
#pragma unroll 8
      for (int i = tid; i < kC * K; i += NTH) {
        const int r = i / K, c = i % K;
        float gv = 0.f;
        if (has_g && r < Cn) gv = ld_any(A.g.p, off(A.g, r) + (chan_g ? c : 0), A.g.dt);
        s.G[r][c] = gv;
      }
    }
    if (!chan_bw) {
      for (int r = tid; r < kC; r += NTH)
        s.wrow[r] = r < Cn ? ld_any(A.beta.p, off(A.beta, r), A.beta.dt) : 0.f;
      __syncthreads();
      for (int i = tid; i < kC * K; i += NTH) {
        const int r = i / K, c = i % K;
        s.u.in.b[r][c] = static_cast<InT>(s.wrow[r]);
      }
    }
    if (A.arm == kArmRand)
      for (int c = tid; c < K; c += NTH) s.r[c] = A.r[h * K + c];
  }
  __syncthreads();
  if (A.prep_stop == 1) return;
  const float lam = qed ? A.lambda[h] : 0.f;
  const Ctx<InT, K> X{s, lam, A.variant, A.arm};
  // QED's projection sums k.k and k.m of every row (MATH.md §2), items i = 4 r + part: four
  // threads per row, each summing every fourth pair of channels (a conflict-free bank pattern),
  // then two shuffles, so the order is the same for any block width and any item placement. The
  // arm is chosen once outside the channel loop, and each channel pair's k (and b, q where the arm
  // reads them) comes by one 32-bit (bf16) or 64-bit (fp32) shared load: the same products and
  // sums as aval_k's m per element. NI items per thread go side by side (independent chains); every
  // lane of the warp takes part (the shuffles).
  const bool projected = qed && (A.arm == kArmFull || A.arm == kArmNogate || A.arm == kArmRand);
  auto proj_sums = [&](auto nitag, int i0) {
    constexpr int NI = decltype(nitag)::value;
    float nn[NI], km[NI];
#pragma unroll
    for (int j = 0; j < NI; ++j) nn[j] = km[j] = 0.f;
    if (projected) {
      const int part = i0 & 3;
      auto sums = [&](auto armtag) {
        constexpr int ARM = decltype(armtag)::value;
#pragma unroll 4
        for (int c = 2 * part; c < K; c += 8) {
#pragma unroll
          for (int j = 0; j < NI; ++j) {
            const int r = (i0 + j * NTH_SIDE) >> 2;
            float k2[2], b2[2], q2[2], m2[2];
            X.ld2(&s.u.in.k[r][c], k2);
            if constexpr (ARM != kArmNogate) X.ld2(&s.u.in.b[r][c], b2);
            if constexpr (ARM != kArmRand) X.ld2(&s.u.in.q[r][c], q2);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if constexpr (ARM == kArmFull) m2[e] = b2[e] * q2[e];
              else if constexpr (ARM == kArmRand) m2[e] = b2[e] * s.r[c + e];
              else m2[e] = q2[e];
            }
            nn[j] = fmaf(k2[0], k2[0], nn[j]);
            km[j] = fmaf(k2[0], m2[0], km[j]);
            nn[j] = fmaf(k2[1], k2[1], nn[j]);
            km[j] = fmaf(k2[1], m2[1], km[j]);
          }
        }
      };
      if (A.arm == kArmFull) sums(std::integral_constant<int, kArmFull>{});
      else if (A.arm == kArmRand) sums(std::integral_constant<int, kArmRand>{});
      else sums(std::integral_constant<int, kArmNogate>{});
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        nn[j] += __shfl_xor_sync(0xffffffffu, nn[j], 1);
        km[j] += __shfl_xor_sync(0xffffffffu, km[j], 1);
        nn[j] += __shfl_xor_sync(0xffffffffu, nn[j], 2);
        km[j] += __shfl_xor_sync(0xffffffffu, km[j], 2);
      }
    }
    if ((i0 & 3) == 0) {
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int r = (i0 + j * NTH_SIDE) >> 2;
        s.coef[r] = (projected && nn[j] > 0.f) ? lam * (km[j] / nn[j]) : 0.f;
        if constexpr (BWD)  // the gradient pass's projection coefficients (zero without projection)
          *reinterpret_cast<float2*>(bblob + Lb::kPJ + 8 * r) = make_float2(nn[j], km[j]);
      }
    }
  };
  // ---- in-chunk cumulative decay, base 2 (padded rows: g = 0), on threads 0..K-1 ----
  // Eight warps at K <= 128 leave the last four idle here: they take the projection sums (two
  // items each, one after the other: side by side, the gradient pass's prep instance spilled 28
  // bytes instead of 12), which then cost no phase of their own.
  for (int c = tid; c < K; c += NTH) {
    float acc = 0.f;
#pragma unroll 8
    for (int r = 0; r < kC; ++r) {
      acc = fmaf(s.G[r][c], kLog2e, acc);
      s.G[r][c] = acc;
    }
  }
  if constexpr (kSideSums) {
    if (tid >= NTH - NTH_SIDE) {
      proj_sums(std::integral_constant<int, 1>{}, tid - (NTH - NTH_SIDE));
      proj_sums(std::integral_constant<int, 1>{}, tid - (NTH - NTH_SIDE) + NTH_SIDE);
    }
  }
  __syncthreads();
  if (A.prep_stop == 2) return;
  // ---- QED prologue (unless done beside the decay): projection coefficients; steep channels ----
  {
    if constexpr (!kSideSums) {
      if constexpr (NTH == NTH_SIDE) {
        proj_sums(std::integral_constant<int, 2>{}, tid);
      } else {
        for (int i = tid; i < 4 * kC; i += NTH) proj_sums(std::integral_constant<int, 1>{}, i);
      }
    }
    if (warp < 4) {  // warp I lists the steep channels of diagonal block I
      const int I = warp;
      int base = 0;
      for (int u = 0; u < K / 32; ++u) {
        const int c = 32 * u + lane;
        const float Gp = I == 0 ? 0.f : s.G[16 * I - 1][c];
        const bool uns = (Gp - s.G[16 * I + 15][c]) > A.max_diag;
        const unsigned m = __ballot_sync(0xffffffffu, uns);
        if (lane == 0) s.umask[I][u] = m;
        if (uns) s.ulist[I][base + __popc(m & ((1u << lane) - 1u))] = static_cast<uint8_t>(c);
        base += __popc(m);
      }
      if (lane == 0) s.nuns[I] = base;
    }
  }
  __syncthreads();
  if (A.prep_stop == 3) return;

  // ---- T = stril(Ã' K̃'ᵀ) and M = tril(Q̃' K̃'ᵀ), 16-row blocks referenced at row 16I-1 ----
  {
    constexpr int NI = NW == 4 ? 5 : 3;  // items per warp
    float accT[NI][4], accM[NI][4];
#pragma unroll
    for (int i = 0; i < NI; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) accT[i][e] = accM[i][e] = 0.f;
    // The products over the channel blocks, with the erase vector's kind fixed for the loop.
    // M in the forward's read-out precision; the backward (BWD) feeds it to the state adjoint, so
    // there it takes the state path's terms.
    constexpr int NTM = BWD ? NT : NTQ;
    // The A fragments of row block I and channel block kb for the lane (gg, tt): registers
    // reg = 2 * half + rr (row 16I + gg + 8rr, channels 16kb + 2tt + 8half, +1), rr = 0, 1, into
    // xT[NT][2] and xM[NTM][2]. (Array-reference parameters here crash cicc 13.0: a segfault.)
    auto afrag = [&](auto aktag, int I, int kb, int gg, int tt, int half, uint32_t (*xT)[2],
                     uint32_t (*xM)[2]) {
      constexpr int AK = decltype(aktag)::value;
      const int p = 16 * I - 1, r0 = 16 * I + gg, c = 16 * kb + 2 * tt + 8 * half;
      float cf[2] = {0.f, 0.f};  // the rows' projection coefficients (QED)
      if constexpr (AK != kAkPlain) cf[0] = s.coef[r0], cf[1] = s.coef[r0 + 8];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = r0 + 8 * rr;
        const float e0 = ex2(s.G[r][c] - (p < 0 ? 0.f : s.G[p][c]));
        const float e1 = ex2(s.G[r][c + 1] - (p < 0 ? 0.f : s.G[p][c + 1]));
        float k2[2], b2[2], q2[2];
        X.pair(r, c, k2, b2, q2);
        uint32_t x[NT], y[NTM];
        split2<NT>(X.template aval_k<AK>(k2[0], b2[0], q2[0], cf[rr], c) * e0,
                   X.template aval_k<AK>(k2[1], b2[1], q2[1], cf[rr], c + 1) * e1, x);
        split2<NTM>(q2[0] * e0, q2[1] * e1, y);
#pragma unroll
        for (int i = 0; i < NT; ++i) xT[i][rr] = x[i];
#pragma unroll
        for (int i = 0; i < NTM; ++i) xM[i][rr] = y[i];
      }
    };
    // Item it's B fragment (K̃' of rows 8nt.., channel block kb, referenced at row 16I-1) and its
    // two products.
    auto item_products = [&](int it, int I, int nt, int kb, const uint32_t* aT, const uint32_t* aM) {
      const int p = 16 * I - 1;
      uint32_t bK[NT * 2];
      const int j = 8 * nt + g, c0 = 16 * kb + 2 * t;
      // Steep channels of a diagonal block drop out of the factored product: their bits for this
      // lane's channels c0 + {0, 1, 8, 9} (one mask word; usually none at all).
      uint32_t steep = 0;
      if (nt >= 2 * I && s.nuns[I] > 0) steep = s.umask[I][kb >> 1] >> (c0 & 31);
#pragma unroll
      for (int reg = 0; reg < 2; ++reg) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = c0 + e + 8 * reg;
          v[e] = X.kf(j, c) * ex2((p < 0 ? 0.f : s.G[p][c]) - s.G[j][c]);
          if ((steep >> (e + 8 * reg)) & 1u) v[e] = 0.f;
        }
        uint32_t x[NT];
        split2<NT>(v[0], v[1], x);
#pragma unroll
        for (int i = 0; i < NT; ++i) bK[2 * i + reg] = x[i];
      }
      mma_split<NT, NT>(accT[it], aT, bK);
      mma_split<NTM, NTM>(accM[it], aM, bK);
    };
    // RING (eight warps, the overlapped forward's persistent pass): row blocks 3, 2 and 1 are split
    // over three, two and two warps, so warps building the A fragments of their own row block
    // build most of them two or three times. Instead every thread builds a quarter of one lane's
    // fragments of channel block kb + 1 into a ring of two channel blocks in s.T (T is written only
    // after the products), while the warps multiply channel block kb; one barrier a channel block.
    // The same values in the same registers of the same products: the same bits as the path
    // below. Measured (reports/device/chunked.md run 29): the overlapped forward at
    // [1,65536,8,128] 6% faster; with two prep blocks a multiprocessor and nothing beside them
    // (the passes in series) the barriers cost what the ring saves, so that path keeps its own
    // fragments, and so does the backward's instance (more spills with the ring).
    constexpr int NTA = NT + NTM;  // fragment terms a row block and lane
    static_assert(!RING || 2 * 4 * NTA * 32 * 16 <= static_cast<int>(sizeof(Sm::T)),
                  "prep_kernel: the A-fragment ring must fit in s.T");
    auto products = [&](auto aktag) {
      using AkTag = decltype(aktag);
      // RING: this thread's quarter of a lane's fragments (row block bI, lane bl, half) into the
      // ring's slot of channel block kb.
      const int slot = tid & 127, half = tid >> 7;  // NTH = 256: two threads a (row block, lane)
      const int bI = slot >> 5, bl = slot & 31;
      [[maybe_unused]] uint4* ring = reinterpret_cast<uint4*>(&s.T[0][0]);  // [buf][I][term][lane]
      [[maybe_unused]] auto build = [&](int kb) {
        uint32_t xT[NT][2], xM[NTM][2];
        afrag(AkTag{}, bI, kb, bl >> 2, bl & 3, half, xT, xM);
        uint2* dst = reinterpret_cast<uint2*>(ring + ((kb & 1) * 4 + bI) * NTA * 32 + bl) + half;
#pragma unroll
        for (int i = 0; i < NT; ++i) dst[2 * 32 * i] = make_uint2(xT[i][0], xT[i][1]);
#pragma unroll
        for (int i = 0; i < NTM; ++i) dst[2 * 32 * (NT + i)] = make_uint2(xM[i][0], xM[i][1]);
      };
      if constexpr (RING) {
        static_assert(NW == 8, "prep_kernel: the A-fragment ring takes eight warps");
        build(0);
        __syncthreads();
      }
      for (int kb = 0; kb < K / 16; ++kb) {
        if constexpr (RING)
          if (kb + 1 < K / 16) build(kb + 1);
        uint32_t aT[NT * 4], aM[NTM * 4];
        int prevI = -1;
#pragma unroll
        for (int it = 0; it < NI; ++it) {
          int I, nt;
          if (!tm_item<NW>(warp, it, I, nt)) continue;
          if (I != prevI) {
            prevI = I;
            if constexpr (RING) {  // from the ring
              const uint4* src = ring + ((kb & 1) * 4 + I) * NTA * 32 + lane;
#pragma unroll
              for (int i = 0; i < NTA; ++i) {
                const uint4 v = src[32 * i];
                uint32_t* d = i < NT ? &aT[4 * i] : &aM[4 * (i - NT)];
                d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
              }
            } else {  // this lane's own, both halves
#pragma unroll
              for (int hf = 0; hf < 2; ++hf) {
                uint32_t xT[NT][2], xM[NTM][2];
                afrag(AkTag{}, I, kb, g, t, hf, xT, xM);
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
                  for (int i = 0; i < NT; ++i) aT[4 * i + 2 * hf + rr] = xT[i][rr];
#pragma unroll
                  for (int i = 0; i < NTM; ++i) aM[4 * i + 2 * hf + rr] = xM[i][rr];
                }
              }
            }
          }
          item_products(it, I, nt, kb, aT, aM);
        }
        if constexpr (RING) __syncthreads();  // channel block kb + 1 built, kb's fragments read
      }
    };
    X.by_akind(products);
#pragma unroll
    for (int it = 0; it < NI; ++it) {
      int I, nt;
      if (!tm_item<NW>(warp, it, I, nt)) continue;
      const bool diag = nt >= 2 * I;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * I + g + 8 * (e >> 1), j = 8 * nt + 2 * t + (e & 1);
        float Tv = accT[it][e], Mv = accM[it][e];
        if (diag && j <= r) {
          // Channels whose in-block decay is too steep for the factored product.
          for (int u = 0; u < s.nuns[I]; ++u) {
            const int c = s.ulist[I][u];
            const float kx = X.kf(j, c) * ex2(s.G[r][c] - s.G[j][c]);
            if (j < r) Tv = fmaf(X.aval(r, c), kx, Tv);
            Mv = fmaf(X.qf(r, c), kx, Mv);
          }
        }
        s.T[r][j] = j < r ? Tv : 0.f;
        accM[it][e] = j <= r ? Mv : 0.f;
      }
      // M straight into the state pass's Mᵀ fragments: rows 16I+g(+8), columns of tile nt.
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        uint32_t x[NTQ];
        split2<NTQ>(accM[it][2 * pr], accM[it][2 * pr + 1], x);
        const int slot = ((I * 4 + (nt >> 1)) * 2 + pr) * 32 + lane;
        uint32_t* dst = reinterpret_cast<uint32_t*>(blob + Lw::kMM + slot * NTQ * 8);
#pragma unroll
        for (int i = 0; i < NTQ; ++i) dst[2 * i + (nt & 1)] = x[i];
      }
      if constexpr (BWD) {
        // s M as the backward's B-fragments (k: rows of M, n: its columns): the 8 x 8 block of
        // rows 16I+8hh.. and columns 8nt.. transposed is register hh of slot [nt/2][I][nt%2].
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          uint32_t x[NT];
          split2<NT>(A.scale * accM[it][2 * hh], A.scale * accM[it][2 * hh + 1], x);
          const int slot = (((nt >> 1) * 4 + I) * 2 + (nt & 1)) * 32 + lane;
          uint32_t* dst = reinterpret_cast<uint32_t*>(bblob + Lb::kMN + slot * NT * 8);
#pragma unroll
          for (int i = 0; i < NT; ++i) dst[2 * i + hh] = transpose8x8(x[i]);
        }
      }
    }
  }
  __syncthreads();
  if (A.prep_stop == 4) return;

  // ---- L = (I+T)^-1 by 16 x 16 blocks, fp32, on every thread of the block ----
  // Where L goes: phase 4 wrote only the block-lower part of T, so the strict upper triangle of
  // s.T is free; row j of s.T holds, right of its diagonal, column j of L's strict lower part
  // (s.T[j][R] = L[R][j] for j < R; lval() reads L back). In order:
  //  a. D_I = (I + T_II)^-1 of the four diagonal blocks, one column per thread (a 16-step forward
  //     substitution, threads 0..63), while the other threads build K̂;
  //  b. P_KJ = T_KJ D_J for the six blocks below the diagonal blocks, which replaces T_KJ (T is
  //     read nowhere else);
  //  c. the off-diagonal blocks by their distance d = I - J from the diagonal, d = 1, 2, 3:
  //     L_IJ = -sum_{K=J+1..I} L_IK P_KJ with L_II = D_I (from L (I+T) = I), a sum over the 16d
  //     rows of P between the two blocks; a level reads only blocks that earlier levels wrote.
  // Every element's terms are added in a fixed order whichever thread computes it, so the four-
  // and eight-warp blocks agree bit for bit. (Until 2026-12 two warps ran a 64-step substitution,
  // one column of L each, while the other six waited at the phase's barrier: reports/device/
  // chunked.md run 4.)
  static_assert(256 % NTH == 0, "prep_kernel: the block steps of L assume NTH divides 256");
  auto lval = [&](int R, int j) -> float { return j < R ? s.T[j][R] : (j == R ? 1.f : 0.f); };
  if (tid < 64) {
    const int o = 16 * (tid >> 4), c = tid & 15;
    float d[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float a4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j + 4 <= r; j += 4) {
        const float4 tr = *reinterpret_cast<const float4*>(&s.T[o + r][o + j]);
        a4[0] = fmaf(tr.x, d[j], a4[0]);
        a4[1] = fmaf(tr.y, d[j + 1], a4[1]);
        a4[2] = fmaf(tr.z, d[j + 2], a4[2]);
        a4[3] = fmaf(tr.w, d[j + 3], a4[3]);
      }
#pragma unroll
      for (int j = r & ~3; j < r; ++j) a4[j & 3] = fmaf(s.T[o + r][o + j], d[j], a4[j & 3]);
      const float acc = (a4[0] + a4[1]) + (a4[2] + a4[3]);
      d[r] = r < c ? 0.f : (r == c ? 1.f : -acc);
    }
#pragma unroll
    for (int r = 1; r < 16; ++r)
      if (r > c) s.T[o + c][o + r] = d[r];
  } else {
    // ---- K̂ (decayed to the chunk end) in fragment order, beside the diagonal blocks ----
    const int u = tid - 64;
    constexpr int NU = NTH - 64;  // threads of this branch
    constexpr int nKH = 4 * 4 * (K / 32) * 32;
    for (int i = u; i < nKH; i += NU) {
      const int ln = i & 31, gg = ln >> 2, tt = ln & 3;
      int rest = i >> 5;
      const int nt = rest % (K / 32);
      rest /= (K / 32);
      const int kb = rest % 4, sl = rest / 4;
      const int ch = sl * (K / 4) + 8 * nt + gg, j0 = 16 * kb + 2 * tt;
      const float Gl = s.G[kC - 1][ch];
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + (e & 1) + ((e & 2) ? 8 : 0);
        v[e] = X.kf(j, ch) * ex2(Gl - s.G[j][ch]);
      }
      uint32_t x0[NT], x1[NT];
      split2<NT>(v[0], v[1], x0);
      split2<NT>(v[2], v[3], x1);
      store_slot<NT>(blob + Lw::kKH + static_cast<int64_t>(i) * NT * 8, x0, x1);
    }
  }
  __syncthreads();
  {
    // b. P_KJ = T_KJ D_J: block b = (K, J) of (1,0) (2,1) (3,2) (2,0) (3,1) (3,0); lanes along the
    // column c (D_J's column is row c of its transposed store), held until every thread has read
    // T. D_J[k][c] is 1 at k = c, 0 above it.
    constexpr int EP = 6 * 256 / NTH;
    // Item m of this thread lies in block b = m NTH / 256: its column block J and row block Kb.
    auto pblock = [](int m, int& J, int& Kb) {
      const int b = (m * NTH) >> 8;
      const int dd = b < 3 ? 1 : (b < 5 ? 2 : 3);
      J = b < 3 ? b : (b < 5 ? b - 3 : 0);
      Kb = J + dd;
    };
    float pv[EP];
#pragma unroll
    for (int m = 0; m < EP; ++m) {
      const int e = tid + m * NTH, r = (e >> 4) & 15, c = e & 15;
      int J, Kb;
      pblock(m, J, Kb);
      const float* tr = &s.T[16 * Kb + r][16 * J];
      const float* dc = &s.T[16 * J + c][16 * J];
      float a4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q4 = 0; q4 < 4; ++q4) {
        const float4 t4 = *reinterpret_cast<const float4*>(tr + 4 * q4);
        const float4 d4 = *reinterpret_cast<const float4*>(dc + 4 * q4);
        const float tv[4] = {t4.x, t4.y, t4.z, t4.w}, dv[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int k = 4 * q4 + x;
          a4[x] = fmaf(tv[x], k > c ? dv[x] : (k == c ? 1.f : 0.f), a4[x]);
        }
      }
      pv[m] = (a4[0] + a4[1]) + (a4[2] + a4[3]);
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < EP; ++m) {
      const int e = tid + m * NTH, r = (e >> 4) & 15, c = e & 15;
      int J, Kb;
      pblock(m, J, Kb);
      s.T[16 * Kb + r][16 * J + c] = pv[m];
    }
    __syncthreads();
    // c. L_IJ, I = J + d: element (R, C) = -sum_j L[R][j] P[j][C] over rows j = 16(J+1) .. R
    // (L[R][R] = 1), stored at s.T[C][R]. No block of a level reads another's output.
    auto level = [&](auto dtag) {
      constexpr int D = decltype(dtag)::value;
      constexpr int EL = (4 - D) * 256 / NTH;
#pragma unroll
      for (int m = 0; m < EL; ++m) {
        const int J = (m * NTH) >> 8, e = tid + m * NTH, r = (e >> 4) & 15, c = e & 15;
        const int R = 16 * (J + D) + r, C = 16 * J + c;
        float a4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int jj = 0; jj < 16 * D; ++jj) {
          const int j = 16 * (J + 1) + jj;
          const float lv = jj < 16 * (D - 1) ? s.T[j][R] : lval(R, j);
          a4[jj & 3] = fmaf(lv, s.T[j][C], a4[jj & 3]);
        }
        s.T[C][R] = -((a4[0] + a4[1]) + (a4[2] + a4[3]));
      }
    };
    level(std::integral_constant<int, 1>{});
    __syncthreads();
    level(std::integral_constant<int, 2>{});
    __syncthreads();
    level(std::integral_constant<int, 3>{});
  }
  {
    // ---- Q̃ and the chunk decay in fragment order (and the backward's K̂ᵀ, s Q̃), every thread ----
    const int u = tid;
    constexpr int NU = NTH;
    constexpr int nKH = 4 * 4 * (K / 32) * 32;
    constexpr int nQT = 4 * (K / 16) * 2 * 32;
    for (int i = u; i < nQT; i += NU) {
      const int ln = i & 31, gg = ln >> 2, tt = ln & 3;
      int rest = i >> 5;
      const int nt = rest & 1;
      rest >>= 1;
      const int kb = rest % (K / 16), w = rest / (K / 16);
      const int r = 16 * w + 8 * nt + gg, c0 = 16 * kb + 2 * tt;
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = c0 + (e & 1) + ((e & 2) ? 8 : 0);
        v[e] = X.qf(r, c) * ex2(s.G[r][c]);
      }
      uint32_t x0[NTQ], x1[NTQ];
      split2<NTQ>(v[0], v[1], x0);
      split2<NTQ>(v[2], v[3], x1);
      store_slot<NTQ>(blob + Lw::kQT + static_cast<int64_t>(i) * NTQ * 8, x0, x1);
    }
    for (int c = u; c < K; c += NU)
      reinterpret_cast<float*>(blob + Lw::kGC)[c] = ex2(s.G[kC - 1][c]);
    if constexpr (BWD) {
      // K̂ᵀ in QT's order (k: channels, n: rows) and s Q̃ in KH's (k: rows, n: channels).
      for (int i = u; i < nQT; i += NU) {
        const int ln = i & 31, gg = ln >> 2, tt = ln & 3;
        int rest = i >> 5;
        const int nt = rest & 1;
        rest >>= 1;
        const int kb = rest % (K / 16), w = rest / (K / 16);
        const int r = 16 * w + 8 * nt + gg, c0 = 16 * kb + 2 * tt;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = c0 + (e & 1) + ((e & 2) ? 8 : 0);
          v[e] = X.kf(r, c) * ex2(s.G[kC - 1][c] - s.G[r][c]);
        }
        uint32_t x0[NT], x1[NT];
        split2<NT>(v[0], v[1], x0);
        split2<NT>(v[2], v[3], x1);
        store_slot<NT>(bblob + Lb::kKT + static_cast<int64_t>(i) * NT * 8, x0, x1);
      }
      for (int i = u; i < nKH; i += NU) {
        const int ln = i & 31, gg = ln >> 2, tt = ln & 3;
        int rest = i >> 5;
        const int nt = rest % (K / 32);
        rest /= (K / 32);
        const int kb = rest % 4, sl = rest / 4;
        const int ch = sl * (K / 4) + 8 * nt + gg, j0 = 16 * kb + 2 * tt;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = j0 + (e & 1) + ((e & 2) ? 8 : 0);
          v[e] = A.scale * X.qf(j, ch) * ex2(s.G[j][ch]);
        }
        uint32_t x0[NT], x1[NT];
        split2<NT>(v[0], v[1], x0);
        split2<NT>(v[2], v[3], x1);
        store_slot<NT>(bblob + Lb::kQN + static_cast<int64_t>(i) * NT * 8, x0, x1);
      }
    }
  }
  __syncthreads();
  if (A.prep_stop == 5) return;
  // ---- Ã = A ⊙ Γ in place of G; q, k, b are then free for v and w ----
  // Eight channels per item (16 bytes of bf16 k, b, q; two items of four for fp32).
  {
    constexpr int VE = 16 / sizeof(InT), NV = K / VE;
    auto atilde = [&](auto aktag) {
      constexpr int AK = decltype(aktag)::value;
      for (int i = tid; i < kC * NV; i += NTH) {
        const int r = i / NV, c0 = (i % NV) * VE;
        const uint4 uk = *reinterpret_cast<const uint4*>(&s.u.in.k[r][c0]);
        const uint4 ub = *reinterpret_cast<const uint4*>(&s.u.in.b[r][c0]);
        uint4 uq = make_uint4(0, 0, 0, 0);  // q enters a only for QED
        float cr = 0.f;
        if constexpr (AK != kAkPlain) uq = *reinterpret_cast<const uint4*>(&s.u.in.q[r][c0]), cr = s.coef[r];
        const InT* ek = reinterpret_cast<const InT*>(&uk);
        const InT* eb = reinterpret_cast<const InT*>(&ub);
        const InT* eq = reinterpret_cast<const InT*>(&uq);
#pragma unroll
        for (int e = 0; e < VE; ++e) {
          const int c = c0 + e;
          s.G[r][c] = X.template aval_k<AK>(to_f(ek[e]), to_f(eb[e]), to_f(eq[e]), cr, c) * ex2(s.G[r][c]);
        }
      }
    };
    X.by_akind(atilde);
  }
  __syncthreads();
  if (A.prep_stop == 6) return;
  {
    constexpr int VE = 16 / sizeof(InT);
    const int NVv = static_cast<int>(A.V) / VE;
    const InT* vp = static_cast<const InT*>(A.v.p);
    const InT* wp = static_cast<const InT*>(A.w.p);
#pragma unroll 2
    for (int i = tid; i < kC * NVv; i += NTH) {
      const int r = i / NVv, c = (i % NVv) * VE;
      uint4 vv = make_uint4(0, 0, 0, 0), vw = vv;
      if (r < Cn) {
        if (A.vec_vw) {
          vv = *reinterpret_cast<const uint4*>(vp + off(A.v, r) + c);
          if (chan_bw) vw = *reinterpret_cast<const uint4*>(wp + off(A.w, r) + c);
        } else {
          InT* ev = reinterpret_cast<InT*>(&vv);
          InT* ew = reinterpret_cast<InT*>(&vw);
          for (int e = 0; e < VE; ++e) {
            ev[e] = vp[off(A.v, r) + c + e];
            if (chan_bw) ew[e] = wp[off(A.w, r) + c + e];
          }
        }
      }
      *reinterpret_cast<uint4*>(&s.u.vw.v[r][c]) = vv;
      if (chan_bw) *reinterpret_cast<uint4*>(&s.u.vw.w[r][c]) = vw;
    }
  }
  // L (fp32, transposed in T's upper triangle) into its bf16 terms, once, for the fragment loads
  // of W_a and W_z; lanes along rows (a column of the transposed store: no bank conflicts). The
  // backward's blob takes L itself.
  for (int i = tid; i < kC * 32; i += NTH) {
    const int r = i & (kC - 1), cp = i / kC;
    const float l0 = lval(r, 2 * cp), l1 = lval(r, 2 * cp + 1);
    uint32_t x[NT];
    split2<NT>(l0, l1, x);
#pragma unroll
    for (int k = 0; k < NT; ++k) s.u.vw.L[k][r][cp] = x[k];
    if constexpr (BWD)
      *reinterpret_cast<float2*>(bblob + Lb::kLM + 4 * (r * kC + 2 * cp)) = make_float2(l0, l1);
  }
  __syncthreads();
  if (A.prep_stop == 7) return;

  constexpr int NH = NW / 2;  // warps on W_a, then as many on W_z
  if (warp < NH) {
    // ---- W_a = L Ã, stored negated as -W_aᵀ B-fragments; L fragments loaded per channel pair
    // (holding all ten would cost 40 registers per term) ----
    for (int kbp = warp; kbp < K / 16; kbp += NH) {
      float acc[4][2][4];
#pragma unroll
      for (int I = 0; I < 4; ++I)
#pragma unroll
        for (int p = 0; p < 2; ++p)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[I][p][e] = 0.f;
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        uint32_t bb[2][NT * 2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int ch = 16 * kbp + 8 * p + g;
#pragma unroll
          for (int reg = 0; reg < 2; ++reg) {
            const int j = 16 * kb + 2 * t + 8 * reg;
            uint32_t x[NT];
            split2<NT>(s.G[j][ch], s.G[j + 1][ch], x);
#pragma unroll
            for (int i = 0; i < NT; ++i) bb[p][2 * i + reg] = x[i];
          }
        }
#pragma unroll
        for (int I = kb; I < 4; ++I) {
          uint32_t la[NT * 4];
#pragma unroll
          for (int reg = 0; reg < 4; ++reg) {
            const int r = 16 * I + g + ((reg & 1) ? 8 : 0), cw = 8 * kb + t + ((reg & 2) ? 4 : 0);
#pragma unroll
            for (int i = 0; i < NT; ++i) la[4 * i + reg] = s.u.vw.L[i][r][cw];
          }
          mma_split<NT, NT>(acc[I][0], la, bb[0]);
          mma_split<NT, NT>(acc[I][1], la, bb[1]);
        }
      }
#pragma unroll
      for (int I = 0; I < 4; ++I)
#pragma unroll
        for (int ntp = 0; ntp < 2; ++ntp) {
          uint32_t x0[NT], x1[NT];
          split2<NT>(-acc[I][0][2 * ntp], -acc[I][0][2 * ntp + 1], x0);
          split2<NT>(-acc[I][1][2 * ntp], -acc[I][1][2 * ntp + 1], x1);
          const int slot = ((I * (K / 16) + kbp) * 2 + ntp) * 32 + lane;
          store_slot<NT>(blob + Lw::kWA + static_cast<int64_t>(slot) * NT * 8, x0, x1);
          if constexpr (BWD) {
            // -W_a as the backward's B-fragments (k: rows, n: channels): the 8 x 8 block of rows
            // 16I+8ntp.. and channels 16kbp+8p.. transposed is register ntp of WN slot
            // [ct / (K/32)][I][ct % (K/32)], ct = 2kbp + p.
#pragma unroll
            for (int p = 0; p < 2; ++p) {
              const int ct = 2 * kbp + p;
              const int bslot = (((ct / (K / 32)) * 4 + I) * (K / 32) + ct % (K / 32)) * 32 + lane;
              uint32_t* dst = reinterpret_cast<uint32_t*>(bblob + Lb::kWN + static_cast<int64_t>(bslot) * NT * 8);
#pragma unroll
              for (int i = 0; i < NT; ++i) dst[2 * i + ntp] = transpose8x8(p == 0 ? x0[i] : x1[i]);
            }
          }
        }
    }
  } else {
    // ---- W_zᵀ = Zᵀ Lᵀ (Z = w ⊙ v), fp32 accumulator tiles; Lᵀ fragments loaded per value block ----
    auto zval = [&](int j, int vv) -> float {
      const float wv = chan_bw ? to_f(s.u.vw.w[j][vv]) : s.wrow[j];
      return wv * to_f(s.u.vw.v[j][vv]);
    };
    const int nvb = static_cast<int>(A.V / 16);
    for (int vb = warp - NH; vb < nvb; vb += NH) {
      uint32_t za[4][NT * 4];
#pragma unroll
      for (int kb = 0; kb < 4; ++kb)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          const int vv = 16 * vb + g + ((reg & 1) ? 8 : 0), j = 16 * kb + 2 * t + ((reg & 2) ? 8 : 0);
          uint32_t x[NT];
          split2<NT>(zval(j, vv), zval(j + 1, vv), x);
#pragma unroll
          for (int i = 0; i < NT; ++i) za[kb][4 * i + reg] = x[i];
        }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kb = 0; kb <= nt / 2; ++kb) {
          uint32_t lt[NT * 2];
          const int r = 8 * nt + g;
#pragma unroll
          for (int reg = 0; reg < 2; ++reg)
#pragma unroll
            for (int i = 0; i < NT; ++i) lt[2 * i + reg] = s.u.vw.L[i][r][8 * kb + t + 4 * reg];
          mma_split<NT, NT>(acc, za[kb], lt);
        }
        const int slot = ((vb * 4 + nt / 2) * 2 + (nt & 1)) * 32 + lane;
        *reinterpret_cast<float4*>(blob + Lw::kWZ + static_cast<int64_t>(slot) * 16) =
            make_float4(acc[0], acc[1], acc[2], acc[3]);
      }
    }
  }
}

// Without A.ready: one block per (chunk, head), grid (grid_chunks, H). With it (the overlapped
// forward): a persistent grid whose blocks take the (chunk, head) items in the order the state
// pass walks them (the chunk's index in its sequence first when no cu_seqlens is given, so that
// every sequence's next chunk is ready at about the same time), publishing each blob when it is
// written. It lets the state pass launch at once (programmatic dependent launch), which then waits
// for the flags, not for this grid: if that launch is not overlapped (no support, a profiler, a
// sanitizer), the state pass simply starts after this grid and finds every flag set.
template <class InT, int K, int NT, int NTQ, int NW, bool BWD>
__global__ void __launch_bounds__(NW * 32, NW == 8 ? 2 : 1) prep_kernel(const Args A, int64_t grid_chunks) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (!A.ready) {
    prep_item<InT, K, NT, NTQ, NW, BWD, false>(A, grid_chunks, blockIdx.x, blockIdx.y, smem_raw);
    return;
  }
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int64_t items = grid_chunks * A.H;
  const int64_t lanes = A.N * A.H;
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    int64_t gc, h;
    if (!A.overlap_seq_major) {  // i = (ci * N + seq) * H + h, gc = seq * chunks_per_seq + ci
      const int64_t ci = i / lanes, rest = i % lanes;
      gc = (rest / A.H) * A.chunks_per_seq + ci;
      h = rest % A.H;
    } else {
      gc = i / A.H;
      h = i % A.H;
    }
    prep_item<InT, K, NT, NTQ, NW, BWD, NW == 8 && !BWD>(A, grid_chunks, gc, h, smem_raw);
    ready_publish(A.ready + gc * A.H + h);  // also the barrier before the next item reuses smem
  }
}

// Chunk bases of packed sequences: base[n] = sum_{m<n} ceil(len_m / 64), one block.
__global__ void chunk_base_kernel(const Args A, int64_t* base) {
  __shared__ int64_t sums[1024];
  const int tid = threadIdx.x;
  const int64_t N = A.N, per = (N + 1023) / 1024;
  const int64_t lo = tid * per < N ? tid * per : N;
  const int64_t hi = lo + per < N ? lo + per : N;
  int64_t mine = 0;
  for (int64_t i = lo; i < hi; ++i) mine += (seq_span(A, i).len + kC - 1) / kC;
  sums[tid] = mine;
  __syncthreads();
  for (int o = 1; o < 1024; o <<= 1) {
    const int64_t x = tid >= o ? sums[tid - o] : 0;
    __syncthreads();
    sums[tid] += x;
    __syncthreads();
  }
  int64_t run = sums[tid] - mine;
  for (int64_t i = lo; i < hi; ++i) {
    base[i] = run;
    run += (seq_span(A, i).len + kC - 1) / kC;
  }
  if (tid == 1023) base[N] = sums[1023];
}

template <class InT, int K, int NT, int NTQ, int NW>
cudaError_t launch_prep_t(const Args& A, int64_t grid_chunks, cudaStream_t st) {
  const int smem = static_cast<int>(sizeof(PrepSmem<InT, K>));
  auto kern = A.bws ? prep_kernel<InT, K, NT, NTQ, NW, true> : prep_kernel<InT, K, NT, NTQ, NW, false>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  if (grid_chunks == 0 || A.H == 0) return cudaSuccess;
  if (A.ready) {
    // persistent: the blocks that fit beside the state pass's (prep_free_slots: run_forward)
    int per_sm = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, NW * 32, smem);
    if (e != cudaSuccess) return e;
    const int64_t items = grid_chunks * A.H, sms = num_sms();
    int64_t blocks = int64_t{per_sm} * sms - A.prep_free_slots;
    // at least half the machine's prep blocks (a forced overlap of many walkers); with one prep
    // block a multiprocessor (the fp32 inputs' pass) the walkers still get multiprocessors of
    // their own
    const int64_t least = (int64_t{per_sm} * sms + 1) / 2;
    if (blocks < least) blocks = least;
    if (blocks > items) blocks = items;
    kern<<<dim3(static_cast<unsigned>(blocks)), NW * 32, smem, st>>>(A, grid_chunks);
    return cudaGetLastError();
  }
  kern<<<dim3(static_cast<unsigned>(grid_chunks), static_cast<unsigned>(A.H)), NW * 32, smem, st>>>(
      A, grid_chunks);
  return cudaGetLastError();
}

// Benchmark hook: QEDCHECK_CHUNKED_PREP_WARPS=4 runs the bf16 modes' prep pass with four warps per
// block instead of eight (the same arithmetic in the same order: bitwise equal results), for the
// side-by-side table in reports/device/chunked.md.
bool prep_four_warps() {
  const char* e = std::getenv("QEDCHECK_CHUNKED_PREP_WARPS");
  return e && std::strcmp(e, "4") == 0;
}

template <int K>
cudaError_t launch_prep_bf16(const Args& A, Mode m, int64_t grid_chunks, cudaStream_t st) {
  const bool four = prep_four_warps();
  if (m == Mode::bf16_single)
    return four ? launch_prep_t<__nv_bfloat16, K, 1, 1, 4>(A, grid_chunks, st)
                : launch_prep_t<__nv_bfloat16, K, 1, 1, 8>(A, grid_chunks, st);
  return four ? launch_prep_t<__nv_bfloat16, K, 2, 1, 4>(A, grid_chunks, st)
              : launch_prep_t<__nv_bfloat16, K, 2, 1, 8>(A, grid_chunks, st);
}

}  // namespace

namespace {
// f(BwdLayout<K, NT>{}) for the runtime head size and mode: the one place that maps them.
template <class F>
int64_t with_bwd_layout(int K, Mode m, F f) {
  const int nt = mode_nt(m);
  if (K == 64)
    return nt == 3 ? f(BwdLayout<64, 3>{}) : (nt == 2 ? f(BwdLayout<64, 2>{}) : f(BwdLayout<64, 1>{}));
  return nt == 3 ? f(BwdLayout<128, 3>{}) : (nt == 2 ? f(BwdLayout<128, 2>{}) : f(BwdLayout<128, 1>{}));
}
}  // namespace

int64_t bwd_blob_bytes(int K, Mode m) {
  return with_bwd_layout(K, m, [](auto L) { return decltype(L)::bytes; });
}

int64_t bwd_lm_offset(int K, Mode m) {
  return with_bwd_layout(K, m, [](auto L) { return decltype(L)::kLM; });
}

int64_t bwd_pj_offset(int K, Mode m) {
  return with_bwd_layout(K, m, [](auto L) { return decltype(L)::kPJ; });
}

int prep_smem_bytes(int K, bool fp32_inputs) {
  if (K == 64)
    return fp32_inputs ? sizeof(PrepSmem<float, 64>) : sizeof(PrepSmem<__nv_bfloat16, 64>);
  return fp32_inputs ? sizeof(PrepSmem<float, 128>) : sizeof(PrepSmem<__nv_bfloat16, 128>);
}

cudaError_t launch_chunk_base(const Args& A, int64_t* base, cudaStream_t st) {
  chunk_base_kernel<<<1, 1024, 0, st>>>(A, base);
  return cudaGetLastError();
}

cudaError_t launch_prep(const Args& A, bool fp32_inputs, Mode m, int64_t grid_chunks,
                        cudaStream_t st) {
  // fp32 inputs take the fp32 mode (three-term split); bf16 inputs a bf16 mode.
  if (fp32_inputs != (m == Mode::fp32)) return cudaErrorInvalidValue;
  if (fp32_inputs) {
    if (A.K == 64) return launch_prep_t<float, 64, 3, 3, 4>(A, grid_chunks, st);
    return launch_prep_t<float, 128, 3, 3, 4>(A, grid_chunks, st);
  }
  if (A.K == 64) return launch_prep_bf16<64>(A, m, grid_chunks, st);
  return launch_prep_bf16<128>(A, m, grid_chunks, st);
}

}  // namespace qed::kernels::chunked
