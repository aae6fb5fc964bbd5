#include "verify/head_padding.hpp"

#include <algorithm>

namespace qed::verify {

namespace {

using reference::Inputs;

// rows x n -> rows x n2: each row's first min(n, n2) values kept, the rest zero.
std::vector<double> resize_rows(const std::vector<double>& x, int64_t n, int64_t n2) {
  if (x.empty() || n == n2) return x;
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  const int64_t keep = std::min(n, n2);
  std::vector<double> out(static_cast<size_t>(rows * n2), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(x.begin() + r * n, keep, out.begin() + r * n2);
  return out;
}

// count x K x V -> count x K2 x V2 (states: [N,H,K,V]).
std::vector<double> resize_states(const std::vector<double>& x, int64_t K, int64_t V, int64_t K2,
                                  int64_t V2) {
  if (x.empty() || (K == K2 && V == V2)) return x;
  // First the value columns of every key row, then each state's key rows (K rows of V2 values).
  return resize_rows(resize_rows(x, V, V2), K * V2, K2 * V2);
}

// One resize: key tensors [.., K], value tensors [.., V], states [.., K, V].
struct Sizes {
  int64_t K, V, K2, V2;
  std::vector<double> key(const std::vector<double>& x) const { return resize_rows(x, K, K2); }
  std::vector<double> value(const std::vector<double>& x) const { return resize_rows(x, V, V2); }
  std::vector<double> state(const std::vector<double>& x) const { return resize_states(x, K, V, K2, V2); }
  // g is [B,T,H,K] for the per-channel variants, [B,T,H] for gdn (unchanged).
  std::vector<double> gate(const std::vector<double>& x, const Inputs<double>& in) const {
    return reference::layout_of(in.variant, in.arm).channel_g ? key(x) : x;
  }
};

Sizes sizes(const Inputs<double>& in, int64_t K2, int64_t V2) { return {in.dims.K, in.dims.V, K2, V2}; }

// The eight tensors laid out like the inputs q k v g b w r h0, or like their gradients.
void resize_input_like(const Sizes& s, const Inputs<double>& layout, std::vector<double>& q,
                       std::vector<double>& k, std::vector<double>& v, std::vector<double>& g,
                       std::vector<double>& b, std::vector<double>& w, std::vector<double>& r,
                       std::vector<double>& h0) {
  q = s.key(q);
  k = s.key(k);
  v = s.value(v);
  g = s.gate(g, layout);
  b = s.key(b);
  w = s.value(w);
  r = s.key(r);
  h0 = s.state(h0);
}

}  // namespace

Inputs<double> resize_heads(const Inputs<double>& in, int64_t K2, int64_t V2) {
  Inputs<double> out = in;
  out.dims.K = K2;
  out.dims.V = V2;
  resize_input_like(sizes(in, K2, V2), in, out.q, out.k, out.v, out.g, out.b, out.w, out.r, out.h0);
  return out;
}

reference::Cotangents<double> resize_heads(const reference::Cotangents<double>& c, const Inputs<double>& in,
                                           int64_t K2, int64_t V2) {
  const Sizes s = sizes(in, K2, V2);
  return {s.value(c.do_), s.state(c.dht)};
}

reference::Outputs<double> resize_heads(const reference::Outputs<double>& o, const Inputs<double>& in,
                                        int64_t K2, int64_t V2) {
  const Sizes s = sizes(in, K2, V2);
  return {s.value(o.o), s.state(o.ht)};
}

reference::Grads<double> resize_heads(const reference::Grads<double>& g, const Inputs<double>& in,
                                      int64_t K2, int64_t V2) {
  reference::Grads<double> out = g;  // dbeta, dlambda: no head dimension
  resize_input_like(sizes(in, K2, V2), in, out.dq, out.dk, out.dv, out.dg, out.db, out.dw, out.dr, out.dh0);
  return out;
}

HeadSizes built_head_sizes(const std::string& impl, int64_t K, int64_t V) {
  // Mirrors the kernels' checks (kernels/api.cpp validate_problem, chunked_common.cuh
  // check_built_sizes); the GPU golden replay fails if the two ever disagree.
  auto smallest_at_least = [](int64_t n, std::initializer_list<int64_t> built) {
    for (int64_t b : built)
      if (b >= n) return b;
    return n;
  };
  if (impl == "cuda-recurrent")
    return {smallest_at_least(K, {16, 32, 64, 128, 256}), V >= 1 && V <= 4096 ? (V + 3) / 4 * 4 : V};
  if (impl == "cuda-chunked") return {smallest_at_least(K, {64, 128}), smallest_at_least(V, {64, 128})};
  return {K, V};
}

}  // namespace qed::verify
