// Literal implementations, each written from its own published update rule (MATH.md §2) with
// explicit K x K matrices: KDA, Gated DeltaNet, DeltaNet, and a matrix-product GDN-2/QED oracle
// that builds P(k) and (I - k a^T) as matrices (MATH.md §11, first row). They share the
// Inputs/Outputs types of the reference but none of its code (no LaneView, no GDN-2 core), so
// agreement with recurrent_forward is evidence about both. Slow (O(K^2 V) per step) on purpose.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/error.hpp"
#include "reference/types.hpp"

namespace qed::reference::literal {

// A small dense row-major matrix; just enough algebra to write the update rules as printed.
template <class S>
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<S> a;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), a(static_cast<size_t>(r * c), S(0)) {}
  S& operator()(int64_t i, int64_t j) { return a[static_cast<size_t>(i * cols + j)]; }
  const S& operator()(int64_t i, int64_t j) const { return a[static_cast<size_t>(i * cols + j)]; }

  static Mat identity(int64_t n) {
    Mat m(n, n);
    for (int64_t i = 0; i < n; ++i) m(i, i) = S(1);
    return m;
  }
  static Mat column(const std::vector<S>& x) {
    Mat m(static_cast<int64_t>(x.size()), 1);
    m.a = x;
    return m;
  }
  static Mat diag(const std::vector<S>& x) {
    Mat m(static_cast<int64_t>(x.size()), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) m(i, i) = x[i];
    return m;
  }
  Mat transpose() const {
    Mat t(cols, rows);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) t(j, i) = (*this)(i, j);
    return t;
  }
  friend Mat operator*(const Mat& x, const Mat& y) {
    if (x.cols != y.rows) throw Error("literal: matrix product with mismatched shapes");
    Mat p(x.rows, y.cols);
    for (int64_t i = 0; i < x.rows; ++i)
      for (int64_t j = 0; j < y.cols; ++j) {
        S acc(0);
        for (int64_t l = 0; l < x.cols; ++l) acc += x(i, l) * y(l, j);
        p(i, j) = acc;
      }
    return p;
  }
  friend Mat operator+(Mat x, const Mat& y) {
    for (size_t i = 0; i < x.a.size(); ++i) x.a[i] += y.a[i];
    return x;
  }
  friend Mat operator-(Mat x, const Mat& y) {
    for (size_t i = 0; i < x.a.size(); ++i) x.a[i] -= y.a[i];
    return x;
  }
  friend Mat operator*(const S& s, Mat x) {
    for (auto& e : x.a) e *= s;
    return x;
  }
};

// P(k) = I - k k^T / (k^T k) as a matrix, with P(0) = I (MATH.md §2 convention).
template <class S>
Mat<S> projector(const std::vector<S>& k) {
  const int64_t K = static_cast<int64_t>(k.size());
  S n(0);
  for (const auto& e : k) n += e * e;
  Mat<S> P = Mat<S>::identity(K);
  if (n == S(0)) return P;
  Mat<S> kc = Mat<S>::column(k);
  return P - (S(1) / n) * (kc * kc.transpose());
}

namespace detail {

// Where one (sequence, head) lane lives in the flat [B,T,H,D] / [N,H,K,V] tensors; written here
// again rather than borrowed from lane.hpp, so that an indexing slip there is not shared.
struct Lane {
  int64_t row = 0, t0 = 0, len = 0, n = 0, h = 0;
};

template <class S>
std::vector<Lane> lanes(const Inputs<S>& in) {
  const auto& d = in.dims;
  std::vector<Lane> out;
  if (in.cu_seqlens.empty()) {
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h) out.push_back({b, 0, d.T, b, h});
  } else {
    for (size_t n = 0; n + 1 < in.cu_seqlens.size(); ++n)
      for (int64_t h = 0; h < d.H; ++h)
        out.push_back({0, in.cu_seqlens[n], in.cu_seqlens[n + 1] - in.cu_seqlens[n],
                       static_cast<int64_t>(n), h});
  }
  return out;
}

template <class S>
std::vector<S> slice(const std::vector<S>& x, int64_t offset, int64_t count) {
  return std::vector<S>(x.begin() + offset, x.begin() + offset + count);
}

// Per-token row of a [B,T,H,D] tensor (D = 1 for the per-token scalars beta and scalar g).
inline int64_t at(const Dims& d, const Lane& L, int64_t t, int64_t D) {
  return ((L.row * d.T + L.t0 + t) * d.H + L.h) * D;
}

// The update rule of one variant: S_t from S_{t-1} and the token's inputs.
template <class S>
Mat<S> step(const Inputs<S>& in, const Lane& L, int64_t t, const Mat<S>& Sprev) {
  using std::exp;
  const auto& d = in.dims;
  const int64_t K = d.K, V = d.V;
  const Mat<S> I = Mat<S>::identity(K);
  const Mat<S> k = Mat<S>::column(slice(in.k, at(d, L, t, K), K));
  const Mat<S> v = Mat<S>::column(slice(in.v, at(d, L, t, V), V));
  switch (in.variant) {
    case Variant::kda: {
      // S_t = (I - beta k k^T) D_t S_{t-1} + beta k v^T
      const S beta = in.beta[at(d, L, t, 1)];
      std::vector<S> alpha(static_cast<size_t>(K));
      for (int64_t c = 0; c < K; ++c) alpha[c] = exp(in.g[at(d, L, t, K) + c]);
      return (I - beta * (k * k.transpose())) * (Mat<S>::diag(alpha) * Sprev) +
             beta * (k * v.transpose());
    }
    case Variant::gdn: {
      // S_t = alpha_t (I - beta k k^T) S_{t-1} + beta k v^T, alpha_t a scalar
      const S beta = in.beta[at(d, L, t, 1)];
      const S alpha = exp(in.g[at(d, L, t, 1)]);
      return alpha * ((I - beta * (k * k.transpose())) * Sprev) + beta * (k * v.transpose());
    }
    case Variant::deltanet: {
      // S_t = S_{t-1} + beta k (v - S_{t-1}^T k)^T
      const S beta = in.beta[at(d, L, t, 1)];
      return Sprev + beta * (k * (v - Sprev.transpose() * k).transpose());
    }
    case Variant::gdn2:
    case Variant::qed: {
      // S_t = (I - k a^T) D_t S_{t-1} + k z^T, a = b ⊙ k + lambda p, z = w ⊙ v (MATH.md §2)
      std::vector<S> kv = slice(in.k, at(d, L, t, K), K);
      std::vector<S> bv = slice(in.b, at(d, L, t, K), K);
      std::vector<S> qv = slice(in.q, at(d, L, t, K), K);
      std::vector<S> alpha(static_cast<size_t>(K));
      for (int64_t c = 0; c < K; ++c) alpha[c] = exp(in.g[at(d, L, t, K) + c]);
      Mat<S> a = Mat<S>::diag(bv) * k;
      if (in.variant == Variant::qed) {
        std::vector<S> m(static_cast<size_t>(K));
        for (int64_t c = 0; c < K; ++c) {
          switch (in.arm) {
            case Arm::full: m[c] = bv[c] * qv[c]; break;
            case Arm::nogate:
            case Arm::nogate_noproj: m[c] = qv[c]; break;
            case Arm::rand: m[c] = bv[c] * in.r[L.h * K + c]; break;
            case Arm::none: throw Error("literal: qed variant needs an arm");
          }
        }
        const Mat<S> mc = Mat<S>::column(m);
        const Mat<S> p = in.arm == Arm::nogate_noproj ? mc : projector(kv) * mc;
        a = a + in.lambda[L.h] * p;
      }
      Mat<S> z(V, 1);
      for (int64_t j = 0; j < V; ++j) z(j, 0) = in.w[at(d, L, t, V) + j] * v(j, 0);
      return (I - k * a.transpose()) * (Mat<S>::diag(alpha) * Sprev) + k * z.transpose();
    }
  }
  throw Error("literal: unknown variant");
}

}  // namespace detail

// Forward pass of the whole case by the literal rule of its variant: o [B,T,H,V], ht [N,H,K,V].
template <class S>
Outputs<S> forward(const Inputs<S>& in) {
  const auto& d = in.dims;
  const int64_t K = d.K, V = d.V;
  Outputs<S> out;
  out.o.assign(static_cast<size_t>(d.B * d.T * d.H * V), S(0));
  out.ht.assign(static_cast<size_t>(in.num_sequences() * d.H * K * V), S(0));
  for (const auto& L : detail::lanes(in)) {
    const int64_t st = (L.n * d.H + L.h) * K * V;
    Mat<S> St(K, V);
    if (!in.h0.empty()) St.a = detail::slice(in.h0, st, K * V);
    for (int64_t t = 0; t < L.len; ++t) {
      St = detail::step(in, L, t, St);
      // o_t = scale S_t^T q_t
      const Mat<S> q = Mat<S>::column(detail::slice(in.q, detail::at(d, L, t, K), K));
      const Mat<S> o = in.scale * (St.transpose() * q);
      for (int64_t j = 0; j < V; ++j) out.o[detail::at(d, L, t, V) + j] = o(j, 0);
    }
    for (int64_t i = 0; i < K * V; ++i) out.ht[st + i] = St.a[i];
  }
  return out;
}

// The named entry points of MATH.md §2; each insists on its own variant so that a test cannot
// silently compare a variant with itself.
template <class S>
Outputs<S> kda_forward(const Inputs<S>& in) {
  if (in.variant != Variant::kda) throw Error("literal::kda_forward: inputs are not kda");
  return forward(in);
}
template <class S>
Outputs<S> gated_deltanet_forward(const Inputs<S>& in) {
  if (in.variant != Variant::gdn) throw Error("literal::gated_deltanet_forward: inputs are not gdn");
  return forward(in);
}
template <class S>
Outputs<S> deltanet_forward(const Inputs<S>& in) {
  if (in.variant != Variant::deltanet) throw Error("literal::deltanet_forward: inputs are not deltanet");
  return forward(in);
}
template <class S>
Outputs<S> matrix_oracle_forward(const Inputs<S>& in) {
  if (in.variant != Variant::gdn2 && in.variant != Variant::qed)
    throw Error("literal::matrix_oracle_forward: inputs are not gdn2 or qed");
  return forward(in);
}

}  // namespace qed::reference::literal
