// Device pieces shared by the two chunked-forward kernels: launch arguments, the split-bf16
// tensor-core product (mma.sync m16n8k16, fp32 accumulation), and the workspace layout through
// which the chunk-parallel pass (chunked_prep.cu) hands its matrices to the sequential state
// pass (chunked_state.cu) in the exact register-fragment order the latter consumes; and the
// host-side limits that the chunked forward and backward entry points share.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/api.hpp"
#include "kernels/chunked_api.hpp"

namespace qed::kernels::chunked {

// The limits both chunked entry points share (checked after the generic validate_* checks):
// K and V in {64, 128}, q in bf16 or fp32. `fn` prefixes the message as every API message is.
inline Status check_built_sizes(const char* fn, const Problem& pr, DType q_dtype) {
  auto unsupported = [fn](const std::string& msg) -> Status {
    return {StatusCode::unsupported, std::string(fn) + ": " + msg};
  };
  if (pr.K != 64 && pr.K != 128)
    return unsupported("K = " + std::to_string(pr.K) + " is not built (K must be 64 or 128)");
  if (pr.V != 64 && pr.V != 128)
    return unsupported("V = " + std::to_string(pr.V) + " is not built (V must be 64 or 128)");
  if (q_dtype != DType::bf16 && q_dtype != DType::fp32)
    return unsupported(std::string("q dtype ") + to_string(q_dtype) + " (bf16 or fp32 only)");
  return {};
}

constexpr int kC = 64;       // chunk size
constexpr int kThreads = 128;  // both kernels: 4 warps
constexpr float kLog2e = 1.4426950408889634f;
// Largest in-block exponent (base 2) that the factored diagonal-block product may use; a channel
// whose decay over one 16-row block exceeds it takes the element-wise path (MATH.md §4.6).
constexpr float kMaxDiagExp2 = 64.f;

enum : int { kGdn2 = 0, kQed = 1, kKda = 2, kGdn = 3, kDeltanet = 4 };
enum : int { kArmNone = 0, kArmFull = 1, kArmNogate = 2, kArmNoproj = 3, kArmRand = 4 };

struct Seq {
  const void* p = nullptr;
  int64_t sb = 0, st = 0, sh = 0;
  int dt = 0;  // DType: 0 fp32, 1 bf16
};

struct Args {
  int variant = 0, arm = 0;
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0, N = 0;
  float scale = 1.f;
  const int64_t* cu = nullptr;          // device [N+1] or null
  const int64_t* chunk_base = nullptr;  // device [N+1] (varlen) or null
  int64_t chunks_per_seq = 0;           // without cu
  int64_t chunk_bound = 0;              // workspace blobs per head
  Seq q, k, v, g, b, w, beta;
  const float* lambda = nullptr;
  const float* r = nullptr;
  const float* h0 = nullptr;
  int64_t h0_sn = 0, h0_sh = 0, h0_sk = 0;
  void* o = nullptr;
  int64_t o_sb = 0, o_st = 0, o_sh = 0;
  int o_dt = 0;
  float* ht = nullptr;
  int64_t ht_sn = 0, ht_sh = 0, ht_sk = 0;
  float* cs = nullptr;  // chunk states
  int64_t cs_sn = 0, cs_sh = 0, cs_sk = 0;
  char* ws = nullptr;
  int64_t blob = 0;  // bytes per (chunk, head)
  int vec = 0;       // q, k, b rows may be read in 16-byte pieces
  int vec_g = 0;     // g too (channel g of q's dtype)
  int vec_vw = 0;    // v, w too
  int vec_do = 0;    // do rows of a value tile too (the backward's sweep)
  float max_diag = kMaxDiagExp2;
  int prep_stop = 0;  // benchmark hook: the prep pass returns after its phase prep_stop (0: none)
  int load_mutant = 0;  // testing hook: the state pass's bulk loads leave out the chunk decay
  int state_nw = 0;     // the state pass's warps as the forward's plan chose them (0: state_warps())
  // The overlapped forward (chunked_forward.cu, choose_plan): one flag per (chunk, head),
  // chunk * H + h, zeroed before the prep pass, which sets it once that blob is written; the state
  // pass, launched while the prep pass still runs, waits for it before reading the blob. Null:
  // the passes run one after the other and nothing is flagged.
  unsigned* ready = nullptr;
  int overlap_seq_major = 0;  // the persistent prep pass's order: 0 chunk index first (no cu), 1 global chunks
  int64_t prep_free_slots = 0;  // prep blocks per device the persistent grid leaves room for
  int ready_mutant = 0;  // testing hook: the state pass does not wait for the flags
  int split_mutant = 0;  // testing hook: the read-out warps (SPLIT) read the other chunk's Sᵀ and Uᵀ
  // Set only by the chunked backward's recomputing forward (chunked_backward.cu): the prep pass
  // also writes the backward's blob of every (chunk, head) (BwdLayout, bblob bytes each, at bws),
  // and the state pass stores U of every chunk, fp32 [chunk][H][kC][V], at u_out.
  char* bws = nullptr;
  int64_t bblob = 0;
  float* u_out = nullptr;
  // The backward's reverse sweep (chunked_bwd_sweep.cu): do (q's dtype) and dht in; the adjoint
  // of every chunk's end state, fp32 [chunk][H][K][V] (ds), Ū, fp32 [chunk][H][kC][V] (ubar), and
  // dh0 out. The blobs, chunk bases and shapes are the recompute's.
  Seq dout;
  const float* dht = nullptr;
  int64_t dht_sn = 0, dht_sh = 0, dht_sk = 0;
  float* ds = nullptr;
  float* ubar = nullptr;
  float* dh0 = nullptr;
  int64_t dh0_sn = 0, dh0_sh = 0, dh0_sk = 0;
};

// ---- sequences and chunks ----

struct Span {
  int64_t brow, bos, len;
};

__device__ __forceinline__ Span seq_span(const Args& A, int64_t n) {
  if (!A.cu) return {n, 0, A.T};
  int64_t s = A.cu[n], e = A.cu[n + 1];
  s = s < 0 ? 0 : (s > A.T ? A.T : s);
  e = e < s ? s : (e > A.T ? A.T : e);
  return {0, s, e - s};
}

__device__ __forceinline__ int64_t first_chunk(const Args& A, int64_t n) {
  return A.cu ? A.chunk_base[n] : n * A.chunks_per_seq;
}

__device__ __forceinline__ char* blob_ptr(const Args& A, int64_t chunk, int64_t h) {
  return A.ws + (chunk * A.H + h) * A.blob;
}

// ---- the overlapped forward's hand-over (Args::ready) ----

// Prep pass, after every thread of the block has written the blob of (chunk, head): thread 0
// publishes it (the block barrier orders the block's stores before its release at gpu scope).
__device__ __forceinline__ void ready_publish(unsigned* flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flag), "r"(1u) : "memory");
  }
}

// State pass, one warp: lane 0 waits (acquire at gpu scope) until the blob is published, then the
// warp's lanes order their later copies (bulk copies run in the async proxy) after that acquire.
__device__ __forceinline__ void ready_wait(const unsigned* flag, int lane) {
  if (lane == 0) {
    unsigned v = 0;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
      if (v != 0) break;
      __nanosleep(64);
    }
  }
  __syncwarp();
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---- element access ----

__device__ __forceinline__ float ld_any(const void* p, int64_t i, int dt) {
  if (dt == 0) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// ---- split bf16 operands ----
// x = t0 + t1 + ... (each term bf16, round-to-nearest); N = 2 keeps about 16 significant bits,
// N = 3 all 24 of fp32. A pair (x, y) packs into one 32-bit register per term, x in the low half
// (the lower column or row index of an mma fragment).
template <int N>
__device__ __forceinline__ void split2(float x, float y, uint32_t* out) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    out[i] = *reinterpret_cast<uint32_t*>(&h);
    if (i + 1 < N) {
      x -= __low2float(h);
      y -= __high2float(h);
    }
  }
}

__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, const uint32_t* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += A B with A given as NA split terms (a[i*4 .. i*4+3]) and B as NB terms (b[j*2 ..]):
// the products t_i t'_j with i + j < max(NA, NB), smallest first.
template <int NA, int NB>
__device__ __forceinline__ void mma_split(float* d, const uint32_t* a, const uint32_t* b) {
  constexpr int NM = NA > NB ? NA : NB;
#pragma unroll
  for (int s = NM - 1; s >= 0; --s) {
#pragma unroll
    for (int i = 0; i < NA; ++i) {
      const int j = s - i;
      if (j >= 0 && j < NB) mma16816(d, a + 4 * i, b + 2 * j);
    }
  }
}

// ---- ldmatrix: four 8 x 8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 ----
// Without .trans lane 4g+t receives row g, columns 2t, 2t+1 of each matrix; with .trans row g of
// its transpose (rows 2t, 2t+1 of column g).
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// ---- cp.async ----

__device__ __forceinline__ void cp16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  // The clobber keeps the compiler from moving shared-memory reads above the wait.
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// One warp copies `bytes` (a multiple of 16) from global to shared memory.
__device__ __forceinline__ void warp_copy(void* dst, const void* src, int bytes, int lane) {
  for (int i = lane; i < bytes / 16; i += 32)
    cp16(static_cast<char*>(dst) + 16 * i, static_cast<const char*>(src) + 16 * i);
}

// ---- workspace layout of one (chunk, head) blob ----
// Fragment coordinates: lane = 4g + t (g = lane/4, t = lane%4). A "slot" is one lane's part of
// one fragment: NT (or NTQ) split terms x 2 registers (B fragments), or 4 fp32 (accumulators).
//  WA  B-fragments of -W_aᵀ (k: channel block kb, n: chunk rows 16w+8nt..): [w][kb][nt][lane]
//  QT  B-fragments of Q̃ᵀ, same indexing, NTQ terms
//  KH  B-fragments of K̂ (k: chunk-row block kb, n: channels s*K/4 + 8nt..): [s][kb][nt][lane]
//  MM  B-fragments of Mᵀ (k: column block kb, n: rows 16w+8nt..): [w][kb][nt][lane], kb <= w
//  WZ  accumulator tiles of W_zᵀ (m: value block vb, n: rows 16w+8nt..): [vb][w][nt][lane]
//  GC  the chunk's total decay exp(G_last), K floats
template <int K, int NT, int NTQ>
struct WsLayout {
  static constexpr int64_t kWA = 0;
  static constexpr int64_t nWA = 4LL * (K / 16) * 2 * 32 * NT * 8;
  static constexpr int64_t kQT = kWA + nWA;
  static constexpr int64_t nQT = 4LL * (K / 16) * 2 * 32 * NTQ * 8;
  static constexpr int64_t kKH = kQT + nQT;
  static constexpr int64_t nKH = 4LL * 4 * (K / 32) * 32 * NT * 8;
  static constexpr int64_t kMM = kKH + nKH;
  static constexpr int64_t nMM = 4LL * 4 * 2 * 32 * NTQ * 8;
  static constexpr int64_t kGC = kMM + nMM;
  static constexpr int64_t nGC = 4LL * K;
  static constexpr int64_t kWZ = kGC + nGC;
  // + V/16 * 4 KB of WZ
  static constexpr int64_t wz_bytes(int64_t V) { return (V / 16) * 4 * 2 * 32 * 16; }
  static constexpr int64_t blob_bytes(int64_t V) { return ((kWZ + wz_bytes(V)) + 255) / 256 * 256; }
};

// ---- the backward's blob of one (chunk, head) ----
// What the reverse sweep of the backward (chunked_bwd_sweep.cu) consumes, B-fragments as in WsLayout,
// and L for the chunk-parallel gradient pass (chunked_bwd_grads.cu):
//  KT  K̂ᵀ (k: channel block kb, n: chunk rows 16w+8nt..)                 [w][kb][nt][lane], NT terms
//  MN  s M (k: row block kb of M, n: columns 16w+8nt.. of M; kb >= w)     [w][kb][nt][lane], NT terms
//  WN  -W_a (k: chunk-row block kb, n: channels s*K/4 + 8nt..)            [s][kb][nt][lane], NT terms
//  QN  s Q̃ (as WN)                                                        [s][kb][nt][lane], NT terms
//  LM  L = (I+T)^-1, fp32 [kC][kC] row-major
// KT has WA's layout and WN, QN have KH's: the sweep walks them as the state pass walks those.
// Every fragment takes the state path's NT terms (s M and s Q̃ feed the state adjoint).
template <int K, int NT>
struct BwdLayout {
  static constexpr int64_t kKT = 0;
  static constexpr int64_t nKT = 4LL * (K / 16) * 2 * 32 * NT * 8;
  static constexpr int64_t kMN = kKT + nKT;
  static constexpr int64_t nMN = 4LL * 4 * 2 * 32 * NT * 8;
  static constexpr int64_t kWN = kMN + nMN;
  static constexpr int64_t nWN = 4LL * 4 * (K / 32) * 32 * NT * 8;
  static constexpr int64_t kQN = kWN + nWN;
  static constexpr int64_t nQN = 4LL * 4 * (K / 32) * 32 * NT * 8;
  static constexpr int64_t kLM = kQN + nQN;
  static constexpr int64_t nLM = 4LL * kC * kC;
  // QED's projection per row: k.k and k.m (fp32 pairs; zero where the arm has no projection)
  static constexpr int64_t kPJ = kLM + nLM;
  static constexpr int64_t nPJ = 4LL * 2 * kC;
  static constexpr int64_t bytes = (kPJ + nPJ + 255) / 256 * 256;
};

// movmatrix: the 8 x 8 b16 matrix whose row g, columns 2t, 2t+1 lane 4g+t holds (the layout of an
// mma accumulator or A-fragment quarter) comes back transposed in the same layout.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// ---- entry points of the two device translation units ----
// Precision modes: split terms of state-path operands (NT) and of read-out operands (NTQ).
enum class Mode : int { bf16 = 0, fp32 = 1, bf16_single = 2 };
constexpr int mode_nt(Mode m) { return m == Mode::fp32 ? 3 : (m == Mode::bf16 ? 2 : 1); }
constexpr int mode_ntq(Mode m) { return m == Mode::fp32 ? 3 : 1; }

int64_t blob_bytes(int K, int64_t V, Mode m);
int64_t bwd_blob_bytes(int K, Mode m);
int64_t bwd_lm_offset(int K, Mode m);  // of L in the backward's blob
int64_t bwd_pj_offset(int K, Mode m);  // of the per-row (k.k, k.m) pairs in the backward's blob
// Shared memory the launches need (to check against the device limit).
int prep_smem_bytes(int K, bool fp32_inputs);
int state_smem_bytes(int K, int MT, Mode m, bool overlap = false);
// warps per block of the state pass: 4, or 8 at K = 128 in the overlapped forward or on request;
// split_ok (bf16, one value tile): the overlapped forward takes the SPLIT instance (4 walking warps)
int state_warps(int K, bool overlap = false, bool split_ok = false);
bool state_split();  // QEDCHECK_CHUNKED_STATE_SPLIT=0 turns the read-out warps off
cudaError_t launch_chunk_base(const Args& A, int64_t* base, cudaStream_t st);
cudaError_t launch_prep(const Args& A, bool fp32_inputs, Mode m, int64_t grid_chunks,
                        cudaStream_t st);
cudaError_t launch_state(const Args& A, Mode m, int MT, cudaStream_t st);
// The chunked backward's recompute (chunked_backward.cu): the forward of bf16 inputs in Mode::bf16
// whose prep pass also writes the backward's blobs (bblob bytes per (chunk, head) at bws) and whose
// state pass stores U (u_out); `used` receives its launch arguments (blobs, chunk bases). The
// forward's workspace must be given (the backward keeps it).
struct BwdHooks {
  char* bws = nullptr;
  int64_t bblob = 0;
  float* u_out = nullptr;
};
Status forward_for_backward(const ChunkedForwardParams& p, const BwdHooks& hooks, Args* used);
// What forward_for_backward would put into `used`, without launching anything (the backward after
// chunked_forward_saving).
Args recompute_args(const ChunkedForwardParams& p, const BwdHooks& hooks);
size_t forward_workspace_bytes(const Problem& pr, Mode m);  // of the forward in mode m
int num_sms();  // multiprocessors of the current device (cached)
size_t ready_flag_bytes(const Problem& pr);  // the overlapped forward's flags in the workspace
// Whether a [B,T,H,D] tensor's rows may be read in 16-byte pieces (no tensor: nothing to read).
template <class Tensor>
inline bool rows_aligned16(const Tensor& t, int elem) {
  if (!t.data) return true;
  const int ve = 16 / elem;
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride_b % ve == 0 && t.stride_t % ve == 0 &&
         t.stride_h % ve == 0;
}
// The backward's reverse sweep (chunked_bwd_sweep.cu), value tiles of 16*MT columns.
cudaError_t launch_sweep(const Args& A, Mode m, int MT, cudaStream_t st);

}  // namespace qed::kernels::chunked
