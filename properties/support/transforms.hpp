// Input transformations the properties are stated in: prefixes and token slices, a varlen case
// cut into its sequences, one (sequence, head) lane on its own, identity padding, channel
// permutations, key-space rotations. Generic over the scalar; none of them calls the reference.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "reference/error.hpp"
#include "reference/types.hpp"

namespace qed::properties {

using reference::Dims;
using reference::Layout;
using reference::Outputs;

// Calls f(tensor, D) for every per-token tensor [B,T,H,D] the case carries.
template <class S, class F>
void for_token_tensors(reference::Inputs<S>& in, F&& f) {
  const Layout lay = reference::layout_of(in.variant, in.arm);
  const int64_t K = in.dims.K, V = in.dims.V;
  f(in.q, K);
  f(in.k, K);
  f(in.v, V);
  if (lay.channel_g) f(in.g, K);
  if (lay.scalar_g) f(in.g, int64_t{1});
  if (lay.has_bw) {
    f(in.b, K);
    f(in.w, V);
  }
  if (lay.has_beta) f(in.beta, int64_t{1});
}

// Tokens [t0, t1) of every batch row: [B,T,H,D] -> [B,t1-t0,H,D].
template <class S>
std::vector<S> slice_tokens(const std::vector<S>& x, const Dims& d, int64_t D, int64_t t0, int64_t t1) {
  std::vector<S> out;
  out.reserve(static_cast<size_t>(d.B * (t1 - t0) * d.H * D));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = 0; i < d.H * D; ++i) out.push_back(x[((b * d.T + t) * d.H) * D + i]);
  return out;
}

// Tokens [t0, t1) of every row, same h0 (not for varlen cases).
template <class S>
reference::Inputs<S> token_range(const reference::Inputs<S>& in, int64_t t0, int64_t t1) {
  if (!in.cu_seqlens.empty()) throw Error("token_range: not for varlen cases");
  reference::Inputs<S> out = in;
  for_token_tensors(out, [&](std::vector<S>& x, int64_t D) { x = slice_tokens(x, in.dims, D, t0, t1); });
  out.dims.T = t1 - t0;
  return out;
}

// The first Tp tokens; for a varlen case the split points are clamped to Tp (later sequences
// become zero-length, so the output layout keeps its N).
template <class S>
reference::Inputs<S> prefix(const reference::Inputs<S>& in, int64_t Tp) {
  if (in.cu_seqlens.empty()) return token_range(in, 0, Tp);
  reference::Inputs<S> out = in;
  Dims d = in.dims;
  for_token_tensors(out, [&](std::vector<S>& x, int64_t D) { x = slice_tokens(x, d, D, 0, Tp); });
  out.dims.T = Tp;
  for (auto& c : out.cu_seqlens) c = std::min(c, Tp);
  return out;
}

// Sequence n of a case (a batch row, or a packed sequence) as a B = 1 case without cu_seqlens.
template <class S>
reference::Inputs<S> sequence(const reference::Inputs<S>& in, int64_t n) {
  const auto& d = in.dims;
  reference::Inputs<S> out = in;
  int64_t row = n, t0 = 0, len = d.T;
  if (!in.cu_seqlens.empty()) {
    row = 0;
    t0 = in.cu_seqlens[n];
    len = in.cu_seqlens[n + 1] - t0;
  }
  for_token_tensors(out, [&](std::vector<S>& x, int64_t D) {
    std::vector<S> y;
    for (int64_t t = t0; t < t0 + len; ++t)
      for (int64_t i = 0; i < d.H * D; ++i) y.push_back(x[((row * d.T + t) * d.H) * D + i]);
    x = std::move(y);
  });
  out.dims.B = 1;
  out.dims.T = len;
  out.cu_seqlens.clear();
  if (!in.h0.empty())
    out.h0.assign(in.h0.begin() + n * d.H * d.K * d.V, in.h0.begin() + (n + 1) * d.H * d.K * d.V);
  return out;
}

// Head h of a B = 1 case alone (H = 1), with its lambda and r.
template <class S>
reference::Inputs<S> head(const reference::Inputs<S>& in, int64_t h) {
  const auto& d = in.dims;
  reference::Inputs<S> out = in;
  for_token_tensors(out, [&](std::vector<S>& x, int64_t D) {
    std::vector<S> y;
    for (int64_t bt = 0; bt < d.B * d.T; ++bt)
      for (int64_t i = 0; i < D; ++i) y.push_back(x[(bt * d.H + h) * D + i]);
    x = std::move(y);
  });
  out.dims.H = 1;
  if (!in.lambda.empty()) out.lambda = {in.lambda[h]};
  if (!in.r.empty()) out.r.assign(in.r.begin() + h * d.K, in.r.begin() + (h + 1) * d.K);
  if (!in.h0.empty()) {
    out.h0.clear();
    for (int64_t n = 0; n < in.num_sequences(); ++n)
      for (int64_t i = 0; i < d.K * d.V; ++i) out.h0.push_back(in.h0[(n * d.H + h) * d.K * d.V + i]);
  }
  return out;
}

// Output slices matching `sequence` and `head`.
template <class S>
std::vector<S> sequence_o(const reference::Inputs<S>& in, const std::vector<S>& o, int64_t n) {
  const auto& d = in.dims;
  int64_t row = n, t0 = 0, len = d.T;
  if (!in.cu_seqlens.empty()) {
    row = 0;
    t0 = in.cu_seqlens[n];
    len = in.cu_seqlens[n + 1] - t0;
  }
  return std::vector<S>(o.begin() + (row * d.T + t0) * d.H * d.V,
                        o.begin() + (row * d.T + t0 + len) * d.H * d.V);
}
template <class S>
std::vector<S> sequence_state(const reference::Inputs<S>& in, const std::vector<S>& ht, int64_t n) {
  const int64_t st = in.dims.H * in.dims.K * in.dims.V;
  return std::vector<S>(ht.begin() + n * st, ht.begin() + (n + 1) * st);
}
template <class S>
std::vector<S> head_slice(const std::vector<S>& x, int64_t rows, int64_t H, int64_t D, int64_t h) {
  std::vector<S> y;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < D; ++i) y.push_back(x[(r * H + h) * D + i]);
  return y;
}

// Inserts identity steps (k = 0, g = 0, z = 0 through v = 0; q, b, w, beta arbitrary) into every
// sequence: pads[p] steps before packed token p (p < T; they join p's sequence) and pads[T] at the
// end of the last sequence. Returns the padded case and, per original token, its new position.
template <class S>
reference::Inputs<S> insert_identity_steps(const reference::Inputs<S>& in, const std::vector<int64_t>& pads,
                                           std::vector<int64_t>& new_pos, uint64_t seed) {
  const auto& d = in.dims;
  if (static_cast<int64_t>(pads.size()) != d.T + 1) throw Error("insert_identity_steps: pads needs T+1 entries");
  int64_t extra = 0;
  for (auto p : pads) extra += p;
  const int64_t T2 = d.T + extra;
  new_pos.assign(static_cast<size_t>(d.T), 0);
  std::vector<int64_t> src(static_cast<size_t>(T2), -1);  // original token, or -1 for a pad
  int64_t pos = 0;
  for (int64_t t = 0; t <= d.T; ++t) {
    pos += pads[t];
    if (t < d.T) {
      new_pos[t] = pos;
      src[pos++] = t;
    }
  }
  reference::Inputs<S> out = in;
  out.dims.T = T2;
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next_unit = [&state] {  // a small LCG in [0.05, 0.95]: pad contents need not be random-quality
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return 0.05 + 0.9 * static_cast<double>(state >> 11) * 0x1.0p-53;
  };
  const Layout lay = reference::layout_of(in.variant, in.arm);
  auto rebuild = [&](std::vector<S>& x, int64_t D, bool zero_pad) {
    std::vector<S> y(static_cast<size_t>(d.B * T2 * d.H * D));
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t t = 0; t < T2; ++t)
        for (int64_t i = 0; i < d.H * D; ++i) {
          const int64_t o = (b * T2 + t) * d.H * D + i;
          y[o] = src[t] >= 0 ? x[(b * d.T + src[t]) * d.H * D + i] : (zero_pad ? S(0) : S(next_unit()));
        }
    x = std::move(y);
  };
  rebuild(out.q, d.K, false);
  rebuild(out.k, d.K, true);
  rebuild(out.v, d.V, true);
  if (lay.channel_g) rebuild(out.g, d.K, true);
  if (lay.scalar_g) rebuild(out.g, 1, true);
  if (lay.has_bw) {
    rebuild(out.b, d.K, false);
    rebuild(out.w, d.V, false);
  }
  if (lay.has_beta) rebuild(out.beta, 1, false);
  if (!in.cu_seqlens.empty()) {
    // Sequence n keeps its tokens and gains the pads inserted before them (the last sequence
    // also gains the trailing pads), so new_cu[n] is where its first token's pads begin.
    const int64_t N = in.num_sequences();
    std::vector<int64_t> cum(static_cast<size_t>(d.T + 2), 0);
    for (int64_t t = 0; t <= d.T; ++t) cum[t + 1] = cum[t] + pads[t];
    for (int64_t n = 0; n < N; ++n) out.cu_seqlens[n] = in.cu_seqlens[n] + cum[in.cu_seqlens[n]];
    out.cu_seqlens[N] = T2;
  }
  return out;
}

// Gather positions `pos` (tokens of the padded run) back into the original [B,T,H,V] layout.
template <class S>
std::vector<S> gather_tokens(const std::vector<S>& o, const Dims& d, int64_t T2, const std::vector<int64_t>& pos) {
  std::vector<S> y;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.T; ++t)
      for (int64_t i = 0; i < d.H * d.V; ++i) y.push_back(o[(b * T2 + pos[t]) * d.H * d.V + i]);
  return y;
}

template <class S>
std::vector<S> permute_states(const std::vector<S>& st, const Dims& d, const std::vector<int64_t>& pK,
                              const std::vector<int64_t>& pV) {
  std::vector<S> y(st.size());
  for (size_t s = 0; s * d.K * d.V < st.size(); ++s)
    for (int64_t c = 0; c < d.K; ++c)
      for (int64_t j = 0; j < d.V; ++j) y[s * d.K * d.V + pK[c] * d.V + pV[j]] = st[s * d.K * d.V + c * d.V + j];
  return y;
}

// Relabels key channels (c -> permK[c]) and value channels (j -> permV[j]) everywhere.
template <class S>
reference::Inputs<S> permute_channels(const reference::Inputs<S>& in, const std::vector<int64_t>& pK,
                                      const std::vector<int64_t>& pV) {
  const auto& d = in.dims;
  reference::Inputs<S> out = in;
  auto perm_rows = [](std::vector<S>& x, int64_t D, const std::vector<int64_t>& p) {
    std::vector<S> y(x.size());
    for (size_t r = 0; r * D < x.size(); ++r)
      for (int64_t c = 0; c < D; ++c) y[r * D + p[c]] = x[r * D + c];
    x = std::move(y);
  };
  const Layout lay = reference::layout_of(in.variant, in.arm);
  perm_rows(out.q, d.K, pK);
  perm_rows(out.k, d.K, pK);
  perm_rows(out.v, d.V, pV);
  if (lay.channel_g) perm_rows(out.g, d.K, pK);
  if (lay.has_bw) {
    perm_rows(out.b, d.K, pK);
    perm_rows(out.w, d.V, pV);
  }
  if (lay.has_r) perm_rows(out.r, d.K, pK);
  if (!in.h0.empty()) out.h0 = permute_states(in.h0, d, pK, pV);
  return out;
}

template <class S>
std::vector<S> permute_values(const std::vector<S>& o, int64_t V, const std::vector<int64_t>& pV) {
  std::vector<S> y(o.size());
  for (size_t r = 0; r * V < o.size(); ++r)
    for (int64_t j = 0; j < V; ++j) y[r * V + pV[j]] = o[r * V + j];
  return y;
}

// x -> R x on every key-space row vector (q, k, r) and on h0's rows (S0 -> R S0).
template <class S>
std::vector<S> rotate_rows(const std::vector<S>& x, int64_t K, const std::vector<S>& R) {
  std::vector<S> y(x.size(), S(0));
  for (size_t r = 0; r * K < x.size(); ++r)
    for (int64_t i = 0; i < K; ++i) {
      S acc(0);
      for (int64_t c = 0; c < K; ++c) acc += R[i * K + c] * x[r * K + c];
      y[r * K + i] = acc;
    }
  return y;
}
template <class S>
std::vector<S> rotate_states(const std::vector<S>& st, int64_t K, int64_t V, const std::vector<S>& R) {
  std::vector<S> y(st.size(), S(0));
  for (size_t s = 0; s * K * V < st.size(); ++s)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j) {
        S acc(0);
        for (int64_t c = 0; c < K; ++c) acc += R[i * K + c] * st[s * K * V + c * V + j];
        y[s * K * V + i * V + j] = acc;
      }
  return y;
}

// A random orthogonal K x K matrix (row-major) by Gram-Schmidt on Gaussian columns, carried
// out in S so that it is orthogonal to S's precision. `normal` supplies N(0,1) doubles.
template <class S>
std::vector<S> random_orthogonal(int64_t K, const std::function<double()>& normal) {
  using std::sqrt;
  std::vector<S> Q(static_cast<size_t>(K * K), S(0));
  for (int64_t j = 0; j < K; ++j) {
    std::vector<S> x(static_cast<size_t>(K));
    for (auto& e : x) e = S(normal());
    for (int pass = 0; pass < 2; ++pass)  // twice is enough (Kahan)
      for (int64_t l = 0; l < j; ++l) {
        S dot(0);
        for (int64_t i = 0; i < K; ++i) dot += Q[i * K + l] * x[i];
        for (int64_t i = 0; i < K; ++i) x[i] -= dot * Q[i * K + l];
      }
    S n(0);
    for (auto& e : x) n += e * e;
    n = sqrt(n);
    for (int64_t i = 0; i < K; ++i) Q[i * K + j] = x[i] / n;
  }
  return Q;
}

}  // namespace qed::properties
