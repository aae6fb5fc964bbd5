// Host-side glue shared by the recurrent .cu files: filling the kernel arguments from the API
// structs, CUDA error reporting, and the forward launch that the backward reuses to store its
// checkpoints.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/api.hpp"
#include "kernels/recurrent_common.cuh"

namespace qed::kernels::detail {

inline SeqArg seq_arg(const SeqTensor& t) {
  return {t.data, t.stride_b, t.stride_t, t.stride_h, static_cast<int>(t.dtype)};
}
inline SeqOutArg seq_out_arg(const SeqTensorOut& t) {
  return {t.data, t.stride_b, t.stride_t, t.stride_h, static_cast<int>(t.dtype)};
}
inline StateArg state_arg(const StateTensor& s) { return {s.data, s.stride_n, s.stride_h, s.stride_k}; }
inline StateOutArg state_out_arg(const StateTensorOut& s) {
  return {s.data, s.stride_n, s.stride_h, s.stride_k};
}

inline RecArgs make_args(const Problem& p, const Inputs& in) {
  RecArgs A;
  A.variant = static_cast<int>(p.variant);
  A.arm = static_cast<int>(p.arm);
  A.B = p.B;
  A.T = p.T;
  A.H = p.H;
  A.K = p.K;
  A.V = p.V;
  A.scale = p.scale;
  A.cu = p.cu_seqlens;
  A.N = p.sequences();
  A.q = seq_arg(in.q);
  A.k = seq_arg(in.k);
  A.v = seq_arg(in.v);
  A.g = seq_arg(in.g);
  A.b = seq_arg(in.b);
  A.w = seq_arg(in.w);
  A.beta = seq_arg(in.beta);
  A.lambda = in.lambda;
  A.r = in.r;
  A.h0 = state_arg(in.h0);
  return A;
}

inline Status cuda_status(const char* fn, const char* what, cudaError_t e) {
  if (e == cudaSuccess) return {};
  return {StatusCode::cuda_error, std::string(fn) + ": " + what + ": " + cudaGetErrorString(e)};
}

int num_sms();

// device_status(), asked once per process (launch paths must stay cheap and capturable).
Status cached_device_status();

// Columns per warp of the state-tile layout for head dimension K.
int columns_per_warp(int64_t K);

// The row decode kernel (recurrent_decode_rows.cu): whether it can run A (one token per sequence,
// K in {64, 128, 256}, V a multiple of 64, 16-byte aligned state rows), and its launch.
bool decode_rows_eligible(const RecArgs& A);
Status launch_rec_decode_rows(const char* fn, const RecArgs& A, cudaStream_t stream);
// The pipelined row kernel (same file): persistent blocks, the next tiles' state rows brought
// into shared memory by cp.async while the current tile is computed.
Status launch_rec_decode_stream(const char* fn, const RecArgs& A, cudaStream_t stream);
// The same walk with each tile brought in by one bulk tensor copy (the pool's tensor map): needs
// the pool read and written in place.
bool decode_tma_eligible(const RecArgs& A);
// early: a stage is refilled as soon as its tile is in registers (QED_REC_DECODE_KERNEL=tmae).
Status launch_rec_decode_tma(const char* fn, const RecArgs& A, bool early, cudaStream_t stream);
// ... and with the new state stored by bulk tensor copies too (same eligibility).
Status launch_rec_decode_tmas(const char* fn, const RecArgs& A, cudaStream_t stream);
// The small-batch kernel (recurrent_decode_latency.cu): 16 state values per thread, a compact
// argument struct; K in {32, 64, 128, 256}, V a multiple of 16, strides within 32 bits.
bool decode_lat_eligible(const RecArgs& A);
Status launch_rec_decode_lat(const char* fn, const RecArgs& A, cudaStream_t stream);

// Launches the forward kernel with `nwarps` warps per block (= steps per chunk). Writes o, ht
// and checkpoints as A asks.
Status launch_rec_forward(const char* fn, const RecArgs& A, int nwarps, cudaStream_t stream);

}  // namespace qed::kernels::detail
