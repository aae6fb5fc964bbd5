// P16 of MATH.md §9: the recurrent adjoint against central finite differences computed in mpfr at
// 256 bits, on every entry of every input (q k v g b w beta lambda r h0), for every variant and
// arm, with varlen (a zero-length sequence included) and h0. Step h = 1e-20: the central
// difference's truncation error is ~h^2 |L'''| ~ 1e-40 and its rounding error ~2^-256 |L| / h
// ~ 1e-57, so >= 25 significant digits per entry is a requirement with 10^15 to spare.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <chrono>

#include "fixtures/generate.hpp"
#include "properties/support/cases.hpp"
#include "properties/support/fd.hpp"
#include "properties/support/mutants.hpp"
#include "reference/recurrent.hpp"

using namespace qed::properties;
using qed::reference::Outputs;

namespace {

constexpr int kBits = 256;
constexpr double kDigits = 25;
// Entries whose true value is below 1e-30 of the largest gradient are judged absolutely.
constexpr double kFloor = 1e-30;

Outputs<mpfr_float> fwd(const Inputs<mpfr_float>& x) { return qed::reference::recurrent_forward(x, 1); }
Grads<mpfr_float> bwd(const Inputs<mpfr_float>& x, const Cotangents<mpfr_float>& c) {
  return qed::reference::recurrent_backward(x, c, 1);
}

struct FdCase {
  CaseSpec spec;
  bool dht = true;
};

GradError run_fd(const FdCase& c, bool use_mutant = false, mutants::Bwd bug = mutants::Bwd::none) {
  const auto in = inputs_as<mpfr_float>(c.spec, kBits);
  const auto cot = qed::reference::convert_cotangents<mpfr_float>(
      qed::fixtures::generate_cotangents(make_inputs(c.spec), c.spec.seed + 1, c.dht));
  const mpfr_float h("1e-20");
  if (use_mutant)
    return check_P16_entries<mpfr_float>(
        fwd, [bug](const auto& x, const auto& y) { return mutants::backward(x, y, bug); }, in, cot, h, kFloor);
  return check_P16_entries<mpfr_float>(fwd, bwd, in, cot, h, kFloor);
}

std::vector<FdCase> cases(int64_t T, int64_t K, int64_t V, uint64_t seed0) {
  std::vector<FdCase> out;
  uint64_t seed = seed0;
  for (auto [v, a] : all_variant_arms()) {
    FdCase c;
    c.spec.variant = v;
    c.spec.arm = a;
    c.spec.B = 1;
    c.spec.H = 1;
    c.spec.T = T;
    c.spec.K = K;
    c.spec.V = V;
    c.spec.h0 = true;
    c.spec.unit_keys = (seed % 2) == 0;  // raw keys exercise the 1/n and 2ce/n^2 terms
    c.spec.seed = seed++;
    out.push_back(c);
  }
  return out;
}

void expect_digits(const FdCase& c, const std::string& family) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = run_fd(c);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  record("P16 FD mpfr256 worst rel, " + family, e.worst);
  std::printf("[P16] %s: %.1f digits (worst %s), %.2f s\n", replay_line(c.spec).c_str(), e.min_digits(),
              e.where.c_str(), secs);
  EXPECT_GE(e.min_digits(), kDigits) << replay_line(c.spec) << " worst at " << e.where;
}

}  // namespace

// Every variant and arm at the prototype's size (MATH.md §5: T = 9, K = 4, V = 3), h0 and dht.
TEST(GradFd, EveryVariantEveryEntry) {
  for (const auto& c : cases(9, 4, 3, 100)) expect_digits(c, variant_label(c.spec.variant, c.spec.arm));
}

// Varlen with a zero-length sequence, two heads (lambda and r are shared across sequences).
TEST(GradFd, VarlenTwoHeads) {
  for (auto [v, a] : {std::pair{Variant::qed, Arm::rand}, std::pair{Variant::gdn, Arm::none}}) {
    FdCase c;
    c.spec.variant = v;
    c.spec.arm = a;
    c.spec.B = 1;
    c.spec.H = 2;
    c.spec.K = 3;
    c.spec.V = 2;
    c.spec.seqlens = {3, 0, 2};
    c.spec.T = 5;
    c.spec.h0 = true;
    c.spec.unit_keys = false;
    c.spec.seed = 7;
    expect_digits(c, "varlen");
  }
}

// Random small cases from the shared generator: every variant and arm, varlen with zero-length
// sequences, h0 or not, gate extremes (b = 1, g = 0), lambda in {prop draw, 0, 1}, raw keys.
RC_GTEST_PROP(GradFd, RandomSmallCases, ()) {
  CaseShape shape;
  shape.max_T = slow_mode() ? 12 : 4;
  shape.max_K = slow_mode() ? 5 : 3;
  shape.max_V = slow_mode() ? 4 : 2;
  shape.max_B = shape.max_H = 2;
  FdCase c;
  c.spec = *gen_case(shape);
  c.dht = *rc::gen::arbitrary<bool>();
  const auto e = run_fd(c);
  record("P16 FD mpfr256 worst rel, random small cases", e.worst);
  RC_ASSERT(e.min_digits() >= kDigits);
}

// Larger cases behind the slow label: T up to 40, K and V up to 8.
TEST(GradFd, SlowLargerCases) {
  if (!slow_mode()) GTEST_SKIP() << "set QEDCHECK_SLOW=1 (ctest -L slow)";
  for (const auto& c : cases(40, 8, 8, 300)) expect_digits(c, "slow T=40 K=V=8");
  for (const auto& c : cases(17, 6, 5, 400)) expect_digits(c, "slow T=17 K=6 V=5");
  FdCase c;
  c.spec.variant = Variant::qed;
  c.spec.arm = Arm::full;
  c.spec.B = 1;
  c.spec.H = 2;
  c.spec.K = 5;
  c.spec.V = 4;
  c.spec.seqlens = {9, 0, 13, 1};
  c.spec.T = 23;
  c.spec.h0 = true;
  c.spec.seed = 8;
  expect_digits(c, "slow varlen");
}

// Mutation check of P16: an adjoint without the -2ce/n^2 term of §5.2 fails on a projected arm;
// the unmutated copy passes.
TEST(GradFd, CatchesDropped2ceTerm) {
  FdCase c = cases(4, 3, 2, 500)[1];  // qed/full
  c.spec.unit_keys = false;
  const auto bad = run_fd(c, true, mutants::Bwd::drop_2ce_term);
  const auto copy = run_fd(c, true, mutants::Bwd::none);
  record("mutant P16 vs drop_2ce_term: mutant", bad.worst);
  record("mutant P16 vs drop_2ce_term: unmutated copy", copy.worst);
  EXPECT_LT(bad.min_digits(), 3) << "worst at " << bad.where;
  EXPECT_GE(copy.min_digits(), kDigits) << "worst at " << copy.where;
}
