// `qedcheck reference IN.h5 -o OUT.h5`: the oracle on a case. Computes /outputs (and /grads when
// the case has /cotangents/do) with the recurrent reference, certifies the digits of every
// dataset by comparing two precisions, and writes them with double-double low parts.
#include <fmt/format.h>

#include <memory>

#include "cli/output_path.hpp"
#include "cli/verbs.hpp"
#include "fixtures/case.hpp"
#include "verify/evaluate.hpp"

namespace qed::cli {
namespace {

struct ReferenceOptions {
  std::string input;
  std::string output;
  std::string precision = "auto:30";
  int cap_bits = 4096;
  int threads = 0;
  bool force = false;
};

std::string shape_text(const fixtures::Case& c, const std::string& name) {
  return fmt::format("[{}]", fmt::join(verify::result_shape(c, name), ","));
}

int run_reference(const ReferenceOptions& opt) {
  const auto choice = verify::parse_precision_choice(opt.precision);
  check_output_path(opt.output, opt.input, opt.force);
  fixtures::Case c = fixtures::read_case(opt.input);
  const auto compute = verify::recurrent_compute(c, opt.threads);
  reference::OracleReport rep = choice.automatic
                                    ? reference::evaluate_auto(compute, choice.target_digits, opt.cap_bits)
                                    : reference::evaluate_fixed(compute, choice.fixed);
  verify::store_results(rep, c);
  c.producer = "qedcheck reference " + rep.precision.name();
  fixtures::write_case(opt.output, c);

  const auto& d = c.inputs.dims;
  const bool qed = c.inputs.variant == reference::Variant::qed;
  fmt::print("case      {}  ({}{}{}, B={} T={} H={} K={} V={}, N={})\n", opt.input,
             reference::to_string(c.inputs.variant), qed ? " arm " : "",
             qed ? reference::to_string(c.inputs.arm) : "", d.B, d.T, d.H, d.K, d.V,
             c.inputs.num_sequences());
  fmt::print("precision {} checked against {} ({}, {:.2f} s)\n", rep.precision.name(),
             rep.check.name(), choice.text(), rep.seconds);
  fmt::print("{:<16} {:<16} {:>9} {:>12}\n", "dataset", "shape", "digits", "max|value|");
  for (const auto& ds : rep.datasets)
    fmt::print("{:<16} {:<16} {:>9.1f} {:>12.4e}\n", ds.name, shape_text(c, ds.name), ds.digits,
               ds.max_abs);
  fmt::print("wrote     {}\n", opt.output);
  if (!rep.target_met) {
    fmt::print(stderr, "qedcheck: warning: {}\n", rep.note);
    return 1;
  }
  return 0;
}

const RegisterVerb register_reference(10, [](CLI::App& app, Action& action) {
  auto opt = std::make_shared<ReferenceOptions>();
  CLI::App* sub = app.add_subcommand(
      "reference",
      "Compute /outputs (and /grads when /cotangents/do is present) of a case with the "
      "arbitrary-precision recurrent reference and certify their digits");
  sub->add_option("input", opt->input, "case file (HDF5, CASE_FORMAT version 1)")->required();
  sub->add_option("-o,--output", opt->output, "where to write the case with results")->required();
  sub->add_option("--precision", opt->precision,
                  "float | double | float128 | mpfr:BITS (checked against a higher precision) | "
                  "auto:DIGITS (escalate until DIGITS are certified for every dataset)")
      ->capture_default_str();
  sub->add_option("--cap-bits", opt->cap_bits, "auto mode: highest mpfr precision to try")
      ->capture_default_str()
      ->check(CLI::Range(64, 1 << 20));
  sub->add_option("--threads", opt->threads, "worker threads (0: all cores)")->check(CLI::Range(0, 4096));
  sub->add_flag("--force", opt->force, "replace OUT if it exists");
  sub->callback([opt, &action] { action = [opt] { return run_reference(*opt); }; });
});

}  // namespace
}  // namespace qed::cli
