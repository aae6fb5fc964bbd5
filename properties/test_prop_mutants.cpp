// Mutation checks of the forward property families: each check function is run on the real
// reference and on a copy of the recurrence with one planted bug (properties/support/mutants.hpp);
// it must pass on the first and fail on the second. The unmutated copy must pass everything.
#include <gtest/gtest.h>

#include "properties/support/cases.hpp"
#include "properties/support/checks_forward.hpp"
#include "properties/support/checks_state.hpp"
#include "properties/support/mutants.hpp"
#include "reference/recurrent.hpp"

using namespace qed::properties;
using qed::reference::Outputs;
namespace mut = qed::properties::mutants;

namespace {

Outputs<double> ref(const Inputs<double>& x) { return qed::reference::recurrent_forward(x); }

auto mutant(mut::Fwd bug) {
  return [bug](const Inputs<double>& x) { return mut::forward(x, bug); };
}

CaseSpec spec(Variant v, Arm a, uint64_t seed) {
  CaseSpec s;
  s.variant = v;
  s.arm = a;
  s.B = 2;
  s.T = 9;
  s.H = 2;
  s.K = 4;
  s.V = 3;
  s.h0 = true;
  s.seed = seed;
  return s;
}

// The check passes on the reference and fails, by a wide margin, on the mutant.
void expect_caught(const std::string& family, double real, double bad, double tol) {
  record("mutant " + family + ": reference", real);
  record("mutant " + family + ": mutant", bad);
  EXPECT_LE(real, tol) << family << " fails on the real reference";
  EXPECT_GT(bad, 100 * tol) << family << " does not catch its mutant";
}

}  // namespace

TEST(Mutants, P1CausalityCatchesLookahead) {
  const auto s = spec(Variant::gdn2, Arm::none, 1);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P1 vs reads_next_q", check_P1_causality(ref, in, 5),
                check_P1_causality(mutant(mut::Fwd::reads_next_q), in, 5), 0.0);
}

TEST(Mutants, P2SequencesCatchStateLeak) {
  auto s = spec(Variant::qed, Arm::full, 2);
  s.B = 1;
  s.seqlens = {3, 0, 4, 2};
  s.T = 9;
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P2 vs state_leaks", check_P2_sequences(ref, in),
                check_P2_sequences(mutant(mut::Fwd::state_leaks), in), 0.0);
}

TEST(Mutants, P3LinearityCatchesNormalisedV) {
  const auto s = spec(Variant::kda, Arm::none, 3);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P3 vs v_normalised", check_P3_linearity(ref, in, 33, 2.0, -0.5),
                check_P3_linearity(mutant(mut::Fwd::v_normalised), in, 33, 2.0, -0.5), 1e-13);
}

TEST(Mutants, P4HomogeneityCatchesNormalisedEraseQuery) {
  const auto s = spec(Variant::qed, Arm::full, 4);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P4 vs erase_q_normalised", check_P4_homogeneity(ref, in, 2.5),
                check_P4_homogeneity(mutant(mut::Fwd::erase_q_normalised), in, 2.5), 1e-13);
}

TEST(Mutants, P6PaddingCatchesDecayOffByOne) {
  const auto s = spec(Variant::gdn2, Arm::none, 5);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  std::vector<int64_t> pads(10, 0);
  pads[3] = 2;
  pads[9] = 1;
  expect_caught("P6 vs decay_off_by_one", check_P6_padding(ref, in, pads, 7),
                check_P6_padding(mutant(mut::Fwd::decay_off_by_one), in, pads, 7), 1e-13);
}

TEST(Mutants, P7PermutationCatchesChannel0Decay) {
  const auto s = spec(Variant::gdn2, Arm::none, 6);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  const std::vector<int64_t> pK{2, 0, 3, 1}, pV{1, 2, 0};
  expect_caught("P7 vs decay_channel0", check_P7_permutation(ref, in, pK, pV),
                check_P7_permutation(mutant(mut::Fwd::decay_channel0), in, pK, pV), 1e-13);
}

TEST(Mutants, P8RotationCatchesDiagonalProjector) {
  const auto s = spec(Variant::qed, Arm::nogate, 7);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  qed::fixtures::Rng rng(77);
  const auto R = random_orthogonal<double>(4, [&] { return rng.normal(); });
  expect_caught("P8 vs diagonal_projector", check_P8_rotation(ref, in, R),
                check_P8_rotation(mutant(mut::Fwd::diagonal_projector), in, R), 1e-13);
}

// P9 (c) with the floors of P10 under its scales: a projector that is not the orthogonal one
// (identity on q perpendicular to k) separates nogate from nogate_noproj.
TEST(Mutants, P9QPerpKCatchesDiagonalProjector) {
  const auto s = spec(Variant::qed, Arm::nogate, 9);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P9c vs diagonal_projector", check_P9_q_perp_k(ref, in, 9),
                check_P9_q_perp_k(mutant(mut::Fwd::diagonal_projector), in, 9), 1e-13);
}

TEST(Mutants, P9ArmsCatchUnprojectedRand) {
  const auto s = spec(Variant::qed, Arm::rand, 8);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P9d vs rand_unprojected", check_P9_q_is_r(ref, in, 8),
                check_P9_q_is_r(mutant(mut::Fwd::rand_unprojected), in, 8), 1e-14);
}

TEST(Mutants, P10LiteralCatchesScaledEraseQuery) {
  const auto s = spec(Variant::qed, Arm::full, 9);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P10 oracle vs erase_q_scaled", check_P10_literal(ref, in),
                check_P10_literal(mutant(mut::Fwd::erase_q_scaled), in), 1e-13);
}

TEST(Mutants, P10TiedCatchesDecayAfterErase) {
  const auto s = spec(Variant::kda, Arm::none, 10);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P10 tied vs decay_after_erase", check_P10_tied(ref, in),
                check_P10_tied(mutant(mut::Fwd::decay_after_erase), in), 1e-13);
}

TEST(Mutants, P11ExactWriteCatchesDecayAfterErase) {
  const auto s = spec(Variant::gdn2, Arm::none, 11);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P11 vs decay_after_erase", check_P11_exact_write(ref, in),
                check_P11_exact_write(mutant(mut::Fwd::decay_after_erase), in), 1e-13);
}

TEST(Mutants, P12LanesCatchStateLeakAndHeadMixing) {
  const auto s = spec(Variant::qed, Arm::nogate, 12);
  SCOPED_TRACE(replay_line(s));
  const auto in = make_inputs(s);
  expect_caught("P12 lanes vs state_leaks", check_P12_lanes(ref, in),
                check_P12_lanes(mutant(mut::Fwd::state_leaks), in), 0.0);
  expect_caught("P12 perturb vs lambda_of_head0", check_P12_perturb(ref, in, 0, 0, 5),
                check_P12_perturb(mutant(mut::Fwd::lambda_of_head0), in, 0, 0, 5), 0.0);
}

// The copy the mutants are made from computes the right function: every family passes on it.
TEST(Mutants, UnmutatedCopyPassesEveryCheck) {
  const auto none = mutant(mut::Fwd::none);
  for (auto [v, a] : all_variant_arms()) {
    auto s = spec(v, a, 13);
    SCOPED_TRACE(replay_line(s));
    const auto in = make_inputs(s);
    EXPECT_LE(rel_max(none(in).o, ref(in).o), 1e-14);
    EXPECT_LE(rel_max(none(in).ht, ref(in).ht), 1e-14);
    EXPECT_EQ(check_P1_causality(none, in, 4), 0.0);
    EXPECT_EQ(check_P2_sequences(none, in), 0.0);
    EXPECT_LE(check_P3_linearity(none, in, 3, 0.5, 1.5), 1e-13);
    EXPECT_LE(check_P4_homogeneity(none, in, -1.7), 1e-13);
    EXPECT_LE(check_P10_literal(none, in), 1e-13);
    EXPECT_LE(check_P11_exact_write(none, in), 1e-13);
    EXPECT_EQ(check_P12_lanes(none, in), 0.0);
  }
}

// The generators shrink: RapidCheck, run on the P3 property of the v_normalised mutant, must
// find a counterexample and shrink it to a small case whose replay line it prints.
TEST(Mutants, RapidCheckFindsAndShrinksAMutantCase) {
  CaseShape shape;
  shape.max_T = 12;
  const auto bad = mutant(mut::Fwd::v_normalised);
  rc::detail::TestMetadata meta;
  meta.id = meta.description = "P3 on v_normalised mutant (expected to fail)";
  rc::detail::TestParams params;
  params.seed = 2024;
  params.maxSuccess = 200;
  // A listener of our own keeps this expected failure out of RC's end-of-run reproduce list.
  struct Quiet : rc::detail::TestListener {
    void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
    void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
    void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
  } quiet;
  const auto result = rc::detail::checkTestable(
      [&] {
        const auto s = *gen_case(shape);
        RC_ASSERT(check_P3_linearity(bad, make_inputs(s), 5, 2.0, -0.5) <= 1e-13);
      },
      meta, params, quiet);
  rc::detail::FailureResult failure;
  ASSERT_TRUE(result.match(failure)) << "RapidCheck did not falsify P3 on the mutant";
  std::ostringstream msg;
  rc::detail::printResultMessage(result, msg);
  std::printf("[shrunk] %s\n", msg.str().c_str());
  ASSERT_FALSE(failure.counterExample.empty());
  // Shrinking reaches one token of one sequence: the smallest case on which v / |v| is visible.
  EXPECT_NE(failure.counterExample.front().second.find("T=1 "), std::string::npos)
      << failure.counterExample.front().second;
}
