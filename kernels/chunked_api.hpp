// Host API of the chunked (WY / UT transform, MATH.md §4) CUDA forward: one parameter struct
// over the shared kernels/api.hpp descriptors, a workspace query and the forward itself.
// Chunk size 64; K, V in {64, 128}; bf16 or fp32 inputs (q, k, v, b, w, beta of one dtype).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/api.hpp"

namespace qed::kernels {

// Forward of every variant and QED arm. o [B,T,H,V] (bf16 or fp32) is required; ht [N,H,K,V]
// is optional. chunk_states, when given, receives the state before every chunk as fp32
// [total_chunks, H, K, V] with total_chunks = sum_n ceil(len_n / 64), sequence 0's chunks first
// (the layout of reference::chunked_forward's chunk_states); its stride_n is per chunk.
//
// Arithmetic. bf16 inputs: tensor-core products of bf16 operands with fp32 accumulation; every
// product that feeds the state (T, W_a, W_z, W_a S, K̂ᵀU) splits both operands into a bf16 high
// and low part and sums three products (about 16 significant bits), the state stays fp32; the
// read-out products (Q̃ S, M U) use one bf16 term for Q̃ and M. fp32 inputs: every operand is
// split into three bf16 parts and six products are summed, which reproduces fp32 arithmetic
// (no TF32 anywhere). Decay factors are exp2 of pairwise differences of in-chunk cumulative
// sums referenced so that no exponent is positive off the 16x16 diagonal blocks, and inside them
// at most 2^64 (channels with a larger in-block decay take an element-wise path): no overflow or
// NaN for any g <= 0, and g = 0 gives alpha = 1 exactly.
struct ChunkedForwardParams {
  Problem problem;
  Inputs in;
  SeqTensorOut o;
  StateTensorOut ht;            // optional
  StateTensorOut chunk_states;  // optional, see above
  // Scratch of chunked_forward_workspace() bytes; nullptr: allocated and freed on the stream.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Bytes of workspace the call needs (depends on shapes, dtype and sequence count only).
Status chunked_forward_workspace(const ChunkedForwardParams& p, size_t* bytes);
Status chunked_forward(const ChunkedForwardParams& p);

// How chunked_forward would run its state pass for these parameters on the current device (the
// plan depends on shapes, dtype, the device's multiprocessors and the QEDCHECK_CHUNKED_* knobs):
// the value columns a block carries, its warps (walking the chunks, and forming o one chunk
// behind them where the read-out has warps of its own), the block count, and whether the pass
// overlaps the prep pass. For benchmarks, and for tests that must know which instance ran.
struct ChunkedForwardPlan {
  int tile_columns = 0;
  int walking_warps = 0;
  int read_out_warps = 0;
  bool overlapped = false;
  int64_t state_blocks = 0;
};
Status chunked_forward_plan(const ChunkedForwardParams& p, ChunkedForwardPlan* plan);

// Backward of L = sum(do*o) + sum(dht*ht) (MATH.md §6), every variant and QED arm. It recomputes
// the chunk-start states with the chunked forward (no step is ever inverted). Two pipelines:
//  bf16 inputs (kernels/chunked_bwd_sweep.cu, kernels/chunked_bwd_grads.cu): the recompute also
//   keeps U and a second set of fragments per chunk; a reverse sweep per (sequence, head, value
//   tile) on tensor cores carries the state adjoint from chunk to chunk (two-term split-bf16
//   products, fp32 state) and stores it and Ū per chunk; one chunk-parallel pass then forms every
//   gradient of the chunk (Ȳ, M̄, T̄, Q̃̄, Ã̄, K̂̄ and §6.2-§6.3 on tensor cores, two terms for
//   every operand that is not an exact bf16 input) and applies the §5.2 VJPs of its tokens.
//  fp32 inputs, or QEDCHECK_CHUNKED_BWD_IMPL=v1 (kernels/chunked_backward.cu): the block functions
//   of kernels/chunked_backward_tile.hpp, which a CPU test runs on g++ (prep, a reverse sweep per
//   64 value columns, a decay-factor pass, a token pass), matrix products on tensor cores with
//   three-term (fp32-faithful) splits.
// Both: deterministic (no atomics, every reduction in a fixed order, so repeated calls agree bit
// for bit); dlambda and dr summed over tokens per head in a fixed order.
// Gradients (dq dk dv dg db dw dbeta) are fp32 or bf16; dlambda, dr, dh0 fp32 (written, not
// accumulated). Chunk size 64; K, V in {64, 128}; q, k, v, b, w, beta and do_ of one dtype
// (bf16 or fp32), g fp32 or that dtype.
struct ChunkedBackwardParams {
  Problem problem;
  Inputs in;
  SeqTensor do_;    // [B,T,H,V], required
  StateTensor dht;  // optional (zero when absent)
  GradOutputs grads;
  // Scratch of chunked_backward_workspace() bytes (256-byte aligned); nullptr: allocated and
  // freed on the stream.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // true: `workspace` already holds what chunked_forward_saving wrote for this problem and these
  // inputs (same tensors, same contents, nothing run in that workspace since), and the recompute
  // is skipped. The call cannot check this; anything else gives wrong gradients.
  bool saved_forward = false;
};

Status chunked_backward_workspace(const ChunkedBackwardParams& p, size_t* bytes);
Status chunked_backward(const ChunkedBackwardParams& p);

// The training forward: o (and ht where given) exactly as chunked_forward computes them, run as
// chunked_backward's recompute into `bwd_workspace` (chunked_backward_workspace() bytes for the
// same problem and inputs, 256-byte aligned), so that a chunked_backward with saved_forward = true
// and that workspace skips its recompute. chunk_states must be absent (the states stay in the
// workspace); p.workspace is not used.
Status chunked_forward_saving(const ChunkedForwardParams& p, void* bwd_workspace, size_t bwd_workspace_bytes);
// The bwd_workspace bytes chunked_forward_saving needs (chunked_backward_workspace's number).
Status chunked_forward_saving_workspace(const ChunkedForwardParams& p, size_t* bytes);

}  // namespace qed::kernels
