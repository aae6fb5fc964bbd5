// `qedcheck gate --certificate reports/certificates/X.json [--bench-table FRESH]`: the CI
// regression gate. Exit 0: every re-measured error within its certified bound, every exactness
// property holds, no benchmark slower than the margin; 1: a regression (diff table on stdout);
// 2: bad input.
#include <fmt/format.h>

#include <memory>

#include "cli/verbs.hpp"
#include "verify/certify_gate.hpp"

namespace qed::cli {
namespace {

struct GateCli {
  verify::GateOptions o;
  std::string impl, operands, precision, dtype;
  int64_t chunk = 0;
  bool no_exact = false, quiet = false;
};

int run_gate_verb(GateCli& c) {
  if (!c.impl.empty()) c.o.impl = c.impl;
  if (!c.operands.empty()) c.o.operands = c.operands;
  if (!c.precision.empty()) c.o.precision = c.precision;
  if (!c.dtype.empty()) c.o.dtype = c.dtype;
  if (c.chunk > 0) c.o.chunk = c.chunk;
  c.o.exact = !c.no_exact;
  const auto r = verify::run_gate(c.o, c.quiet ? nullptr : stderr);
  verify::print_gate(stdout, r);
  return r.pass ? 0 : 1;
}

const RegisterVerb register_gate(45, [](CLI::App& app, Action& action) {
  auto c = std::make_shared<GateCli>();
  CLI::App* sub = app.add_subcommand(
      "gate", "CI regression gate: re-measure certified cells, exactness properties, benchmarks");
  sub->add_option("--certificate", c->o.certificates, "certificate(s) to re-measure (repeatable)");
  sub->add_option("--max-T", c->o.max_T,
                  "re-measure certified cells with T <= this (default: the "
                  "certificate's smallest T)");
  sub->add_flag("--all-cells", c->o.all_cells, "re-measure every certified cell");
  sub->add_option("--impl", c->impl, "candidate implementation instead of the certificate's");
  sub->add_option("--operands", c->operands, "candidate reference-chunked operands")
      ->check(CLI::IsMember({"none", "fp32", "bf16", "fp16"}));
  sub->add_option("--precision", c->precision, "candidate CPU precision (float, double, ...)");
  sub->add_option("--dtype", c->dtype, "candidate CUDA dtype")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--chunk", c->chunk, "candidate chunk size");
  sub->add_flag("--no-exact", c->no_exact, "skip the exactness properties");
  sub->add_flag("--require-all", c->o.require_all,
                "fail when a certificate's implementation cannot run here (default: skip it, "
                "e.g. CUDA certificates on a machine without a device)");
  sub->add_option("--bench-table", c->o.bench_table,
                  "fresh benchmark table (qedcheck.bench/1 JSON or Markdown)");
  sub->add_option("--bench-baseline", c->o.bench_baseline,
                  "committed table to compare with (default reports/bench/<same file name>)");
  sub->add_option("--bench-margin", c->o.bench_margin, "allowed slowdown, fraction")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  sub->add_option("--threads", c->o.threads, "CPU worker threads (0: all cores)");
  sub->add_flag("-q,--quiet", c->quiet, "no progress lines on stderr");
  sub->callback([c, &action] { action = [c] { return run_gate_verb(*c); }; });
});

}  // namespace
}  // namespace qed::cli
