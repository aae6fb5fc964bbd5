// Launch of the chunked backward's chunk-parallel gradient pass (kernels/chunked_bwd_grads.cu) over
// the workspace the recomputing forward and the reverse sweep leave behind.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/chunked_backward_tile.hpp"

namespace qed::kernels::chunked_bwd {

struct GradArgs {
  BwdArgs b;                    // inputs, gradients, token arrays, chunk geometry, cs = S_[n]
  const float* u = nullptr;     // U of every chunk, fp32 [chunk][H][kC][V]
  const float* ubar = nullptr;  // Ū, the same layout
  const float* ds = nullptr;    // Ŝ' (adjoint of the chunk's end state), fp32 [chunk][H][K][V]
  const char* bws = nullptr;    // the backward's blobs (chunked::BwdLayout), for L
  int64_t bblob = 0;            // bytes per (chunk, head)
  int64_t lm_off = 0;           // offset of L in a blob
  int64_t pj_off = 0;           // offset of the per-row (k.k, k.m) pairs in a blob (QED)
  float max_diag = 64.f;        // steepest in-block decay (log2) of the factored diagonal blocks
  int vec = 0;                  // rows of q, k, b, g and do may be read in 16-byte pieces
  int vec_vw = 0;               // rows of v and w (where given) likewise
  int vec_out = 0;              // rows of dq dk dv dg db dw (where given) may be written so
  int warps = 8;                // warps per block: 8 or 16 (QEDCHECK_CHUNKED_GRADS_WARPS)
  int raw = 0;                  // every input row bf16 and 16-byte aligned (q k v b w g do), every
                                // output row aligned: the kernel without the other layouts' code
                                // (QEDCHECK_CHUNKED_GRADS_RAW=0 turns it off, for timing)
  int ahead = 1;                // eight warps: load a slab's inputs one slab ahead (timing knob:
                                // QEDCHECK_CHUNKED_GRADS_AHEAD=0 loads them at use)
  int hold = 1;                 // QED's projected arms, bf16 dq, dk, db, the RAW kernel: the slabs'
                                // partial dq, dk, db held in registers for the final pass instead of
                                // stored and read back (timing knob: QEDCHECK_CHUNKED_GRADS_HOLD=0)
};

// bf16 inputs, K and V in {64, 128}; one block per (chunk slot, head).
cudaError_t launch_grads(const GradArgs& G, int64_t chunks, cudaStream_t st);

}  // namespace qed::kernels::chunked_bwd
