// `qedcheck fuzz --impl IMPL [--time 60s] [--seed N] [--corpus DIR] [--tolerance FILE]`: draws
// configurations far beyond the unit tests, judges IMPL on each against the oracle (the
// tolerance file's bounds, else verify's twin rule), shrinks every failure and saves it in the
// corpus with the command that replays it; `--replay FILE` judges one saved case again.
// Exit 0: no failure (replay: passes), 1: a failure found (replay: still fails), 2: bad input.
#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "cli/verbs.hpp"
#include "fuzz/campaign.hpp"
#include "fuzz/case_edit.hpp"
#include "fuzz/mutants.hpp"

namespace qed::cli {
namespace {

struct FuzzCli {
  std::string impl = "reference-recurrent", precision = "double", operands = "none", dtype = "fp32";
  int64_t chunk = 0;
  std::string time = "60s", shrink_time = "120s", corpus = "fuzz/corpus", tolerance, replay;
  uint64_t seed = 0;
  int64_t iterations = -1, max_evals = 20000;
  int max_failures = 1, threads = 1;
  double min_score = 16;
  bool verbose = false;
  CLI::Option* impl_opt = nullptr;
};

// "60s", "2m", "1.5h", "90" (seconds).
double parse_duration(const std::string& s, const char* what) {
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  const std::string unit = end ? end : "";
  double mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
  if (s.empty() || end == s.c_str() || mult < 0 || !std::isfinite(x) || x < 0)
    throw qed::Error(fmt::format("{} '{}': expected a duration such as 60s, 2m or 1h", what, s));
  return x * mult;
}

fuzz::ImplSpec spec_from(const FuzzCli& o) {
  fuzz::ImplSpec s;
  s.run.impl = o.impl;
  s.run.precision = reference::parse_precision(o.precision);
  s.run.operands = o.operands;
  s.run.dtype = o.dtype;
  s.run.chunk = o.chunk > 0 ? o.chunk : 64;
  s.draw_chunk = o.chunk <= 0 && s.chunked();
  bool known = false;
  for (const auto& n : fuzz::known_impls()) known = known || n == o.impl;
  for (const auto& n : fuzz::mutant_names()) known = known || n == o.impl;  // run_impl explains
  if (!known) {
    std::string names;
    for (const auto& n : fuzz::known_impls()) names += (names.empty() ? "" : ", ") + n;
    throw qed::Error("--impl '" + o.impl + "' is not available in this build (known: " + names + ")");
  }
  return s;
}

void print_judgement(const fuzz::Judgement& j) {
  fmt::print("{:<14} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "dataset", "rel_F", "bound", "max_abs", "bound", "score");
  for (const auto& d : j.datasets)
    fmt::print("{:<14} {:>10.3e} {:>10.3e} {:>10.3e} {:>10.3e} {:>9.3g}{}\n", d.metrics.name, d.metrics.rel_frobenius,
               d.bound.rtol_frobenius, d.metrics.max_abs_error, d.bound.atol_max, d.score, d.score > 1 ? "  FAIL" : "");
  fmt::print("{}\n", fuzz::summary(j));
}

int run_replay(const FuzzCli& o, const fuzz::JudgeOptions& jopt) {
  const fuzz::CorpusEntry e = fuzz::read_counterexample(o.replay);
  fuzz::ImplSpec spec;
  if (o.impl_opt->count() > 0 || e.meta.impl_args.empty()) {
    spec = spec_from(o);
    if (spec.draw_chunk) spec.draw_chunk = false;
  } else {
    spec = fuzz::parse_impl_args(e.meta.impl_args);
  }
  fuzz::ImplSpec check = spec;
  check.draw_chunk = false;
  fmt::print("replay {}: {}\n  implementation {}\n", o.replay, fuzz::describe(e.c), check.args());
  if (!e.meta.found.empty()) fmt::print("  found (seed {} config {}): {}\n", e.meta.seed, e.meta.config, e.meta.found);
  const fuzz::Judgement j = fuzz::judge_safely(e.c, check, jopt);
  print_judgement(j);
  return j.outcome == fuzz::Outcome::fail ? 1 : 0;
}

int run_fuzz(const FuzzCli& o) {
  fuzz::JudgeOptions jopt;
  jopt.threads = o.threads;
  if (!o.tolerance.empty()) jopt.tolerance = verify::read_tolerance_file(o.tolerance);
  if (!o.replay.empty()) return run_replay(o, jopt);
  fuzz::CampaignOptions c;
  c.spec = spec_from(o);
  c.seed = o.seed;
  c.seconds = parse_duration(o.time, "--time");
  c.max_configs = o.iterations;
  c.corpus_dir = o.corpus;
  c.judge = jopt;
  c.shrink.seconds = parse_duration(o.shrink_time, "--shrink-time");
  c.shrink.max_evals = o.max_evals;
  c.shrink.log = o.verbose ? stdout : nullptr;
  c.max_failures = o.max_failures;
  c.min_score = o.min_score;
  c.verbose = o.verbose;
  const fuzz::CampaignResult r = fuzz::run_campaign(c);
  return r.failed > 0 ? 1 : 0;
}

const RegisterVerb register_fuzz(40, [](CLI::App& app, Action& action) {
  auto o = std::make_shared<FuzzCli>();
  CLI::App* sub = app.add_subcommand(
      "fuzz",
      "Fuzz an implementation against the oracle: random and adversarial configurations, shrinking "
      "of failures, a corpus of counterexamples. Exit 0 no failure, 1 failure found (saved), 2 bad "
      "input. --replay FILE judges one saved case again (exit 0 passes, 1 still fails).");
  o->impl_opt = sub->add_option("--impl", o->impl, "implementation under test (test-only mutant-* names need "
                                                   "QEDCHECK_ENABLE_MUTANTS=1)")
                    ->capture_default_str();
  sub->add_option("--precision", o->precision, "CPU references and mutants: float | double | float128 | mpfr:BITS")
      ->capture_default_str();
  sub->add_option("--chunk", o->chunk, "chunk size of chunked implementations (default: drawn per configuration, at most 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--operands", o->operands, "reference-chunked: none | fp32 | bf16 | fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "fp32", "bf16", "fp16"}));
  sub->add_option("--dtype", o->dtype, "CUDA kernels: fp32 | bf16 | fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--time", o->time, "stop drawing configurations after this long (60s, 2m, 1h)")->capture_default_str();
  sub->add_option("--seed", o->seed, "campaign seed: configuration i depends on (seed, i) only")->capture_default_str();
  sub->add_option("--iterations", o->iterations, "stop after this many configurations");
  sub->add_option("--corpus", o->corpus, "folder of saved counterexamples")->capture_default_str();
  sub->add_option("--tolerance", o->tolerance,
                  "tolerance or certificate file (JSON); datasets it does not cover use verify's twin rule");
  sub->add_option("--replay", o->replay, "judge one saved case again (implementation from the file unless --impl)");
  sub->add_option("--max-failures", o->max_failures, "stop after this many saved counterexamples")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--min-score", o->min_score,
                  "failures scoring at most this (metric / bound; also rounding noise where the oracle value is "
                  "exactly 0) are reported as marginal, not shrunk or saved (1: verify's exact semantics)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e300));
  sub->add_option("--shrink-time", o->shrink_time, "time budget of shrinking one failure")->capture_default_str();
  sub->add_option("--shrink-evals", o->max_evals, "evaluation budget of shrinking one failure")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--threads", o->threads, "worker threads per evaluation")->capture_default_str()->check(CLI::Range(0, 4096));
  sub->add_flag("--verbose", o->verbose, "one line per configuration and per shrinking step");
  sub->callback([o, &action] { action = [o] { return run_fuzz(*o); }; });
});

}  // namespace
}  // namespace qed::cli
