// Backward properties on larger cases: the P13 Euler identities of MATH.md §9 in double, and
// directional derivatives u^T J v (adjoint <grad, delta> against a central difference along a
// random delta over every input) in float128. Mutation checks show each identity catching a bug.
#include <gtest/gtest.h>

#include <chrono>

#include "fixtures/generate.hpp"
#include "properties/support/cases.hpp"
#include "properties/support/checks_grad.hpp"
#include "properties/support/fd.hpp"
#include "properties/support/mutants.hpp"
#include "reference/recurrent.hpp"

using namespace qed::properties;
using qed::reference::Outputs;

namespace {

template <class S>
Outputs<S> fwd(const Inputs<S>& x) {
  return qed::reference::recurrent_forward(x);
}
template <class S>
Grads<S> bwd(const Inputs<S>& x, const Cotangents<S>& c) {
  return qed::reference::recurrent_backward(x, c);
}

CaseSpec big(Variant v, Arm a, int64_t T, int64_t KV, uint64_t seed, bool varlen) {
  CaseSpec s;
  s.variant = v;
  s.arm = a;
  s.B = varlen ? 1 : 2;
  s.H = 2;
  s.T = T;
  s.K = s.V = KV;
  if (varlen) s.seqlens = {T / 3, 0, T - T / 3 - 1, 1};
  s.h0 = true;
  s.unit_keys = seed % 3 != 0;
  s.seed = seed;
  return s;
}

}  // namespace

// P13 in double, T = 256, K = V = 32 (slow: T = 1024, K = V = 64), every variant and arm, varlen
// on every other case. Tolerance 1e-12 (§9) on the residual relative to the terms' magnitudes.
TEST(GradIdentities, P13EulerDouble) {
  const int64_t T = slow_mode() ? 1024 : 256, KV = slow_mode() ? 64 : 32;
  uint64_t seed = 40;
  for (auto [v, a] : all_variant_arms()) {
    const auto s = big(v, a, T, KV, seed, seed % 2 == 0);
    ++seed;
    SCOPED_TRACE(replay_line(s));
    const auto in = make_inputs(s);
    const auto cot = qed::fixtures::generate_cotangents(in, s.seed, true);
    const auto r = check_P13_euler<double>(fwd<double>, bwd<double>, in, cot);
    record("P13 <dv,v>+<dh0,h0>=L double", r.value_identity);
    record("P13 <dw,w>=<dv,v> double", r.write_identity);
    record("P13 <dq,q>=sum do.o+lam dlam double", r.query_identity);
    EXPECT_LE(r.max(), 1e-12);
  }
}

// u^T J v in float128, T = 128, K = V = 16 (slow: T = 512, K = V = 32), every variant and arm.
// delta ~ N(0,1) per entry, h = 1e-11, Richardson-extrapolated central differences: the h^2
// truncation term cancels (without it, an unstable nogate_noproj case whose states reach 1e88
// showed 2.2e-20, scaling exactly as h^2), the h^4 term is ~1e-44 and the rounding ~1e-34 |L| / h,
// so the 1e-20 tolerance has headroom (measured worst printed) while a wrong adjoint term shows
// up at 1e-6 or more (the mutants below: ~1e-2).
TEST(GradIdentities, DirectionalFloat128) {
  const int64_t T = slow_mode() ? 512 : 128, KV = slow_mode() ? 32 : 16;
  uint64_t seed = 60;
  for (auto [v, a] : all_variant_arms()) {
    const auto s = big(v, a, T, KV, seed, seed % 2 == 1);
    ++seed;
    SCOPED_TRACE(replay_line(s));
    const auto t0 = std::chrono::steady_clock::now();
    const auto in = inputs_as<float128>(s);
    const auto cot = qed::reference::convert_cotangents<float128>(
        qed::fixtures::generate_cotangents(make_inputs(s), s.seed, true));
    const double r = check_directional<float128>(fwd<float128>, bwd<float128>, in, cot, s.seed + 7, float128(1e-11));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    record("directional u^T J v float128 (rel)", r);
    std::printf("[directional] %s: %.2e (%.2f s)\n", variant_label(v, a).c_str(), r, secs);
    EXPECT_LE(r, 1e-20);
  }
}

namespace {
namespace mut = qed::properties::mutants;
auto mutant_bwd(mut::Bwd bug) {
  return [bug](const auto& x, const auto& c) { return mut::backward(x, c, bug); };
}
}  // namespace

// Each identity catches one adjoint bug that the others may miss; the unmutated copy passes.
TEST(GradIdentities, MutantsAreCaught) {
  const auto s = big(Variant::qed, Arm::full, 24, 5, 3, false);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  const auto cot = qed::fixtures::generate_cotangents(in, 9, true);
  const auto real = check_P13_euler<double>(fwd<double>, bwd<double>, in, cot);
  const auto copy = check_P13_euler<double>(fwd<double>, mutant_bwd(mut::Bwd::none), in, cot);
  const auto w = check_P13_euler<double>(fwd<double>, mutant_bwd(mut::Bwd::dw_uses_w), in, cot);
  const auto q = check_P13_euler<double>(fwd<double>, mutant_bwd(mut::Bwd::dq_misses_erase_path), in, cot);
  record("mutant P13 write vs dw_uses_w: reference", real.write_identity);
  record("mutant P13 write vs dw_uses_w: mutant", w.write_identity);
  record("mutant P13 query vs dq_misses_erase_path: reference", real.query_identity);
  record("mutant P13 query vs dq_misses_erase_path: mutant", q.query_identity);
  EXPECT_LE(real.max(), 1e-12);
  EXPECT_LE(copy.max(), 1e-12);
  EXPECT_GT(w.write_identity, 1e-6);
  EXPECT_GT(q.query_identity, 1e-6);

  const auto in128 = inputs_as<float128>(s);
  const auto cot128 = qed::reference::convert_cotangents<float128>(cot);
  const float128 h(1e-11);
  const double dr = check_directional<float128>(fwd<float128>, bwd<float128>, in128, cot128, 1, h);
  const double dg = check_directional<float128>(fwd<float128>, mutant_bwd(mut::Bwd::dg_without_alpha), in128, cot128, 1, h);
  const double dk = check_directional<float128>(fwd<float128>, mutant_bwd(mut::Bwd::drop_2ce_term), in128, cot128, 1, h);
  record("mutant directional vs dg_without_alpha: reference", dr);
  record("mutant directional vs dg_without_alpha: mutant", dg);
  record("mutant directional vs drop_2ce_term: mutant", dk);
  EXPECT_LE(dr, 1e-20);
  EXPECT_GT(dg, 1e-6);
  EXPECT_GT(dk, 1e-6);
}
