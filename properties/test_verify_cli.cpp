// Acceptance tests of `qedcheck verify`, through the binary: accurate candidates pass, one element
// of one gradient perturbed just below the tolerance passes and just above (or far above) fails
// with the right location, NaN/Inf fail with their location, low-precision candidates are judged
// by the twin rule of their dtype, and the JSON verdict is written atomically.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fixtures/generate.hpp"
#include "properties/test_verify_support.hpp"
#include "reference/rounding.hpp"
#include "verify/compare.hpp"
#include "verify/implementations.hpp"
#include "verify/tolerance.hpp"

using namespace qed;
using namespace qed::verify_test;

namespace {

// The candidate that is the golden oracle itself (values and low parts): error exactly zero.
fixtures::Case exact_candidate(const std::string& name) {
  fixtures::Case c = golden(name);
  c.producer = "test: the golden oracle values";
  return c;
}

fixtures::Case run(const fixtures::Case& c, const std::string& impl, reference::Precision p,
                   const std::string& operands = "none") {
  verify::RunOptions o;
  o.impl = impl;
  o.precision = p;
  o.operands = operands;
  return verify::run_implementation(c, o);
}

std::vector<int64_t> index_of(const nlohmann::json& loc) { return loc.at("index").get<std::vector<int64_t>>(); }

// Rounds every input (and cotangent) to `ops` and labels the case with `dtype`.
fixtures::Case rounded_case(const fixtures::Case& in, reference::Operands ops, const std::string& dtype) {
  fixtures::Case c = in;
  c.outputs.clear();
  c.grads.clear();
  auto r = [&](std::vector<double>& x) {
    for (auto& e : x) e = reference::round_operand(e, ops);
  };
  auto& i = c.inputs;
  for (auto* x : {&i.q, &i.k, &i.v, &i.g, &i.b, &i.w, &i.beta, &i.lambda, &i.r, &i.h0}) r(*x);
  if (c.cotangents) {
    r(c.cotangents->do_);
    r(c.cotangents->dht);
  }
  c.dtype = dtype;
  return c;
}

}  // namespace

TEST(VerifyCli, AccurateCandidatesPassWithGoldenAndWithOracle) {
  Scratch s;
  for (const char* name : {"gdn2_prop", "qed_full_varlen_zero", "kda_mixed", "gdn2_T1"}) {
    SCOPED_TRACE(name);
    const fixtures::Case cand = run(golden(name), "reference-recurrent", reference::Precision::f64());
    fixtures::write_case(s.path("cand.h5"), cand);
    CliResult r = qedcheck(s, "verify " + quote(s.path("cand.h5")) + " --json " + quote(s.path("v.json")));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    nlohmann::json v = read_json(s.path("v.json"));
    EXPECT_EQ(v.at("schema"), "qedcheck.verdict/1");
    EXPECT_EQ(v.at("reference").at("source"), "golden");
    EXPECT_EQ(v.at("tolerance").at("source"), "rule");
    EXPECT_EQ(v.at("pass"), true);
    EXPECT_EQ(v.at("exit_code"), 0);
    EXPECT_EQ(v.at("datasets").size(), cand.outputs.size() + cand.grads.size());
    r = qedcheck(s, "verify " + quote(s.path("cand.h5")) + " --no-golden --json " + quote(s.path("v.json")));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    v = read_json(s.path("v.json"));
    EXPECT_EQ(v.at("reference").at("source"), "oracle");
    EXPECT_GE(v.at("reference").at("min_digits").get<double>(), 20);
  }
  // No temporary file is left next to the verdict.
  for (const auto& e : fs::directory_iterator(s.dir()))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
}

// One element of grads/dk moved by f times the distance the bound allows: f = 0.99 passes,
// 1.01 and 1000 fail, and the verdict names that element.
void perturbation_ladder(const Scratch& s, const std::string& extra_args, const std::string& expect_source) {
  fixtures::Case cand = exact_candidate("qed_full_prop");
  fixtures::write_case(s.path("cand.h5"), cand);
  CliResult r = qedcheck(s, "verify " + quote(s.path("cand.h5")) + extra_args + " --json " + quote(s.path("v.json")));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json v0 = read_json(s.path("v.json"));
  const auto& dk0 = dataset(v0, "grads/dk");
  EXPECT_EQ(dk0.at("max_abs_error").get<double>(), 0.0);
  EXPECT_EQ(dk0.at("tolerance").at("source"), expect_source);
  // The distance one element may move: min over the bounds present (null = not checked).
  const auto& tol = dk0.at("tolerance");
  double room = std::numeric_limits<double>::infinity();
  if (!tol.at("atol_max").is_null()) room = tol.at("atol_max").get<double>();
  if (!tol.at("rtol_frobenius").is_null())
    room = std::min(room, tol.at("rtol_frobenius").get<double>() * dk0.at("ref_frobenius").get<double>());
  ASSERT_TRUE(std::isfinite(room));
  // The element with the smallest nonzero |dk|: its ulp is far below `room`.
  const auto& dk = cand.grads.at("dk").data;
  size_t at = 0;
  for (size_t i = 0; i < dk.size(); ++i)
    if (dk[i] != 0 && (dk[at] == 0 || std::abs(dk[i]) < std::abs(dk[at]))) at = i;
  const auto& d = cand.inputs.dims;
  const std::vector<int64_t> where = {static_cast<int64_t>(at) / (d.T * d.H * d.K),
                                      static_cast<int64_t>(at) / (d.H * d.K) % d.T,
                                      static_cast<int64_t>(at) / d.K % d.H, static_cast<int64_t>(at) % d.K};
  for (double f : {0.99, 1.01, 1000.0}) {
    SCOPED_TRACE("perturbation " + std::to_string(f) + " x the allowed error" + extra_args);
    fixtures::Case p = cand;
    p.grads.at("dk").data[at] += f * room;
    const double moved = p.grads.at("dk").data[at] - dk[at];
    ASSERT_NEAR(moved / room, f, 1e-3 * f);
    fixtures::write_case(s.path("p.h5"), p);
    r = qedcheck(s, "verify " + quote(s.path("p.h5")) + extra_args + " --json " + quote(s.path("v.json")));
    const nlohmann::json v = read_json(s.path("v.json"));
    const auto& e = dataset(v, "grads/dk");
    EXPECT_EQ(index_of(e.at("max_abs_at")), where);
    EXPECT_NEAR(e.at("score").get<double>(), f, 2e-3 * f);
    if (f < 1) {
      EXPECT_EQ(r.code, 0) << r.out;
      EXPECT_EQ(e.at("pass"), true);
    } else {
      EXPECT_EQ(r.code, 1) << r.out;
      EXPECT_EQ(v.at("exit_code"), 1);
      EXPECT_EQ(e.at("pass"), false);
      EXPECT_NE(r.out.find("FAIL       grads/dk"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find(fmt::format("(b={}, t={}, h={}, k={})", where[0], where[1], where[2], where[3])),
                std::string::npos)
          << r.out;
      for (const auto& other : v.at("datasets")) {
        if (other.at("name") != "grads/dk") {
          EXPECT_EQ(other.at("pass"), true) << other.at("name");
        }
      }
    }
  }
}

TEST(VerifyCli, PerturbedGradientAgainstTwinRule) {
  Scratch s;
  perturbation_ladder(s, "", "rule:twin");
}
TEST(VerifyCli, PerturbedGradientAgainstOptions) {
  Scratch s;
  perturbation_ladder(s, " --rtol 1e-7 --atol 3e-8", "options");
}
TEST(VerifyCli, PerturbedGradientAgainstToleranceFile) {
  Scratch s;
  {
    std::ofstream f(s.path("tol.json"));
    f << R"({"schema": "qedcheck.tolerance/1", "datasets": {"dk": {"rtol_frobenius": 1e-5}}})";
  }
  perturbation_ladder(s, " --tolerance " + quote(s.path("tol.json")), "file:" + s.path("tol.json") + "[dk]");
}

TEST(VerifyCli, NonFiniteValuesFailWithTheirLocation) {
  Scratch s;
  fixtures::Case c = run(golden("gdn_prop"), "reference-recurrent", reference::Precision::f64());
  c.grads.at("dv").data[7] = std::numeric_limits<double>::quiet_NaN();
  c.grads.at("dv").data[9] = std::numeric_limits<double>::infinity();
  c.outputs.at("ht").data[3] = -std::numeric_limits<double>::infinity();
  fixtures::write_case(s.path("nan.h5"), c);
  const CliResult r = qedcheck(s, "verify " + quote(s.path("nan.h5")) + " --json " + quote(s.path("v.json")));
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const nlohmann::json v = read_json(s.path("v.json"));
  const auto& dv = dataset(v, "grads/dv");
  EXPECT_EQ(dv.at("finite"), false);
  EXPECT_EQ(dv.at("first_nonfinite").at("flat"), 7);  // V = 3: (b=0, t=1, h=0, v=1)
  EXPECT_EQ(index_of(dv.at("first_nonfinite")), (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(dv.at("rel_frobenius"), "inf");
  EXPECT_EQ(dataset(v, "outputs/ht").at("first_nonfinite").at("flat"), 3);
  EXPECT_NE(r.out.find("non-finite value nan at (b=0, t=1, h=0, v=1)"), std::string::npos) << r.out;
  EXPECT_EQ(dataset(v, "grads/dk").at("pass"), true);
}

TEST(VerifyCli, LowPrecisionCandidatesUseTheirTwin) {
  Scratch s;
  fixtures::GenSpec spec;
  spec.variant = reference::Variant::gdn2;
  spec.dims = {1, 70, 2, 8, 8};
  spec.regime = fixtures::Regime::std_;
  spec.seed = 20240;
  spec.with_h0 = true;
  fixtures::Case base;
  base.inputs = fixtures::generate(spec);
  base.cotangents = fixtures::generate_cotangents(base.inputs, spec.seed, true);
  struct Row {
    reference::Operands ops;
    const char* dtype;
    const char* impl;
    reference::Precision prec;
    const char* operands;
  };
  const Row rows[] = {
      {reference::Operands::fp32, "float32", "reference-recurrent", reference::Precision::f32(), "none"},
      {reference::Operands::fp32, "float32", "reference-chunked", reference::Precision::f32(), "none"},
      {reference::Operands::fp32, "float32", "reference-recurrent", reference::Precision::f64(), "none"},
      {reference::Operands::bf16, "bfloat16", "reference-chunked", reference::Precision::f32(), "bf16"},
      {reference::Operands::fp16, "float16", "reference-chunked", reference::Precision::f32(), "fp16"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(std::string(row.dtype) + " candidate from " + row.impl + "@" + row.prec.name());
    const fixtures::Case in = rounded_case(base, row.ops, row.dtype);
    fixtures::Case cand = run(in, row.impl, row.prec, row.operands);
    fixtures::write_case(s.path("lp.h5"), cand);
    CliResult r = qedcheck(s, "verify " + quote(s.path("lp.h5")) + " --json " + quote(s.path("v.json")));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    nlohmann::json v = read_json(s.path("v.json"));
    EXPECT_EQ(v.at("candidate").at("unit_roundoff"), verify::unit_roundoff(row.dtype));
    EXPECT_TRUE(v.at("candidate").at("warnings").empty()) << v.at("candidate").at("warnings");
    // A float computation judged as if it were float64 fails by orders of magnitude.
    if (row.prec.kind == reference::ScalarKind::f32) {
      cand.dtype = "float64";
      fixtures::write_case(s.path("lp64.h5"), cand);
      r = qedcheck(s, "verify " + quote(s.path("lp64.h5")));
      EXPECT_EQ(r.code, 1) << r.out;
    }
  }
  // A dtype whose values the inputs do not hold is flagged, not silently accepted.
  fixtures::Case wrong = run(base, "reference-recurrent", reference::Precision::f32());
  wrong.dtype = "float32";
  fixtures::write_case(s.path("wrong.h5"), wrong);
  qedcheck(s, "verify " + quote(s.path("wrong.h5")) + " --json " + quote(s.path("v.json")));
  const auto warnings = read_json(s.path("v.json")).at("candidate").at("warnings");
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].get<std::string>().find("is not a float32 value"), std::string::npos);
}

TEST(VerifyCli, OutputsOnlyCandidateAndHelpStateTheRule) {
  Scratch s;
  fixtures::Case c = run(golden("deltanet_a1b1"), "reference-recurrent", reference::Precision::f64());
  c.grads.clear();
  c.cotangents.reset();
  c.outputs.erase("ht");
  fixtures::write_case(s.path("o.h5"), c);
  CliResult r = qedcheck(s, "verify " + quote(s.path("o.h5")) + " --json " + quote(s.path("v.json")));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(read_json(s.path("v.json")).at("datasets").size(), 1u);
  EXPECT_NE(r.out.find("twin rule"), std::string::npos);
  r = qedcheck(s, "verify --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("twin rule: per dataset"), std::string::npos) << r.out;
}

// A correct chunked implementation whose chunk is longer than the default twins' (128 against 64,
// 32, 16, 8) sums in an order none of them samples; `--chunk 128` adds that order's twin, and the
// verdict then passes (the candidate's error is that twin's) and lists the added twin.
TEST(VerifyCli, ChunkOptionAddsTheCandidatesOwnChunkTwin) {
  Scratch s;
  fixtures::GenSpec spec;
  spec.variant = reference::Variant::gdn2;
  spec.dims = {1, 128, 2, 8, 8};
  spec.seed = 3;
  spec.with_h0 = true;
  fixtures::Case base;
  base.inputs = fixtures::generate(spec);
  base.cotangents = fixtures::generate_cotangents(base.inputs, spec.seed, true);
  verify::RunOptions o;
  o.impl = "reference-chunked";
  o.precision = reference::Precision::f64();
  o.chunk = 128;
  const fixtures::Case full = verify::run_implementation(base, o);
  fixtures::write_case(s.path("c128.h5"), full);
  const CliResult r = qedcheck(s, "verify " + quote(s.path("c128.h5")) + " --no-golden --chunk 128 --json " +
                                      quote(s.path("v.json")));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json v = read_json(s.path("v.json"));
  const auto& twins = v.at("tolerance").at("twins");
  bool has128 = false;
  for (const auto& t : twins) has128 = has128 || t.get<std::string>().find("C=128") != std::string::npos;
  EXPECT_TRUE(has128) << twins.dump();
  // A candidate that leaves results out passes on what it holds, and says what was not judged.
  fixtures::Case part = full;
  part.outputs.erase("ht");
  part.grads.erase("dh0");
  fixtures::write_case(s.path("part.h5"), part);
  const CliResult rp = qedcheck(s, "verify " + quote(s.path("part.h5")) + " --no-golden --chunk 128 --json " +
                                       quote(s.path("vp.json")));
  EXPECT_EQ(rp.code, 0) << rp.out << rp.err;
  const nlohmann::json vp = read_json(s.path("vp.json"));
  bool said = false;
  for (const auto& w : vp.at("candidate").at("warnings"))
    said = said || w.get<std::string>() == "not judged, absent from the candidate: outputs/ht, grads/dh0";
  EXPECT_TRUE(said) << vp.at("candidate").at("warnings").dump();
  // Without the option the plan is the default one (no C=128 twin).
  const std::string plan = verify::twin_plan_text("float64");
  EXPECT_EQ(plan.find("C=128"), std::string::npos) << plan;
}
