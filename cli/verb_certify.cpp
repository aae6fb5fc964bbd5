// `qedcheck certify [--impl NAME...] [--dtype fp32|bf16...] [--quick|--full] [--out DIR]`: measures
// error envelopes against the oracle and writes one certificate per implementation and dtype
// (verify/certificate.hpp, reports/certificates/README.md). Re-running with the same --out
// resumes: finished cells are kept, the rest measured.
#include <fmt/format.h>

#include <memory>

#include "cli/verbs.hpp"
#include "verify/certify.hpp"

namespace qed::cli {
namespace {

struct CertifyCli {
  verify::CertifyOptions o;
  bool quick = false, full = false, no_unstable = false, quiet = false;
};

int run_certify_verb(CertifyCli& c) {
  if (c.quick && c.full) throw qed::Error("--quick and --full exclude each other");
  c.o.mode = c.full ? "full" : "quick";
  c.o.unstable = !c.no_unstable;
  c.o.progress = !c.quiet;
  const auto sum = verify::run_certify(c.o, stderr);
  for (const auto& s : sum.skipped) fmt::print("skipped {}\n", s);
  // Implementations named on the command line that cannot run here (a CUDA kernel without a
  // device) are a usage error when nothing else was certified: exit 2, not an empty success.
  if (!c.o.impls.empty() && sum.certificates.empty() && !sum.skipped.empty())
    throw qed::Error(fmt::format("nothing certified: {} (rule: --impl names implementations that run here)",
                                 sum.skipped.front()));
  for (const auto& p : sum.certificates) {
    const auto cert = verify::read_certificate(p);
    int certified = 0, unstable = 0, not_certified = 0;
    for (const auto& cell : cert.cells) {
      certified += cell.status == "certified";
      unstable += cell.status == "unstable";
      not_certified += cell.status == "not-certified";
    }
    fmt::print("{}: {} cells ({} certified, {} unstable reported, {} not certified)\n", p,
               cert.cells.size(), certified, unstable, not_certified);
  }
  fmt::print(
      "measured {} of {} pending problem(s), {} cell(s) resumed from earlier runs, {:.1f} s{}\n",
      sum.problems_measured, sum.problems_total, sum.cells_resumed, sum.seconds,
      sum.interrupted ? " (stopped by --max-cells; run again to resume)" : "");
  return 0;
}

const RegisterVerb register_certify(40, [](CLI::App& app, Action& action) {
  auto c = std::make_shared<CertifyCli>();
  CLI::App* sub = app.add_subcommand(
      "certify", "Measure error envelopes against the oracle and write certificates (resumable)");
  sub->add_option("--impl", c->o.impls,
                  "implementations (default: all of this build): reference-recurrent, "
                  "reference-chunked, cuda-recurrent, cuda-chunked");
  sub->add_option("--dtype", c->o.dtypes, "input dtypes fp32 | bf16 (default: per implementation)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_flag("--quick", c->quick, "small sweep: T 64..256, K=V=64 (default)");
  sub->add_flag("--full", c->full, "long sweep: T 64..16384, K=V 64 and 128, more families");
  sub->add_option("--out", c->o.out_dir, "folder of the certificates and journals")
      ->capture_default_str();
  sub->add_option("--seeds", c->o.seeds, "seeds per cell (0..N-1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--first-seed", c->o.first_seed, "seeds are FIRST .. FIRST+N-1")
      ->capture_default_str();
  sub->add_option("--T", c->o.Ts, "override the lengths")->delimiter(',');
  sub->add_option("--head-dim", c->o.head_dims, "override K = V")->delimiter(',');
  sub->add_option("--family", c->o.families,
                  "override families: gdn2, kda, gdn, deltanet, qed.ARM@LAMBDA")
      ->delimiter(',');
  sub->add_option("--regime", c->o.regimes, "override regimes: std, mixed, hard, a1b1, hard_corr")
      ->delimiter(',');
  sub->add_option("--heads", c->o.heads, "H of every case")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  sub->add_flag("--no-unstable", c->no_unstable, "leave out the unstable configurations");
  sub->add_option("--max-cells", c->o.max_new_cells,
                  "stop after measuring N problems (resume later)");
  sub->add_option("--threads", c->o.threads, "CPU worker threads (0: all cores)");
  sub->add_flag("-q,--quiet", c->quiet, "no progress lines on stderr");
  sub->callback([c, &action] { action = [c] { return run_certify_verb(*c); }; });
});

}  // namespace
}  // namespace qed::cli
