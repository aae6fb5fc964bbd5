// The chunked (WY) forward pass of MATH.md §4 for every variant and arm, generic over the scalar
// type, with the operand-rounding twin of chunked_core.hpp. Each sequence is chunked on its own
// (chunks never straddle sequences); lanes run in parallel and write disjoint outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/chunked_core.hpp"
#include "reference/lane.hpp"
#include "reference/parallel.hpp"
#include "reference/recurrent.hpp"
#include "reference/types.hpp"

namespace qed::reference {

// First global chunk index of every sequence: sequence n owns chunks
// [base[n], base[n] + ceil(len_n / C)); base.back() is the total.
template <class S>
std::vector<int64_t> chunk_bases(const Inputs<S>& in, int64_t C) {
  std::vector<int64_t> base{0};
  for (const Span& sp : in.spans()) base.push_back(base.back() + chunk_count(sp.len, C));
  return base;
}

// Forward pass: o [B,T,H,V] and ht [N,H,K,V]. If chunk_states is given it receives the
// chunk-start states S_[n] as [total_chunks, H, K, V], total_chunks = sum_n ceil(len_n / C),
// chunks of sequence 0 first (the layout of a varlen kernel's `h`).
template <class S>
Outputs<S> chunked_forward(const Inputs<S>& in, const ChunkOptions& opt,
                           std::vector<S>* chunk_states = nullptr, int threads = 0) {
  check_options(opt);
  const auto& d = in.dims;
  const int64_t K = d.K, V = d.V, H = d.H;
  Outputs<S> out;
  out.o.assign(static_cast<size_t>(d.B * d.T * H * V), S(0));
  out.ht.assign(static_cast<size_t>(in.num_sequences() * H * K * V), S(0));
  const std::vector<int64_t> base = chunk_bases(in, opt.chunk);
  if (chunk_states) chunk_states->assign(static_cast<size_t>(base.back() * H * K * V), S(0));
  auto lanes = lanes_of(in);
  parallel_for(
      static_cast<int64_t>(lanes.size()),
      [&](int64_t li) {
        const auto& Lv = lanes[li];
        std::vector<S> St = detail::initial_state(Lv);
        const int64_t len = Lv.span.len;
        for (int64_t t0 = 0, ci = 0; t0 < len; t0 += opt.chunk, ++ci) {
          if (chunk_states) {
            const int64_t off = ((base[Lv.n] + ci) * H + Lv.h) * K * V;
            for (int64_t i = 0; i < K * V; ++i) (*chunk_states)[off + i] = St[i];
          }
          const Chunk<S> ch = build_chunk(Lv, t0, std::min(opt.chunk, len - t0), opt);
          const std::vector<S> Sr = rounded_copy(St, opt.operands);
          const std::vector<S> Ur = chunk_pseudo_values(ch, Sr);
          for (int64_t r = 0; r < ch.n; ++r)
            chunk_output_row(ch, r, Sr, Ur, in.scale, out.o.data() + Lv.tok(t0 + r, V));
          chunk_advance_state(ch, Ur, St);
        }
        for (int64_t i = 0; i < K * V; ++i) out.ht[Lv.state_offset() + i] = St[i];
      },
      threads);
  return out;
}

}  // namespace qed::reference
