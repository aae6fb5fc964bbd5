// C entry points over the recurrent host API for ctypes (bench/bench_recurrent.py): contiguous
// [B,T,H,D] tensors and [N,H,K,V] fp32 states, one dtype for all sequence tensors. Each returns
// 0 on success, else the StatusCode, with the message copied into err.
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/api.hpp"

using namespace qed::kernels;

namespace {

int report(const Status& s, char* err, int errlen) {
  if (err && errlen > 0) {
    std::strncpy(err, s.message.c_str(), static_cast<size_t>(errlen) - 1);
    err[errlen - 1] = '\0';
  }
  return static_cast<int>(s.code);
}

struct Shape {
  int variant, arm;
  int64_t B, T, H, K, V;
  float scale;
  int dtype;
};

Problem problem(const Shape& s, void* stream) {
  Problem p;
  p.variant = static_cast<Variant>(s.variant);
  p.arm = static_cast<Arm>(s.arm);
  p.B = s.B;
  p.T = s.T;
  p.H = s.H;
  p.K = s.K;
  p.V = s.V;
  p.scale = s.scale;
  p.stream = static_cast<Stream>(stream);
  return p;
}

Inputs inputs(const Shape& s, const void* q, const void* k, const void* v, const void* g,
              const void* b, const void* w, const void* beta, const float* lambda,
              const float* r, const float* h0) {
  const DType dt = static_cast<DType>(s.dtype);
  const qed::reference::Layout lay = qed::reference::layout_of(static_cast<Variant>(s.variant),
                                                               static_cast<Arm>(s.arm));
  Inputs in;
  in.q = seq_tensor(q, dt, s.T, s.H, s.K);
  in.k = seq_tensor(k, dt, s.T, s.H, s.K);
  in.v = seq_tensor(v, dt, s.T, s.H, s.V);
  if (g) in.g = seq_tensor(g, dt, s.T, s.H, lay.scalar_g ? 1 : s.K);
  if (b) in.b = seq_tensor(b, dt, s.T, s.H, s.K);
  if (w) in.w = seq_tensor(w, dt, s.T, s.H, s.V);
  if (beta) in.beta = seq_tensor(beta, dt, s.T, s.H, 1);
  in.lambda = lambda;
  in.r = r;
  if (h0) in.h0 = state_tensor(h0, s.H, s.K, s.V);
  return in;
}

}  // namespace

extern "C" {

int qed_rec_forward(int variant, int arm, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V,
                    float scale, int dtype, const void* q, const void* k, const void* v,
                    const void* g, const void* b, const void* w, const void* beta,
                    const float* lambda, const float* r, const float* h0, void* o, float* ht,
                    void* stream, char* err, int errlen) {
  const Shape s{variant, arm, B, T, H, K, V, scale, dtype};
  RecurrentForwardParams p;
  p.problem = problem(s, stream);
  p.in = inputs(s, q, k, v, g, b, w, beta, lambda, r, h0);
  p.o = seq_tensor_out(o, static_cast<DType>(dtype), T, H, V);
  if (ht) p.ht = state_tensor_out(ht, H, K, V);
  return report(recurrent_forward(p), err, errlen);
}

int qed_rec_decode(int variant, int arm, int64_t B, int64_t H, int64_t K, int64_t V, float scale,
                   int dtype, const void* q, const void* k, const void* v, const void* g,
                   const void* b, const void* w, const void* beta, const float* lambda,
                   const float* r, float* state, const int32_t* indices, int64_t slots, void* o,
                   void* stream, char* err, int errlen) {
  const Shape s{variant, arm, B, 1, H, K, V, scale, dtype};
  RecurrentDecodeParams p;
  p.problem = problem(s, stream);
  p.in = inputs(s, q, k, v, g, b, w, beta, lambda, r, nullptr);
  p.o = seq_tensor_out(o, static_cast<DType>(dtype), 1, H, V);
  p.state = state_tensor_out(state, H, K, V);
  p.state_indices = indices;
  p.num_state_slots = slots;
  return report(recurrent_decode(p), err, errlen);
}

// grads: dq dk dv dg db dw dbeta (sequence tensors in dtype, nullptr where absent), dlambda, dr,
// dh0 (fp32). ws may be nullptr (allocated on the stream).
int qed_rec_backward(int variant, int arm, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V,
                     float scale, int dtype, const void* q, const void* k, const void* v,
                     const void* g, const void* b, const void* w, const void* beta,
                     const float* lambda, const float* r, const float* h0, const void* dout,
                     const float* dht, void* dq, void* dk, void* dv, void* dg, void* db, void* dw,
                     void* dbeta, float* dlambda, float* dr, float* dh0, void* ws,
                     uint64_t ws_bytes, void* stream, char* err, int errlen) {
  const Shape s{variant, arm, B, T, H, K, V, scale, dtype};
  const DType dt = static_cast<DType>(dtype);
  const qed::reference::Layout lay = qed::reference::layout_of(static_cast<Variant>(variant),
                                                               static_cast<Arm>(arm));
  RecurrentBackwardParams p;
  p.problem = problem(s, stream);
  p.in = inputs(s, q, k, v, g, b, w, beta, lambda, r, h0);
  p.do_ = seq_tensor(dout, dt, T, H, V);
  if (dht) p.dht = state_tensor(dht, H, K, V);
  p.grads.dq = seq_tensor_out(dq, dt, T, H, K);
  p.grads.dk = seq_tensor_out(dk, dt, T, H, K);
  p.grads.dv = seq_tensor_out(dv, dt, T, H, V);
  if (dg) p.grads.dg = seq_tensor_out(dg, dt, T, H, lay.scalar_g ? 1 : K);
  if (db) p.grads.db = seq_tensor_out(db, dt, T, H, K);
  if (dw) p.grads.dw = seq_tensor_out(dw, dt, T, H, V);
  if (dbeta) p.grads.dbeta = seq_tensor_out(dbeta, dt, T, H, 1);
  p.grads.dlambda = dlambda;
  p.grads.dr = dr;
  p.grads.dh0 = state_tensor_out(dh0, H, K, V);
  p.workspace = ws;
  p.workspace_bytes = ws_bytes;
  return report(recurrent_backward(p), err, errlen);
}

uint64_t qed_rec_backward_workspace(int variant, int arm, int64_t B, int64_t T, int64_t H,
                                    int64_t K, int64_t V) {
  RecurrentBackwardParams p;
  p.problem = problem(Shape{variant, arm, B, T, H, K, V, 1.f, 0}, nullptr);
  size_t bytes = 0;
  if (!recurrent_backward_workspace(p, &bytes).ok()) return 0;
  return bytes;
}

}  // extern "C"
