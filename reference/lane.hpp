// A lane is one (sequence, head) pair: an independent recurrence. LaneView maps a variant's
// inputs onto the general GDN-2/QED form (channel decay g, erase gate b, write gate w, lambda,
// arm) so that one core serves every variant; the literal KDA/GDN/DeltaNet code does not use it.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/types.hpp"

namespace qed::reference {

template <class S>
struct LaneView {
  const Inputs<S>* in = nullptr;
  Span span;
  int64_t n = 0;  // sequence index
  int64_t h = 0;  // head
  int64_t K = 0, V = 0, H = 0, T = 0;

  LaneView(const Inputs<S>& inputs, const Span& sp, int64_t seq, int64_t head)
      : in(&inputs), span(sp), n(seq), h(head), K(inputs.dims.K), V(inputs.dims.V),
        H(inputs.dims.H), T(inputs.dims.T) {}

  // Flat index of token t (0-based, within the span) in a [B,T,H,D] tensor with D channels.
  int64_t tok(int64_t t, int64_t D) const { return ((span.b * T + span.t0 + t) * H + h) * D; }
  int64_t tok_scalar(int64_t t) const { return (span.b * T + span.t0 + t) * H + h; }
  int64_t state_offset() const { return (n * H + h) * K * V; }

  const S* q(int64_t t) const { return in->q.data() + tok(t, K); }
  const S* k(int64_t t) const { return in->k.data() + tok(t, K); }
  const S* v(int64_t t) const { return in->v.data() + tok(t, V); }

  bool projected() const {
    return in->variant == Variant::qed &&
           (in->arm == Arm::full || in->arm == Arm::nogate || in->arm == Arm::rand);
  }
  bool has_lambda() const { return in->variant == Variant::qed; }
  S lambda() const { return has_lambda() ? in->lambda[h] : S(0); }

  S g(int64_t t, int64_t c) const {
    switch (in->variant) {
      case Variant::gdn2:
      case Variant::qed:
      case Variant::kda: return in->g[tok(t, K) + c];
      case Variant::gdn: return in->g[tok_scalar(t)];
      case Variant::deltanet: return S(0);
    }
    return S(0);
  }
  S b(int64_t t, int64_t c) const {
    if (in->variant == Variant::gdn2 || in->variant == Variant::qed) return in->b[tok(t, K) + c];
    return in->beta[tok_scalar(t)];
  }
  S w(int64_t t, int64_t j) const {
    if (in->variant == Variant::gdn2 || in->variant == Variant::qed) return in->w[tok(t, V) + j];
    return in->beta[tok_scalar(t)];
  }

  // Query-side vector m_t of MATH.md §2 (only meaningful for the qed variant).
  void m_vector(int64_t t, std::vector<S>& m) const {
    const S* qt = q(t);
    for (int64_t c = 0; c < K; ++c) {
      switch (in->arm) {
        case Arm::full: m[c] = b(t, c) * qt[c]; break;
        case Arm::nogate:
        case Arm::nogate_noproj: m[c] = qt[c]; break;
        case Arm::rand: m[c] = b(t, c) * in->r[h * K + c]; break;
        case Arm::none: m[c] = S(0); break;
      }
    }
  }

  // Erase vector a_t = b ⊙ k + lambda p_t; also returns p_t and m_t (p = m = 0 without lambda).
  void erase_vector(int64_t t, std::vector<S>& a, std::vector<S>& p, std::vector<S>& m) const {
    const S* kt = k(t);
    for (int64_t c = 0; c < K; ++c) a[c] = b(t, c) * kt[c];
    if (!has_lambda()) return;
    m_vector(t, m);
    for (int64_t c = 0; c < K; ++c) p[c] = m[c];
    if (projected()) {
      S nn(0), km(0);
      for (int64_t c = 0; c < K; ++c) {
        nn += kt[c] * kt[c];
        km += kt[c] * m[c];
      }
      if (nn != S(0)) {
        S f = km / nn;
        for (int64_t c = 0; c < K; ++c) p[c] -= f * kt[c];
      }
    }
    S lam = lambda();
    for (int64_t c = 0; c < K; ++c) a[c] += lam * p[c];
  }
};

// Every lane of a case, in a fixed order (sequence-major), so that reductions are deterministic.
template <class S>
std::vector<LaneView<S>> lanes_of(const Inputs<S>& in) {
  std::vector<LaneView<S>> out;
  auto spans = in.spans();
  for (size_t n = 0; n < spans.size(); ++n)
    for (int64_t h = 0; h < in.dims.H; ++h)
      out.emplace_back(in, spans[n], static_cast<int64_t>(n), h);
  return out;
}

}  // namespace qed::reference
