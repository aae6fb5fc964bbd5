// Zero-padding of the head dimensions K and V, so that a kernel built for a few head sizes can run
// a case of any smaller size (the golden corpus has K = V = 4; the CUDA recurrent kernel is built
// for K in {16, 32, 64, 128, 256}, the chunked kernel for K, V in {64, 128}).
//
// Why this is exact (MATH.md §2): pad q, k, b, g (per channel), r and h0 with zeros in the new key
// channels and v, w, h0 with zeros in the new value channels. Then a_t is zero in the new key
// channels (b*k = 0, m_t = 0 there, and P(k)m keeps that zero because k is zero there), so the
// rows of S for new key channels stay D*0 - 0 + 0 = 0 and the columns for new value channels stay
// zero (z_t = w*v = 0 there). Every sum over a head dimension gains only zero terms, which leave
// a floating-point sum unchanged (x + 0 = x), and o_t = s S_t^T q_t is zero in the new value
// channels. The gradients in the original channels are therefore those of the original problem;
// the padded channels' gradients are dropped. properties/test_head_padding.cpp checks this bit for
// bit against the CPU reference.
#pragma once

#include <cstdint>
#include <string>

#include "reference/types.hpp"

namespace qed::verify {

// Every tensor of a problem with its K and V changed to K2, V2: the first min(K, K2) key channels
// and min(V, V2) value channels are kept, new channels are zero. Padding (K2 >= K, V2 >= V) and
// trimming back (resize of the padded problem to the original sizes) are the same operation.
// `in` gives the layout (variant, arm, sizes, number of sequences).
reference::Inputs<double> resize_heads(const reference::Inputs<double>& in, int64_t K2, int64_t V2);
reference::Cotangents<double> resize_heads(const reference::Cotangents<double>& c,
                                           const reference::Inputs<double>& in, int64_t K2, int64_t V2);
reference::Outputs<double> resize_heads(const reference::Outputs<double>& o,
                                        const reference::Inputs<double>& in, int64_t K2, int64_t V2);
reference::Grads<double> resize_heads(const reference::Grads<double>& g,
                                      const reference::Inputs<double>& in, int64_t K2, int64_t V2);

// The head sizes a CUDA implementation runs a problem of size K x V at: the smallest built sizes
// that are at least K and V (cuda-recurrent: K in {16, 32, 64, 128, 256}, V a multiple of 4;
// cuda-chunked: K and V in {64, 128}). A size above the largest built one is returned unchanged,
// so that the kernel's own error message reports it.
struct HeadSizes {
  int64_t K = 0, V = 0;
};
HeadSizes built_head_sizes(const std::string& impl, int64_t K, int64_t V);

}  // namespace qed::verify
