// `qedcheck run --impl NAME IN.h5 -o OUT.h5`: runs one implementation on a case and writes its
// outputs (and gradients when the case has cotangents), for verify, certify and outside tools.
#include <fmt/format.h>

#include <memory>

#include "cli/output_path.hpp"
#include "cli/verbs.hpp"
#include "verify/implementations.hpp"

namespace qed::cli {
namespace {

struct RunCli {
  std::string input, output, precision = "double";
  verify::RunOptions run;
  bool force = false;
};

int run_run(RunCli& opt) {
  check_output_path(opt.output, opt.input, opt.force);
  opt.run.precision = reference::parse_precision(opt.precision);
  fixtures::Case c = fixtures::read_case(opt.input);
  fixtures::Case out = verify::run_implementation(c, opt.run);
  fixtures::write_case(opt.output, out);
  fmt::print("{}: {} on {} -> {} ({} outputs, {} gradients)\n", opt.run.impl, opt.input,
             out.dtype, opt.output, out.outputs.size(), out.grads.size());
  return 0;
}

const RegisterVerb register_run(20, [](CLI::App& app, Action& action) {
  auto opt = std::make_shared<RunCli>();
  CLI::App* sub = app.add_subcommand(
      "run", "Run one implementation (CPU reference or CUDA kernel) on a case and write its results");
  sub->add_option("input", opt->input, "case file")->required();
  sub->add_option("-o,--output", opt->output, "where to write the case with results")->required();
  add_implementation_options(sub, opt->run, opt->precision);
  sub->add_option("--threads", opt->run.threads, "CPU worker threads (0: all cores)");
  sub->add_flag("--force", opt->force, "replace OUT if it exists");
  sub->callback([opt, &action] { action = [opt] { return run_run(*opt); }; });
});

}  // namespace
}  // namespace qed::cli
