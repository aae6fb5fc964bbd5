// Forward properties P1-P4 of MATH.md §9 on the recurrent reference, as RapidCheck properties over
// random small cases (every variant and arm, varlen with zero-length sequences, h0, gate
// extremes): in double with §9's tolerances and in mpfr (200 bits) with the same number of
// roundoffs. A failure prints RC's reproduce string and the case's replay line.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "properties/support/cases.hpp"
#include "properties/support/checks_forward.hpp"
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
void prop_P1() {
  const auto spec = *gen_case(shape_for<S>());
  const auto in = inputs_as<S>(spec);
  const int64_t Tp = *rc::gen::inRange<int64_t>(0, spec.T + 1);
  const double r = record(label<S>("P1 causality (bitwise)"), check_P1_causality(ref<S>, in, Tp));
  RC_ASSERT(r == 0.0);
}

template <class S>
void prop_P2() {
  const auto spec = *gen_case(shape_for<S>());
  const auto in = inputs_as<S>(spec);
  double r = record(label<S>("P2 sequences alone (bitwise)"), check_P2_sequences(ref<S>, in));
  if (spec.seqlens.empty()) {
    const int64_t tau = *rc::gen::inRange<int64_t>(0, spec.T + 1);
    r = std::max(r, record(label<S>("P2 split at tau (bitwise)"), check_P2_split(ref<S>, in, tau)));
  }
  RC_ASSERT(r == 0.0);
}

template <class S>
void prop_P3() {
  const auto spec = *gen_case(shape_for<S>());
  const auto in = inputs_as<S>(spec);
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 20);
  const double ca = *rc::gen::element(-1.5, 0.5, 2.0, 0.3), cb = *rc::gen::element(-0.7, 1.0, 3.0);
  const double r = record(label<S>("P3 joint linearity (v,h0)"), check_P3_linearity(ref<S>, in, seed, ca, cb));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

template <class S>
void prop_P4() {
  const auto spec = *gen_case(shape_for<S>());
  const auto in = inputs_as<S>(spec);
  const double c = *rc::gen::element(2.0, -1.0, 0.37, 3.1, -2.6);
  const double r = record(label<S>("P4 q-homogeneity (o and ht)"), check_P4_homogeneity(ref<S>, in, c));
  RC_ASSERT(r <= tol_like_f64<S>(1e-13));
}

}  // namespace

RC_GTEST_PROP(Forward, P1CausalityDouble, ()) { prop_P1<double>(); }
RC_GTEST_PROP(Forward, P1CausalityMpfr, ()) { prop_P1<mpfr_float>(); }
RC_GTEST_PROP(Forward, P2StatePassingDouble, ()) { prop_P2<double>(); }
RC_GTEST_PROP(Forward, P2StatePassingMpfr, ()) { prop_P2<mpfr_float>(); }
RC_GTEST_PROP(Forward, P3JointLinearityDouble, ()) { prop_P3<double>(); }
RC_GTEST_PROP(Forward, P3JointLinearityMpfr, ()) { prop_P3<mpfr_float>(); }
RC_GTEST_PROP(Forward, P4QHomogeneityDouble, ()) { prop_P4<double>(); }
RC_GTEST_PROP(Forward, P4QHomogeneityMpfr, ()) { prop_P4<mpfr_float>(); }
