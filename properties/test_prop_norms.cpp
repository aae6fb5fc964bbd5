// MATH.md §8.3 on the reference: the closed-form spectral norm of I - k a^T against an SVD, the
// GDN-2 bound 2/sqrt(3) and the example that attains it, the per-step bound
// ||S_t||_F <= rho_t ||S_{t-1}||_F + ||k_t|| ||z_t|| along reference trajectories, and the two
// growth examples (GDN-2 alternating keys: (alpha^2 5/4)^100 over 200 steps; QED full: phi^200).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "fixtures/generate.hpp"
#include "properties/support/cases.hpp"
#include "properties/support/erase.hpp"
#include "properties/support/numerics.hpp"
#include "properties/support/transforms.hpp"
#include "properties/support/mutants.hpp"
#include "reference/recurrent.hpp"

using namespace qed::properties;
using qed::reference::Arm;
using qed::reference::Outputs;
using qed::reference::Variant;

namespace {

std::vector<double> unit_vec(qed::fixtures::Rng& rng, int64_t K) {
  std::vector<double> v(static_cast<size_t>(K));
  for (auto& e : v) e = rng.normal();
  const double n = norm(v);
  for (auto& e : v) e /= n;
  return v;
}

}  // namespace

// Closed form vs JacobiSVD on random draws over all arms, K in [2, 40], unit and raw keys.
RC_GTEST_PROP(SpectralNorm, ClosedFormMatchesSvd, ()) {
  const int64_t K = *rc::gen::inRange<int64_t>(2, 41);
  const auto [variant, arm] = *rc::gen::elementOf(std::vector<std::pair<Variant, Arm>>{
      {Variant::gdn2, Arm::none}, {Variant::qed, Arm::full}, {Variant::qed, Arm::nogate},
      {Variant::qed, Arm::nogate_noproj}, {Variant::qed, Arm::rand}});
  const bool raw = *rc::gen::arbitrary<bool>();
  qed::fixtures::Rng rng(*rc::gen::inRange<uint64_t>(0, 1u << 30));
  auto k = unit_vec(rng, K);
  if (raw)
    for (auto& e : k) e *= 0.5 + 1.5 * rng.uniform();
  const auto q = unit_vec(rng, K), r = unit_vec(rng, K);
  std::vector<double> b(static_cast<size_t>(K));
  for (auto& e : b) e = rng.uniform();
  const double lambda = 1.5 * rng.uniform();
  const auto a = reference_erase<double>(variant, arm, k, q, b, lambda, r);
  const double cf = closed_form_norm(k, a), sv = svd_norm(k, a);
  const double res = std::abs(cf - sv) / sv;
  record("||I-ka^T||_2 closed form vs SVD (rel)", res);
  RC_ASSERT(res <= 1e-13);
}

// GDN-2 (lambda = 0): ||I - k (b ⊙ k)^T||_2 <= 2/sqrt(3) for unit k and b in [0, 1]^K; gates at
// the ends of [0, 1] are drawn often, since the bound is approached there.
RC_GTEST_PROP(SpectralNorm, Gdn2BoundTwoOverSqrt3, ()) {
  const int64_t K = *rc::gen::inRange<int64_t>(2, 9);
  qed::fixtures::Rng rng(*rc::gen::inRange<uint64_t>(0, 1u << 30));
  double worst = 0;
  for (int draw = 0; draw < 200; ++draw) {
    const auto k = unit_vec(rng, K);
    std::vector<double> b(static_cast<size_t>(K));
    for (auto& e : b) {
      const double u = rng.uniform();
      e = u < 0.3 ? 0.0 : u > 0.7 ? 1.0 : rng.uniform();
    }
    const auto a = reference_erase<double>(Variant::gdn2, Arm::none, k, {}, b, 0.0, {});
    const double n = closed_form_norm(k, a);
    worst = std::max(worst, n);
    RC_ASSERT(n <= 2 / std::sqrt(3.0) * (1 + 4e-15));  // a few roundoffs of the closed form
  }
  record("gdn2 max ||M||_2 / (2/sqrt 3) over draws", worst / (2 / std::sqrt(3.0)));
}

TEST(SpectralNorm, Gdn2BoundAttained) {
  const double s3 = 1 / std::sqrt(3.0);
  const std::vector<double> k{s3, s3, s3}, b{1, 0, 0};
  const auto a = reference_erase<double>(Variant::gdn2, Arm::none, k, {}, b, 0.0, {});
  const double target = 2 / std::sqrt(3.0);
  const double r1 = std::abs(svd_norm(k, a) - target) / target, r2 = std::abs(closed_form_norm(k, a) - target) / target;
  record("gdn2 bound attained: k=1/sqrt3, b=e1 (rel)", std::max(r1, r2));
  EXPECT_LE(r1, 4e-16);
  EXPECT_LE(r2, 4e-16);
}

namespace {

// Per-step bound ||S_t||_F <= rho_t ||S_{t-1}||_F + ||k_t|| ||z_t|| (rho_t = ||I - k a^T||_2 max
// alpha, with a the reference's erase vector) along impl's trajectory, states chained one step at
// a time through h0 (equal to the single run by P2). Returns max_t ||S_t||_F / bound_t: <= 1 holds.
template <class F>
double check_step_bound(F&& impl, const Inputs<double>& in) {
  const int64_t K = in.dims.K, V = in.dims.V;
  auto state = in.h0;
  double tightest = 0;
  for (int64_t t = 0; t < in.dims.T; ++t) {
    auto step = token_range(in, t, t + 1);
    step.h0 = state;
    const auto next = impl(step).ht;
    const std::vector<double> k(in.k.begin() + t * K, in.k.begin() + (t + 1) * K);
    const std::vector<double> q(in.q.begin() + t * K, in.q.begin() + (t + 1) * K);
    const std::vector<double> b(in.b.begin() + t * K, in.b.begin() + (t + 1) * K);
    const double lam = in.variant == Variant::qed ? in.lambda[0] : 0.0;
    const auto av = reference_erase<double>(in.variant, in.arm, k, q, b, lam, in.r);
    double amax = 0;
    for (int64_t c = 0; c < K; ++c) amax = std::max(amax, std::exp(in.g[t * K + c]));
    std::vector<double> z(static_cast<size_t>(V));
    for (int64_t j = 0; j < V; ++j) z[j] = in.w[t * V + j] * in.v[t * V + j];
    const double bound = closed_form_norm(k, av) * amax * norm(state) + norm(k) * norm(z);
    tightest = std::max(tightest, norm(next) / bound);
    state = next;
  }
  return tightest;
}

Outputs<double> ref(const Inputs<double>& x) { return qed::reference::recurrent_forward(x); }

CaseSpec trajectory_case(Variant v, Arm a) {
  CaseSpec s;
  s.variant = v;
  s.arm = a;
  s.T = 200;
  s.K = 8;
  s.V = 6;
  s.h0 = true;
  s.lambda = 1.0;
  s.seed = 31;
  return s;
}

}  // namespace

// Along 200-step reference trajectories of gdn2, full (lambda = 1) and nogate_noproj (lambda = 1).
TEST(SpectralNorm, PerStepStateBoundAlongTrajectories) {
  for (auto [v, a] : std::vector<std::pair<Variant, Arm>>{
           {Variant::gdn2, Arm::none}, {Variant::qed, Arm::full}, {Variant::qed, Arm::nogate_noproj}}) {
    const auto s = trajectory_case(v, a);
    SCOPED_TRACE(replay_line(s));
    const double r = check_step_bound(ref, make_inputs(s));
    record("per-step bound: max ||S_t|| / bound, " + variant_label(v, a), r);
    EXPECT_LE(r, 1 + 1e-14);
  }
}

namespace {

// ||S_400||_F / ||S_200||_F of a 2-channel trajectory with h0 and no writes (v = 0); keys,
// queries and gates cycle through the given period.
template <class S, class F>
S growth_ratio(F&& impl, Variant variant, const std::vector<std::vector<S>>& ks, const std::vector<std::vector<S>>& qs,
               const std::vector<std::vector<S>>& bs, const S& lambda, const S& g) {
  CaseSpec s;
  s.variant = variant;
  s.arm = variant == Variant::qed ? Arm::full : Arm::none;
  s.T = 400;
  s.K = 2;
  s.V = 3;
  s.h0 = true;
  s.seed = 5;
  auto in = inputs_as<S>(s, 256);
  for (int64_t t = 0; t < s.T; ++t) {
    const size_t p = static_cast<size_t>(t % ks.size());
    for (int64_t c = 0; c < 2; ++c) {
      in.k[t * 2 + c] = ks[p][c];
      in.q[t * 2 + c] = qs[p][c];
      in.b[t * 2 + c] = bs[p][c];
      in.g[t * 2 + c] = g;
    }
    for (int64_t j = 0; j < 3; ++j) in.v[t * 3 + j] = S(0);
  }
  for (auto& l : in.lambda) l = lambda;
  auto fro = [](const std::vector<S>& x) {
    S acc(0);
    for (const auto& e : x) acc += e * e;
    using std::sqrt;
    return S(sqrt(acc));
  };
  return S(fro(impl(in).ht) / fro(impl(prefix(in, 200)).ht));
}

// The alternating GDN-2 pair in S: k = (1/sqrt6, sqrt(5/6)) with b = e1, then swapped with b = e2.
template <class S, class F>
S gdn2_alternating_ratio(F&& impl, const S& g) {
  using std::sqrt;
  const S r6 = S(1) / S(sqrt(S(6))), r56 = S(sqrt(S(5) / S(6)));
  const S z(0), one(1);
  return growth_ratio<S>(impl, Variant::gdn2, {{r6, r56}, {r56, r6}}, {{z, z}, {z, z}}, {{one, z}, {z, one}}, z, g);
}

}  // namespace

// GDN-2 alternating example: rho(M2 M1) = alpha^2 5/4, so the ratio is (alpha^2 5/4)^100 (the
// other eigenvalue, alpha^2 5/9, leaves a relative trace of (4/9)^100 ~ 6e-36). alpha = exp(g) as
// the reference forms it; in mpfr the keys are formed at 256 bits.
TEST(Growth, Gdn2AlternatingExample) {
  for (double alpha : {0.88, 0.9, 1.0}) {
    const double g = std::log(alpha), al = std::exp(g);
    const double ratio = gdn2_alternating_ratio<double>(ref, g);
    const double expect = std::pow(al * al * 1.25, 100);
    const double rel = std::abs(ratio - expect) / expect;
    record("growth gdn2 (alpha^2 5/4)^100 double (rel)", rel);
    EXPECT_LE(rel, 1e-12) << "alpha " << alpha;

    qed::reference::set_mpfr_bits(256);
    const mpfr_float gm = log(mpfr_float(alpha));
    const mpfr_float ratio_m = gdn2_alternating_ratio<mpfr_float>(
        [](const Inputs<mpfr_float>& x) { return qed::reference::recurrent_forward(x); }, gm);
    const mpfr_float alm = exp(gm);
    const mpfr_float expect_m = pow(mpfr_float(alm * alm * mpfr_float(1.25)), 100);
    const double rel_m = to_d(mpfr_float(abs(ratio_m - expect_m) / expect_m));
    record("growth gdn2 (alpha^2 5/4)^100 mpfr256 (rel)", rel_m);
    EXPECT_LE(rel_m, 1e-30) << "alpha " << alpha;
  }
}

// QED full, eps = 0: k1 = e1, q1 = e2, b1 = (0, 1); k2 = e2, q2 = e1, b2 = (1, 0):
// rho(M2 M1) = ((lambda + sqrt(lambda^2 + 4)) / 2)^2, phi^2 at lambda = 1; 100 periods give phi^200.
TEST(Growth, QedFullExample) {
  const double ratio =
      growth_ratio<double>(ref, Variant::qed, {{1, 0}, {0, 1}}, {{0, 1}, {1, 0}}, {{0, 1}, {1, 0}}, 1.0, 0.0);
  const double phi = (1 + std::sqrt(5.0)) / 2;
  const double expect = std::pow(phi, 200);
  const double rel = std::abs(ratio - expect) / expect;
  record("growth qed full phi^200 double (rel)", rel);
  EXPECT_LE(rel, 1e-12);
}

// Mutation checks of the §8.3 family: the closed form without the |k| factor in s fails against
// the SVD on raw keys; a recurrence whose erase reads the undecayed state breaks the per-step
// bound and the growth law of the alternating example.
TEST(SpectralNorm, MutantsAreCaught) {
  qed::fixtures::Rng rng(3);
  auto k = unit_vec(rng, 6);
  for (auto& e : k) e *= 1.7;
  const auto q = unit_vec(rng, 6);
  const std::vector<double> b{0.2, 0.9, 0.5, 0.1, 0.7, 0.4};
  const auto a = reference_erase<double>(Variant::qed, Arm::full, k, q, b, 0.8, {});
  const double sv = svd_norm(k, a);
  const double real = std::abs(closed_form_norm(k, a) - sv) / sv;
  const double bad = std::abs(mutants::closed_form_norm_without_key_norm(k, a) - sv) / sv;
  record("mutant closed form vs without_key_norm: reference", real);
  record("mutant closed form vs without_key_norm: mutant", bad);
  EXPECT_LE(real, 1e-13);
  EXPECT_GT(bad, 1e-3);

  const auto undecayed = [](const Inputs<double>& x) {
    return mutants::forward(x, mutants::Fwd::erase_reads_undecayed);
  };
  // Strong decay (alpha = e^-3) is where reading the undecayed state shows: the bound shrinks
  // with max alpha, the mutant's transition D - k a^T does not.
  auto strong = make_inputs(trajectory_case(Variant::gdn2, Arm::none));
  for (auto& e : strong.g) e = -3.0;
  const double r_ref = check_step_bound(ref, strong), r_bad = check_step_bound(undecayed, strong);
  record("mutant step bound vs erase_reads_undecayed: reference", r_ref);
  record("mutant step bound vs erase_reads_undecayed: mutant", r_bad);
  EXPECT_LE(r_ref, 1 + 1e-14);
  EXPECT_GT(r_bad, 1.01);

  const double g = std::log(0.88), al = std::exp(g), expect = std::pow(al * al * 1.25, 100);
  const double g_ref = std::abs(gdn2_alternating_ratio<double>(ref, g) - expect) / expect;
  const double g_bad = std::abs(gdn2_alternating_ratio<double>(undecayed, g) - expect) / expect;
  record("mutant growth law vs erase_reads_undecayed: reference", g_ref);
  record("mutant growth law vs erase_reads_undecayed: mutant", g_bad);
  EXPECT_LE(g_ref, 1e-12);
  EXPECT_GT(g_bad, 1e-3);
}
