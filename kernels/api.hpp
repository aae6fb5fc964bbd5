// Plain C++ host API of the CUDA kernels (recurrent here; chunked in kernels/chunked_api.hpp):
// POD parameter structs of raw device pointers, strides in elements, shapes, dtypes, variant and
// arm, and a stream. Every entry point validates its arguments and returns a Status with a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "reference/types.hpp"

// Same type as cudaStream_t, declared here so that callers need no CUDA headers.
struct CUstream_st;

namespace qed::kernels {

using Stream = CUstream_st*;
using reference::Arm;
using reference::Variant;

// Element type of a sequence tensor. States (h0, ht, dht, dh0) and lambda, r are always fp32.
enum class DType : int32_t { fp32 = 0, bf16 = 1, fp16 = 2 };

const char* to_string(DType d);
int dtype_bytes(DType d);

enum class StatusCode : int32_t {
  ok = 0,
  invalid_argument = 1,  // a parameter breaks a rule; the message names it
  unsupported = 2,       // valid, but not built (e.g. a K outside {16,32,64,128,256})
  no_device = 3,         // no CUDA device present
  cuda_error = 4,        // a CUDA call failed; the message carries cudaGetErrorString
};

struct Status {
  StatusCode code = StatusCode::ok;
  std::string message;
  bool ok() const { return code == StatusCode::ok; }
};

// A [B,T,H,D] tensor (D = K, V, or 1 for per-token scalars g of gdn and beta) whose D axis is
// contiguous. Strides are in elements. data == nullptr means absent.
struct SeqTensor {
  const void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t stride_b = 0, stride_t = 0, stride_h = 0;
};

struct SeqTensorOut {
  void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t stride_b = 0, stride_t = 0, stride_h = 0;
};

// A per-sequence fp32 state [N,H,K,V] (or a pool [P,H,K,V] indexed through state_indices),
// V contiguous, strides in elements. The kernels move states in 16-byte pieces: data must be
// 16-byte aligned and every stride a multiple of 4.
struct StateTensor {
  const float* data = nullptr;
  int64_t stride_n = 0, stride_h = 0, stride_k = 0;
};

struct StateTensorOut {
  float* data = nullptr;
  int64_t stride_n = 0, stride_h = 0, stride_k = 0;
};

// Contiguous [B,T,H,D] and [N,H,K,V] descriptors.
SeqTensor seq_tensor(const void* data, DType dtype, int64_t T, int64_t H, int64_t D);
SeqTensorOut seq_tensor_out(void* data, DType dtype, int64_t T, int64_t H, int64_t D);
StateTensor state_tensor(const float* data, int64_t H, int64_t K, int64_t V);
StateTensorOut state_tensor_out(float* data, int64_t H, int64_t K, int64_t V);

// What every kernel shares: the problem's shape and options.
// Sequences: without cu_seqlens, N = B and each batch row is one sequence of T tokens. With
// cu_seqlens (device int64 [N+1], 0 = c_0 <= c_1 <= ... <= c_N = T), B must be 1 and sequence n
// is tokens [c_n, c_{n+1}); zero-length sequences are allowed (their ht = h0, dh0 = dht). The
// host cannot read device memory cheaply, so kernels clamp every c_n into [0, T] instead of
// trusting it: bad offsets give wrong answers, never out-of-bounds accesses. Pass the same
// offsets in cu_seqlens_host to have them checked on the host too.
struct Problem {
  Variant variant = Variant::gdn2;
  Arm arm = Arm::none;  // qed only: full, nogate, nogate_noproj, rand
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0;
  float scale = 1.0f;   // applied to the read-out only; QED's erase term uses the unscaled q
  const int64_t* cu_seqlens = nullptr;       // device, [N+1] or nullptr
  const int64_t* cu_seqlens_host = nullptr;  // optional host copy, validated when given
  int64_t num_seqs = 0;                      // N when cu_seqlens is given
  Stream stream = nullptr;

  int64_t sequences() const { return cu_seqlens ? num_seqs : B; }
};

// Inputs of the recurrence (CASE_FORMAT.md /inputs). Which of g, b, w, beta, lambda, r must be
// present follows reference::layout_of(variant, arm); the others must be nullptr.
struct Inputs {
  SeqTensor q, k, v;   // [B,T,H,K], [B,T,H,K], [B,T,H,V]
  SeqTensor g;         // [B,T,H,K] (gdn2, qed, kda) or [B,T,H] (gdn)
  SeqTensor b, w;      // [B,T,H,K], [B,T,H,V] (gdn2, qed)
  SeqTensor beta;      // [B,T,H] (kda, gdn, deltanet)
  const float* lambda = nullptr;  // [H] (qed)
  const float* r = nullptr;       // [H,K] contiguous (qed rand)
  StateTensor h0;                 // [N,H,K,V] optional (zero when absent)
};

// Gradients (CASE_FORMAT.md /grads): the ones the variant has must be given, others nullptr.
// dlambda [H] and dr [H,K] are fp32, written (not accumulated).
struct GradOutputs {
  SeqTensorOut dq, dk, dv, dg, db, dw, dbeta;
  float* dlambda = nullptr;
  float* dr = nullptr;
  StateTensorOut dh0;  // [N,H,K,V], required
};

// Shared argument checks (also used by the chunked kernels). Each returns the first rule
// broken, e.g. "recurrent_forward: q.stride_t = 3 is smaller than H*K = 256".
Status validate_problem(const char* fn, const Problem& p);
Status validate_inputs(const char* fn, const Problem& p, const Inputs& in);
Status validate_grads(const char* fn, const Problem& p, const GradOutputs& gr);
Status validate_output(const char* fn, const char* name, const Problem& p, const SeqTensorOut& t);
Status validate_state(const char* fn, const char* name, const StateTensor& s);
Status validate_state(const char* fn, const char* name, const StateTensorOut& s);

// Whether a CUDA device can be used; the message says why not.
Status device_status();
// The current device's name ("NVIDIA H200"), or "" without a device.
std::string device_name();
// Sixteen hex digits identifying the kernels' sources this library was built from
// (cmake/kernel_fingerprint.cmake): certificates of CUDA subjects record it, and the gate says
// when the kernels it re-measures are not the ones a certificate measured.
const char* source_fingerprint();

// ---- recurrent kernels ----

// Whole-sequence forward. o [B,T,H,V] is required; ht [N,H,K,V] optional (nullptr: not stored).
// With state_indices (device int32 [N]), sequence n reads h0 and writes ht at state slot
// state_indices[n] of pools holding num_state_slots slots; a negative slot skips the sequence
// (nothing is read or written for it, o included). h0 and ht may be the same memory (in place).
struct RecurrentForwardParams {
  Problem problem;
  Inputs in;
  SeqTensorOut o;
  StateTensorOut ht;
  const int32_t* state_indices = nullptr;
  int64_t num_state_slots = 0;
};
Status recurrent_forward(const RecurrentForwardParams& p);

// One decode step for B independent sequences (inputs [B,1,H,D]), states updated in place in
// a pool [P,H,K,V]: sequence i uses slot state_indices[i] (identity when nullptr; negative:
// skipped). The step reads the slot and writes it back; o [B,1,H,V] receives the read-out.
struct RecurrentDecodeParams {
  Problem problem;  // T must be 1 and cu_seqlens nullptr
  Inputs in;        // in.h0 is ignored: the state comes from `state`
  SeqTensorOut o;
  StateTensorOut state;
  const int32_t* state_indices = nullptr;
  int64_t num_state_slots = 0;
};
Status recurrent_decode(const RecurrentDecodeParams& p);

// Backward of L = sum(do*o) + sum(dht*ht): recomputes states from checkpoints it stores in the
// workspace (never by inverting a step). Deterministic: no atomics, fixed reduction orders.
// workspace may be nullptr: then it is allocated and freed on the stream (cudaMallocAsync).
struct RecurrentBackwardParams {
  Problem problem;
  Inputs in;
  SeqTensor do_;    // [B,T,H,V]
  StateTensor dht;  // optional (zero when absent)
  GradOutputs grads;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
Status recurrent_backward_workspace(const RecurrentBackwardParams& p, size_t* bytes);
Status recurrent_backward(const RecurrentBackwardParams& p);

}  // namespace qed::kernels
