// `qedcheck verify CANDIDATE.h5`: judges the outputs and gradients a candidate case carries
// against the oracle (or the golden corpus' stored oracle when the inputs match bit for bit),
// under a tolerance file, --rtol/--atol, or the default twin rule. Exit 0 pass, 1 numerical
// failure, 2 a candidate or option that cannot be judged.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>

#include "cli/verbs.hpp"
#include "fixtures/case.hpp"
#include "reference/oracle.hpp"
#include "verify/verdict.hpp"

namespace qed::cli {
namespace {

struct VerifyCli {
  std::string input, tolerance_file, json, golden;
  double rtol = 0, atol = 0, digits = 20;
  CLI::Option* rtol_given = nullptr;
  CLI::Option* atol_given = nullptr;
  int cap_bits = 4096, threads = 0;
  int64_t chunk = 0;
  bool no_golden = false;
};

// The corpus next to this source file (the build is configured from the source tree), unless
// QEDCHECK_GOLDEN or --golden says otherwise.
std::string default_golden_dir() {
  if (const char* env = std::getenv("QEDCHECK_GOLDEN")) return env;
  const auto dir = std::filesystem::path(__FILE__).parent_path().parent_path() / "fixtures" / "golden";
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) ? dir.string() : "";
}

int run_verify(const VerifyCli& opt) {
  try {
    const bool has_rtol = opt.rtol_given->count() > 0, has_atol = opt.atol_given->count() > 0;
    if (!opt.tolerance_file.empty() && has_rtol)
      throw qed::Error("--tolerance and --rtol exclude each other (one source of bounds)");
    if (has_atol && !has_rtol)
      throw qed::Error("--atol needs --rtol (the pair sets every dataset's bounds)");
    verify::VerifyOptions vo;
    vo.digits = opt.digits;
    vo.cap_bits = opt.cap_bits;
    vo.threads = opt.threads;
    vo.chunk = opt.chunk;
    vo.golden_dir = opt.no_golden ? "" : (opt.golden.empty() ? default_golden_dir() : opt.golden);
    if (!opt.tolerance_file.empty()) vo.tolerance = verify::read_tolerance_file(opt.tolerance_file);
    if (has_rtol)
      vo.tolerance = verify::tolerance_from_options(
          opt.rtol, has_atol ? std::optional<double>(opt.atol) : std::nullopt);
    const fixtures::Case cand = fixtures::read_case(opt.input);
    const verify::Verdict v = verify::verify_candidate(cand, vo);
    verify::print_verdict(stdout, v);
    if (!opt.json.empty()) verify::write_json_atomic(opt.json, verify::verdict_json(v));
    return v.exit_code;
  } catch (const qed::Error& e) {
    // The JSON verdict records bad input too, so a CI step that reads it sees exit code 2.
    if (!opt.json.empty()) {
      try {
        verify::write_json_atomic(opt.json, verify::error_json(opt.input, e.what()));
      } catch (const qed::Error&) {
      }
    }
    throw;
  }
}

const RegisterVerb register_verify(30, [](CLI::App& app, Action& action) {
  auto opt = std::make_shared<VerifyCli>();
  CLI::App* sub = app.add_subcommand(
      "verify",
      "Judge a candidate case's /outputs and /grads against the oracle. Exit 0 pass, 1 numerical "
      "failure (or NaN/Inf), 2 bad input.\nDefault tolerance: " +
          verify::twin_rule_text() +
          ".\nWhen the candidate's inputs equal a golden case's bit for bit, its stored oracle "
          "values are the reference; otherwise the oracle is recomputed to --digits.");
  sub->add_option("candidate", opt->input, "candidate case (HDF5, CASE_FORMAT version 1)")->required();
  sub->add_option("--tolerance", opt->tolerance_file,
                  "tolerance file (JSON, schema qedcheck.tolerance/1); datasets it does not cover "
                  "use the twin rule");
  opt->rtol_given =
      sub->add_option("--rtol", opt->rtol, "bound on ||cand-ref||_F / ||ref||_F for every dataset");
  opt->atol_given =
      sub->add_option("--atol", opt->atol, "with --rtol: bound on max |cand-ref| for every dataset");
  sub->add_option("--json", opt->json, "write the verdict as JSON (schema qedcheck.verdict/1)");
  sub->add_option("--digits", opt->digits, "oracle: certified digits when recomputing")
      ->capture_default_str()
      ->check(CLI::Range(8.0, reference::kMaxCertifiedDigits));
  sub->add_option("--cap-bits", opt->cap_bits, "oracle: highest mpfr precision to try")
      ->capture_default_str()
      ->check(CLI::Range(64, 1 << 20));
  sub->add_option("--golden", opt->golden, "golden corpus folder (default: fixtures/golden of the "
                                           "source tree, or $QEDCHECK_GOLDEN)");
  sub->add_flag("--no-golden", opt->no_golden, "always recompute the oracle");
  sub->add_option("--chunk", opt->chunk,
                  "the candidate's chunk size, if chunked: adds a chunked twin with that chunk to "
                  "the default ones (64, 32, 16, 8), so that a longer chunk's summation order is "
                  "judged against its own rounding")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--threads", opt->threads, "worker threads (0: all cores)")->check(CLI::Range(0, 4096));
  sub->callback([opt, &action] { action = [opt] { return run_verify(*opt); }; });
});

}  // namespace
}  // namespace qed::cli
