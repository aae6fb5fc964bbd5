// Cases of the property tests as small printable specs: a CaseSpec names variant, arm, shape,
// varlen split (zero-length sequences allowed), h0, gate mode, lambda and the fixtures seed, and
// make_inputs turns it into Inputs<double> deterministically. RapidCheck generators draw and
// shrink specs; a failing property prints the spec as a replay line next to RC's reproduce string.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures/generate.hpp"
#include "properties/support/numerics.hpp"
#include "reference/types.hpp"

namespace qed::properties {

using reference::Arm;
using reference::Inputs;
using reference::Variant;

// Gate overrides applied after the prop-regime draw.
enum class Gates {
  random,     // MATH.md §9 distribution
  b_one,      // erase gate b = 1 (beta = 1)
  decay_one,  // g = 0
  a1b1,       // both
  scalar      // b_t and g_t constant over channels (rotation invariance needs this)
};

inline const char* to_string(Gates g) {
  switch (g) {
    case Gates::random: return "random";
    case Gates::b_one: return "b_one";
    case Gates::decay_one: return "decay_one";
    case Gates::a1b1: return "a1b1";
    case Gates::scalar: return "scalar";
  }
  return "?";
}

struct CaseSpec {
  Variant variant = Variant::gdn2;
  Arm arm = Arm::none;
  int64_t B = 1, T = 8, H = 1, K = 4, V = 3;
  std::vector<int64_t> seqlens;  // non-empty: packed varlen, B = 1, T = sum
  bool h0 = false;
  bool unit_keys = true;
  Gates gates = Gates::random;
  double lambda = -1;  // < 0: the prop regime's draw in [0.5, 0.9]
  uint64_t seed = 0;
};

// One line that rebuilds the case in a test: paste it into a CaseSpec initialiser.
inline std::string replay_line(const CaseSpec& s) {
  std::ostringstream o;
  o << "CaseSpec{variant=" << reference::to_string(s.variant) << " arm=" << reference::to_string(s.arm)
    << " B=" << s.B << " T=" << s.T << " H=" << s.H << " K=" << s.K << " V=" << s.V << " seqlens=[";
  for (size_t i = 0; i < s.seqlens.size(); ++i) o << (i ? "," : "") << s.seqlens[i];
  o << "] h0=" << s.h0 << " unit_keys=" << s.unit_keys << " gates=" << to_string(s.gates)
    << " lambda=" << s.lambda << " seed=" << s.seed << "}";
  return o.str();
}

// RapidCheck prints counterexamples through this (found by ADL).
inline void showValue(const CaseSpec& s, std::ostream& os) { os << "replay: " << replay_line(s); }

inline Inputs<double> make_inputs(const CaseSpec& s) {
  fixtures::GenSpec g;
  g.variant = s.variant;
  g.arm = s.variant == Variant::qed ? s.arm : Arm::none;
  g.dims = {s.B, s.T, s.H, s.K, s.V};
  g.regime = fixtures::Regime::prop;
  g.seed = s.seed;
  g.unit_keys = s.unit_keys;
  g.with_h0 = s.h0;
  g.seqlens = s.seqlens;
  Inputs<double> in = fixtures::generate(g);
  if (s.lambda >= 0)
    for (auto& l : in.lambda) l = s.lambda;
  const bool b_one = s.gates == Gates::b_one || s.gates == Gates::a1b1;
  const bool g_zero = s.gates == Gates::decay_one || s.gates == Gates::a1b1;
  if (b_one) {
    for (auto& e : in.b) e = 1.0;
    for (auto& e : in.beta) e = 1.0;
  }
  if (g_zero)
    for (auto& e : in.g) e = 0.0;
  if (s.gates == Gates::scalar) {
    const int64_t K = s.K;
    const bool channel_g = reference::layout_of(in.variant, in.arm).channel_g;
    for (size_t i = 0; i * K < in.b.size(); ++i)
      for (int64_t c = 1; c < K; ++c) in.b[i * K + c] = in.b[i * K];
    if (channel_g)
      for (size_t i = 0; i * K < in.g.size(); ++i)
        for (int64_t c = 1; c < K; ++c) in.g[i * K + c] = in.g[i * K];
  }
  return in;
}

// Which cases a generator may produce.
struct CaseShape {
  std::vector<Variant> variants{Variant::gdn2, Variant::qed, Variant::kda, Variant::gdn,
                                Variant::deltanet};
  std::vector<Arm> arms{Arm::full, Arm::nogate, Arm::nogate_noproj, Arm::rand};
  std::vector<Gates> gates{Gates::random, Gates::random, Gates::b_one, Gates::decay_one,
                           Gates::a1b1};
  int64_t max_B = 2, max_T = 16, max_H = 2, max_K = 6, max_V = 5;
  bool varlen = true;    // may pack sequences (some of length zero)
  bool raw_keys = true;  // may use non-unit keys
};

inline rc::Gen<CaseSpec> gen_case(CaseShape shape) {
  return rc::gen::exec([shape] {
    CaseSpec s;
    s.variant = *rc::gen::elementOf(shape.variants);
    s.arm = s.variant == Variant::qed ? *rc::gen::elementOf(shape.arms) : Arm::none;
    s.H = *rc::gen::inRange<int64_t>(1, shape.max_H + 1);
    s.K = *rc::gen::inRange<int64_t>(1, shape.max_K + 1);
    s.V = *rc::gen::inRange<int64_t>(1, shape.max_V + 1);
    const bool varlen = shape.varlen && *rc::gen::weightedElement<bool>({{3, false}, {1, true}});
    if (varlen) {
      const int64_t n = *rc::gen::inRange<int64_t>(1, 5);
      s.B = 1;
      s.T = 0;
      for (int64_t i = 0; i < n; ++i) {
        // Zero-length sequences are drawn on purpose (CASE_FORMAT.md allows them).
        s.seqlens.push_back(*rc::gen::inRange<int64_t>(0, shape.max_T / 2 + 1));
        s.T += s.seqlens.back();
      }
    } else {
      s.B = *rc::gen::inRange<int64_t>(1, shape.max_B + 1);
      s.T = *rc::gen::inRange<int64_t>(1, shape.max_T + 1);
    }
    s.h0 = *rc::gen::arbitrary<bool>();
    s.unit_keys = !shape.raw_keys || *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
    s.gates = *rc::gen::elementOf(shape.gates);
    s.lambda = *rc::gen::weightedElement<double>({{3, -1.0}, {1, 0.0}, {1, 1.0}});
    s.seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
    return s;
  });
}

// Shortest label for residual tables: "qed/full", "kda", ...
inline std::string variant_label(Variant v, Arm a) {
  std::string s(reference::to_string(v));
  if (v == Variant::qed) {  // appended piecewise: GCC 12 warns (-Wrestrict) on "/" + string
    s.push_back('/');
    s.append(reference::to_string(a));
  }
  return s;
}

// Every (variant, arm) pair of the suite.
inline std::vector<std::pair<Variant, Arm>> all_variant_arms() {
  return {{Variant::gdn2, Arm::none},        {Variant::qed, Arm::full},
          {Variant::qed, Arm::nogate},       {Variant::qed, Arm::nogate_noproj},
          {Variant::qed, Arm::rand},         {Variant::kda, Arm::none},
          {Variant::gdn, Arm::none},         {Variant::deltanet, Arm::none}};
}

}  // namespace qed::properties

namespace qed::properties {

// A permutation of 0..n-1 drawn from `seed` (Fisher-Yates on the fixtures' portable stream).
inline std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  fixtures::Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(i + 1)]);
  return p;
}

// MATH.md §9 states tolerances for double; the same number of units of roundoff in S.
template <class S>
double tol_like_f64(double f64_tol) {
  return f64_tol / std::ldexp(1.0, -53) * unit_roundoff<S>();
}

// Draws a case, converts it to S (mpfr at `mpfr_bits`) and returns it.
template <class S>
Inputs<S> inputs_as(const CaseSpec& s, int mpfr_bits = 200) {
  if constexpr (std::is_same_v<S, double>) {
    return make_inputs(s);
  } else {
    if constexpr (std::is_same_v<S, mpfr_float>) reference::set_mpfr_bits(mpfr_bits);
    return reference::convert_inputs<S>(make_inputs(s));
  }
}

}  // namespace qed::properties
