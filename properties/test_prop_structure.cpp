// Forward properties P6-P8, P11, P12 of MATH.md §9 on the recurrent reference: identity padding,
// channel permutations, key-space rotations (scalar gates), the exact write of a full erase, and
// (sequence, head) lane independence. Double with §9's tolerances, mpfr (200 bits) alongside.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/support/cases.hpp"
#include "properties/support/checks_forward.hpp"
#include "properties/support/checks_state.hpp"
#include "reference/recurrent.hpp"

using namespace qed::properties;
using qed::reference::Outputs;

namespace {

template <class S>
Outputs<S> ref(const Inputs<S>& x) {
  return qed::reference::recurrent_forward(x);
}

template <class S>
CaseShape shape_for() {
  CaseShape s;
  if (std::is_same_v<S, mpfr_float>) {
    s.max_T = slow_mode() ? 16 : 8;
    s.max_K = 4;
    s.max_V = 3;
  } else if (slow_mode()) {
    s.max_T = 48;
    s.max_K = s.max_V = 10;
    s.max_B = s.max_H = 3;
  }
  return s;
}

template <class S>
std::string label(const char* p) {
  return std::string(p) + (std::is_same_v<S, double> ? " double" : " mpfr200");
}

template <class S>
void prop_P6() {
  const auto spec = *gen_case(shape_for<S>());
  const auto in = inputs_as<S>(spec);
  std::vector<int64_t> pads(static_cast<size_t>(spec.T + 1));
  for (auto& p : pads) p = *rc::gen::weightedElement<int64_t>({{4, 0}, {2, 1}, {1, 3}});
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
  const double r = record(label<S>("P6 identity padding"), check_P6_padding(ref<S>, in, pads, seed));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

template <class S>
void prop_P7() {
  const auto spec = *gen_case(shape_for<S>());
  const auto in = inputs_as<S>(spec);
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
  const auto pK = permutation(spec.K, seed), pV = permutation(spec.V, seed + 1);
  const double r = record(label<S>("P7 permutation equivariance"), check_P7_permutation(ref<S>, in, pK, pV));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

template <class S>
void prop_P8() {
  CaseShape shape = shape_for<S>();
  shape.gates = {Gates::scalar, Gates::b_one, Gates::a1b1};
  // Unit keys, the inputs MATH.md states P8's tolerance for. With raw Gaussian keys and b = 1 the
  // transitions I - k k^T have norm |1 - |k|^2| (above 1 once |k|^2 > 2; |k|^2 is about K), and
  // a rotated run's rounding is amplified by their product: 4.4e-14 was seen at T = 14, K = 2,
  // the conditioning of that case, not a broken invariance. The worst of about 40000 unit-key
  // draws was 1.1e-14.
  shape.raw_keys = false;
  const auto spec = *gen_case(shape);
  const auto in = inputs_as<S>(spec);
  qed::fixtures::Rng rng(*rc::gen::inRange<uint64_t>(0, 1u << 20));
  const auto R = random_orthogonal<S>(spec.K, [&] { return rng.normal(); });
  const double r = record(label<S>("P8 rotation invariance"), check_P8_rotation(ref<S>, in, R));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

template <class S>
void prop_P11() {
  CaseShape shape = shape_for<S>();
  shape.max_T = std::min<int64_t>(shape.max_T, 12);  // states come from T prefix runs
  const auto spec = *gen_case(shape);
  const auto in = inputs_as<S>(spec);
  const double r = record(label<S>("P11 exact write"), check_P11_exact_write(ref<S>, in));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

template <class S>
void prop_P12() {
  CaseShape shape = shape_for<S>();
  shape.max_B = shape.max_H = 3;
  const auto spec = *gen_case(shape);
  const auto in = inputs_as<S>(spec);
  const int64_t n = *rc::gen::inRange<int64_t>(0, in.num_sequences());
  const int64_t h = *rc::gen::inRange<int64_t>(0, spec.H);
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
  const double a = record(label<S>("P12 lanes alone (bitwise)"), check_P12_lanes(ref<S>, in));
  const double b = record(label<S>("P12 perturb one lane (bitwise)"), check_P12_perturb(ref<S>, in, n, h, seed));
  RC_ASSERT(a == 0.0);
  RC_ASSERT(b == 0.0);
}

}  // namespace

RC_GTEST_PROP(Structure, P6IdentityPaddingDouble, ()) { prop_P6<double>(); }
RC_GTEST_PROP(Structure, P6IdentityPaddingMpfr, ()) { prop_P6<mpfr_float>(); }
RC_GTEST_PROP(Structure, P7PermutationDouble, ()) { prop_P7<double>(); }
RC_GTEST_PROP(Structure, P7PermutationMpfr, ()) { prop_P7<mpfr_float>(); }
RC_GTEST_PROP(Structure, P8RotationDouble, ()) { prop_P8<double>(); }
RC_GTEST_PROP(Structure, P8RotationMpfr, ()) { prop_P8<mpfr_float>(); }
RC_GTEST_PROP(Structure, P11ExactWriteDouble, ()) { prop_P11<double>(); }
RC_GTEST_PROP(Structure, P11ExactWriteMpfr, ()) { prop_P11<mpfr_float>(); }
RC_GTEST_PROP(Structure, P12LaneIndependenceDouble, ()) { prop_P12<double>(); }
RC_GTEST_PROP(Structure, P12LaneIndependenceMpfr, ()) { prop_P12<mpfr_float>(); }
