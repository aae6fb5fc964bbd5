// The golden corpus (fixtures/golden): what it covers, that every stored dataset is certified to
// 30 digits and its manifest hash matches, that every CPU implementation replays it within the
// committed budgets (fixtures/golden/replay_*.json, through verify's golden lookup), and that
// both the replay and `qedcheck golden --check` fail when a value is wrong.
#include <gtest/gtest.h>

#include <set>

#include "fixtures/case_patch.hpp"
#include "properties/test_verify_support.hpp"
#include "verify/compare_golden.hpp"
#include "verify/golden_replay.hpp"
#include "verify/implementations.hpp"
#include "verify/verdict.hpp"

using namespace qed;
using namespace qed::verify_test;
using reference::Arm;
using reference::Variant;

namespace {

struct Loaded {
  verify::GoldenEntry entry;
  fixtures::Case c;
};

const std::vector<Loaded>& corpus() {
  static const std::vector<Loaded> all = [] {
    std::vector<Loaded> out;
    for (const auto& e : verify::read_golden_manifest(golden_dir().string()).cases)
      out.push_back({e, fixtures::read_case((golden_dir() / e.file).string())});
    return out;
  }();
  return all;
}

// The CPU implementations replayed, and the budget file of the precision they compute in.
struct Replay {
  verify::RunOptions run;
  std::string budget;
  std::string label() const { return run.impl + "@" + run.precision.name() + "+" + run.operands; }
};

std::vector<Replay> replays() {
  std::vector<Replay> out;
  for (const auto& impl : verify::implementation_names()) {
    if (impl.rfind("reference-", 0) != 0) continue;  // CUDA kernels replay in the gpu suite
    for (auto p : {reference::Precision::f64(), reference::Precision::f32()}) {
      Replay r;
      r.run.impl = impl;
      r.run.precision = p;
      r.budget = p.kind == reference::ScalarKind::f64 ? "replay_float64.json" : "replay_float32.json";
      out.push_back(r);
    }
    if (impl == "reference-chunked") {
      Replay r;
      r.run.impl = impl;
      r.run.precision = reference::Precision::f32();
      r.run.operands = "bf16";
      r.budget = "replay_bf16.json";
      out.push_back(r);
    }
  }
  return out;
}

verify::Verdict judge(const fixtures::Case& cand, const std::string& budget) {
  verify::VerifyOptions o;
  o.tolerance = verify::read_tolerance_file((golden_dir() / budget).string());
  o.golden_dir = golden_dir().string();
  return verify::verify_candidate(cand, o);
}

}  // namespace

TEST(GoldenCorpus, CoversTheRequiredCasesWithinFiveMegabytes) {
  std::set<std::pair<Variant, Arm>> kinds;
  std::set<int64_t> lengths;
  bool zero_length = false, h0 = false, strong_decay = false, a1b1 = false, raw_keys = false;
  bool large_lambda = false;
  uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(golden_dir())) bytes += fs::file_size(e.path());
  EXPECT_LE(bytes, 5u << 20);
  for (const auto& [entry, c] : corpus()) {
    const auto& in = c.inputs;
    kinds.insert({in.variant, in.arm});
    lengths.insert(in.dims.T);
    for (size_t n = 0; n + 1 < in.cu_seqlens.size(); ++n)
      zero_length = zero_length || in.cu_seqlens[n] == in.cu_seqlens[n + 1];
    h0 = h0 || !in.h0.empty();
    for (double g : in.g) strong_decay = strong_decay || g <= -20;
    bool all_one = !in.g.empty() || !in.beta.empty();
    for (double g : in.g) all_one = all_one && g == 0;
    for (double b : in.b) all_one = all_one && b == 1;
    for (double b : in.beta) all_one = all_one && b == 1;
    a1b1 = a1b1 || all_one;
    for (double l : in.lambda) large_lambda = large_lambda || l >= 2;
    for (size_t i = 0; i < in.k.size(); i += static_cast<size_t>(in.dims.K)) {
      double n2 = 0;
      for (int64_t ch = 0; ch < in.dims.K; ++ch) n2 += in.k[i + ch] * in.k[i + ch];
      raw_keys = raw_keys || std::abs(n2 - 1) > 1e-6;
    }
  }
  EXPECT_EQ(kinds.size(), 8u) << "every variant and QED arm";
  for (int64_t T : {1, 63, 64, 65}) EXPECT_TRUE(lengths.count(T)) << "T = " << T;
  EXPECT_TRUE(zero_length);
  EXPECT_TRUE(h0);
  EXPECT_TRUE(strong_decay);
  EXPECT_TRUE(a1b1);
  EXPECT_TRUE(large_lambda);
  EXPECT_TRUE(raw_keys);
  EXPECT_TRUE(std::any_of(corpus().begin(), corpus().end(), [](const Loaded& l) {
    return l.entry.name == "qed_nogate_noproj_unstable" && l.c.outputs.at("ht").data.size() > 0;
  }));
}

TEST(GoldenCorpus, EveryDatasetCertifiedAndHashed) {
  for (const auto& [entry, c] : corpus()) {
    SCOPED_TRACE(entry.name);
    EXPECT_EQ(verify::input_hash(c), entry.input_hash);
    ASSERT_TRUE(c.cotangents.has_value());
    EXPECT_EQ(c.outputs.size(), 2u);
    EXPECT_EQ(c.grads.size(), fixtures::grad_names(c.inputs.variant, c.inputs.arm).size());
    for (const auto* group : {&c.outputs, &c.grads})
      for (const auto& [name, d] : *group) {
        EXPECT_GE(d.digits, 30) << name;
        EXPECT_EQ(d.lo.size(), d.data.size()) << name;
      }
  }
}

TEST(GoldenCorpus, EveryCpuImplementationReplaysWithinBudget) {
  const auto configs = replays();
  ASSERT_GE(configs.size(), 2u);
  for (const Replay& r : configs) {
    SCOPED_TRACE(r.label() + " (budget " + r.budget + ")");
    EXPECT_EQ(verify::default_replay_budget(r.run), r.budget);  // what `golden --replay` picks
    const auto rows = verify::replay_golden(golden_dir().string(), r.run);
    EXPECT_EQ(rows.size(), corpus().size());
    for (const auto& row : rows) {
      EXPECT_EQ(row.reference_source, "golden") << row.name;
      EXPECT_TRUE(row.pass) << row.name << ": " << row.worst_dataset << " at " << row.worst_score
                            << " of its budget (rel_frob " << row.worst_rel_frobenius << ")";
      EXPECT_GT(row.datasets, 0) << row.name;
    }
  }
}

TEST(GoldenCorpus, ReplayFailsOnAWrongValue) {
  // Mutation check: one element of one gradient off by ten budgets must fail the replay.
  const Loaded& l = corpus().front();
  verify::RunOptions o;
  fixtures::Case cand = verify::run_implementation(l.c, o);
  const verify::Verdict ok = judge(cand, "replay_float64.json");
  ASSERT_TRUE(ok.pass);
  double frob = 0;
  for (double x : l.c.grads.at("dk").data) frob += x * x;
  const double budget = verify::read_tolerance_file((golden_dir() / "replay_float64.json").string())
                            .explicit_bound("grads/dk")
                            ->rtol_frobenius;
  cand.grads.at("dk").data[5] += 10 * budget * std::sqrt(frob);
  const verify::Verdict bad = judge(cand, "replay_float64.json");
  EXPECT_FALSE(bad.pass);
  for (const auto& d : bad.datasets) EXPECT_EQ(d.pass, d.metrics.name != "grads/dk") << d.metrics.name;
}

TEST(GoldenCorpus, GeneratorCheckFailsOnAChangedFile) {
  // The committed corpus itself is checked by the ctest golden.corpus_matches_generator; here a
  // copy with one changed value, one stray file and one missing file must be caught.
  Scratch s;
  const fs::path copy = s.dir() / "golden";
  fs::copy(golden_dir(), copy);
  {
    fixtures::CasePatch p((copy / "gdn2_T64.h5").string());
    p.set("/grads/dg", 17, 0.125);
  }
  fs::copy_file(copy / "gdn2_T1.h5", copy / "extra.h5");
  fs::remove(copy / "kda_prop.h5");
  const CliResult r = qedcheck(s, "golden --check " + quote(copy.string()));
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("gdn2_T64.h5: /grads/dg values differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("extra.h5: not part of the corpus"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kda_prop.h5: file missing"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 difference(s)"), std::string::npos) << r.out;
}
