// Forward properties about states and lanes (MATH.md §9 P11, P12): the exact write of a full
// erase, and the independence of (sequence, head) lanes. Same shape as checks_forward.hpp:
// `residual = check_Px(impl, inputs, ...)` for any callable Inputs<S> -> Outputs<S>.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fixtures/generate.hpp"
#include "properties/support/checks_forward.hpp"
#include "properties/support/numerics.hpp"
#include "properties/support/transforms.hpp"
#include "reference/literal.hpp"

namespace qed::properties {

// P11: with a full erase along a unit key the new state reads back exactly what was written:
// S_t^T k_t = z_t (gdn2 with b = 1, kda / gdn / deltanet with beta = 1), and for qed `full` with
// b = 1: S_t^T k_t = z_t - lambda (D_t S_{t-1})^T P(k_t) q_t. Keys are normalised here; states
// are read from the implementation as ht of prefix runs of each sequence.
template <class S, class F>
double check_P11_exact_write(F&& impl, const Inputs<S>& in0) {
  using std::exp;
  using std::sqrt;
  Inputs<S> in = in0;
  const int64_t K = in.dims.K, V = in.dims.V, H = in.dims.H;
  if (in.variant == Variant::qed) in.arm = Arm::full;
  if (in.variant == Variant::qed) in.r.clear();
  for (auto& e : in.b) e = S(1);
  for (auto& e : in.beta) e = S(1);
  for (size_t t = 0; t * K < in.k.size(); ++t) {
    S n(0);
    for (int64_t c = 0; c < K; ++c) n += in.k[t * K + c] * in.k[t * K + c];
    n = sqrt(n);
    if (n == S(0)) {
      in.k[t * K] = S(1);
      n = S(1);
    }
    for (int64_t c = 0; c < K; ++c) in.k[t * K + c] /= n;
  }
  const auto lay = reference::layout_of(in.variant, in.arm);
  double worst = 0, zmax = 0;
  std::vector<double> errs;
  for (int64_t n = 0; n < in.num_sequences(); ++n) {
    const Inputs<S> seq = sequence(in, n);
    const int64_t T = seq.dims.T;
    std::vector<std::vector<S>> states;  // states[t] = S_t of every head, [H,K,V]
    for (int64_t t = 0; t <= T; ++t) {
      auto st = impl(prefix(seq, t)).ht;
      states.push_back(std::move(st));
    }
    for (int64_t t = 1; t <= T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t tok = (t - 1) * H + h;
        const S* k = seq.k.data() + tok * K;
        const S* q = seq.q.data() + tok * K;
        const S* St = states[t].data() + h * K * V;
        const S* Sp = states[t - 1].data() + h * K * V;
        // Expected value: z, minus the projected query term for qed.
        std::vector<S> expect(static_cast<size_t>(V));
        for (int64_t j = 0; j < V; ++j) {
          const S vj = seq.v[tok * V + j];
          expect[j] = lay.has_bw ? seq.w[tok * V + j] * vj : vj;
        }
        if (in.variant == Variant::qed) {
          std::vector<S> pq(q, q + K);
          S kq(0);
          for (int64_t c = 0; c < K; ++c) kq += k[c] * q[c];
          for (int64_t c = 0; c < K; ++c) pq[c] -= kq * k[c];  // unit k
          for (int64_t j = 0; j < V; ++j) {
            S acc(0);
            for (int64_t c = 0; c < K; ++c)
              acc += exp(seq.g[tok * K + c]) * Sp[c * V + j] * pq[c];
            expect[j] -= seq.lambda[h] * acc;
          }
        }
        for (int64_t j = 0; j < V; ++j) {
          S got(0);
          for (int64_t c = 0; c < K; ++c) got += St[c * V + j] * k[c];
          worst = std::max(worst, abs_d(got - expect[j]));
          zmax = std::max(zmax, abs_d(expect[j]));
        }
      }
  }
  return worst / std::max(zmax, 1e-300);
}

// Marks the o and ht entries that belong to lane (sequence n, head h).
template <class S>
void lane_masks(const Inputs<S>& in, int64_t n, int64_t h, std::vector<char>& o_mask, std::vector<char>& s_mask) {
  const auto& d = in.dims;
  o_mask.assign(static_cast<size_t>(d.B * d.T * d.H * d.V), 0);
  s_mask.assign(static_cast<size_t>(in.num_sequences() * d.H * d.K * d.V), 0);
  int64_t row = n, t0 = 0, len = d.T;
  if (!in.cu_seqlens.empty()) {
    row = 0;
    t0 = in.cu_seqlens[n];
    len = in.cu_seqlens[n + 1] - t0;
  }
  for (int64_t t = t0; t < t0 + len; ++t)
    for (int64_t j = 0; j < d.V; ++j) o_mask[((row * d.T + t) * d.H + h) * d.V + j] = 1;
  for (int64_t i = 0; i < d.K * d.V; ++i) s_mask[(n * d.H + h) * d.K * d.V + i] = 1;
}

template <class S>
double masked_bitwise(const std::vector<S>& x, const std::vector<S>& y, const std::vector<char>& mask, bool inside) {
  if (x.size() != y.size()) return std::numeric_limits<double>::infinity();
  double r = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if ((mask[i] != 0) == inside && !(x[i] == y[i]))
      r = std::max(r, abs_d(x[i] - y[i]) > 0 ? abs_d(x[i] - y[i]) : std::numeric_limits<double>::infinity());
  return r;
}

// P12 (a): every lane run alone (B = 1, H = 1) reproduces its slice of the batched run, bitwise.
template <class S, class F>
double check_P12_lanes(F&& impl, const Inputs<S>& in) {
  const auto full = impl(in);
  const int64_t H = in.dims.H, K = in.dims.K, V = in.dims.V;
  double r = 0;
  for (int64_t n = 0; n < in.num_sequences(); ++n) {
    const Inputs<S> seq = sequence(in, n);
    const auto so = sequence_o(in, full.o, n);
    const auto ss = sequence_state(in, full.ht, n);
    for (int64_t h = 0; h < H; ++h) {
      const auto one = impl(head(seq, h));
      r = std::max({r, bitwise_residual(one.o, head_slice(so, seq.dims.T, H, V, h)),
                    bitwise_residual(one.ht, head_slice(ss, 1, H, K * V, h))});
    }
  }
  return r;
}

// P12 (b): perturbing every input of lane (n, h) (its tokens and its h0) leaves every other
// lane's o and ht bitwise unchanged; perturbing head h's lambda and r leaves other heads unchanged.
template <class S, class F>
double check_P12_perturb(F&& impl, const Inputs<S>& in, int64_t n, int64_t h, uint64_t seed) {
  const auto& d = in.dims;
  fixtures::Rng rng(seed);
  const auto base = impl(in);
  std::vector<char> om, sm;
  lane_masks(in, n, h, om, sm);
  Inputs<S> x = in;
  int64_t row = n, t0 = 0, len = d.T;
  if (!in.cu_seqlens.empty()) {
    row = 0;
    t0 = in.cu_seqlens[n];
    len = in.cu_seqlens[n + 1] - t0;
  }
  // Gates stay in range: g scaled by a factor in (0.5, 1.5), b, w, beta moved towards 1/2.
  for_token_tensors(x, [&](std::vector<S>& v, int64_t D) {
    const bool gate = &v == &x.b || &v == &x.w || &v == &x.beta;
    const bool decay = &v == &x.g;
    for (int64_t t = t0; t < t0 + len; ++t)
      for (int64_t i = 0; i < D; ++i) {
        S& e = v[((row * d.T + t) * d.H + h) * D + i];
        const double u = rng.uniform();
        if (gate) e = (e + S(u)) / S(2);
        else if (decay) e *= S(0.5 + u);
        else e += S(u - 0.5);
      }
  });
  if (!x.h0.empty())
    for (int64_t i = 0; i < d.K * d.V; ++i) x.h0[(n * d.H + h) * d.K * d.V + i] += S(rng.normal());
  const auto pert = impl(x);
  double r = std::max(masked_bitwise(pert.o, base.o, om, false), masked_bitwise(pert.ht, base.ht, sm, false));
  if (!in.lambda.empty() || !in.r.empty()) {
    Inputs<S> y = in;
    if (!y.lambda.empty()) y.lambda[h] *= S(1.25);
    for (int64_t c = 0; c < d.K && !y.r.empty(); ++c) y.r[h * d.K + c] = -y.r[h * d.K + c];
    const auto ph = impl(y);
    // Other heads: every o and ht entry whose head index differs from h.
    std::vector<char> ohead(base.o.size(), 0), shead(base.ht.size(), 0);
    for (size_t i = 0; i < ohead.size(); ++i) ohead[i] = static_cast<int64_t>(i / d.V) % d.H == h;
    for (size_t i = 0; i < shead.size(); ++i) shead[i] = static_cast<int64_t>(i / (d.K * d.V)) % d.H == h;
    r = std::max({r, masked_bitwise(ph.o, base.o, ohead, false), masked_bitwise(ph.ht, base.ht, shead, false)});
  }
  return r;
}

}  // namespace qed::properties
