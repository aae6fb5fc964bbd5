// Recurrent forward (MATH.md §3) over whole sequences, and the decode step built on it.
// One block = one (sequence, head) and a slice of BV value columns; the state tile stays in
// registers for the whole sequence. Steps come in chunks of Tc = nwarps: each warp prepares one
// step's vectors (decay, erase vector, scaled query, z) into shared memory, double-buffered, with
// the next chunk's loads issued before the current chunk's recurrence so that their latency hides.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/api.hpp"
#include "kernels/recurrent_common.cuh"
#include "kernels/recurrent_launch.cuh"

namespace qed::kernels::detail {

// One step S <- D S + k u^T, u = z - (D S)^T a, o = S^T (scale q) on this thread's tile, from the
// step's vectors in shared memory. Shared by the sequence and decode kernels so that a decode step
// is bitwise the forward's step.
template <int K>
__device__ __forceinline__ void step_tile(float (&S)[Tile<K>::NR][4], const float* vec,
                                          float4 zq, int r, float (&o)[4]) {
  using Tl = Tile<K>;
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
  for (int e = 0; e < 4; ++e) o[e] = 0.f;
#pragma unroll
  for (int f = 0; f < Tl::NQ; ++f) {
    const int rb = (f * Tl::R + r) * 4;
    const float4 qq = *reinterpret_cast<const float4*>(vec + 2 * K + rb);
    const float4 kk = *reinterpret_cast<const float4*>(vec + 3 * K + rb);
    const float qv[4] = {qq.x, qq.y, qq.z, qq.w};
    const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
    for (int e2 = 0; e2 < 4; ++e2)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[f * 4 + e2][e] = fmaf(kv[e2], u[e], S[f * 4 + e2][e]);
        o[e] = fmaf(qv[e2], S[f * 4 + e2][e], o[e]);
      }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = allreduce_r<Tl::R>(o[e]);
}

// One token per sequence (decode, or any T = 1 call): every warp is independent. It prepares the
// step's vectors for its own columns in its own shared-memory slice (no block barrier), so blocks
// are small, many are resident, and state traffic from some overlaps preparation in others.
template <int K>
__global__ void __launch_bounds__(256, 2) rec_decode_kernel(RecArgs A) {
  using Tl = Tile<K>;
  extern __shared__ float4 smem4[];  // nwarps slices of 4 K + CPW floats
  float* sm = reinterpret_cast<float*>(smem4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane % Tl::R, cq = lane / Tl::R;
  // Flat grid: value blocks fastest, then heads, then sequences, so that consecutive blocks read
  // consecutive parts of one sequence's [H,K,V] state (DRAM page locality). The (N, H, value
  // blocks) grid is kept for side-by-side measurement (QED_REC_DECODE_GRID=nhz).
  int64_t n, h, vz;
  if (A.decode_flat) {
    const int64_t nz = (A.V + A.nwarps * Tl::CPW - 1) / (A.nwarps * Tl::CPW);
    vz = blockIdx.x % nz;
    n = blockIdx.x / nz / A.H;
    h = blockIdx.x / nz % A.H;
  } else {
    n = blockIdx.x, h = blockIdx.y, vz = blockIdx.z;
  }
  const int wcol = static_cast<int>(vz * A.nwarps + warp) * Tl::CPW;
  if (wcol >= A.V) return;  // whole warp past V; no block barrier follows
  const int64_t j0 = wcol + cq * 4;
  const bool colok = j0 < A.V;
  float* vec = sm + warp * (4 * K + Tl::CPW);
  RawStep<K> raw;
  load_raw<K>(A, n, 0, h, true, wcol, Tl::CPW, raw);
  int64_t slot = n;
  if (A.slots) {
    slot = A.slots[n];
    if (slot < 0 || slot >= A.nslots) return;  // padding entry: nothing read or written
  }
  float S[Tl::NR][4];
  {
    const bool ld = A.h0.p != nullptr && colok;
    const float* base = A.h0.p + (ld ? slot * A.h0.sn + h * A.h0.sh + j0 : 0);
#pragma unroll
    for (int i = 0; i < Tl::NR; ++i) {
      const float4 x = ld4_if(base + (ld ? Tl::row(r, i) * A.h0.sk : 0), ld);
      S[i][0] = x.x; S[i][1] = x.y; S[i][2] = x.z; S[i][3] = x.w;
    }
  }
  prepare_step<K>(A, h, raw, wcol, Tl::CPW, vec, vec + 4 * K);
  __syncwarp();
  float o[4];
  step_tile<K>(S, vec, *reinterpret_cast<const float4*>(vec + 4 * K + cq * 4), r, o);
  if (A.o.p && colok && r < 4) {
    const float ov = r == 0 ? o[0] : (r == 1 ? o[1] : (r == 2 ? o[2] : o[3]));
    stf(A.o.p, seq_off(A.o, n, 0, h) + j0 + r, A.o.dt, ov);
  }
  if (A.ht.p && colok) {
    float* base = A.ht.p + slot * A.ht.sn + h * A.ht.sh + j0;
#pragma unroll
    for (int i = 0; i < Tl::NR; ++i)
      *reinterpret_cast<float4*>(base + Tl::row(r, i) * A.ht.sk) =
          make_float4(S[i][0], S[i][1], S[i][2], S[i][3]);
  }
}

template <int K>
__global__ void __launch_bounds__(256) rec_forward_kernel(RecArgs A) {
  using Tl = Tile<K>;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  const int nw = A.nwarps;
  const int Tc = nw;
  const int BV = nw * Tl::CPW;
  const int stepf = 4 * K + BV;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane % Tl::R, cq = lane / Tl::R;
  const int64_t n = blockIdx.x, h = blockIdx.y;
  const int vbase = blockIdx.z * BV;
  const int jloc = warp * Tl::CPW + cq * 4;
  const int64_t j0 = vbase + jloc;
  const bool colok = j0 < A.V;

  const SeqSpan sp = seq_span(A, n);
  const int64_t len = sp.eos - sp.bos;
  float* buf0 = sm;
  float* buf1 = sm + Tc * stepf;
  const int64_t nch = (len + Tc - 1) / Tc;
  // Issue the first chunk's input loads, then the state's, before waiting on either.
  RawStep<K> raw;
  load_raw<K>(A, sp.b, sp.bos + warp, h, nch > 0 && warp < len, vbase, BV, raw);
  int64_t slot = n;
  if (A.slots) {
    slot = A.slots[n];
    if (slot < 0 || slot >= A.nslots) return;  // padding entry: nothing read or written
  }
  float S[Tl::NR][4];
  {
    const bool ld = A.h0.p != nullptr && colok;
    const float* base = A.h0.p + (ld ? slot * A.h0.sn + h * A.h0.sh + j0 : 0);
#pragma unroll
    for (int i = 0; i < Tl::NR; ++i) {
      const float4 x = ld4_if(base + (ld ? Tl::row(r, i) * A.h0.sk : 0), ld);
      S[i][0] = x.x; S[i][1] = x.y; S[i][2] = x.z; S[i][3] = x.w;
    }
  }
  prepare_step<K>(A, h, raw, vbase, BV, buf0 + warp * stepf, buf0 + warp * stepf + 4 * K);
  __syncthreads();

  for (int64_t c = 0; c < nch; ++c) {
    const float* cur = (c & 1) ? buf1 : buf0;
    float* nxt = (c & 1) ? buf0 : buf1;
    const int64_t t0 = c * Tc;
    if (A.ckpt && colok) {
      float* base = A.ckpt + (ckpt_index(A, n, sp.bos, c) * A.H + h) * K * A.V + j0;
#pragma unroll
      for (int i = 0; i < Tl::NR; ++i)
        *reinterpret_cast<float4*>(base + Tl::row(r, i) * A.V) =
            make_float4(S[i][0], S[i][1], S[i][2], S[i][3]);
    }
    const bool more = c + 1 < nch;
    {
      const int64_t tn = t0 + Tc + warp;  // issued now, used after this chunk's steps
      load_raw<K>(A, sp.b, sp.bos + tn, h, more && tn < len, vbase, BV, raw);
    }
    const int steps = static_cast<int>(len - t0 < Tc ? len - t0 : Tc);
    for (int s = 0; s < steps; ++s) {
      const float* vec = cur + s * stepf;
      float o[4];
      step_tile<K>(S, vec, *reinterpret_cast<const float4*>(vec + 4 * K + jloc), r, o);
      if (A.o.p && colok && r < 4) {
        const float ov = r == 0 ? o[0] : (r == 1 ? o[1] : (r == 2 ? o[2] : o[3]));
        stf(A.o.p, seq_off(A.o, sp.b, sp.bos + t0 + s, h) + j0 + r, A.o.dt, ov);
      }
    }
    if (more) prepare_step<K>(A, h, raw, vbase, BV, nxt + warp * stepf, nxt + warp * stepf + 4 * K);
    __syncthreads();
  }

  if (A.ht.p && colok) {
    float* base = A.ht.p + slot * A.ht.sn + h * A.ht.sh + j0;
#pragma unroll
    for (int i = 0; i < Tl::NR; ++i)
      *reinterpret_cast<float4*>(base + Tl::row(r, i) * A.ht.sk) =
          make_float4(S[i][0], S[i][1], S[i][2], S[i][3]);
  }
}

Status cached_device_status() {
  static const Status s = device_status();
  return s;
}

int num_sms() {
  static int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 132;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 132;
    return n;
  }();
  return sms;
}

int columns_per_warp(int64_t K) {
  switch (K) {
    case 16: return Tile<16>::CPW;
    case 32: return Tile<32>::CPW;
    case 64: return Tile<64>::CPW;
    case 128: return Tile<128>::CPW;
    default: return Tile<256>::CPW;
  }
}

namespace {

template <int K>
Status launch_k(const char* fn, const RecArgs& A0, int nw, cudaStream_t stream) {
  RecArgs A = A0;
  A.nwarps = nw;
  const int BV = nw * Tile<K>::CPW;
  const size_t smem = sizeof(float) * 2 * nw * (4 * K + BV);
  static bool attr_set = false;  // raised once, before any graph capture can start
  if (!attr_set) {
    Status s = cuda_status(fn, "cudaFuncSetAttribute",
                           cudaFuncSetAttribute(rec_forward_kernel<K>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                96 * 1024));
    if (!s.ok()) return s;
    attr_set = true;
  }
  const int64_t nvblk = (A.V + BV - 1) / BV;
  if (A.N == 0) return {};
  dim3 grid(static_cast<unsigned>(A.N), static_cast<unsigned>(A.H), static_cast<unsigned>(nvblk));
  rec_forward_kernel<K><<<grid, nw * 32, smem, stream>>>(A);
  return cuda_status(fn, "kernel launch", cudaGetLastError());
}

// Warps per block (= steps per chunk). Long sequences: enough warps to cover V (up to 8), so that
// the next chunk's loads have 8 steps of work to hide behind; fewer only when blocks would leave
// most multiprocessors idle. One-token calls (decode): small blocks, several resident per
// multiprocessor, so that one block's memory traffic overlaps another's preparation.
int choose_warps(const RecArgs& A) {
  if (const char* e = std::getenv("QED_REC_WARPS")) {  // tuning override (bench/), 1..8
    const int w = std::atoi(e);
    if (w >= 1 && w <= 8) return w;
  }
  const int cpw = columns_per_warp(A.K);
  const int64_t lanes = A.N * A.H;
  auto blocks = [&](int nw) { return lanes * ((A.V + nw * cpw - 1) / (nw * cpw)); };
  if (!A.cu && A.T == 1) return blocks(2) >= 2 * num_sms() ? 2 : 1;
  int nw = static_cast<int>(std::min<int64_t>(8, (A.V + cpw - 1) / cpw));
  while (nw > 1 && 2 * blocks(nw) < num_sms()) nw /= 2;
  return std::max(nw, 1);
}

template <int K>
Status launch_decode_k(const char* fn, const RecArgs& A0, cudaStream_t stream) {
  RecArgs A = A0;
  const int cpw = Tile<K>::CPW;
  const int64_t warps = A.N * A.H * ((A.V + cpw - 1) / cpw);
  A.nwarps = warps >= 16 * num_sms() ? 4 : 1;  // one-warp blocks spread small batches wider
  // Tuning overrides, for bench/bench_recurrent.py's side-by-side table: warps per block (1..8)
  // and the grid order (flat | nhz).
  if (const char* e = std::getenv("QED_REC_DECODE_WARPS")) {
    const int w = std::atoi(e);
    if (w >= 1 && w <= 8) A.nwarps = w;
  }
  if (const char* e = std::getenv("QED_REC_DECODE_GRID")) A.decode_flat = std::string(e) != "nhz";
  const int64_t nz = (A.V + A.nwarps * cpw - 1) / (A.nwarps * cpw);
  const size_t smem = static_cast<size_t>(A.nwarps) * (4 * K + cpw) * sizeof(float);
  if (A.N == 0) return {};
  if (A.decode_flat) {
    const int64_t blocks = A.N * A.H * nz;
    if (blocks > (int64_t{1} << 31) - 1)
      return {StatusCode::unsupported, std::string(fn) + ": N * H * value blocks exceeds 2^31 - 1"};
    rec_decode_kernel<K><<<static_cast<unsigned>(blocks), A.nwarps * 32, smem, stream>>>(A);
  } else {
    dim3 grid(static_cast<unsigned>(A.N), static_cast<unsigned>(A.H), static_cast<unsigned>(nz));
    rec_decode_kernel<K><<<grid, A.nwarps * 32, smem, stream>>>(A);
  }
  return cuda_status(fn, "decode kernel launch", cudaGetLastError());
}

Status launch_rec_decode(const char* fn, const RecArgs& A, cudaStream_t stream) {
  switch (A.K) {
    case 16: return launch_decode_k<16>(fn, A, stream);
    case 32: return launch_decode_k<32>(fn, A, stream);
    case 64: return launch_decode_k<64>(fn, A, stream);
    case 128: return launch_decode_k<128>(fn, A, stream);
    case 256: return launch_decode_k<256>(fn, A, stream);
  }
  return {StatusCode::unsupported, std::string(fn) + ": K not built"};
}

}  // namespace

Status launch_rec_forward(const char* fn, const RecArgs& A, int nw, cudaStream_t stream) {
  switch (A.K) {
    case 16: return launch_k<16>(fn, A, nw, stream);
    case 32: return launch_k<32>(fn, A, nw, stream);
    case 64: return launch_k<64>(fn, A, nw, stream);
    case 128: return launch_k<128>(fn, A, nw, stream);
    case 256: return launch_k<256>(fn, A, nw, stream);
  }
  return {StatusCode::unsupported, std::string(fn) + ": K not built"};
}

}  // namespace qed::kernels::detail

namespace qed::kernels {

Status recurrent_forward(const RecurrentForwardParams& p) {
  const char* fn = "recurrent_forward";
  Status s;
  if (!(s = validate_problem(fn, p.problem)).ok()) return s;
  if (!(s = validate_inputs(fn, p.problem, p.in)).ok()) return s;
  if (!p.o.data) return {StatusCode::invalid_argument, std::string(fn) + ": o is required"};
  if (!(s = validate_output(fn, "o", p.problem, p.o)).ok()) return s;
  if (!(s = validate_state(fn, "ht", p.ht)).ok()) return s;
  if (p.state_indices && p.num_state_slots < 1)
    return {StatusCode::invalid_argument,
            std::string(fn) + ": state_indices given but num_state_slots < 1"};
  if (!(s = detail::cached_device_status()).ok()) return s;
  detail::RecArgs A = detail::make_args(p.problem, p.in);
  A.o = detail::seq_out_arg(p.o);
  A.ht = detail::state_out_arg(p.ht);
  A.slots = p.state_indices;
  A.nslots = p.num_state_slots;
  if (!A.cu && A.T == 1) return detail::launch_rec_decode(fn, A, p.problem.stream);
  return detail::launch_rec_forward(fn, A, detail::choose_warps(A), p.problem.stream);
}

Status recurrent_decode(const RecurrentDecodeParams& p) {
  const char* fn = "recurrent_decode";
  Status s;
  if (!(s = validate_problem(fn, p.problem)).ok()) return s;
  if (p.problem.T != 1 || p.problem.cu_seqlens)
    return {StatusCode::invalid_argument,
            std::string(fn) + ": a decode step needs T = 1 and no cu_seqlens (got T = " +
                std::to_string(p.problem.T) + ")"};
  Inputs in = p.in;
  in.h0 = StateTensor{};
  if (!(s = validate_inputs(fn, p.problem, in)).ok()) return s;
  if (!(s = validate_output(fn, "o", p.problem, p.o)).ok()) return s;
  if (!p.state.data) return {StatusCode::invalid_argument, std::string(fn) + ": state is required"};
  if (!(s = validate_state(fn, "state", p.state)).ok()) return s;
  in.h0 = StateTensor{p.state.data, p.state.stride_n, p.state.stride_h, p.state.stride_k};
  const int64_t slots = p.num_state_slots > 0 ? p.num_state_slots : p.problem.B;
  if (!p.state_indices && slots < p.problem.B)
    return {StatusCode::invalid_argument,
            std::string(fn) + ": without state_indices the pool needs B = " +
                std::to_string(p.problem.B) + " slots, num_state_slots = " +
                std::to_string(slots)};
  if (!(s = detail::cached_device_status()).ok()) return s;
  detail::RecArgs A = detail::make_args(p.problem, in);
  A.o = detail::seq_out_arg(p.o);
  A.ht = detail::state_out_arg(p.state);
  A.slots = p.state_indices;
  A.nslots = slots;
  // The kernels: the tile kernel (bitwise the forward's step); two row kernels
  // (recurrent_decode_rows.cu: bandwidth-bound layouts for large batches, equal to the forward to
  // rounding): "rows", one block per (sequence, head, value block), and "stream", persistent
  // blocks with cp.async stages, with its bulk-tensor-copy twins "tma" (loads), "tmae" (loads
  // refilling a stage early) and "tmas" (loads and stores); and "lat"
  // (recurrent_decode_latency.cu), short per-thread chains for small batches. The default
  // (QED_REC_DECODE_KERNEL unset or =auto), measured on the H200 at H = 16, K = V = 128
  // (reports/device/recurrent.md run F): batches of at least 8 value blocks of 64 columns per
  // multiprocessor take "tmas" (B = 512: 288.6-290.3 us against stream 301.5-305.1, tile
  // 354-355), else "stream" where the pool cannot be mapped; smaller batches take "lat" (B = 1,
  // per step in a graph of 16 steps: 2.87-2.92 us against tile 3.91-3.94); the tile kernel
  // wherever the others are not built. =tile, =rows, =stream, =tma, =tmae, =tmas or =lat forces
  // one (where it is built).
  const char* e = std::getenv("QED_REC_DECODE_KERNEL");
  const std::string pick = e ? e : "auto";
  const bool large = A.N * A.H * (A.V / 64) >= 8 * detail::num_sms();
  if ((pick == "lat" || (pick == "auto" && !large)) && detail::decode_lat_eligible(A))
    return detail::launch_rec_decode_lat(fn, A, p.problem.stream);
  if ((pick == "tma" || pick == "tmae") && detail::decode_tma_eligible(A))
    return detail::launch_rec_decode_tma(fn, A, pick == "tmae", p.problem.stream);
  if ((pick == "tmas" || (pick == "auto" && large)) && detail::decode_tma_eligible(A))
    return detail::launch_rec_decode_tmas(fn, A, p.problem.stream);
  if (detail::decode_rows_eligible(A)) {
    if (pick == "stream" || (pick == "auto" && large)) return detail::launch_rec_decode_stream(fn, A, p.problem.stream);
    if (pick == "rows") return detail::launch_rec_decode_rows(fn, A, p.problem.stream);
  }
  return detail::launch_rec_decode(fn, A, p.problem.stream);
}

}  // namespace qed::kernels
