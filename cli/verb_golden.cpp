// `qedcheck golden --out DIR [--check DIR]`: the golden corpus. Rebuilds every case from its seed
// (fixtures/generate.hpp) or from its hand-built recipe, certifies outputs and gradients to 30
// digits with the oracle, and writes DIR/NAME.h5 plus DIR/MANIFEST.json; --check compares the
// decoded contents of a corpus folder (datasets and attributes, not bytes) with a fresh build.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/output_path.hpp"
#include "cli/verbs.hpp"
#include "fixtures/case.hpp"
#include "fixtures/generate.hpp"
#include "verify/compare_golden.hpp"
#include "verify/evaluate.hpp"
#include "verify/golden_replay.hpp"
#include "verify/verdict.hpp"

namespace qed::cli {
namespace {

using reference::Arm;
using reference::Variant;
constexpr double kGoldenDigits = 30;

struct Recipe {
  std::string name, description;
  std::function<fixtures::Case()> build;  // inputs and cotangents
};

fixtures::Case from_spec(const fixtures::GenSpec& s, bool with_dht = true) {
  fixtures::Case c;
  c.inputs = fixtures::generate(s);
  c.cotangents = fixtures::generate_cotangents(c.inputs, s.seed, with_dht);
  return c;
}

fixtures::GenSpec spec(Variant v, Arm a, reference::Dims d, fixtures::Regime r, uint64_t seed,
                       bool h0) {
  fixtures::GenSpec s;
  s.variant = v;
  s.arm = a;
  s.dims = d;
  s.regime = r;
  s.seed = seed;
  s.with_h0 = h0;
  return s;
}

// MATH.md §8.2: k = e1, alpha = 1, nogate_noproj. Head 0: q = -k, b = 0.05, lambda = 0.5
// (eigenvalue 1.45); head 1: q = k, b = 0.95, lambda = 1.5 (eigenvalue -1.45). The state grows
// like 1.45^t along k.
fixtures::Case unstable_noproj() {
  auto s = spec(Variant::qed, Arm::nogate_noproj, {1, 50, 2, 4, 4}, fixtures::Regime::prop, 801, true);
  fixtures::Case c = from_spec(s);
  auto& in = c.inputs;
  const auto& d = in.dims;
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t ch = 0; ch < d.K; ++ch) {
        const int64_t i = (t * d.H + h) * d.K + ch;
        in.k[i] = ch == 0 ? 1.0 : 0.0;
        in.q[i] = ch == 0 ? (h == 0 ? -1.0 : 1.0) : 0.0;
        in.b[i] = h == 0 ? 0.05 : 0.95;
        in.g[i] = 0.0;
      }
  in.lambda = {0.5, 1.5};
  return c;
}

// g = -20 on every even channel, and on every channel at every fifth token: the decay spans
// exp(-1280) within one chunk of 64, far below double's range if formed as exp(-G).
fixtures::Case strong_decay() {
  auto s = spec(Variant::gdn2, Arm::none, {1, 70, 2, 4, 4}, fixtures::Regime::std_, 901, true);
  fixtures::Case c = from_spec(s);
  auto& in = c.inputs;
  const auto& d = in.dims;
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t ch = 0; ch < d.K; ++ch)
        if (ch % 2 == 0 || t % 5 == 0) in.g[(t * d.H + h) * d.K + ch] = -20.0;
  return c;
}

std::vector<Recipe> corpus() {
  using R = fixtures::Regime;
  std::vector<Recipe> r;
  auto add = [&](std::string name, std::string desc, fixtures::GenSpec s) {
    r.push_back({std::move(name), std::move(desc), [s] { return from_spec(s); }});
  };
  const reference::Dims small{2, 16, 2, 4, 3};
  const std::pair<Variant, Arm> every[] = {
      {Variant::gdn2, Arm::none},        {Variant::qed, Arm::full}, {Variant::qed, Arm::nogate},
      {Variant::qed, Arm::nogate_noproj}, {Variant::qed, Arm::rand}, {Variant::kda, Arm::none},
      {Variant::gdn, Arm::none},         {Variant::deltanet, Arm::none}};
  uint64_t seed = 100;
  for (auto [v, a] : every) {
    std::string name = std::string(reference::to_string(v)) +
                       (a == Arm::none ? "" : "_" + std::string(reference::to_string(a))) + "_prop";
    add(name, "every variant and arm: prop regime, B=2, h0, dht", spec(v, a, small, R::prop, ++seed, true));
  }
  {
    auto s = spec(Variant::gdn2, Arm::none, {1, 20, 2, 4, 3}, R::prop, 201, true);
    s.seqlens = {7, 0, 13};
    add("gdn2_varlen_zero", "varlen 7+0+13 (a zero-length sequence in the middle), h0", s);
    auto q = spec(Variant::qed, Arm::full, {1, 20, 2, 4, 5}, R::prop, 202, true);
    q.seqlens = {0, 9, 0, 11};
    add("qed_full_varlen_zero", "varlen 0+9+0+11 (zero-length first and third), h0", q);
  }
  for (int64_t T : {1, 63, 64, 65}) {
    add(fmt::format("gdn2_T{}", T), fmt::format("T = {} around the chunk size 64", T),
        spec(Variant::gdn2, Arm::none, {1, T, 1, 4, 4}, R::std_, 300 + T, T % 2 == 1));
  }
  add("qed_full_T65", "T = 65: one full chunk and a one-token tail, h0",
      spec(Variant::qed, Arm::full, {1, 65, 1, 4, 4}, R::mixed, 366, true));
  r.push_back({"gdn2_strong_decay", "g = -20 on even channels and on every fifth token, T = 70",
               strong_decay});
  add("gdn2_a1b1", "alpha = 1 and b = 1 exactly: the DeltaNet projection",
      spec(Variant::gdn2, Arm::none, {1, 40, 2, 4, 4}, R::a1b1, 401, false));
  add("deltanet_a1b1", "beta = 1 exactly: pure projection steps",
      spec(Variant::deltanet, Arm::none, {1, 40, 2, 4, 4}, R::a1b1, 402, true));
  add("qed_full_hard_corr", "correlated keys (mean cosine ~0.5), hard gates",
      spec(Variant::qed, Arm::full, {1, 48, 2, 4, 4}, R::hard_corr, 501, false));
  add("gdn2_hard_corr", "correlated keys, hard gates",
      spec(Variant::gdn2, Arm::none, {1, 48, 2, 4, 4}, R::hard_corr, 502, true));
  add("kda_mixed", "mixed regime: some channels with alpha near 0.999",
      spec(Variant::kda, Arm::none, {1, 48, 2, 4, 4}, R::mixed, 503, false));
  r.push_back({"qed_nogate_noproj_unstable",
               "MATH.md 8.2 counterexamples: eigenvalue +1.45 (head 0) and -1.45 (head 1), T = 50",
               unstable_noproj});
  {
    auto s = spec(Variant::qed, Arm::full, {1, 40, 1, 4, 4}, R::a1b1, 601, false);
    s.lambda = 3.0;
    add("qed_full_large_lambda", "lambda = 3 with alpha = b = 1: mean-square growth 1.5 per step", s);
  }
  {
    auto s = spec(Variant::gdn2, Arm::none, {1, 24, 2, 4, 4}, R::std_, 701, true);
    s.unit_keys = false;
    add("gdn2_raw_keys", "raw Gaussian (non-unit) keys and queries", s);
    auto q = spec(Variant::qed, Arm::nogate, {1, 24, 2, 4, 4}, R::std_, 702, true);
    q.unit_keys = false;
    add("qed_nogate_raw_keys", "raw Gaussian (non-unit) keys and queries", q);
  }
  return r;
}

struct Built {
  fixtures::Case c;
  double min_digits = 0;
};

Built build(const Recipe& rec, int threads) {
  Built b;
  b.c = rec.build();
  const auto compute = verify::recurrent_compute(b.c, threads);
  const reference::OracleReport rep = reference::evaluate_auto(compute, kGoldenDigits);
  if (!rep.target_met) throw qed::Error("golden case " + rec.name + ": " + rep.note);
  verify::store_results(rep, b.c);
  b.c.producer = "qedcheck golden (oracle " + rep.precision.name() + " checked against " +
                 rep.check.name() + ")";
  b.min_digits = 1e9;
  for (const auto& d : rep.datasets) b.min_digits = std::min(b.min_digits, d.digits);
  return b;
}

nlohmann::json manifest_entry(const Recipe& rec, const Built& b) {
  const auto& in = b.c.inputs;
  return {{"name", rec.name},
          {"file", rec.name + ".h5"},
          {"description", rec.description},
          {"variant", reference::to_string(in.variant)},
          {"arm", reference::to_string(in.arm)},
          {"dims", {in.dims.B, in.dims.T, in.dims.H, in.dims.K, in.dims.V}},
          {"N", in.num_sequences()},
          {"h0", !in.h0.empty()},
          {"cu_seqlens", in.cu_seqlens},
          {"input_hash", verify::input_hash(b.c)},
          {"min_digits", std::floor(b.min_digits * 10) / 10}};
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 8 * a.size()) == 0);
}

// Differences between a stored case and a fresh build, one line each.
std::vector<std::string> differences(const fixtures::Case& want, const fixtures::Case& got) {
  std::vector<std::string> out;
  if (!verify::same_inputs(want, got)) out.push_back("/inputs differ");
  if (!verify::same_cotangents(want, got)) out.push_back("/cotangents differ");
  if (want.dtype != got.dtype) out.push_back("/inputs@dtype " + got.dtype + ", expected " + want.dtype);
  if (want.producer != got.producer) out.push_back("producer \"" + got.producer + "\", expected \"" + want.producer + "\"");
  auto group = [&](const std::map<std::string, fixtures::Dataset>& w,
                   const std::map<std::string, fixtures::Dataset>& g, const std::string& name) {
    for (const auto& [k, d] : w) {
      auto it = g.find(k);
      if (it == g.end()) {
        out.push_back("/" + name + "/" + k + " missing");
        continue;
      }
      if (!same_bits(d.data, it->second.data)) out.push_back("/" + name + "/" + k + " values differ");
      if (!same_bits(d.lo, it->second.lo)) out.push_back("/" + name + "/" + k + "_lo differs");
      if (d.digits != it->second.digits)
        out.push_back(fmt::format("/{}/{}@digits {} , expected {}", name, k, it->second.digits, d.digits));
    }
    for (const auto& [k, d] : g)
      if (!w.count(k)) out.push_back("/" + name + "/" + k + " is not expected");
  };
  group(want.outputs, got.outputs, "outputs");
  group(want.grads, got.grads, "grads");
  return out;
}

struct GoldenCli {
  std::string out, check, only;
  int threads = 0;
  // --replay DIR: run an implementation on every case and judge it with verify.
  std::string replay, precision = "double", tolerance, json;
  verify::RunOptions run;
};

// One line per case, then a summary; exit 1 when any case fails its budget.
int run_replay(GoldenCli& opt) {
  // Everything that can be wrong with the command is reported before any case runs (replay_golden
  // reads the manifest and the budget file first).
  verify::require_implementation(opt.run.impl);
  opt.run.precision = reference::parse_precision(opt.precision);
  opt.run.threads = opt.threads;
  if (!opt.json.empty()) check_output_path(opt.json, "", true);
  const std::string budget =
      opt.tolerance.empty() ? (std::filesystem::path(opt.replay) / verify::default_replay_budget(opt.run)).string()
                            : opt.tolerance;
  std::string what = opt.run.impl;
  if (opt.run.impl.rfind("cuda-", 0) == 0) what += " dtype=" + opt.run.dtype;
  else what += " " + opt.run.precision.name() + (opt.run.operands != "none" ? " operands=" + opt.run.operands : "");
  fmt::print("replaying {} with {} (budget {})\n", opt.replay, what, budget);
  const auto rows = verify::replay_golden(opt.replay, opt.run, budget);
  fmt::print("{:<30} {:<6} {:>8} {:>12}  {:<14} {:<7} {:>6}\n", "case", "result", "score", "rel_frob",
             "worst dataset", "oracle", "s");
  int failed = 0;
  double worst = 0;
  nlohmann::json j = {{"schema", "qedcheck.golden_replay/1"}, {"corpus", opt.replay}, {"implementation", what},
                      {"budget", budget}, {"cases", nlohmann::json::array()}};
  for (const auto& r : rows) {
    failed += r.pass ? 0 : 1;
    worst = std::max(worst, r.worst_score);
    fmt::print("{:<30} {:<6} {:>8.3g} {:>12.3e}  {:<14} {:<7} {:>6.2f}\n", r.name, r.pass ? "PASS" : "FAIL",
               r.worst_score, r.worst_rel_frobenius, r.worst_dataset, r.reference_source, r.seconds);
    j["cases"].push_back({{"name", r.name}, {"pass", r.pass}, {"worst_score", r.worst_score},
                          {"worst_dataset", r.worst_dataset}, {"worst_rel_frobenius", r.worst_rel_frobenius},
                          {"reference", r.reference_source}, {"datasets", r.datasets}, {"seconds", r.seconds}});
  }
  fmt::print("replay {}: {} of {} cases within budget, worst score {:.3f} ({})\n", failed == 0 ? "PASS" : "FAIL",
             rows.size() - failed, rows.size(), worst, what);
  j["pass"] = failed == 0;
  j["worst_score"] = worst;
  if (!opt.json.empty()) verify::write_json_atomic(opt.json, j);
  return failed == 0 ? 0 : 1;
}

int run_golden(GoldenCli& opt) {
  namespace fs = std::filesystem;
  if (!opt.replay.empty()) return run_replay(opt);
  if (opt.out.empty() && opt.check.empty())
    throw qed::Error("golden: give --out DIR and/or --check DIR, or --replay DIR");
  if (!opt.out.empty()) fs::create_directories(opt.out);
  nlohmann::json manifest = {{"schema", "qedcheck.golden/1"},
                             {"digits", kGoldenDigits},
                             {"generator", "qedcheck golden --out DIR"},
                             {"cases", nlohmann::json::array()}};
  int failures = 0;
  std::set<std::string> files;
  for (const Recipe& rec : corpus()) {
    if (!opt.only.empty() && rec.name != opt.only) continue;
    const Built b = build(rec, opt.threads);
    manifest["cases"].push_back(manifest_entry(rec, b));
    files.insert(rec.name + ".h5");
    if (!opt.out.empty()) fixtures::write_case((fs::path(opt.out) / (rec.name + ".h5")).string(), b.c);
    if (!opt.check.empty()) {
      const std::string path = (fs::path(opt.check) / (rec.name + ".h5")).string();
      std::vector<std::string> diff;
      if (!fs::exists(path)) {
        diff.push_back("file missing");
      } else {
        diff = differences(b.c, fixtures::read_case(path));
      }
      for (const auto& d : diff) fmt::print("DIFF  {}: {}\n", path, d);
      failures += diff.empty() ? 0 : 1;
      fmt::print("{}  {:<28} {:.1f} digits\n", diff.empty() ? "same" : "DIFF", rec.name, b.min_digits);
    } else {
      fmt::print("wrote {:<28} {:.1f} digits\n", rec.name, b.min_digits);
    }
  }
  if (!opt.out.empty() && opt.only.empty()) {
    verify::write_json_atomic((fs::path(opt.out) / verify::kGoldenManifest).string(), manifest);
  }
  if (!opt.check.empty() && opt.only.empty()) {
    const fs::path mpath = fs::path(opt.check) / verify::kGoldenManifest;
    std::ifstream f(mpath);
    nlohmann::json stored;
    try {
      stored = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception&) {
      stored = nullptr;
    }
    if (stored != manifest) {
      fmt::print("DIFF  {}: manifest differs from a fresh build\n", mpath.string());
      ++failures;
    }
    for (const auto& e : fs::directory_iterator(opt.check))
      if (e.path().extension() == ".h5" && !files.count(e.path().filename().string())) {
        fmt::print("DIFF  {}: not part of the corpus\n", e.path().string());
        ++failures;
      }
  }
  if (!opt.check.empty()) {
    fmt::print("{}: {} difference(s) against a fresh build\n", opt.check, failures);
    return failures == 0 ? 0 : 1;
  }
  return 0;
}

const RegisterVerb register_golden(60, [](CLI::App& app, Action& action) {
  auto opt = std::make_shared<GoldenCli>();
  CLI::App* sub = app.add_subcommand(
      "golden", "Rebuild the golden corpus (seeded and hand-built cases, oracle to 30 digits) "
                "into --out DIR, and/or compare a corpus folder with a fresh build (--check DIR; "
                "exit 1 on any difference in decoded datasets or attributes)");
  sub->add_option("--out", opt->out, "folder to write NAME.h5 and MANIFEST.json into");
  sub->add_option("--check", opt->check, "corpus folder to compare with a fresh build");
  sub->add_option("--only", opt->only, "build just the case of this name (no manifest)");
  sub->add_option("--threads", opt->threads, "worker threads (0: all cores)")->check(CLI::Range(0, 4096));
  CLI::Option* replay = sub->add_option(
      "--replay", opt->replay,
      "corpus folder to replay: run --impl on every case and judge it with verify against the "
      "corpus' budget (exit 1 when a case fails)");
  replay->excludes(sub->get_option("--out"))->excludes(sub->get_option("--check"))->excludes(sub->get_option("--only"));
  add_implementation_options(sub, opt->run, opt->precision, "--replay: ");
  sub->add_option("--tolerance", opt->tolerance,
                  "--replay: budget file (default: the corpus' replay_float64.json, replay_float32.json "
                  "or replay_bf16.json, by precision, operands or dtype)");
  sub->add_option("--json", opt->json, "--replay: write the per-case results as JSON");
  sub->callback([opt, &action] { action = [opt] { return run_golden(*opt); }; });
});

}  // namespace
}  // namespace qed::cli
