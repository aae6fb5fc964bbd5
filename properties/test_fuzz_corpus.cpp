// Replays every saved counterexample of fuzz/corpus/*.h5. Each must pass on the real
// implementations (the implementation it was found on, when that is a real one, and the CPU
// references in the same dtype): a case stays in the corpus after its bug is fixed, as a
// regression test. A case found on a test-only mutant must still fail on that mutant, which shows
// the replay can fail. Replay one by hand: qedcheck fuzz --replay FILE [--impl IMPL].
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "fuzz/campaign.hpp"
#include "fuzz/case_edit.hpp"

using namespace qed;
using namespace qed::fuzz;

namespace {

std::string corpus_dir() {
  if (const char* e = std::getenv("QEDCHECK_FUZZ_CORPUS")) return e;
  return std::string(QEDCHECK_SOURCE_DIR) + "/fuzz/corpus";
}

// The real implementations a case of this dtype is replayed on.
std::vector<ImplSpec> real_specs(const ImplSpec& found) {
  std::vector<ImplSpec> out;
  if (!found.is_mutant()) out.push_back(found);
  for (const char* impl : {"reference-recurrent", "reference-chunked"}) {
    ImplSpec s;
    s.run.impl = impl;
    s.run.precision = found.run.precision;
    s.run.operands = impl == std::string("reference-chunked") ? found.run.operands : "none";
    s.run.chunk = found.chunked() ? found.run.chunk : 64;
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST(FuzzCorpus, EverySavedCounterexampleReplays) {
  const auto files = corpus_files(corpus_dir());
  ASSERT_FALSE(files.empty()) << "no *.h5 in " << corpus_dir();
  ::setenv("QEDCHECK_ENABLE_MUTANTS", "1", 1);
  const JudgeOptions jo;
  for (const auto& path : files) {
    SCOPED_TRACE(path);
    const CorpusEntry e = read_counterexample(path);
    ASSERT_FALSE(e.meta.impl_args.empty()) << "no fuzz_impl attribute";
    const ImplSpec found = parse_impl_args(e.meta.impl_args);
    EXPECT_EQ(e.c.dtype, case_dtype(found));
    for (const ImplSpec& s : real_specs(found)) {
      const Judgement j = judge_safely(e.c, s, jo);
      EXPECT_EQ(j.outcome, Outcome::pass) << s.args() << ": " << summary(j) << "\n  replay: qedcheck fuzz --replay "
                                          << path << " " << s.args();
    }
    if (found.is_mutant()) {
      const Judgement j = judge_safely(e.c, found, jo);
      EXPECT_EQ(j.outcome, Outcome::fail) << "the mutant " << found.run.impl << " no longer fails on its own "
                                          << "counterexample: " << summary(j);
    }
  }
  ::unsetenv("QEDCHECK_ENABLE_MUTANTS");
}
