// The kernel fuzz driver (fuzz/): the acceptance check that a campaign against each deliberately
// broken implementation finds the bug, shrinks it to T <= 8 and K, V <= 4, saves it, and that the
// saved case fails on the mutant and passes on the real implementations; that the real
// implementations survive a short campaign; determinism for a seed; the never-overwriting corpus;
// and the structural edits the shrinker relies on, checked against the recurrence (P1, P12).
// Replay a failure: QEDCHECK_SEED=<seed> (printed); QEDCHECK_SEED_SCALE scales the campaign sizes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "fuzz/campaign.hpp"
#include "fuzz/case_edit.hpp"
#include "fuzz/mutants.hpp"
#include "reference/recurrent.hpp"
#ifdef QEDCHECK_HAVE_CUDA
#include "kernels/api.hpp"
#endif

using namespace qed;
using namespace qed::fuzz;
namespace fs = std::filesystem;

namespace {

uint64_t test_seed(uint64_t fallback) {
  const char* e = std::getenv("QEDCHECK_SEED");
  return e ? std::strtoull(e, nullptr, 10) : fallback;
}

int64_t scaled(int64_t n) {
  const char* e = std::getenv("QEDCHECK_SEED_SCALE");
  const double s = e ? std::atof(e) : 1.0;
  return std::max<int64_t>(1, static_cast<int64_t>(n * (s > 0 ? s : 1.0)));
}

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("qedcheck_fuzz_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

ImplSpec spec(const std::string& impl, const std::string& precision, int64_t chunk = 0) {
  ImplSpec s;
  s.run.impl = impl;
  s.run.precision = reference::parse_precision(precision);
  s.run.chunk = chunk > 0 ? chunk : 64;
  s.draw_chunk = chunk <= 0 && s.chunked();
  return s;
}

struct MutantsOn {
  MutantsOn() { ::setenv("QEDCHECK_ENABLE_MUTANTS", "1", 1); }
  ~MutantsOn() { ::unsetenv("QEDCHECK_ENABLE_MUTANTS"); }
};

}  // namespace

// Acceptance (issue: fuzzing and robustness, item 3), for every mutant.
class FuzzAcceptance : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzAcceptance, FindsShrinksSavesAndReplays) {
  MutantsOn on;
  const uint64_t seed = test_seed(1);
  SCOPED_TRACE("replay: QEDCHECK_SEED=" + std::to_string(seed) + " QEDCHECK_ENABLE_MUTANTS=1 qedcheck fuzz --impl " +
               GetParam() + " --precision float --seed " + std::to_string(seed));
  CampaignOptions opt;
  opt.spec = spec(GetParam(), "float");
  opt.seed = seed;
  opt.seconds = 120;
  opt.max_configs = 200;
  opt.corpus_dir = temp_dir("accept");
  opt.log = nullptr;
  const CampaignResult r = run_campaign(opt);
  ASSERT_EQ(r.found.size(), 1u) << "no failure found in " << r.configs << " configurations";
  const Found& f = r.found[0];
  EXPECT_LE(f.T, 8) << f.minimal;
  EXPECT_LE(f.K, 4) << f.minimal;
  EXPECT_LE(f.V, 4) << f.minimal;
  ASSERT_TRUE(fs::exists(f.path));

  const CorpusEntry e = read_counterexample(f.path);
  EXPECT_EQ(e.meta.impl_args, opt.spec.args());
  EXPECT_EQ(e.meta.config, f.config);
  const JudgeOptions jo;
  EXPECT_EQ(judge_case(e.c, parse_impl_args(e.meta.impl_args), jo).outcome, Outcome::fail);
  for (const char* real : {"reference-recurrent", "reference-chunked"}) {
    const Judgement j = judge_case(e.c, spec(real, "float", 64), jo);
    EXPECT_EQ(j.outcome, Outcome::pass) << real << ": " << summary(j);
  }
  // Saving the same case again finds it under the same name.
  CorpusMeta meta = e.meta;
  const Saved again = save_counterexample(opt.corpus_dir, e.c, meta);
  EXPECT_TRUE(again.existed);
  EXPECT_EQ(again.path, f.path);
  fs::remove_all(opt.corpus_dir);
}

INSTANTIATE_TEST_SUITE_P(Mutants, FuzzAcceptance, ::testing::ValuesIn(mutant_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(FuzzDriver, MutantsNeedTheEnvironmentVariable) {
  ::unsetenv("QEDCHECK_ENABLE_MUTANTS");
  const Config cfg = draw_config(3, 0, spec("reference-recurrent", "float"));
  EXPECT_THROW(run_impl(cfg.c, spec("mutant-decay-after-erase", "float")), qed::Error);
}

// The real implementations survive a short campaign (the judge does not cry wolf), in float and
// double, with a chunk size other than the twin's 64 (so the twin rule is not comparing the
// implementation with itself).
TEST(FuzzDriver, RealImplementationsPassAShortCampaign) {
  const uint64_t seed = test_seed(7);
  SCOPED_TRACE("replay: QEDCHECK_SEED=" + std::to_string(seed));
  for (const auto& s : {spec("reference-chunked", "float", 16), spec("reference-chunked", "double", 16),
                        spec("reference-chunked", "float", 5)}) {
    CampaignOptions opt;
    opt.spec = s;
    opt.seed = seed;
    opt.seconds = 120;
    opt.max_configs = scaled(25);
    opt.limits.work = 2e4;
    opt.corpus_dir = temp_dir("real");
    opt.log = nullptr;
    const CampaignResult r = run_campaign(opt);
    EXPECT_EQ(r.failed, 0) << s.args() << ": " << (r.found.empty() ? "" : r.found[0].summary + " saved " + r.found[0].path);
    EXPECT_EQ(r.configs, opt.max_configs);
    fs::remove_all(opt.corpus_dir);
  }
}

TEST(FuzzDriver, ConfigurationsAreDeterministicAndValid) {
  const uint64_t seed = test_seed(11);
  SCOPED_TRACE("replay: QEDCHECK_SEED=" + std::to_string(seed));
  const ImplSpec s = spec("reference-chunked", "float");
  for (int64_t i = 0; i < scaled(60); ++i) {
    const Config a = draw_config(seed, i, s), b = draw_config(seed, i, s);
    EXPECT_EQ(content_hash(a.c, a.spec.args()), content_hash(b.c, b.spec.args())) << "config " << i;
    EXPECT_EQ(a.classes, b.classes);
    EXPECT_NO_THROW(fixtures::validate_case(a.c, "config")) << "config " << i;
    EXPECT_EQ(a.c.dtype, "float32");
  }
  EXPECT_NE(content_hash(draw_config(seed, 0, s).c, ""), content_hash(draw_config(seed + 1, 0, s).c, ""));
}

// A synthetic failure "T >= 3 and K >= 2 and v has a non-zero" shrinks to exactly that.
TEST(FuzzShrink, ReachesTheSmallestFailingShape) {
  const uint64_t seed = test_seed(5);
  SCOPED_TRACE("replay: QEDCHECK_SEED=" + std::to_string(seed));
  int tested = 0;
  for (int64_t i = 0; i < 200 && tested < scaled(6); ++i) {
    const Config cfg = draw_config(seed, i, spec("reference-recurrent", "double"), {2e4, 16384});
    const auto& d = cfg.c.inputs.dims;
    const bool nonzero_v = std::any_of(cfg.c.inputs.v.begin(), cfg.c.inputs.v.end(), [](double x) { return x != 0; });
    if (d.T < 3 || d.K < 2 || !nonzero_v) continue;
    ++tested;
    const Predicate p = [](const fixtures::Case& c) {
      return c.inputs.dims.T >= 3 && c.inputs.dims.K >= 2 &&
             std::any_of(c.inputs.v.begin(), c.inputs.v.end(), [](double x) { return x != 0; });
    };
    ShrinkStats st;
    const fixtures::Case m = shrink(cfg.c, p, {}, &st);
    SCOPED_TRACE("config " + std::to_string(i) + ": " + describe(cfg.c) + " -> " + describe(m));
    EXPECT_EQ(m.inputs.dims.T, 3);
    EXPECT_EQ(m.inputs.dims.K, 2);
    EXPECT_EQ(m.inputs.dims.V, 1);
    EXPECT_EQ(m.inputs.dims.H, 1);
    EXPECT_EQ(m.inputs.num_sequences(), 1);
    EXPECT_FALSE(m.cotangents.has_value());
    EXPECT_TRUE(m.inputs.h0.empty());
    EXPECT_FALSE(st.budget_hit);
    // Values: q, k, g are zeros; v has one non-zero element, +-1.
    for (double x : m.inputs.q) EXPECT_EQ(x, 0);
    int nonzero = 0;
    for (double x : m.inputs.v) nonzero += x != 0;
    EXPECT_EQ(nonzero, 1);
  }
  EXPECT_EQ(tested, scaled(6));
}

// apply_keep is a restriction of the problem: a token prefix gives the prefix of the outputs
// (P1), a subset of heads or sequences gives those heads' or sequences' outputs (P12).
TEST(FuzzCaseEdit, RestrictionsCommuteWithTheRecurrence) {
  const uint64_t seed = test_seed(9);
  SCOPED_TRACE("replay: QEDCHECK_SEED=" + std::to_string(seed));
  for (int64_t i = 0; i < scaled(40); ++i) {
    const Config cfg = draw_config(seed, i, spec("reference-recurrent", "double"), {2e4, 16384});
    const fixtures::Case& c = cfg.c;
    const auto& d = c.inputs.dims;
    const auto full = reference::recurrent_forward(c.inputs, 1);
    SCOPED_TRACE("config " + std::to_string(i) + ": " + describe(c));
    if (c.inputs.cu_seqlens.empty() && d.T > 1) {  // prefix
      Keep k;
      k.T = std::vector<int64_t>();
      for (int64_t t = 0; t < d.T / 2 + 1; ++t) k.T->push_back(t);
      const auto part = reference::recurrent_forward(apply_keep(c, k).inputs, 1);
      const int64_t Tp = static_cast<int64_t>(k.T->size());
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t x = 0; x < Tp * d.H * d.V; ++x)
          ASSERT_EQ(part.o[b * Tp * d.H * d.V + x], full.o[b * d.T * d.H * d.V + x]);
    }
    if (d.H > 1) {  // last head only
      Keep k;
      k.H = std::vector<int64_t>{d.H - 1};
      const auto part = reference::recurrent_forward(apply_keep(c, k).inputs, 1);
      for (int64_t bt = 0; bt < d.B * d.T; ++bt)
        for (int64_t v = 0; v < d.V; ++v)
          ASSERT_EQ(part.o[bt * d.V + v], full.o[(bt * d.H + d.H - 1) * d.V + v]);
    }
    const int64_t N = c.inputs.num_sequences();
    if (N > 1) {  // drop sequence 0: the others keep their final states
      const auto part = reference::recurrent_forward(drop_sequence(c, 0).inputs, 1);
      const int64_t S = d.H * d.K * d.V;
      for (int64_t x = 0; x < (N - 1) * S; ++x) ASSERT_EQ(part.ht[x], full.ht[S + x]);
    }
  }
}

TEST(FuzzCorpus, HashNamesNeverOverwrite) {
  const std::string dir = temp_dir("names");
  const Config cfg = draw_config(test_seed(2), 0, spec("reference-recurrent", "double"));
  CorpusMeta meta;
  meta.impl_args = "--impl reference-recurrent --precision double";
  meta.found = "first";
  const Saved a = save_counterexample(dir, cfg.c, meta);
  EXPECT_FALSE(a.existed);
  meta.found = "second";
  const Saved b = save_counterexample(dir, cfg.c, meta);
  EXPECT_TRUE(b.existed);
  EXPECT_EQ(a.path, b.path);
  EXPECT_EQ(read_counterexample(a.path).meta.found, "first");  // the first stays
  fixtures::Case other = cfg.c;
  other.inputs.v[0] += 1;
  const Saved c = save_counterexample(dir, other, meta);
  EXPECT_FALSE(c.existed);
  EXPECT_NE(c.path, a.path);
  EXPECT_EQ(corpus_files(dir).size(), 2u);
  fs::remove_all(dir);
}

// Without a CUDA device a kernel's campaign stops at once with the device error (exit 2 from the
// command line) instead of judging the error a failure, shrinking it and saving a counterexample
// (which, run from the repository root, would land in the committed corpus).
TEST(FuzzDriver, NoDeviceStopsTheCampaignAndSavesNothing) {
#ifdef QEDCHECK_HAVE_CUDA
  if (kernels::device_status().ok()) GTEST_SKIP() << "a CUDA device is present: nothing to check here";
  CampaignOptions opt;
  opt.spec = spec("cuda-chunked", "float");
  opt.spec.run.dtype = "fp32";
  opt.seed = 1;
  opt.seconds = 30;
  opt.max_configs = 10;
  opt.corpus_dir = temp_dir("nodevice");
  opt.log = nullptr;
  try {
    (void)run_campaign(opt);
    ADD_FAILURE() << "the campaign ran without a device";
  } catch (const qed::Error& e) {
    EXPECT_TRUE(is_no_device(e)) << e.what();
  }
  EXPECT_TRUE(corpus_files(opt.corpus_dir).empty());
  fs::remove_all(opt.corpus_dir);
#else
  GTEST_SKIP() << "CUDA kernels are not built here";
#endif
}
