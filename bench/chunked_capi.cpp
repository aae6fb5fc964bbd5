// C entry points over the chunked forward and backward (kernels/chunked_api.hpp) for ctypes
// (bench/chunked_bench.py): contiguous [B,T,H,D] tensors, [N,H,K,V] fp32 states, one dtype for
// the sequence tensors except g (fp32 or that dtype), optional packed sequences. The caller
// passes the workspace (so that benchmarks allocate it once and diagnostics can read it).
// Returns 0 on success, else the StatusCode with the message copied into err.
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/chunked_api.hpp"

using namespace qed::kernels;

namespace {

int report(const Status& s, char* err, int errlen) {
  if (err && errlen > 0) {
    std::strncpy(err, s.message.c_str(), static_cast<size_t>(errlen) - 1);
    err[errlen - 1] = '\0';
  }
  return static_cast<int>(s.code);
}

// shape = {variant, arm, B, T, H, K, V, dtype, g_dtype, o_dtype, N (0: no cu_seqlens)}: the
// problem both entry points describe (cu_seqlens given when N > 0).
Problem problem_of(const int64_t* shape, float scale, void* stream, const void* cu_seqlens) {
  Problem pr;
  pr.variant = static_cast<Variant>(shape[0]);
  pr.arm = static_cast<Arm>(shape[1]);
  pr.B = shape[2];
  pr.T = shape[3];
  pr.H = shape[4];
  pr.K = shape[5];
  pr.V = shape[6];
  pr.scale = scale;
  pr.stream = static_cast<Stream>(stream);
  if (shape[10] > 0) {
    pr.cu_seqlens = static_cast<const int64_t*>(cu_seqlens);
    pr.num_seqs = shape[10];
  }
  return pr;
}

// ptrs[0..9] = {q, k, v, g, b, w, beta, lambda, r, h0} in both entry points; absent ones null.
Inputs inputs_of(const int64_t* shape, void* const* ptrs) {
  const DType dt = static_cast<DType>(shape[7]);
  const DType gdt = static_cast<DType>(shape[8]);
  const int64_t T = shape[3], H = shape[4], K = shape[5], V = shape[6];
  const qed::reference::Layout lay = qed::reference::layout_of(static_cast<Variant>(shape[0]),
                                                               static_cast<Arm>(shape[1]));
  Inputs in;
  in.q = seq_tensor(ptrs[0], dt, T, H, K);
  in.k = seq_tensor(ptrs[1], dt, T, H, K);
  in.v = seq_tensor(ptrs[2], dt, T, H, V);
  if (ptrs[3]) in.g = seq_tensor(ptrs[3], gdt, T, H, lay.scalar_g ? 1 : K);
  if (ptrs[4]) in.b = seq_tensor(ptrs[4], dt, T, H, K);
  if (ptrs[5]) in.w = seq_tensor(ptrs[5], dt, T, H, V);
  if (ptrs[6]) in.beta = seq_tensor(ptrs[6], dt, T, H, 1);
  in.lambda = static_cast<const float*>(ptrs[7]);
  in.r = static_cast<const float*>(ptrs[8]);
  if (ptrs[9]) in.h0 = state_tensor(static_cast<const float*>(ptrs[9]), H, K, V);
  return in;
}

}  // namespace

extern "C" {

// shape = {variant, arm, B, T, H, K, V, dtype, g_dtype, o_dtype, N (0: no cu_seqlens)}
// ptrs = {q, k, v, g, b, w, beta, lambda, r, h0, o, ht, chunk_states, cu_seqlens, workspace}
// With query != 0 only the workspace size is computed (into *ws_bytes).
// saving != 0: chunked_forward_saving, the workspace being the backward's (query: its size).
static int forward_impl(const int64_t* shape, float scale, void* const* ptrs, uint64_t* ws_bytes,
                        int query, void* stream, char* err, int errlen, bool saving) {
  const int64_t T = shape[3], H = shape[4], K = shape[5], V = shape[6];
  ChunkedForwardParams p;
  p.problem = problem_of(shape, scale, stream, ptrs[13]);
  p.in = inputs_of(shape, ptrs);
  p.o = seq_tensor_out(ptrs[10], static_cast<DType>(shape[9]), T, H, V);
  if (ptrs[11]) p.ht = state_tensor_out(static_cast<float*>(ptrs[11]), H, K, V);
  if (ptrs[12]) p.chunk_states = state_tensor_out(static_cast<float*>(ptrs[12]), H, K, V);
  if (query) {
    size_t n = 0;
    const Status s = saving ? chunked_forward_saving_workspace(p, &n) : chunked_forward_workspace(p, &n);
    *ws_bytes = n;
    return report(s, err, errlen);
  }
  if (saving) return report(chunked_forward_saving(p, ptrs[14], *ws_bytes), err, errlen);
  p.workspace = ptrs[14];
  p.workspace_bytes = *ws_bytes;
  return report(chunked_forward(p), err, errlen);
}

int qed_chunked_forward(const int64_t* shape, float scale, void* const* ptrs, uint64_t* ws_bytes,
                        int query, void* stream, char* err, int errlen) {
  return forward_impl(shape, scale, ptrs, ws_bytes, query, stream, err, errlen, false);
}

// The state pass's plan for the forward qed_chunked_forward would run (chunked_forward_plan):
// out = {tile columns, walking warps, read-out warps, overlapped (0/1), state blocks}.
int qed_chunked_forward_plan(const int64_t* shape, float scale, void* const* ptrs, int64_t* out, char* err,
                             int errlen) {
  const int64_t T = shape[3], H = shape[4], V = shape[6];
  ChunkedForwardParams p;
  p.problem = problem_of(shape, scale, nullptr, ptrs[13]);
  p.in = inputs_of(shape, ptrs);
  p.o = seq_tensor_out(ptrs[10], static_cast<DType>(shape[9]), T, H, V);
  ChunkedForwardPlan plan;
  const Status s = chunked_forward_plan(p, &plan);
  if (s.ok()) {
    out[0] = plan.tile_columns;
    out[1] = plan.walking_warps;
    out[2] = plan.read_out_warps;
    out[3] = plan.overlapped ? 1 : 0;
    out[4] = plan.state_blocks;
  }
  return report(s, err, errlen);
}

// The training forward (chunked_forward_saving): as qed_chunked_forward, but ptrs[14] is the
// backward's workspace and the query returns its size; chunk_states (ptrs[12]) must be null.
int qed_chunked_forward_saving(const int64_t* shape, float scale, void* const* ptrs, uint64_t* ws_bytes,
                               int query, void* stream, char* err, int errlen) {
  return forward_impl(shape, scale, ptrs, ws_bytes, query, stream, err, errlen, true);
}

// Backward: shape as qed_chunked_forward (o_dtype = the gradients' dtype);
// ptrs = {q, k, v, g, b, w, beta, lambda, r, h0, do, dht, cu_seqlens, workspace,
//         dq, dk, dv, dg, db, dw, dbeta, dlambda, dr, dh0}
static int backward_impl(const int64_t* shape, float scale, void* const* ptrs, uint64_t* ws_bytes,
                         int query, void* stream, char* err, int errlen, bool saved) {
  const DType dt = static_cast<DType>(shape[7]);
  const DType odt = static_cast<DType>(shape[9]);
  const int64_t T = shape[3], H = shape[4], K = shape[5], V = shape[6];
  const qed::reference::Layout lay = qed::reference::layout_of(static_cast<Variant>(shape[0]),
                                                               static_cast<Arm>(shape[1]));
  ChunkedBackwardParams p;
  p.problem = problem_of(shape, scale, stream, ptrs[12]);
  p.in = inputs_of(shape, ptrs);
  p.do_ = seq_tensor(ptrs[10], dt, T, H, V);
  if (ptrs[11]) p.dht = state_tensor(static_cast<const float*>(ptrs[11]), H, K, V);
  GradOutputs& g = p.grads;
  g.dq = seq_tensor_out(ptrs[14], odt, T, H, K);
  g.dk = seq_tensor_out(ptrs[15], odt, T, H, K);
  g.dv = seq_tensor_out(ptrs[16], odt, T, H, V);
  if (ptrs[17]) g.dg = seq_tensor_out(ptrs[17], odt, T, H, lay.scalar_g ? 1 : K);
  if (ptrs[18]) g.db = seq_tensor_out(ptrs[18], odt, T, H, K);
  if (ptrs[19]) g.dw = seq_tensor_out(ptrs[19], odt, T, H, V);
  if (ptrs[20]) g.dbeta = seq_tensor_out(ptrs[20], odt, T, H, 1);
  g.dlambda = static_cast<float*>(ptrs[21]);
  g.dr = static_cast<float*>(ptrs[22]);
  g.dh0 = state_tensor_out(static_cast<float*>(ptrs[23]), H, K, V);
  if (query) {
    size_t n = 0;
    const Status s = chunked_backward_workspace(p, &n);
    *ws_bytes = n;
    return report(s, err, errlen);
  }
  p.workspace = ptrs[13];
  p.workspace_bytes = *ws_bytes;
  p.saved_forward = saved;
  return report(chunked_backward(p), err, errlen);
}

int qed_chunked_backward(const int64_t* shape, float scale, void* const* ptrs, uint64_t* ws_bytes,
                         int query, void* stream, char* err, int errlen) {
  return backward_impl(shape, scale, ptrs, ws_bytes, query, stream, err, errlen, false);
}

// The backward after qed_chunked_forward_saving on the same workspace (saved_forward = true).
int qed_chunked_backward_saved(const int64_t* shape, float scale, void* const* ptrs, uint64_t* ws_bytes,
                               int query, void* stream, char* err, int errlen) {
  return backward_impl(shape, scale, ptrs, ws_bytes, query, stream, err, errlen, true);
}

}  // extern "C"
