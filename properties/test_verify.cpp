// The verify library by itself: metrics and locations on hand-computed data, the tolerance file
// schema, the judgement, the twin plan, and input hashing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "fixtures/generate.hpp"
#include "properties/test_verify_support.hpp"
#include "verify/compare.hpp"
#include "verify/compare_golden.hpp"
#include "verify/implementations.hpp"
#include "verify/tolerance.hpp"
#include "verify/verdict.hpp"

using namespace qed;
using namespace qed::verify;

namespace {

fixtures::Dataset ds(std::vector<double> x, std::vector<double> lo = {}) {
  fixtures::Dataset d;
  d.data = std::move(x);
  d.lo = std::move(lo);
  return d;
}

}  // namespace

TEST(VerifyMetrics, HandComputedErrorsAndLocation) {
  const Axes axes{{2, 3}, {"h", "k"}};
  const auto ref = ds({3, 4, 0, 0, 0, 0});
  const auto cand = ds({3, 4.5, 0, 0, 0, 1e-9});
  const Metrics m = compare_dataset("grads/dr", axes, cand, ref, std::ldexp(1.0, -24));
  EXPECT_DOUBLE_EQ(m.ref_frobenius, 5.0);
  EXPECT_DOUBLE_EQ(m.ref_max_abs, 4.0);
  EXPECT_DOUBLE_EQ(m.err_frobenius, std::sqrt(0.25 + 1e-18));
  EXPECT_DOUBLE_EQ(m.rel_frobenius, m.err_frobenius / 5.0);
  EXPECT_DOUBLE_EQ(m.max_abs_error, 0.5);
  EXPECT_EQ(m.max_abs_at.flat, 1);
  EXPECT_EQ(m.max_abs_at.text(), "(h=0, k=1)");
  // Element 5 has |ref| = 0 < 1e-3 * 4: outside the max relative error.
  EXPECT_DOUBLE_EQ(m.max_rel_error, 0.125);
  EXPECT_EQ(m.max_rel_at.flat, 1);
  EXPECT_DOUBLE_EQ(m.eps_units, m.rel_frobenius / std::ldexp(1.0, -24));
  EXPECT_TRUE(m.finite);
}

TEST(VerifyMetrics, FirstNonFiniteIsReportedAndFails) {
  const Axes axes{{1, 2, 1, 3}, {"b", "t", "h", "v"}};
  const auto ref = ds({1, 2, 3, 4, 5, 6});
  auto cand = ref;
  cand.data[4] = std::numeric_limits<double>::quiet_NaN();
  cand.data[5] = std::numeric_limits<double>::infinity();
  const Metrics m = compare_dataset("outputs/o", axes, cand, ref, 1e-16);
  EXPECT_FALSE(m.finite);
  EXPECT_EQ(m.first_nonfinite.text(), "(b=0, t=1, h=0, v=1)");
  Bound loose;
  loose.rtol_frobenius = 1e300;
  EXPECT_TRUE(std::isinf(judge(m, loose)));
}

TEST(VerifyMetrics, LowPartsAreUsedOnBothSides) {
  const Axes axes{{2}, {"h"}};
  const auto ref = ds({1.0, 2.0}, {1e-20, -3e-20});
  EXPECT_EQ(compare_dataset("grads/dlambda", axes, ref, ref, 1e-16).max_abs_error, 0.0);
  const auto hi_only = ds({1.0, 2.0});
  const Metrics m = compare_dataset("grads/dlambda", axes, hi_only, ref, 1e-16);
  EXPECT_DOUBLE_EQ(m.max_abs_error, 3e-20);
  EXPECT_EQ(m.max_abs_at.flat, 1);
}

TEST(VerifyMetrics, AxesOfEveryResult) {
  fixtures::Case c;
  fixtures::GenSpec spec;
  spec.variant = reference::Variant::gdn;
  spec.dims = {2, 5, 3, 4, 6};
  c.inputs = fixtures::generate(spec);
  EXPECT_EQ(result_axes(c, "outputs/o").labels, (std::vector<std::string>{"b", "t", "h", "v"}));
  EXPECT_EQ(result_axes(c, "outputs/ht").shape, (std::vector<int64_t>{2, 3, 4, 6}));
  EXPECT_EQ(result_axes(c, "grads/dh0").labels, (std::vector<std::string>{"n", "h", "k", "v"}));
  EXPECT_EQ(result_axes(c, "grads/dk").shape, (std::vector<int64_t>{2, 5, 3, 4}));
  EXPECT_EQ(result_axes(c, "grads/dg").shape, (std::vector<int64_t>{2, 5, 3}));  // scalar g
  EXPECT_EQ(result_axes(c, "grads/dbeta").labels, (std::vector<std::string>{"b", "t", "h"}));
  EXPECT_EQ(result_axes(c, "grads/dlambda").labels, (std::vector<std::string>{"h"}));
  EXPECT_EQ(result_axes(c, "grads/dr").shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(locate(result_axes(c, "grads/dv"), 2 * 6 + 5).text(), "(b=0, t=0, h=2, v=5)");
  EXPECT_THROW(result_axes(c, "grads/dz"), qed::Error);
}

TEST(VerifyTolerance, FileSchemaAndPrecedence) {
  const ToleranceSpec s = parse_tolerance(
      R"({"schema": "qedcheck.tolerance/1", "description": "x",
          "datasets": {"o": {"rtol_frobenius": 1e-6, "atol_max": 2e-6},
                       "grads/dk": {"atol_max": 0, "note": "exact"},
                       "*": {"rtol_frobenius": 0.5}}})",
      "t.json");
  auto o = s.explicit_bound("outputs/o");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->rtol_frobenius, 1e-6);
  EXPECT_EQ(o->atol_max, 2e-6);
  EXPECT_EQ(o->source, "file:t.json[o]");
  EXPECT_TRUE(std::isnan(s.explicit_bound("grads/dk")->rtol_frobenius));
  EXPECT_EQ(s.explicit_bound("grads/dv")->rtol_frobenius, 0.5);  // the wildcard
  const ToleranceSpec none = parse_tolerance(
      R"({"schema": "qedcheck.tolerance/1", "datasets": {"dq": {"rtol_frobenius": 1}}})", "t");
  EXPECT_FALSE(none.explicit_bound("grads/dk"));  // left to the twin rule
  // A certificate may carry its tolerance as a member.
  const ToleranceSpec cert = parse_tolerance(
      R"({"schema": "qedcheck.certificate/1", "tolerance":
          {"schema": "qedcheck.tolerance/1", "datasets": {"*": {"atol_max": 3}}}})", "c");
  EXPECT_EQ(cert.explicit_bound("outputs/ht")->atol_max, 3);
}

TEST(VerifyTolerance, EveryBrokenRuleIsAnError) {
  const char* bad[] = {
      "not json",
      R"([1, 2])",
      R"({"datasets": {"o": {"rtol_frobenius": 1}}})",
      R"({"schema": "qedcheck.tolerance/2", "datasets": {}})",
      R"({"schema": "qedcheck.tolerance/1"})",
      R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {"rtol": 1}}})",
      R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {"rtol_frobenius": -1}}})",
      R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {"atol_max": "1e-3"}}})",
      R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {}}})",
      R"({"schema": "qedcheck.tolerance/1", "datasets": {"dz": {"atol_max": 1}}})",
      R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {"atol_max": 1}, "outputs/o": {"atol_max": 1}}})",
  };
  for (const char* text : bad) EXPECT_THROW(parse_tolerance(text, "bad.json"), qed::Error) << text;
  EXPECT_THROW(tolerance_from_options(-1, std::nullopt), qed::Error);
  EXPECT_THROW(tolerance_from_options(1, std::numeric_limits<double>::infinity()), qed::Error);
}

TEST(VerifyTolerance, JudgeAndTwinRule) {
  Metrics m;
  m.rel_frobenius = 1e-6;
  m.max_abs_error = 3e-6;
  m.ref_max_abs = 10;
  Bound b;
  b.rtol_frobenius = 2e-6;
  EXPECT_DOUBLE_EQ(judge(m, b), 0.5);
  b.atol_max = 1e-6;
  EXPECT_DOUBLE_EQ(judge(m, b), 3.0);
  Bound zero;
  zero.atol_max = 0;
  EXPECT_TRUE(std::isinf(judge(m, zero)));
  m.max_abs_error = 0;
  EXPECT_EQ(judge(m, zero), 0.0);
  // Twin rule: F * max(twin error, one rounding to the dtype).
  TwinError e{1e-3, 1e-9, "t"};
  const Bound r = twin_rule_bound(e, m, 1e-5);
  EXPECT_DOUBLE_EQ(r.rtol_frobenius, 2e-3);
  EXPECT_DOUBLE_EQ(r.atol_max, 2e-4);  // 2 * u * max|ref| dominates the tiny twin max error
  EXPECT_EQ(r.source, "rule:twin");
}

TEST(VerifyTolerance, AllZeroReferenceUsesItsGroupScale) {
  Metrics z;
  z.name = "grads/dh0";
  z.ref_max_abs = 0;
  z.max_abs_error = 3e-8;
  z.rel_frobenius = 5e-8;  // an absolute norm when the reference is all zero
  const TwinError exact{0, 0, "t"};
  const double u = std::ldexp(1.0, -24);
  // Without a group scale the old bound stands: the exact twin leaves atol_max = 0.
  EXPECT_TRUE(std::isinf(judge(z, twin_rule_bound(exact, z, u))));
  const Bound b = twin_rule_bound(exact, z, u, 4.0);
  EXPECT_TRUE(std::isnan(b.rtol_frobenius));
  EXPECT_DOUBLE_EQ(b.atol_max, 2 * u * 4.0);
  EXPECT_LT(judge(z, b), 1.0);
  z.max_abs_error = 1e-3;
  EXPECT_GT(judge(z, b), 1.0);
  // A dataset with a scale of its own is unaffected by the group's.
  Metrics m = z;
  m.ref_max_abs = 1;
  EXPECT_DOUBLE_EQ(twin_rule_bound(exact, m, u, 4.0).atol_max, 2 * u);
  EXPECT_DOUBLE_EQ(twin_rule_bound(exact, m, u, 4.0).rtol_frobenius, 2 * u);
  GroupScales g;
  for (auto [name, mx] : {std::pair{"grads/dq", 3.0}, {"grads/dh0", 0.0}, {"outputs/o", 7.0}, {"grads/dk", 5.0}}) {
    Metrics x;
    x.name = name;
    x.ref_max_abs = mx;
    g.add(x);
  }
  EXPECT_EQ(g.of("grads/dh0"), 5.0);
  EXPECT_EQ(g.of("outputs/ht"), 7.0);
  EXPECT_EQ(g.of("other/x"), 0.0);
}

// End to end: with K = 1, b = 1 and unit keys the first step's erase annihilates the state, so
// the oracle's dh0 is exactly zero. A candidate off by a fraction of one rounding at the scale of
// the other gradients passes (an all-zero twin used to leave a zero bound, so any correct order of
// operations failed); one off by far more fails.
TEST(VerifyTolerance, ExactlyZeroGradientEndToEnd) {
  fixtures::GenSpec spec;
  spec.variant = reference::Variant::gdn2;
  spec.dims = {1, 3, 1, 1, 2};
  spec.seed = 4321;
  spec.with_h0 = true;
  fixtures::Case c;
  c.inputs = fixtures::generate(spec);
  for (double& k : c.inputs.k) k = k < 0 ? -1.0 : 1.0;
  for (double& b : c.inputs.b) b = 1.0;
  c.cotangents = fixtures::generate_cotangents(c.inputs, spec.seed, true);
  fixtures::Case cand = run_implementation(c, RunOptions{});
  auto& dh0 = cand.grads.at("dh0").data;
  for (double x : dh0) ASSERT_EQ(x, 0.0) << "the float64 recurrent reference should give dh0 = 0 exactly";
  double scale = 0;
  for (const auto& [name, d] : cand.grads)
    for (double x : d.data) scale = std::max(scale, std::abs(x));
  ASSERT_GT(scale, 0.0);
  const double u = std::ldexp(1.0, -53);
  auto dh0_verdict = [&](double off) {
    dh0[1] = off;
    const Verdict v = verify_candidate(cand, VerifyOptions{});
    for (const auto& d : v.datasets)
      if (d.metrics.name == "grads/dh0") return d;
    ADD_FAILURE() << "no grads/dh0 in the verdict";
    return DatasetVerdict{};
  };
  const DatasetVerdict ok = dh0_verdict(0.5 * u * scale);
  EXPECT_TRUE(ok.pass) << "score " << ok.score << ", atol_max " << ok.bound.atol_max;
  EXPECT_TRUE(std::isnan(ok.bound.rtol_frobenius));
  EXPECT_NEAR(ok.bound.atol_max, 2 * u * scale, 1e-3 * u * scale);
  const DatasetVerdict bad = dh0_verdict(1e3 * u * scale);
  EXPECT_FALSE(bad.pass) << "score " << bad.score;
}

TEST(VerifyTolerance, TwinPlanPerDtype) {
  const auto names = implementation_names();
  const bool chunked = std::find(names.begin(), names.end(), "reference-chunked") != names.end();
  const TwinPlan d = twin_plan("float64");
  EXPECT_EQ(d.labels.front(), "reference-recurrent@double");
  const TwinPlan f = twin_plan("float32");
  EXPECT_EQ(f.labels.front(), "reference-recurrent@float");
  const TwinPlan b = twin_plan("bfloat16");
  EXPECT_EQ(b.provisional, !chunked);
  if (chunked) {
    // Recurrent, then the chunked twins at chunks 64, 32, 16 and 8 (kTwinChunks).
    const std::vector<std::string> want_f = {"reference-recurrent@float", "reference-chunked@float C=64",
                                             "reference-chunked@float C=32", "reference-chunked@float C=16",
                                             "reference-chunked@float C=8"};
    EXPECT_EQ(f.labels, want_f);
    ASSERT_EQ(f.runs.size(), 5u);
    for (size_t i = 1; i < 5; ++i) EXPECT_EQ(f.runs[i].chunk, int64_t{64} >> (i - 1));
    EXPECT_EQ(d.labels.back(), "reference-chunked@double C=8");
    EXPECT_EQ(b.labels.size(), 5u);
    EXPECT_EQ(b.labels.back(), "reference-chunked@float+bf16 C=8");
    EXPECT_EQ(b.runs.back().operands, "bf16");
    EXPECT_EQ(twin_plan("float16").labels.back(), "reference-chunked@float+fp16 C=8");
  }
  if (chunked) {
    // Short sequences: chunks of at least their length are one computation, so the list goes on
    // with 4, 2, 1 to four distinct orders; 64 tokens or more keep the default list; the
    // candidate's own chunk counts by its effective length.
    auto chunks = [](const TwinPlan& p) {
      std::vector<int64_t> c;
      for (size_t i = 1; i < p.runs.size(); ++i) c.push_back(p.runs[i].chunk);
      return c;
    };
    EXPECT_EQ(chunks(twin_plan("float64", 0, 5)), (std::vector<int64_t>{5, 4, 2, 1}));
    EXPECT_EQ(chunks(twin_plan("float64", 0, 18)), (std::vector<int64_t>{18, 16, 8, 4}));
    EXPECT_EQ(chunks(twin_plan("float64", 0, 1)), (std::vector<int64_t>{1}));
    EXPECT_EQ(chunks(twin_plan("float64", 0, 64)), (std::vector<int64_t>{64, 32, 16, 8}));
    EXPECT_EQ(chunks(twin_plan("float64", 0, 5000)), (std::vector<int64_t>{64, 32, 16, 8}));
    EXPECT_EQ(chunks(twin_plan("float64", 128, 5000)), (std::vector<int64_t>{64, 32, 16, 8, 128}));
    EXPECT_EQ(chunks(twin_plan("float64", 128, 100)), (std::vector<int64_t>{64, 32, 16, 8, 100}));
    EXPECT_EQ(chunks(twin_plan("float64", 7, 5)), (std::vector<int64_t>{5, 4, 2, 1}));
    EXPECT_EQ(twin_plan("float64", 0, 5).labels.back(), "reference-chunked@double C=1");
  }
  reference::Inputs<double> in;
  in.dims.T = 12;
  EXPECT_EQ(longest_sequence(in), 12);
  in.cu_seqlens = {0, 3, 3, 10, 12};
  EXPECT_EQ(longest_sequence(in), 7);
  EXPECT_THROW(twin_plan("float8"), qed::Error);
  EXPECT_EQ(unit_roundoff("bfloat16"), std::ldexp(1.0, -8));
  EXPECT_EQ(unit_roundoff("float16"), std::ldexp(1.0, -11));
}

TEST(VerifyGolden, HashSeesEveryInputBitAndNotTheDtype) {
  fixtures::Case a = qed::verify_test::golden("qed_rand_prop");
  const std::string h = input_hash(a);
  fixtures::Case b = a;
  b.dtype = "float32";
  EXPECT_EQ(input_hash(b), h);
  EXPECT_TRUE(same_inputs(a, b));
  using Field = std::vector<double> reference::Inputs<double>::*;
  for (Field f : {&reference::Inputs<double>::q, &reference::Inputs<double>::r,
                  &reference::Inputs<double>::h0, &reference::Inputs<double>::lambda}) {
    fixtures::Case c = a;
    double& x = (c.inputs.*f).back();
    uint64_t bits;
    std::memcpy(&bits, &x, 8);
    bits ^= 1;  // one ulp
    std::memcpy(&x, &bits, 8);
    EXPECT_NE(input_hash(c), h);
    EXPECT_FALSE(same_inputs(a, c));
  }
  fixtures::Case c = a;
  c.cotangents->do_[0] += 1;
  EXPECT_EQ(input_hash(c), h);  // cotangents are not inputs ...
  EXPECT_FALSE(same_cotangents(a, c));  // ... but the golden lookup checks them separately
}
