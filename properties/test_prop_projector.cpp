// MATH.md §8.1 and §8.2 on the reference's own erase code (LaneView::erase_vector): projector
// orthogonality, idempotence, P k = 0 and symmetry in float, double, float128 and mpfr with bounds
// in units of each type's roundoff u; the eigenvalue fact k^T a = sum b_i k_i^2 of the projected
// arms; and a RapidCheck search that must falsify the same claim for nogate_noproj and shrink it.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <Eigen/Eigenvalues>

#include "fixtures/generate.hpp"
#include "properties/support/checks_stability.hpp"
#include "properties/support/erase.hpp"
#include "properties/support/mutants.hpp"
#include "properties/support/numerics.hpp"
#include "reference/literal.hpp"

using namespace qed::properties;
using qed::reference::Arm;
using qed::reference::Variant;

namespace {

// Keys with |k| in [0.1, 10] (log-uniform), Gaussian x and y.
template <class S>
void draw(int64_t K, uint64_t seed, std::vector<S>& k, std::vector<S>& x, std::vector<S>& y) {
  qed::fixtures::Rng rng(seed);
  std::vector<double> kd(static_cast<size_t>(K));
  for (auto& e : kd) e = rng.normal();
  double n = 0;
  for (auto e : kd) n += e * e;
  const double scale = std::pow(10.0, 2 * rng.uniform() - 1) / std::sqrt(n);
  k.clear();
  x.clear();
  y.clear();
  for (auto e : kd) k.push_back(S(e * scale));
  for (int64_t i = 0; i < K; ++i) x.push_back(S(rng.normal()));
  for (int64_t i = 0; i < K; ++i) y.push_back(S(rng.normal()));
}

template <class S>
const char* type_name() {
  if constexpr (std::is_same_v<S, float>) return "float";
  if constexpr (std::is_same_v<S, double>) return "double";
  if constexpr (std::is_same_v<S, float128>) return "float128";
  return "mpfr200";
}

constexpr int kBitsS = 200, kWork = 520;

// Bound: 8 (K + 1) u, i.e. 4 (K + 1) eps. A rounding analysis gives |k^T P x| <~ 2 (K + 2) u |k| |x|
// for the computed P x; idempotence and symmetry compare two such results, hence twice that.
// Measured worst (reported in units of K u) stays below 2.
template <class S>
void prop_projector() {
  const int64_t K = *rc::gen::inRange<int64_t>(1, 65);
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
  std::vector<S> k, x, y;
  if constexpr (std::is_same_v<S, mpfr_float>) qed::reference::set_mpfr_bits(kBitsS);
  draw(K, seed, k, x, y);
  const double u = unit_roundoff<S>();
  const auto r = check_projector<S>(reference_projection<S>, k, x, y, kBitsS, kWork);
  const std::string t = type_name<S>();
  record("projector k^T P x / (K u) " + t, r.orth / (K * u));
  record("projector P(Px)-Px / (K u) " + t, r.idem / (K * u));
  record("projector P k / (K u) " + t, r.pk / (K * u));
  record("projector symmetry / (K u) " + t, r.sym / (K * u));
  RC_ASSERT(r.max() <= 8 * (K + 1) * u);
}

}  // namespace

RC_GTEST_PROP(Projector, IdentitiesFloat, ()) { prop_projector<float>(); }
RC_GTEST_PROP(Projector, IdentitiesDouble, ()) { prop_projector<double>(); }
RC_GTEST_PROP(Projector, IdentitiesFloat128, ()) { prop_projector<float128>(); }
RC_GTEST_PROP(Projector, IdentitiesMpfr, ()) { prop_projector<mpfr_float>(); }

// The literal oracle's explicit matrix P(k) is symmetric bitwise and meets the same bounds.
RC_GTEST_PROP(Projector, LiteralMatrixDouble, ()) {
  const int64_t K = *rc::gen::inRange<int64_t>(1, 33);
  std::vector<double> k, x, y;
  draw(K, *rc::gen::inRange<uint64_t>(0, 1u << 30), k, x, y);
  const auto P = qed::reference::literal::projector(k);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) RC_ASSERT(P(i, j) == P(j, i));
  auto apply = [&](const std::vector<double>& kk, const std::vector<double>& v) {
    const auto Pk = qed::reference::literal::projector(kk);
    return (Pk * qed::reference::literal::Mat<double>::column(v)).a;
  };
  const auto r = check_projector<double>(apply, k, x, y, 53, kWork);
  record("literal projector max / (K u) double", r.max() / (K * unit_roundoff<double>()));
  RC_ASSERT(r.max() <= 8 * (K + 1) * unit_roundoff<double>());
}

// Mutation check of the projector family: the diagonal projector fails the same check.
TEST(Projector, CatchesDiagonalProjectorMutant) {
  std::vector<double> k, x, y;
  draw(8, 99, k, x, y);
  const double bound = 8 * (8 + 1) * unit_roundoff<double>();
  const auto real = check_projector<double>(reference_projection<double>, k, x, y, 53, kWork);
  const auto bad = check_projector<double>(mutants::diagonal_projection<double>, k, x, y, 53, kWork);
  record("mutant projector vs diagonal_projection: reference", real.max());
  record("mutant projector vs diagonal_projection: mutant", bad.max());
  EXPECT_LE(real.max(), bound);
  EXPECT_GT(bad.max(), 1e6 * bound);
}

namespace {

struct EraseDraw {
  std::vector<double> k, q, b, r;
  double lambda = 0;
};

EraseDraw draw_erase(int64_t K, uint64_t seed) {
  qed::fixtures::Rng rng(seed);
  EraseDraw d;
  auto unit = [&] {
    std::vector<double> v(static_cast<size_t>(K));
    double n = 0;
    for (auto& e : v) {
      e = rng.normal();
      n += e * e;
    }
    for (auto& e : v) e /= std::sqrt(n);
    return v;
  };
  d.k = unit();
  d.q = unit();
  d.r = unit();
  for (int64_t i = 0; i < K; ++i) d.b.push_back(rng.uniform());
  d.lambda = 2 * rng.uniform();
  return d;
}

auto erase_of(Arm arm) {
  return [arm](const auto& k, const auto& q, const auto& b, const auto& lam, const auto& r) {
    using S = std::decay_t<decltype(lam)>;
    return reference_erase<S>(Variant::qed, arm, k, q, b, lam, r);
  };
}

}  // namespace

// §8.2: for full, nogate and rand, k^T a = sum b_i k_i^2 (so the eigenvalue along k lies in
// [0, 1]), in double and mpfr; and in double the spectrum of I - k a^T is {1^(K-1), 1 - k^T a}.
RC_GTEST_PROP(EigenFact, ProjectedArms, ()) {
  const int64_t K = *rc::gen::inRange<int64_t>(2, 17);
  const Arm arm = *rc::gen::element(Arm::full, Arm::nogate, Arm::rand);
  const auto d = draw_erase(K, *rc::gen::inRange<uint64_t>(0, 1u << 30));
  const double u = unit_roundoff<double>();
  const double rd = check_eigen_fact<double>(erase_of(arm), d.k, d.q, d.b, d.lambda, d.r, 53, kWork);
  record("eigen k^T a - sum b k^2 / (K u) double", rd / (K * u));
  RC_ASSERT(rd <= 8 * (K + 1) * u);
  qed::reference::set_mpfr_bits(kBitsS);
  const auto cv = [](const std::vector<double>& v) { return qed::reference::convert<mpfr_float>(v); };
  const double rm = check_eigen_fact<mpfr_float>(erase_of(arm), cv(d.k), cv(d.q), cv(d.b), mpfr_float(d.lambda),
                                                 cv(d.r), kBitsS, kWork);
  record("eigen k^T a - sum b k^2 / (K u) mpfr200", rm / (K * unit_roundoff<mpfr_float>()));
  RC_ASSERT(rm <= 8 * (K + 1) * unit_roundoff<mpfr_float>());
  // The spectrum, numerically.
  const auto a = reference_erase<double>(Variant::qed, arm, d.k, d.q, d.b, d.lambda, d.r);
  const double mu = 1 - dot(d.k, a);
  RC_ASSERT(mu >= -1e-15);
  RC_ASSERT(mu <= 1 + 1e-15);
  Eigen::EigenSolver<Eigen::MatrixXd> es(erase_matrix(d.k, a), false);
  std::vector<double> ev;
  double imag = 0;
  for (int64_t i = 0; i < K; ++i) {
    ev.push_back(es.eigenvalues()(i).real());
    imag = std::max(imag, std::abs(es.eigenvalues()(i).imag()));
  }
  // The eigenvalue nearest mu is mu; all the others are 1.
  size_t im = 0;
  for (size_t i = 1; i < ev.size(); ++i)
    if (std::abs(ev[i] - mu) < std::abs(ev[im] - mu)) im = i;
  double worst = std::max(imag, std::abs(ev[im] - mu));
  for (size_t i = 0; i < ev.size(); ++i)
    if (i != im) worst = std::max(worst, std::abs(ev[i] - 1));
  record("eigen spectrum {1, 1-k^T a} (Eigen, double)", worst);
  RC_ASSERT(worst <= 1e-12);
}

namespace {

// Small integer-valued draws shrink to readable counterexamples: components in [-3, 3] (keys and
// queries normalised afterwards), b_i in {0, 0.1, ..., 1}, lambda in {0, 0.1, ..., 2}.
struct SmallErase {
  std::vector<int> k, q, b;
  int lambda10 = 0;
};

void showValue(const SmallErase& s, std::ostream& os) {
  auto vec = [&](const char* n, const std::vector<int>& v, const char* unit) {
    os << n << "=(";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << ")" << unit << " ";
  };
  vec("k", s.k, "/|k|");
  vec("q", s.q, "/|q|");
  vec("b", s.b, "/10");
  os << "lambda=" << s.lambda10 / 10.0;
}

rc::Gen<SmallErase> gen_small_erase() {
  return rc::gen::exec([] {
    SmallErase s;
    const int K = *rc::gen::inRange(2, 5);
    auto nonzero = [K] {
      return *rc::gen::suchThat(rc::gen::container<std::vector<int>>(K, rc::gen::inRange(-3, 4)),
                                [](const std::vector<int>& v) {
                                  for (int e : v)
                                    if (e != 0) return true;
                                  return false;
                                });
    };
    s.k = nonzero();
    s.q = nonzero();
    s.b = *rc::gen::container<std::vector<int>>(K, rc::gen::inRange(0, 11));
    s.lambda10 = *rc::gen::inRange(0, 21);
    return s;
  });
}

// mu = 1 - k^T a of the reference's erase vector for `arm`.
double eigenvalue_along_k(const SmallErase& s, Arm arm) {
  auto unit = [](const std::vector<int>& v) {
    double n = 0;
    for (int e : v) n += double(e) * e;
    std::vector<double> out;
    for (int e : v) out.push_back(e / std::sqrt(n));
    return out;
  };
  const auto k = unit(s.k), q = unit(s.q);
  std::vector<double> b;
  for (int e : s.b) b.push_back(e / 10.0);
  const auto a = reference_erase<double>(Variant::qed, arm, k, q, b, s.lambda10 / 10.0, q);
  return 1 - dot(k, a);
}

struct Quiet : rc::detail::TestListener {
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

rc::detail::TestResult check_claim(Arm arm, uint64_t seed) {
  rc::detail::TestMetadata meta;
  meta.id = meta.description = "eigenvalue of I - k a^T along k lies in [-1, 1]";
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = 300;
  Quiet quiet;
  return rc::detail::checkTestable(
      [arm] {
        const auto s = *gen_small_erase();
        const double mu = eigenvalue_along_k(s, arm);
        RC_ASSERT(mu >= -1 - 1e-12);
        RC_ASSERT(mu <= 1 + 1e-12);
      },
      meta, params, quiet);
}

}  // namespace

// §8.2 caveat: for nogate_noproj the eigenvalue 1 - sum b k^2 - lambda q^T k can leave [-1, 1].
// RapidCheck must falsify the claim and shrink the counterexample; the same claim holds for the
// projected arms (there mu is in [0, 1]).
TEST(EigenFact, RapidCheckFalsifiesNogateNoproj) {
  const uint64_t seed = 20240611;
  const auto result = check_claim(Arm::nogate_noproj, seed);
  rc::detail::FailureResult failure;
  ASSERT_TRUE(result.match(failure)) << "no counterexample found for nogate_noproj (seed " << seed << ")";
  std::ostringstream msg;
  rc::detail::printResultMessage(result, msg);
  std::printf("[shrunk counterexample] %s\n", msg.str().c_str());
  ASSERT_FALSE(failure.counterExample.empty());
  // The shrunk case is a two-channel one.
  EXPECT_NE(failure.counterExample.front().second.find("k=("), std::string::npos);
  for (Arm arm : {Arm::full, Arm::nogate, Arm::rand}) {
    const auto ok = check_claim(arm, seed);
    rc::detail::SuccessResult success;
    EXPECT_TRUE(ok.match(success)) << "projected arm " << qed::reference::to_string(arm) << " falsified";
  }
}

// Mutation check of the §8.2 family: an erase vector built with the diagonal projector breaks
// k^T a = sum b_i k_i^2.
TEST(EigenFact, CatchesDiagonalProjectorMutant) {
  const auto d = draw_erase(6, 17);
  const auto diag_erase = [](const std::vector<double>& k, const std::vector<double>& q, const std::vector<double>& b,
                             double lam, const std::vector<double>&) {
    std::vector<double> m(k.size()), a(k.size());
    for (size_t i = 0; i < k.size(); ++i) m[i] = b[i] * q[i];
    const auto p = mutants::diagonal_projection(k, m);
    for (size_t i = 0; i < k.size(); ++i) a[i] = b[i] * k[i] + lam * p[i];
    return a;
  };
  const double bound = 8 * (6 + 1) * unit_roundoff<double>();
  const double real = check_eigen_fact<double>(erase_of(Arm::full), d.k, d.q, d.b, d.lambda, d.r, 53, kWork);
  const double bad = check_eigen_fact<double>(diag_erase, d.k, d.q, d.b, d.lambda, d.r, 53, kWork);
  record("mutant eigen fact vs diagonal projector: reference", real);
  record("mutant eigen fact vs diagonal projector: mutant", bad);
  EXPECT_LE(real, bound);
  EXPECT_GT(bad, 1e6 * bound);
}
