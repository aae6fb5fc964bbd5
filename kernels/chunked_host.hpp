// Runs the CUDA chunked forward on a reference problem given in double: rounds the inputs to the
// kernel's dtype (kernels/host_run.hpp's round_inputs, as the recurrent kernel sees them),
// uploads, runs chunked_forward and returns o, ht (and optionally the chunk-start states) in
// double with the rounded inputs; run_chunked_grads also runs the chunked backward. Used by
// `qedcheck run --impl cuda-chunked` and the GPU tests.
#pragma once

#include <vector>

#include "kernels/api.hpp"
#include "reference/types.hpp"

namespace qed::kernels {

struct ChunkedHostRun {
  reference::Inputs<double> inputs;    // as consumed
  reference::Outputs<double> outputs;  // o in out_dtype, ht fp32
  std::vector<double> chunk_states;    // [total_chunks, H, K, V] when asked for
  reference::Cotangents<double> cotangents;  // as consumed (do in dtype, dht fp32); run_chunked_grads
  reference::Grads<double> grads;            // in grad_dtype (dlambda, dr, dh0 fp32)
  bool has_grads = false;
};

// Throws qed::Error("no CUDA device: ...") without a usable device and qed::Error with the
// API's message on invalid arguments or CUDA failures. Every output buffer and the workspace are
// NaN-poisoned before the call, so an element the kernels fail to write (or a workspace fragment
// read before it is written) shows up as NaN.
ChunkedHostRun run_chunked(const reference::Inputs<double>& in, DType dtype,
                           bool want_chunk_states = false, DType out_dtype = DType::fp32);

// run_chunked, then, when cot is given, chunked_backward on the same rounded inputs with do
// rounded to dtype and dht to fp32. Gradient buffers are NaN-poisoned before the call.
ChunkedHostRun run_chunked_grads(const reference::Inputs<double>& in,
                                 const reference::Cotangents<double>* cot, DType dtype,
                                 DType grad_dtype = DType::fp32, bool want_chunk_states = false);

// The training pair on the same problem: chunked_forward_saving (o in fp32, ht) into a NaN-poisoned
// backward workspace, then chunked_backward with saved_forward = true on it. `stale`, when given
// (same dims), is what the saving forward runs on instead of `in`: the backward then reads a
// recompute of other inputs (a test's deliberately broken use).
ChunkedHostRun run_chunked_training(const reference::Inputs<double>& in,
                                    const reference::Cotangents<double>& cot, DType dtype,
                                    DType grad_dtype = DType::fp32,
                                    const reference::Inputs<double>* stale = nullptr);

}  // namespace qed::kernels
