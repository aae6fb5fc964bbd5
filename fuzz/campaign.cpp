#include "fuzz/campaign.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "fuzz/case_edit.hpp"

namespace qed::fuzz {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr double kClearFailure = 16;

}  // namespace

void Coverage::add(const Classes& c, Outcome o, bool marginal) {
  for (const auto& [axis, cls] : c) ++counts[axis][cls][marginal ? 3 : static_cast<size_t>(o)];
}

void Coverage::print(std::FILE* out) const {
  fmt::print(out, "coverage: configurations per class (pass / fail / skip / marginal where not all pass)\n");
  for (const auto& [axis, classes] : counts) {
    std::string line;
    for (const auto& [cls, n] : classes) {
      line += fmt::format("{}{} {}", line.empty() ? "" : "; ", cls, n[0] + n[1] + n[2] + n[3]);
      if (n[1] || n[2] || n[3]) line += fmt::format(" ({}/{}/{}/{})", n[0], n[1], n[2], n[3]);
    }
    fmt::print(out, "  {:<11} {}\n", axis, line);
  }
}

Judgement judge_safely(const fixtures::Case& c, const ImplSpec& spec, const JudgeOptions& opt) {
  try {
    return judge_case(c, spec, opt);
  } catch (const std::exception& e) {
    if (is_no_device(e)) throw;
    Judgement j;
    j.outcome = Outcome::fail;
    j.score = std::numeric_limits<double>::infinity();
    j.note = std::string("exception while judging: ") + e.what();
    return j;
  }
}

fixtures::Case shrink_failure(const fixtures::Case& c, const Judgement& j0, const ImplSpec& spec,
                              const JudgeOptions& jopt, const ShrinkOptions& sopt, double min_score,
                              ShrinkStats* stats) {
  const double need = j0.score >= kClearFailure ? std::max(kClearFailure, min_score) : min_score;
  const double u = verify::unit_roundoff(c.dtype);
  const Predicate still_fails = [&](const fixtures::Case& cand) {
    return clear_failure(judge_safely(cand, spec, jopt), u, need);
  };
  return shrink(c, still_fails, sopt, stats);
}

std::string replay_command(const std::string& path, const ImplSpec& spec) {
  std::string s = (spec.is_mutant() ? "QEDCHECK_ENABLE_MUTANTS=1 " : std::string()) + "qedcheck fuzz --replay " + path;
  if (!spec.is_mutant())
    s += "\n  or: qedcheck run " + spec.args() + " " + path + " -o /tmp/replay.h5 --force && qedcheck verify /tmp/replay.h5";
  return s;
}

CampaignResult run_campaign(const CampaignOptions& opt) {
  const auto t0 = Clock::now();
  CampaignResult res;
  std::FILE* log = opt.log;
  if (log)
    fmt::print(log, "fuzz: {} seed {}, {} s{}, corpus {}\n", opt.spec.args() + (opt.spec.draw_chunk ? " (chunk drawn)" : ""),
               opt.seed, opt.seconds, opt.max_configs >= 0 ? fmt::format(", at most {} configurations", opt.max_configs) : "",
               opt.corpus_dir);
  for (int64_t i = 0;; ++i) {
    if (opt.max_configs >= 0 && i >= opt.max_configs) break;
    if (since(t0) >= opt.seconds) break;
    const Config cfg = draw_config(opt.seed, i, opt.spec, opt.limits);
    const auto tc = Clock::now();
    // With bf16/fp16 operands, unstable dynamics amplify each operand rounding exponentially, and
    // where the roundings sit (chunk boundaries) differs from the twin's: no twin bound applies.
    const bool low = cfg.c.dtype == "bfloat16" || cfg.c.dtype == "float16";
    Judgement j;
    if (low && cfg.classes.at("stability") == "unstable") {
      j.outcome = Outcome::skip;
      j.note = "unstable configuration with " + cfg.c.dtype + " operands: roundings amplified exponentially";
    } else {
      j = judge_safely(cfg.c, cfg.spec, opt.judge);
    }
    ++res.configs;
    const bool marginal =
        j.outcome == Outcome::fail && !clear_failure(j, verify::unit_roundoff(cfg.c.dtype), opt.min_score);
    res.coverage.add(cfg.classes, j.outcome, marginal);
    if (j.outcome == Outcome::pass) ++res.passed;
    if (j.outcome == Outcome::skip) {
      ++res.skipped;
      ++res.skip_reasons[j.note.substr(0, j.note.find(':'))];
    }
    if (log && opt.verbose)
      fmt::print(log, "  config {:>5} {:<4} {:>8.3f} s score {:9.3g}  {}{}\n", i, to_string(j.outcome), since(tc), j.score,
                 describe(cfg.c), cfg.spec.chunked() ? fmt::format(" C={}", cfg.spec.run.chunk) : "");
    if (marginal) {
      ++res.marginal;
      if (j.score > res.worst_marginal) {
        res.worst_marginal = j.score;
        res.worst_marginal_config = i;
        res.worst_marginal_summary = describe(cfg.c) + ": " + summary(j);
      }
      continue;
    }
    if (j.outcome != Outcome::fail) continue;

    ++res.failed;
    Found f;
    f.config = i;
    f.original = describe(cfg.c);
    if (log) {
      fmt::print(log, "FAIL config {} (seed {}): {}\n  {}\n", i, opt.seed, f.original, summary(j));
      fmt::print(log, "  shrinking (at most {} evaluations, {} s)\n", opt.shrink.max_evals, opt.shrink.seconds);
    }
    const fixtures::Case minimal = shrink_failure(cfg.c, j, cfg.spec, opt.judge, opt.shrink, opt.min_score, &f.stats);
    const Judgement jm = judge_safely(minimal, cfg.spec, opt.judge);
    f.minimal = describe(minimal);
    f.summary = summary(jm);
    const auto& d = minimal.inputs.dims;
    f.T = d.T, f.K = d.K, f.V = d.V, f.H = d.H, f.N = minimal.inputs.num_sequences();
    CorpusMeta meta;
    meta.impl_args = cfg.spec.args();
    meta.seed = opt.seed;
    meta.config = i;
    meta.found = f.summary;
    meta.original = f.original;
    const Saved saved = save_counterexample(opt.corpus_dir, minimal, meta);
    f.path = saved.path;
    f.existed = saved.existed;
    if (log) {
      fmt::print(log, "  minimal ({} evaluations, {} accepted, {:.1f} s{}): {}\n  {}\n", f.stats.evals, f.stats.accepted,
                 f.stats.seconds, f.stats.budget_hit ? ", budget spent" : "", f.minimal, f.summary);
      fmt::print(log, "  {} {}\n  replay: {}\n", saved.existed ? "already in the corpus:" : "saved", saved.path,
                 replay_command(saved.path, cfg.spec));
    }
    res.found.push_back(std::move(f));
    if (static_cast<int>(res.found.size()) >= opt.max_failures) break;
  }
  res.seconds = since(t0);
  if (log) {
    fmt::print(log, "fuzz: {} configurations in {:.1f} s: {} pass, {} fail, {} skipped, {} marginal (no clear failure at --min-score {:g})\n",
               res.configs, res.seconds, res.passed, res.failed, res.skipped, res.marginal, opt.min_score);
    if (res.marginal)
      fmt::print(log, "  worst marginal: config {}: {}\n", res.worst_marginal_config, res.worst_marginal_summary);
    for (const auto& [why, n] : res.skip_reasons) fmt::print(log, "  skipped {}x: {}\n", n, why);
    res.coverage.print(log);
  }
  return res;
}

}  // namespace qed::fuzz
