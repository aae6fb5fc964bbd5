// Arm equivalences (P9) and reductions (P10) of MATH.md §9 on the recurrent reference: lambda = 0
// gives gdn2 bitwise; b = 1 full = nogate; q ⊥ k nogate = nogate_noproj; q = r full = rand; gdn2
// with tied gates against the literal KDA / Gated DeltaNet / DeltaNet rules, the kda / gdn /
// deltanet variants against the same rules, and gdn2 / qed against the literal matrix oracle.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/support/cases.hpp"
#include "properties/support/checks_forward.hpp"
#include "reference/literal.hpp"
#include "reference/recurrent.hpp"

using namespace qed::properties;
using qed::reference::Outputs;

namespace {

template <class S>
Outputs<S> ref(const Inputs<S>& x) {
  return qed::reference::recurrent_forward(x);
}

template <class S>
CaseShape shape_for(std::vector<Variant> variants) {
  CaseShape s;
  s.variants = std::move(variants);
  if (std::is_same_v<S, mpfr_float>) {
    s.max_T = slow_mode() ? 16 : 8;
    s.max_K = 4;
    s.max_V = 3;
  } else if (slow_mode()) {
    s.max_T = 64;
    s.max_K = s.max_V = 12;
    s.max_B = s.max_H = 3;
  }
  return s;
}

template <class S>
std::string label(const char* p) {
  return std::string(p) + (std::is_same_v<S, double> ? " double" : " mpfr200");
}

template <class S>
void prop_P9() {
  const auto spec = *gen_case(shape_for<S>({Variant::gdn2, Variant::qed}));
  const auto in = inputs_as<S>(spec);
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
  const double a = record(label<S>("P9a lambda=0 == gdn2 (bitwise)"), check_P9_lambda0(ref<S>, in, seed));
  const double b = record(label<S>("P9b b=1: full == nogate"), check_P9_b_one(ref<S>, in, seed));
  const double c = record(label<S>("P9c q perp k: nogate == noproj"), check_P9_q_perp_k(ref<S>, in, seed));
  const double d = record(label<S>("P9d q=r: full == rand"), check_P9_q_is_r(ref<S>, in, seed));
  RC_ASSERT(a == 0.0);
  RC_ASSERT(b <= tol_like_f64<S>(1e-14));
  RC_ASSERT(c <= tol_like_f64<S>(1e-13));
  RC_ASSERT(d <= tol_like_f64<S>(1e-14));
}

template <class S>
void prop_P10_tied() {
  const auto spec = *gen_case(shape_for<S>({Variant::kda, Variant::gdn, Variant::deltanet}));
  const auto in = inputs_as<S>(spec);
  const double r = record(label<S>("P10 gdn2 tied vs literal KDA/GDN/DN"), check_P10_tied(ref<S>, in));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

template <class S>
void prop_P10_variant() {
  const auto spec = *gen_case(shape_for<S>({Variant::kda, Variant::gdn, Variant::deltanet}));
  const auto in = inputs_as<S>(spec);
  const double r = record(label<S>("P10 kda/gdn/deltanet vs literal"), check_P10_literal(ref<S>, in));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

template <class S>
void prop_matrix_oracle() {
  const auto spec = *gen_case(shape_for<S>({Variant::gdn2, Variant::qed}));
  const auto in = inputs_as<S>(spec);
  const double r = record(label<S>("gdn2/qed vs literal matrix oracle"), check_P10_literal(ref<S>, in));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

}  // namespace

RC_GTEST_PROP(Arms, P9EquivalencesDouble, ()) { prop_P9<double>(); }
RC_GTEST_PROP(Arms, P9EquivalencesMpfr, ()) { prop_P9<mpfr_float>(); }
RC_GTEST_PROP(Reductions, P10TiedGatesVsLiteralDouble, ()) { prop_P10_tied<double>(); }
RC_GTEST_PROP(Reductions, P10TiedGatesVsLiteralMpfr, ()) { prop_P10_tied<mpfr_float>(); }
RC_GTEST_PROP(Reductions, P10VariantsVsLiteralDouble, ()) { prop_P10_variant<double>(); }
RC_GTEST_PROP(Reductions, P10VariantsVsLiteralMpfr, ()) { prop_P10_variant<mpfr_float>(); }
RC_GTEST_PROP(Reductions, MatrixOracleDouble, ()) { prop_matrix_oracle<double>(); }
RC_GTEST_PROP(Reductions, MatrixOracleMpfr, ()) { prop_matrix_oracle<mpfr_float>(); }

// MATH.md §11 first row at high precision: the step form against the literal matrix product at
// 256 bits, every arm, unit and raw keys, h0 and varlen; the residual sits near 2^-256.
TEST(Reductions, MatrixOracleMpfr256AllArms) {
  for (auto [v, a] : all_variant_arms()) {
    for (bool unit : {true, false}) {
      CaseSpec s;
      s.variant = v;
      s.arm = a;
      s.B = 1;
      s.T = 11;
      s.H = 2;
      s.K = 5;
      s.V = 3;
      s.seqlens = {4, 0, 7};
      s.h0 = true;
      s.unit_keys = unit;
      s.seed = 11;
      SCOPED_TRACE(replay_line(s));
      const auto in = inputs_as<mpfr_float>(s, 256);
      const double r = record("literal vs recurrent mpfr256 (all variants)", check_P10_literal(ref<mpfr_float>, in));
      EXPECT_LE(r, tol_like_f64<mpfr_float>(1e-13));
    }
  }
}
