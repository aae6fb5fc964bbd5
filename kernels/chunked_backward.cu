// Chunked backward (kernels/chunked_api.hpp): argument checks, workspace, and the launches of
// the block functions of kernels/chunked_backward_tile.hpp, each a thin __global__ wrapper that
// passes its block coordinates, its dynamic shared memory and BlockExec (threads stride over an
// index range; sync = __syncthreads). The same functions run on the CPU in
// properties/test_chunked_backward_tiles.cpp.
//
// Accuracy contract (properties/test_gpu_chunked_backward.cpp): against the double recurrent
// reference on the inputs the kernel consumed, every gradient X has
//   relF(X) <= 8 max(relF_twin32(X), relF_rec32(X)) + 2e-6          (fp32 inputs)
// with twin32 = reference::chunked_backward<float> (C = 64, operands none) and rec32 = the float
// recurrence (the CPU run of the same block functions on reference chunk states passes 4x + 1e-6,
// properties/test_chunked_backward_tiles.cpp); bf16 inputs take the larger of that and
//   2 relF_twinbf16(X)                                               (bf16 inputs)
// with twinbf16 = the same twin with every matmul operand rounded to bf16 (the README's default
// rule for bf16 candidates): the kernel is fp32 except the forward's 16-bit chunk states.
//
// Speed: CUDA-core fp32 loops over shared and global memory; the tensor-core version (mma.sync
// split-bf16 products as in the forward, fused passes, smaller workspace) is the next step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/chunked_api.hpp"
#include "kernels/chunked_backward_tile.hpp"
#include "kernels/chunked_common.cuh"

namespace qed::kernels {
namespace cb = chunked_bwd;

namespace {

constexpr int kThreadsBwd = 256;

struct BlockExec {
  template <class F>
  __host__ __device__ void for_each(int64_t n, F&& f) const {
#ifdef __CUDA_ARCH__
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(i);
#else
    (void)n;
    (void)f;
#endif
  }
  __host__ __device__ void sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
};

__global__ void __launch_bounds__(kThreadsBwd) bwd_prep_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_prep[];
  cb::prep_block(BlockExec{}, A, blockIdx.x, blockIdx.y, sm_prep);
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_state_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_state[];
  cb::state_block(BlockExec{}, A, blockIdx.x, blockIdx.y, static_cast<int>(blockIdx.z), sm_state);
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_chunk_kernel(const cb::BwdArgs A) {
  extern __shared__ __align__(16) float sm_chunk[];
  cb::chunk_block(BlockExec{}, A, blockIdx.x, blockIdx.y, sm_chunk);
}
struct WarpSum {  // butterfly: every lane ends with the same total, in a fixed order
  __device__ float operator()(float x) const {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
};
constexpr int kTokenWarps = kThreadsBwd / 32;  // token items per block, one warp each
__global__ void __launch_bounds__(kThreadsBwd) bwd_token_kernel(const cb::BwdArgs A, int64_t items) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kTokenWarps + threadIdx.x / 32;
  if (item < items) cb::token_item(A, item, static_cast<int>(threadIdx.x % 32), 32, WarpSum{});
}
__global__ void __launch_bounds__(kThreadsBwd) bwd_head_reduce_kernel(const float* tok, int64_t BT,
                                                                   int64_t H, int D, float* out) {
  __shared__ float scratch[cb::kReduceGroups];
  cb::head_reduce_block(BlockExec{}, tok, BT, H, D, blockIdx.x, out, scratch);
}

const char* kFn = "chunked_backward";

Status bad(const std::string& msg) { return {StatusCode::invalid_argument, std::string(kFn) + ": " + msg}; }
Status unsupported(const std::string& msg) { return {StatusCode::unsupported, std::string(kFn) + ": " + msg}; }
Status cuda_fail(const char* what, cudaError_t e) {
  return {StatusCode::cuda_error, std::string(kFn) + ": " + what + ": " + cudaGetErrorString(e)};
}

// Testing hook: QEDCHECK_CHUNKED_BWD_MUTANT=khat|rho|proj drops one term (chunked_backward_tile.hpp).
int mutant() {
  const char* m = std::getenv("QEDCHECK_CHUNKED_BWD_MUTANT");
  if (!m) return cb::kMutantNone;
  if (std::strcmp(m, "khat") == 0) return cb::kMutantNoKhatGrad;
  if (std::strcmp(m, "rho") == 0) return cb::kMutantNoDecayRho;
  if (std::strcmp(m, "proj") == 0) return cb::kMutantNoProjGrad;
  return cb::kMutantNone;
}

// Benchmark hook: QEDCHECK_CHUNKED_BWD_STOP=k returns after pass k (1 the recomputing forward,
// 2 prep, 3 the reverse state sweep, 4 chunk, 5 token); the time of a pass is the difference of
// neighbouring cuts (bench/bench_chunked.py --only bwdphases). The gradients are then incomplete.
int bwd_stop() {
  const char* s = std::getenv("QEDCHECK_CHUNKED_BWD_STOP");
  return s ? std::atoi(s) : 0;
}

Status check(const ChunkedBackwardParams& p) {
  const Problem& pr = p.problem;
  if (Status s = validate_problem(kFn, pr); !s.ok()) return s;
  if (Status s = validate_inputs(kFn, pr, p.in); !s.ok()) return s;
  if (Status s = validate_grads(kFn, pr, p.grads); !s.ok()) return s;
  if (!p.do_.data) return bad("do_ is required");
  const SeqTensorOut d{const_cast<void*>(p.do_.data), p.do_.dtype, p.do_.stride_b, p.do_.stride_t,
                       p.do_.stride_h};
  if (Status s = validate_output(kFn, "do_", pr, d); !s.ok()) return s;
  if (Status s = validate_state(kFn, "dht", p.dht); !s.ok()) return s;
  if (Status s = chunked::check_built_sizes(kFn, pr, p.in.q.dtype); !s.ok()) return s;
  const DType dt = p.in.q.dtype;
  const std::pair<const SeqTensor*, const char*> same[] = {{&p.in.k, "k"},       {&p.in.v, "v"},
                                                           {&p.in.b, "b"},       {&p.in.w, "w"},
                                                           {&p.in.beta, "beta"}, {&p.do_, "do_"}};
  for (const auto& [t, n] : same)
    if (t->data && t->dtype != dt)
      return bad(std::string(n) + " dtype " + to_string(t->dtype) + " differs from q dtype " +
                 to_string(dt) + " (q, k, v, b, w, beta, do_ share one dtype)");
  if (p.in.g.data && p.in.g.dtype != dt && p.in.g.dtype != DType::fp32)
    return bad(std::string("g dtype ") + to_string(p.in.g.dtype) + " must be fp32 or q's dtype");
  const std::pair<const SeqTensorOut*, const char*> outs[] = {
      {&p.grads.dq, "dq"}, {&p.grads.dk, "dk"}, {&p.grads.dv, "dv"},      {&p.grads.dg, "dg"},
      {&p.grads.db, "db"}, {&p.grads.dw, "dw"}, {&p.grads.dbeta, "dbeta"}};
  for (const auto& [t, n] : outs)
    if (t->data && t->dtype != DType::fp32 && t->dtype != DType::bf16)
      return unsupported(std::string(n) + " dtype " + to_string(t->dtype) + " (fp32 or bf16 only)");
  return {};
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

struct Layout {
  int64_t bound = 0, per = 0;
  int n_vt = 1;
  size_t base = 0, fwd = 0, cs = 0, o = 0, blob = 0, part = 0, tok_k = 0, tok_v = 0, dlam = 0,
         dr = 0, total = 0;
  size_t fwd_bytes = 0;
};

// The forward that recomputes the chunk-start states: o (bf16, discarded) and chunk_states in the
// workspace; `ws` may be null for the workspace query (pointers then only need to be non-null).
ChunkedForwardParams forward_params(const ChunkedBackwardParams& p, char* ws, const Layout& L) {
  const Problem& pr = p.problem;
  char* base = ws ? ws : reinterpret_cast<char*>(256);
  ChunkedForwardParams fp;
  fp.problem = pr;
  fp.in = p.in;
  fp.o = seq_tensor_out(base + L.o, DType::bf16, pr.T, pr.H, pr.V);
  fp.chunk_states = state_tensor_out(reinterpret_cast<float*>(base + L.cs), pr.H, pr.K, pr.V);
  fp.workspace = ws ? ws + L.fwd : nullptr;
  fp.workspace_bytes = L.fwd_bytes;
  return fp;
}

Status layout_for(const ChunkedBackwardParams& p, Layout* out) {
  const Problem& pr = p.problem;
  const reference::Layout lay = reference::layout_of(pr.variant, pr.arm);
  Layout L;
  L.per = (pr.T + cb::kC - 1) / cb::kC;
  L.bound = pr.cu_seqlens ? L.per + pr.sequences() : pr.B * L.per;
  L.n_vt = static_cast<int>((pr.V + cb::kVT - 1) / cb::kVT);
  const size_t H = pr.H, K = pr.K, V = pr.V, BTH = static_cast<size_t>(pr.B * pr.T) * H;
  const size_t bound = static_cast<size_t>(L.bound);
  size_t off = 0;
  L.base = off;
  off = align256(off + (pr.cu_seqlens ? (static_cast<size_t>(pr.sequences()) + 1) * 8 : 0));
  L.cs = off;
  off = align256(off + bound * H * K * V * 4);
  L.o = off;
  off = align256(off + BTH * V * 2);
  L.blob = off;
  off = align256(off + bound * H * static_cast<size_t>(cb::blob_floats(pr.K, pr.V)) * 4);
  L.part = off;
  off = align256(off + bound * H * L.n_vt * static_cast<size_t>(cb::part_floats(pr.K)) * 4);
  L.tok_k = off;
  off = align256(off + 4 * BTH * K * 4);
  L.tok_v = off;
  off = align256(off + BTH * V * 4);
  L.dlam = off;
  if (lay.has_lambda) off = align256(off + BTH * 4);
  L.dr = off;
  if (lay.has_r) off = align256(off + BTH * K * 4);
  L.fwd = off;
  ChunkedForwardParams fp = forward_params(p, nullptr, L);
  if (Status s = chunked_forward_workspace(fp, &L.fwd_bytes); !s.ok()) return s;
  L.total = align256(off + L.fwd_bytes);
  *out = L;
  return {};
}

cb::SeqIn seq_in(const SeqTensor& t) {
  cb::SeqIn s;
  s.p = t.data;
  s.sb = t.stride_b, s.st = t.stride_t, s.sh = t.stride_h;
  s.dt = t.dtype == DType::fp32 ? 0 : 1;
  return s;
}
cb::SeqOut seq_out(const SeqTensorOut& t) {
  cb::SeqOut s;
  s.p = t.data;
  s.sb = t.stride_b, s.st = t.stride_t, s.sh = t.stride_h;
  s.dt = t.dtype == DType::fp32 ? 0 : 1;
  return s;
}

cudaError_t set_smem(const void* kern, int64_t floats) {
  return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(floats * 4));
}

}  // namespace

Status chunked_backward_workspace(const ChunkedBackwardParams& p, size_t* bytes) {
  if (!bytes) return bad("bytes is nullptr");
  if (Status s = check(p); !s.ok()) return s;
  Layout L;
  if (Status s = layout_for(p, &L); !s.ok()) return s;
  *bytes = L.total;
  return {};
}

Status chunked_backward(const ChunkedBackwardParams& p) {
  if (Status s = check(p); !s.ok()) return s;
  if (Status s = device_status(); !s.ok()) return s;
  Layout L;
  if (Status s = layout_for(p, &L); !s.ok()) return s;
  const Problem& pr = p.problem;
  const reference::Layout lay = reference::layout_of(pr.variant, pr.arm);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(pr.stream);
  char* ws = static_cast<char*>(p.workspace);
  bool owned = false;
  if (!ws) {
    void* m = nullptr;
    if (cudaError_t e = cudaMallocAsync(&m, L.total > 0 ? L.total : 256, st); e != cudaSuccess)
      return cuda_fail("workspace allocation", e);
    ws = static_cast<char*>(m);
    owned = true;
  } else if (p.workspace_bytes < L.total) {
    return bad("workspace_bytes = " + std::to_string(p.workspace_bytes) + " is smaller than the " +
               std::to_string(L.total) + " bytes chunked_backward_workspace asks for");
  } else if (reinterpret_cast<uintptr_t>(ws) % 256 != 0) {
    return bad("workspace must be 256-byte aligned");
  }

  Status result;
  cudaError_t e = cudaSuccess;
  // 0. Chunk-start states (and nothing else that is kept) from the chunked forward.
  {
    const ChunkedForwardParams fp = forward_params(p, ws, L);
    if (Status s = chunked_forward(fp); !s.ok()) result = {s.code, std::string(kFn) + ": recompute: " + s.message};
  }
  cb::BwdArgs A;
  A.variant = static_cast<int>(pr.variant);
  A.arm = static_cast<int>(pr.arm);
  A.B = pr.B, A.T = pr.T, A.H = pr.H, A.K = pr.K, A.V = pr.V, A.N = pr.sequences();
  A.scale = pr.scale;
  A.cu = pr.cu_seqlens;
  A.chunk_base = pr.cu_seqlens ? reinterpret_cast<const int64_t*>(ws + L.base) : nullptr;
  A.chunks_per_seq = L.per;
  A.chunk_bound = L.bound;
  A.q = seq_in(p.in.q), A.k = seq_in(p.in.k), A.v = seq_in(p.in.v), A.g = seq_in(p.in.g);
  A.b = seq_in(p.in.b), A.w = seq_in(p.in.w), A.beta = seq_in(p.in.beta), A.dout = seq_in(p.do_);
  A.g.dt = p.in.g.dtype == DType::fp32 ? 0 : 1;
  A.lambda = p.in.lambda;
  A.r = p.in.r;
  A.dht = p.dht.data;
  A.dht_sn = p.dht.stride_n, A.dht_sh = p.dht.stride_h, A.dht_sk = p.dht.stride_k;
  A.cs = reinterpret_cast<const float*>(ws + L.cs);
  A.dh0 = p.grads.dh0.data;
  A.dh0_sn = p.grads.dh0.stride_n, A.dh0_sh = p.grads.dh0.stride_h, A.dh0_sk = p.grads.dh0.stride_k;
  A.dq = seq_out(p.grads.dq), A.dk = seq_out(p.grads.dk), A.dv = seq_out(p.grads.dv);
  A.dg = seq_out(p.grads.dg), A.db = seq_out(p.grads.db), A.dw = seq_out(p.grads.dw);
  A.dbeta = seq_out(p.grads.dbeta);
  A.blob = reinterpret_cast<float*>(ws + L.blob);
  A.part = reinterpret_cast<float*>(ws + L.part);
  A.n_vt = L.n_vt;
  A.tok_k = reinterpret_cast<float*>(ws + L.tok_k);
  A.tok_v = reinterpret_cast<float*>(ws + L.tok_v);
  A.dlam_tok = reinterpret_cast<float*>(ws + L.dlam);
  A.dr_tok = reinterpret_cast<float*>(ws + L.dr);
  A.mutant = mutant();

  const int64_t BT = pr.B * pr.T, items = BT * pr.H;
  const unsigned H = static_cast<unsigned>(pr.H);
  if (result.ok() && pr.cu_seqlens) {
    chunked::Args ca;
    ca.T = pr.T;
    ca.N = pr.sequences();
    ca.cu = pr.cu_seqlens;
    e = chunked::launch_chunk_base(ca, reinterpret_cast<int64_t*>(ws + L.base), st);
  }
  const int stop = bwd_stop();
  auto go = [stop](int pass) { return stop <= 0 || pass <= stop; };
  if (!go(2)) {
    // benchmark cut after the recomputing forward
  } else if (result.ok() && e == cudaSuccess && L.bound > 0 && items > 0) {
    const int64_t fp = cb::prep_smem_floats(pr.K), fc = cb::chunk_smem_floats(pr.K);
    if ((e = set_smem(reinterpret_cast<const void*>(bwd_prep_kernel), fp)) == cudaSuccess) {
      bwd_prep_kernel<<<dim3(static_cast<unsigned>(L.bound), H), kThreadsBwd, fp * 4, st>>>(A);
      e = cudaGetLastError();
    }
    const int64_t fs = cb::state_smem_floats(pr.K);
    if (go(3) && e == cudaSuccess && (e = set_smem(reinterpret_cast<const void*>(bwd_state_kernel), fs)) == cudaSuccess) {
      bwd_state_kernel<<<dim3(static_cast<unsigned>(A.N), H, static_cast<unsigned>(L.n_vt)), kThreadsBwd,
                         fs * 4, st>>>(A);
      e = cudaGetLastError();
    }
    if (go(4) && e == cudaSuccess && (e = set_smem(reinterpret_cast<const void*>(bwd_chunk_kernel), fc)) == cudaSuccess) {
      bwd_chunk_kernel<<<dim3(static_cast<unsigned>(L.bound), H), kThreadsBwd, fc * 4, st>>>(A);
      e = cudaGetLastError();
    }
    if (go(5) && e == cudaSuccess) {
      bwd_token_kernel<<<static_cast<unsigned>((items + kTokenWarps - 1) / kTokenWarps), kThreadsBwd, 0, st>>>(
          A, items);
      e = cudaGetLastError();
    }
  } else if (result.ok() && e == cudaSuccess && A.N > 0) {
    // No tokens: dh0 = dht (or zero), written by the sequential pass with no chunks.
    const int64_t fs = cb::state_smem_floats(pr.K);
    if ((e = set_smem(reinterpret_cast<const void*>(bwd_state_kernel), fs)) == cudaSuccess) {
      bwd_state_kernel<<<dim3(static_cast<unsigned>(A.N), H, static_cast<unsigned>(L.n_vt)), kThreadsBwd,
                         fs * 4, st>>>(A);
      e = cudaGetLastError();
    }
  }
  if (result.ok() && e == cudaSuccess && lay.has_lambda && go(6)) {
    if (BT > 0) {
      bwd_head_reduce_kernel<<<H, kThreadsBwd, 0, st>>>(A.dlam_tok, BT, pr.H, 1, p.grads.dlambda);
      e = cudaGetLastError();
    } else {
      e = cudaMemsetAsync(p.grads.dlambda, 0, sizeof(float) * pr.H, st);
    }
  }
  if (result.ok() && e == cudaSuccess && lay.has_r && go(6)) {
    if (BT > 0) {
      bwd_head_reduce_kernel<<<H, kThreadsBwd, 0, st>>>(A.dr_tok, BT, pr.H, static_cast<int>(pr.K),
                                                        p.grads.dr);
      e = cudaGetLastError();
    } else {
      e = cudaMemsetAsync(p.grads.dr, 0, sizeof(float) * pr.H * pr.K, st);
    }
  }
  if (result.ok() && e != cudaSuccess) result = cuda_fail("kernel launch", e);
  if (owned) {
    const cudaError_t f = cudaFreeAsync(ws, st);
    if (result.ok() && f != cudaSuccess) result = cuda_fail("workspace free", f);
  }
  return result;
}

}  // namespace qed::kernels
