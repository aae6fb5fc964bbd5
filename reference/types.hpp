// Problem description shared by every implementation: variants, arms, tensor shapes and the
// per-variant set of inputs and gradients. Plain data, generic over the scalar type S.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qed::reference {

enum class Variant { gdn2, qed, kda, gdn, deltanet };
enum class Arm { none, full, nogate, nogate_noproj, rand };

inline std::string_view to_string(Variant v) {
  switch (v) {
    case Variant::gdn2: return "gdn2";
    case Variant::qed: return "qed";
    case Variant::kda: return "kda";
    case Variant::gdn: return "gdn";
    case Variant::deltanet: return "deltanet";
  }
  return "?";
}

inline std::string_view to_string(Arm a) {
  switch (a) {
    case Arm::none: return "none";
    case Arm::full: return "full";
    case Arm::nogate: return "nogate";
    case Arm::nogate_noproj: return "nogate_noproj";
    case Arm::rand: return "rand";
  }
  return "?";
}

inline bool parse_variant(std::string_view s, Variant& out) {
  for (Variant v : {Variant::gdn2, Variant::qed, Variant::kda, Variant::gdn, Variant::deltanet})
    if (s == to_string(v)) { out = v; return true; }
  return false;
}

inline bool parse_arm(std::string_view s, Arm& out) {
  for (Arm a : {Arm::full, Arm::nogate, Arm::nogate_noproj, Arm::rand})
    if (s == to_string(a)) { out = a; return true; }
  return false;
}

// Which optional tensors a variant carries (CASE_FORMAT.md, /inputs table).
struct Layout {
  bool channel_g = false;  // g is [B,T,H,K]
  bool scalar_g = false;   // g is [B,T,H]
  bool has_bw = false;     // b [B,T,H,K] and w [B,T,H,V]
  bool has_beta = false;   // beta [B,T,H]
  bool has_lambda = false; // lambda [H]
  bool has_r = false;      // r [H,K]
};

inline Layout layout_of(Variant v, Arm a) {
  Layout l;
  switch (v) {
    case Variant::gdn2: l.channel_g = l.has_bw = true; break;
    case Variant::qed:
      l.channel_g = l.has_bw = l.has_lambda = true;
      l.has_r = (a == Arm::rand);
      break;
    case Variant::kda: l.channel_g = l.has_beta = true; break;
    case Variant::gdn: l.scalar_g = l.has_beta = true; break;
    case Variant::deltanet: l.has_beta = true; break;
  }
  return l;
}

struct Dims {
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0;
};

// One independent sequence: batch row `b`, tokens [t0, t0 + len) of that row.
struct Span {
  int64_t b = 0, t0 = 0, len = 0;
};

// All inputs of one case, in the [B,T,H,D] layout of CASE_FORMAT.md. Tensors a variant does not
// have are empty; h0 and cu_seqlens are optional (empty when absent).
template <class S>
struct Inputs {
  Variant variant = Variant::gdn2;
  Arm arm = Arm::none;
  Dims dims;
  S scale = S(1);
  std::vector<S> q, k, v;  // [B,T,H,K], [B,T,H,K], [B,T,H,V]
  std::vector<S> g;        // [B,T,H,K] or [B,T,H] (gdn); empty for deltanet
  std::vector<S> b, w;     // [B,T,H,K], [B,T,H,V]   (gdn2, qed)
  std::vector<S> beta;     // [B,T,H]                (kda, gdn, deltanet)
  std::vector<S> lambda;   // [H]                    (qed)
  std::vector<S> r;        // [H,K]                  (qed rand)
  std::vector<S> h0;       // [N,H,K,V] or empty
  std::vector<int64_t> cu_seqlens;  // [N+1] or empty

  int64_t num_sequences() const {
    return cu_seqlens.empty() ? dims.B : static_cast<int64_t>(cu_seqlens.size()) - 1;
  }
  std::vector<Span> spans() const {
    std::vector<Span> out;
    if (cu_seqlens.empty()) {
      for (int64_t b0 = 0; b0 < dims.B; ++b0) out.push_back({b0, 0, dims.T});
    } else {
      for (size_t n = 0; n + 1 < cu_seqlens.size(); ++n)
        out.push_back({0, cu_seqlens[n], cu_seqlens[n + 1] - cu_seqlens[n]});
    }
    return out;
  }
};

template <class S>
struct Outputs {
  std::vector<S> o;   // [B,T,H,V]
  std::vector<S> ht;  // [N,H,K,V]
};

template <class S>
struct Cotangents {
  std::vector<S> do_;  // [B,T,H,V]
  std::vector<S> dht;  // [N,H,K,V] or empty (zero)
};

// Gradients of L = sum(do*o) + sum(dht*ht). Only those the variant has are filled; dh0 is
// always filled (the gradient with respect to the initial state, zero h0 if absent).
template <class S>
struct Grads {
  std::vector<S> dq, dk, dv, dg, db, dw, dbeta, dlambda, dr, dh0;
};

// Convert every tensor of one scalar type into another (exact when widening).
template <class To, class From>
std::vector<To> convert(const std::vector<From>& x) {
  std::vector<To> out;
  out.reserve(x.size());
  for (const auto& e : x) out.push_back(static_cast<To>(e));
  return out;
}

template <class To, class From>
Inputs<To> convert_inputs(const Inputs<From>& in) {
  Inputs<To> o;
  o.variant = in.variant;
  o.arm = in.arm;
  o.dims = in.dims;
  o.scale = static_cast<To>(in.scale);
  o.q = convert<To>(in.q);
  o.k = convert<To>(in.k);
  o.v = convert<To>(in.v);
  o.g = convert<To>(in.g);
  o.b = convert<To>(in.b);
  o.w = convert<To>(in.w);
  o.beta = convert<To>(in.beta);
  o.lambda = convert<To>(in.lambda);
  o.r = convert<To>(in.r);
  o.h0 = convert<To>(in.h0);
  o.cu_seqlens = in.cu_seqlens;
  return o;
}

template <class To, class From>
Cotangents<To> convert_cotangents(const Cotangents<From>& c) {
  return {convert<To>(c.do_), convert<To>(c.dht)};
}

}  // namespace qed::reference
