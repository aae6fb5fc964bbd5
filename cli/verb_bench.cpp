// `qedcheck bench`: times one implementation on a generated case (no file needed), e.g. the
// float128 recurrent reference at T=4096, K=V=64, 8 heads, the figure README quotes. Reports
// wall time, CPU time and the thread count, forward and optionally backward.
#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <memory>

#include "cli/verbs.hpp"
#include "fixtures/generate.hpp"
#include "reference/parallel.hpp"
#include "verify/implementations.hpp"

namespace qed::cli {
namespace {

struct BenchCli {
  std::string precision = "float128", variant = "qed", arm = "full", regime = "std";
  verify::RunOptions run;
  int64_t B = 1, T = 4096, H = 8, K = 64, V = 64;
  bool backward = false;
  int repeats = 1;
};

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int run_bench(BenchCli& o) {
  fixtures::GenSpec s;
  if (!reference::parse_variant(o.variant, s.variant))
    throw qed::Error("--variant '" + o.variant + "': expected gdn2, qed, kda, gdn or deltanet");
  if (s.variant == reference::Variant::qed && !reference::parse_arm(o.arm, s.arm))
    throw qed::Error("--arm '" + o.arm + "': expected full, nogate, nogate_noproj or rand");
  s.regime = fixtures::parse_regime(o.regime);
  s.dims = {o.B, o.T, o.H, o.K, o.V};
  fixtures::Case c;
  c.inputs = fixtures::generate(s);
  if (o.backward) c.cotangents = fixtures::generate_cotangents(c.inputs, 1, true);
  o.run.precision = reference::parse_precision(o.precision);
  const int threads = o.run.threads > 0 ? o.run.threads : reference::default_threads();
  fmt::print("{} {} {}{}{} B={} T={} H={} K={} V={}, {} thread(s), {}\n", o.run.impl,
             o.run.precision.name(), o.variant, s.variant == reference::Variant::qed ? "/" : "",
             s.variant == reference::Variant::qed ? o.arm : "", o.B, o.T, o.H, o.K, o.V, threads,
             o.backward ? "forward + backward" : "forward");
  for (int r = 0; r < o.repeats; ++r) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    fixtures::Case out = verify::run_implementation(c, o.run);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("run {}: wall {:.2f} s, cpu {:.2f} s ({} datasets)\n", r + 1, wall,
               cpu_seconds() - c0, out.outputs.size() + out.grads.size());
  }
  return 0;
}

const RegisterVerb register_bench(90, [](CLI::App& app, Action& action) {
  auto o = std::make_shared<BenchCli>();
  CLI::App* sub = app.add_subcommand("bench", "Time an implementation on a generated case");
  add_implementation_options(sub, o->run, o->precision);
  sub->add_option("--variant", o->variant, "variant")->capture_default_str();
  sub->add_option("--arm", o->arm, "qed arm")->capture_default_str();
  sub->add_option("--regime", o->regime, "input regime")->capture_default_str();
  sub->add_option("-B", o->B, "batch")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("-T", o->T, "tokens")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("-H", o->H, "heads")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  sub->add_option("-K", o->K, "key dim")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  sub->add_option("-V", o->V, "value dim")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  sub->add_option("--threads", o->run.threads, "worker threads (0: all cores)");
  sub->add_option("--repeats", o->repeats, "timed runs")->capture_default_str()->check(CLI::Range(1, 100));
  sub->add_flag("--backward", o->backward, "also run the backward pass (with do and dht)");
  sub->callback([o, &action] { action = [o] { return run_bench(*o); }; });
});

}  // namespace
}  // namespace qed::cli
