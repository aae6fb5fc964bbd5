// Case-file validation, continued: /cotangents, /outputs, /grads (X_lo, X@digits) and the
// in-memory validate_case.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fixtures/case.hpp"
#include "fixtures/case_patch.hpp"
#include "fixtures/generate.hpp"

namespace {

using namespace qed::fixtures;
using qed::reference::Arm;
using qed::reference::Variant;
namespace fs = std::filesystem;

// B=2 T=7 H=2 K=3 V=5 (or B=1 with cu_seqlens {0,3,3,7}: N=3), h0, do+dht, outputs, grads.
Case good_case(Variant v, Arm a, bool varlen) {
  GenSpec s;
  s.variant = v;
  s.arm = a;
  s.seed = 42;
  s.dims = {varlen ? 1 : 2, 7, 2, 3, 5};
  if (varlen) s.seqlens = {3, 0, 4};
  s.with_h0 = true;
  Case c;
  c.inputs = generate(s);
  c.cotangents = generate_cotangents(c.inputs, 1, true);
  auto add = [&](std::map<std::string, Dataset>& m, const std::string& n) {
    Dataset d;
    d.shape = input_shape(c.inputs, n);
    size_t count = 1;
    for (auto e : d.shape) count *= static_cast<size_t>(e);
    d.data.assign(count, 0.5);
    d.lo.assign(count, 1e-17);
    d.digits = 20;
    m[n] = d;
  };
  add(c.outputs, "o");
  add(c.outputs, "ht");
  for (const auto& n : grad_names(v, a)) add(c.grads, n);
  return c;
}

class Results : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qedcheck-results-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string good(Variant v = Variant::gdn2, Arm a = Arm::none, bool varlen = false) {
    const std::string path = (dir_ / "c.h5").string();
    write_case(path, good_case(v, a, varlen));
    return path;
  }
  // read_case must throw exactly `path + ": " + rest` and keep stderr silent.
  // Both ways of reading (isolated child process and in-process) must agree.
  void expect_error(const std::string& path, const std::string& rest, ReadOptions o = {}) {
    for (bool isolate : {true, false}) {
      o.isolate = isolate;
      SCOPED_TRACE(isolate ? "isolated" : "in-process");
      expect_error_once(path, rest, o);
    }
  }
  void expect_error_once(const std::string& path, const std::string& rest, const ReadOptions& o) {
    ::testing::internal::CaptureStderr();
    std::string got = "(no error)";
    try {
      read_case(path, o);
    } catch (const qed::Error& e) {
      got = e.what();
    }
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "HDF5 printed on stderr";
    EXPECT_EQ(got, path + ": " + rest);
  }
  fs::path dir_;
};

// ---------------------------------------------------------------- /cotangents
TEST_F(Results, CotangentDoMissing) {
  const std::string p = good();
  CasePatch(p).remove("/cotangents/do");
  expect_error(
      p, "/cotangents/do: missing (rule: /cotangents holds do (required) and dht (optional))");
}
TEST_F(Results, CotangentShapes) {
  const std::string p = good(Variant::kda, Arm::none, true);
  CasePatch(p).doubles("/cotangents/dht", {1, 2, 3, 5}, std::vector<double>(30, 0.0));
  expect_error(p,
               "/cotangents/dht: shape [1,2,3,5], expected [3,2,3,5] = [N,H,K,V] (rule: dht is "
               "[N,H,K,V], with B, T, H, K from q, V from v, N from cu_seqlens)");
  CasePatch(p)
      .remove("/cotangents/dht")
      .doubles("/cotangents/do", {1, 7, 2, 3}, std::vector<double>(42, 0.0));
  expect_error(p,
               "/cotangents/do: shape [1,7,2,3], expected [1,7,2,5] = [B,T,H,V] (rule: do is "
               "[B,T,H,V], with B, T, H, K from q, V from v, N from cu_seqlens)");
}
TEST_F(Results, CotangentNotFinite) {
  const std::string p = good();
  CasePatch(p).set("/cotangents/dht", 7, NAN);
  expect_error(p,
               "/cotangents/dht[0,0,1,2]: value nan is not finite (rule: cotangents are finite)");
}
TEST_F(Results, CotangentUnknownName) {
  const std::string p = good();
  CasePatch(p).doubles("/cotangents/dq", {1}, {0.0});
  expect_error(p, "/cotangents/dq: unknown dataset (rule: /cotangents holds do and dht)");
}

// ---------------------------------------------------------------- /outputs and /grads
TEST_F(Results, OutputShape) {
  const std::string p = good();
  CasePatch(p).doubles("/outputs/ht", {2, 2, 5, 3}, std::vector<double>(60, 0.0));
  expect_error(p,
               "/outputs/ht: shape [2,2,5,3], expected [2,2,3,5] = [N,H,K,V] (rule: ht is "
               "[N,H,K,V], with B, T, H, K from q, V from v, N from cu_seqlens)");
}
TEST_F(Results, OutputUnknownName) {
  const std::string p = good();
  CasePatch(p).doubles("/outputs/y", {1}, {0.0});
  expect_error(
      p, "/outputs/y: unknown dataset (rule: /outputs holds only o ht (and their _lo parts))");
}
TEST_F(Results, GradientTheVariantDoesNotHave) {
  const std::string p = good(Variant::kda);
  CasePatch(p).doubles("/grads/db", {2, 7, 2, 3}, std::vector<double>(84, 0.0));
  expect_error(p,
               "/grads/db: present, but variant kda has no db (rule: /grads holds only dq dk dv dg "
               "dbeta dh0 (and their _lo parts))");
}
TEST_F(Results, GradientShapeFollowsItsInput) {
  const std::string p = good(Variant::gdn);
  CasePatch(p).doubles("/grads/dg", {2, 7, 2, 3}, std::vector<double>(84, 0.0));
  expect_error(p, "/grads/dg: rank 4 [2,7,2,3], expected rank 3 [B,T,H] (rule: dg is [B,T,H])");
}
TEST_F(Results, GradientOfInitialStateWithoutInitialState) {
  Case c = good_case(Variant::deltanet, Arm::none, true);
  c.inputs.h0.clear();
  const std::string p = (dir_ / "c.h5").string();
  write_case(p, c);
  EXPECT_EQ(read_case(p).grads.at("dh0").shape, (std::vector<int64_t>{3, 2, 3, 5}));
  CasePatch(p).doubles("/grads/dh0", {1, 2, 3, 5}, std::vector<double>(30, 0.0));
  expect_error(p,
               "/grads/dh0: shape [1,2,3,5], expected [3,2,3,5] = [N,H,K,V] (rule: dh0 is "
               "[N,H,K,V], with B, T, H, K from q, V from v, N from cu_seqlens)");
}
TEST_F(Results, LowPartWithoutHighPart) {
  const std::string p = good(Variant::qed, Arm::rand);
  CasePatch(p).remove("/grads/dr");
  expect_error(p, "/grads/dr_lo: present without /grads/dr (rule: X_lo accompanies X)");
}
TEST_F(Results, LowPartShapeAndType) {
  const std::string p = good();
  CasePatch(p).doubles("/outputs/o_lo", {2, 7, 2, 4}, std::vector<double>(112, 0.0));
  expect_error(p,
               "/outputs/o_lo: shape [2,7,2,4], expected [2,7,2,5] = [B,T,H,V] (rule: o_lo is "
               "[B,T,H,V], with B, T, H, K from q, V from v, N from cu_seqlens)");
  CasePatch(p).doubles("/outputs/o_lo", {2, 7, 2, 5}, std::vector<double>(140, 0.0),
                       H5T_IEEE_F32LE);
  expect_error(
      p,
      "/outputs/o_lo: stored as a 32-bit float (rule: floating-point datasets are IEEE float64)");
}
TEST_F(Results, DigitsAttribute) {
  const std::string p = good();
  CasePatch(p).attr_number("/grads/dw", "digits", H5T_IEEE_F64LE, {-1});
  expect_error(p, "/grads/dw@digits: value -1 (rule: digits is finite and >= 0)");
  CasePatch(p).attr_number("/grads/dw", "digits", H5T_IEEE_F64LE, {NAN});
  expect_error(p, "/grads/dw@digits: value nan (rule: digits is finite and >= 0)");
  CasePatch(p).attr_string("/grads/dw", "digits", "30");
  expect_error(p,
               "/grads/dw@digits: has HDF5 type class string (rule: this attribute is a float64)");
  CasePatch(p).attr_number("/grads/dw", "digits", H5T_IEEE_F32LE, {12.5});
  EXPECT_EQ(read_case(p).grads.at("dw").digits, 12.5);
  CasePatch(p).attr_remove("/grads/dw", "digits");
  EXPECT_LT(read_case(p).grads.at("dw").digits, 0);
}
TEST_F(Results, NonFiniteResultsOnlyWhenAllowed) {
  const std::string p = good();
  CasePatch(p).set("/outputs/o", 7, NAN).set("/grads/dk_lo", 0, INFINITY);
  EXPECT_TRUE(std::isnan(read_case(p).outputs.at("o").data[7]));
  ReadOptions strict;
  strict.allow_nonfinite_results = false;
  expect_error(p,
               "/outputs/o[0,0,1,2]: value nan is not finite (rule: results are finite "
               "(allow_nonfinite_results off))",
               strict);
  CasePatch(p).set("/outputs/o", 7, 0.0);
  expect_error(p,
               "/grads/dk_lo[0,0,0,0]: value inf is not finite (rule: results are finite "
               "(allow_nonfinite_results off))",
               strict);
}
TEST_F(Results, UnknownRootGroupsAndAttributesAreIgnored) {
  const std::string p = good();
  CasePatch(p)
      .group("/meta")
      .attr_string("/", "note", "extension")
      .attr_number("/inputs/q", "unit", H5T_STD_I8LE, {1});
  EXPECT_NO_THROW(read_case(p));
}

// ---------------------------------------------------------------- validate_case in memory
TEST(ValidateCase, InMemoryRules) {
  auto message = [](const Case& c, const ReadOptions& o = {}) {
    try {
      validate_case(c, "mem", o);
    } catch (const qed::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const Case ok = good_case(Variant::qed, Arm::full, true);
  EXPECT_EQ(message(ok), "(no error)");
  Case c = ok;
  c.inputs.dims.K = 0;
  EXPECT_EQ(message(c), "mem: /inputs/q: K = 0 (rule: dimensions B, T, H, K, V >= 1)");
  c = ok;
  c.inputs.arm = Arm::none;
  EXPECT_EQ(message(c), "mem: /@arm: missing (rule: arm is required for variant qed)");
  c = ok;
  c.inputs.beta.assign(14, 0.5);
  EXPECT_EQ(message(c),
            "mem: /inputs/beta: present, but variant qed has no beta (rule: variant qed has inputs "
            "q, k, v, g, b, w, lambda (+ h0, cu_seqlens))");
  c = ok;
  c.inputs.lambda.clear();
  EXPECT_EQ(message(c),
            "mem: /inputs/lambda: missing (rule: variant qed requires q, k, v, g, b, w, lambda)");
  c = ok;
  c.inputs.h0.resize(2 * 3 * 5);
  EXPECT_EQ(message(c),
            "mem: /inputs/h0: 30 values, expected 90 = [3,2,3,5] [N,H,K,V] (rule: shapes follow q "
            "[B,T,H,K] and v [B,T,H,V])");
  c = ok;
  c.inputs.cu_seqlens = {0, 4, 3, 7};
  EXPECT_EQ(message(c),
            "mem: /inputs/cu_seqlens[2]: value 3 < previous 4 (rule: cu_seqlens non-decreasing)");
  c = ok;
  c.grads["dbeta"] = c.grads["dq"];
  EXPECT_EQ(message(c),
            "mem: /grads/dbeta: not a dataset of variant qed (rule: /grads holds only dq dk dv dg "
            "db dw dlambda dh0)");
  c = ok;
  c.outputs["o"].digits = NAN;
  EXPECT_EQ(message(c), "mem: /outputs/o@digits: value nan (rule: digits is finite and >= 0)");
  c = ok;
  c.outputs["o"].lo.pop_back();
  EXPECT_EQ(message(c),
            "mem: /outputs/o_lo: 69 values, expected 70 = [1,7,2,5] [B,T,H,V] (rule: shapes follow "
            "q [B,T,H,K] and v [B,T,H,V])");
  c = ok;
  c.dtype = "fp8";
  EXPECT_EQ(message(c),
            "mem: /inputs@dtype: 'fp8' (rule: dtype is float64, float32, float16 or bfloat16)");
  c = ok;
  c.inputs.scale = NAN;
  EXPECT_EQ(message(c), "mem: /@scale: value nan is not finite (rule: scale is finite)");
  c = ok;
  c.inputs.b[5] = -0.5;
  EXPECT_EQ(message(c),
            "mem: /inputs/b[0,0,1,2]: value -0.5 is outside [0, 1] (rule: gate b in [0, 1])");
  ReadOptions lax;
  lax.check_values = false;
  EXPECT_EQ(message(c, lax), "(no error)");
}

}  // namespace
