// Malformed candidates through `qedcheck verify`: every rule of spec/CASE_FORMAT.md broken once
// (and the rules verify adds: results present, gradients only with cotangents, only the
// variant's gradients), each must give exit code 2 and one clear line on stderr that names the
// file and what is wrong. The JSON verdict, when asked for, records exit code 2 as well.
#include <gtest/gtest.h>

#include <functional>

#include "fixtures/case_patch.hpp"
#include "properties/test_verify_support.hpp"
#include "verify/implementations.hpp"

using namespace qed;
using namespace qed::verify_test;
using fixtures::CasePatch;

namespace {

struct Broken {
  const char* rule;
  const char* base;                          // golden case the candidate starts from
  std::function<void(fixtures::Case&)> edit;  // in memory, before writing (may be empty)
  std::function<void(CasePatch&)> patch;      // on disk, after writing (may be empty)
  const char* expect;                         // must appear in the one error line
};

fixtures::Case candidate(const char* base) {
  verify::RunOptions o;
  return verify::run_implementation(golden(base), o);
}

std::vector<double> zeros(size_t n) { return std::vector<double>(n, 0.0); }

const std::vector<Broken>& broken_rules() {
  using P = CasePatch;
  static const std::vector<Broken> rules = {
      {"no results at all", "gdn2_prop", [](fixtures::Case& c) { c.outputs.clear(); c.grads.clear(); },
       nullptr, "no /outputs and no /grads"},
      {"gradients without cotangents", "gdn2_prop", nullptr,
       [](P& p) { p.remove("/cotangents"); }, "cotangents"},
      {"a gradient the variant does not have", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/grads/dbeta", {2, 16, 2}, zeros(64)); }, "dbeta"},
      {"format attribute", "gdn2_prop", nullptr, [](P& p) { p.attr_string("/", "format", "qedcheck.kase"); },
       "format"},
      {"version attribute", "gdn2_prop", nullptr,
       [](P& p) { p.attr_number("/", "version", H5T_STD_I64LE, {2}); }, "version"},
      {"unknown variant", "gdn2_prop", nullptr, [](P& p) { p.attr_string("/", "variant", "gdn3"); }, "variant"},
      {"qed without arm", "qed_full_prop", nullptr, [](P& p) { p.attr_remove("/", "arm"); }, "arm"},
      {"unknown arm", "qed_full_prop", nullptr, [](P& p) { p.attr_string("/", "arm", "half"); }, "arm"},
      {"scale missing", "gdn2_prop", nullptr, [](P& p) { p.attr_remove("/", "scale"); }, "scale"},
      {"q missing", "gdn2_prop", nullptr, [](P& p) { p.remove("/inputs/q"); }, "q"},
      {"k of the wrong shape", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/inputs/k", {2, 16, 2, 5}, zeros(320)); }, "inputs/k"},
      {"v with another batch size", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/inputs/v", {1, 16, 2, 3}, zeros(96)); }, "inputs/v"},
      {"gdn with a channel-wise g", "gdn_prop", nullptr,
       [](P& p) { p.doubles("/inputs/g", {2, 16, 2, 4}, zeros(256)); }, "inputs/g"},
      {"gdn2 without b", "gdn2_prop", nullptr, [](P& p) { p.remove("/inputs/b"); }, "b"},
      {"kda without beta", "kda_prop", nullptr, [](P& p) { p.remove("/inputs/beta"); }, "beta"},
      {"qed without lambda", "qed_full_prop", nullptr, [](P& p) { p.remove("/inputs/lambda"); }, "lambda"},
      {"qed rand without r", "qed_rand_prop", nullptr, [](P& p) { p.remove("/inputs/r"); }, "inputs/r"},
      {"g > 0", "gdn2_prop", nullptr, [](P& p) { p.set("/inputs/g", 5, 0.25); }, "inputs/g"},
      {"b above 1", "gdn2_prop", nullptr, [](P& p) { p.set("/inputs/b", 3, 1.5); }, "inputs/b"},
      {"w below 0", "gdn2_prop", nullptr, [](P& p) { p.set("/inputs/w", 2, -0.1); }, "inputs/w"},
      {"beta above 1", "kda_prop", nullptr, [](P& p) { p.set("/inputs/beta", 1, 1.01); }, "inputs/beta"},
      {"NaN input", "gdn2_prop", nullptr, [](P& p) { p.set("/inputs/q", 11, std::nan("")); }, "inputs/q"},
      {"h0 of the wrong shape", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/inputs/h0", {1, 2, 4, 3}, zeros(24)); }, "h0"},
      {"cu_seqlens with B = 2", "gdn2_prop", nullptr,
       [](P& p) { p.ints("/inputs/cu_seqlens", {3}, {0, 8, 16}); }, "cu_seqlens"},
      {"cu_seqlens not starting at 0", "gdn2_varlen_zero", nullptr,
       [](P& p) { p.ints("/inputs/cu_seqlens", {4}, {1, 7, 7, 20}); }, "cu_seqlens"},
      {"cu_seqlens decreasing", "gdn2_varlen_zero", nullptr,
       [](P& p) { p.ints("/inputs/cu_seqlens", {4}, {0, 7, 6, 20}); }, "cu_seqlens"},
      {"cu_seqlens not ending at T", "gdn2_varlen_zero", nullptr,
       [](P& p) { p.ints("/inputs/cu_seqlens", {4}, {0, 7, 7, 19}); }, "cu_seqlens"},
      {"cu_seqlens stored as float", "gdn2_varlen_zero", nullptr,
       [](P& p) { p.doubles("/inputs/cu_seqlens", {4}, {0, 7, 7, 20}); }, "cu_seqlens"},
      {"unknown dtype", "gdn2_prop", nullptr, [](P& p) { p.attr_string("/inputs", "dtype", "float8"); },
       "dtype"},
      {"q stored as float32", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/inputs/q", {2, 16, 2, 4}, zeros(256), H5T_IEEE_F32LE); }, "inputs/q"},
      {"do of the wrong shape", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/cotangents/do", {2, 16, 2, 4}, zeros(256)); }, "do"},
      {"dht of the wrong shape", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/cotangents/dht", {2, 2, 3, 4}, zeros(48)); }, "dht"},
      {"o of the wrong shape", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/outputs/o", {2, 16, 2, 4}, zeros(256)); }, "outputs/o"},
      {"dq of the wrong shape", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/grads/dq", {2, 16, 2, 3}, zeros(192)); }, "grads/dq"},
      {"X_lo of another shape than X", "gdn2_prop", nullptr,
       [](P& p) { p.doubles("/outputs/o_lo", {2, 16, 2, 2}, zeros(128)); }, "o_lo"},
      {"negative digits", "gdn2_prop", nullptr,
       [](P& p) { p.attr_number("/outputs/o", "digits", H5T_IEEE_F64LE, {-3}); }, "digits"},
  };
  return rules;
}

}  // namespace

TEST(VerifyMalformed, EveryBrokenRuleIsExitTwoWithOneClearLine) {
  Scratch s;
  for (const Broken& b : broken_rules()) {
    SCOPED_TRACE(b.rule);
    fixtures::Case c = candidate(b.base);
    if (b.edit) b.edit(c);
    const std::string path = s.path("bad.h5");
    fixtures::write_case(path, c);
    if (b.patch) {
      CasePatch p(path);
      b.patch(p);
    }
    const CliResult r = qedcheck(s, "verify " + quote(path) + " --json " + quote(s.path("v.json")));
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("qedcheck: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(b.expect), std::string::npos) << r.err;
    const nlohmann::json v = read_json(s.path("v.json"));
    EXPECT_EQ(v.at("exit_code"), 2);
    EXPECT_EQ(v.at("pass"), false);
    EXPECT_NE(v.at("error").get<std::string>().find(b.expect), std::string::npos);
  }
}

TEST(VerifyMalformed, FilesAndOptionsThatCannotBeUsed) {
  Scratch s;
  fixtures::write_case(s.path("good.h5"), candidate("gdn2_prop"));
  {
    std::ofstream f(s.path("text.h5"));
    f << "not an HDF5 file\n";
    std::ofstream t(s.path("tol.json"));
    t << R"({"schema": "qedcheck.tolerance/1", "datasets": {"o": {"rtol": 1}}})";
  }
  const std::pair<std::string, std::string> cases[] = {
      {"verify " + quote(s.path("missing.h5")), "missing.h5"},
      {"verify " + quote(s.path("text.h5")), "text.h5"},
      {"verify " + quote(s.path("good.h5")) + " --tolerance " + quote(s.path("tol.json")), "rtol"},
      {"verify " + quote(s.path("good.h5")) + " --tolerance " + quote(s.path("nope.json")), "nope.json"},
      {"verify " + quote(s.path("good.h5")) + " --rtol 1e-3 --tolerance " + quote(s.path("tol.json")),
       "exclude"},
      {"verify " + quote(s.path("good.h5")) + " --atol 1e-3", "--atol needs --rtol"},
      {"verify " + quote(s.path("good.h5")) + " --rtol -1", "--rtol"},
      {"verify " + quote(s.path("good.h5")) + " --json " + quote(s.path("no/such/dir/v.json")), "does not exist"},
  };
  for (const auto& [args, expect] : cases) {
    SCOPED_TRACE(args);
    const CliResult r = qedcheck(s, args);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
  }
}
