// `qedcheck generate -o OUT.h5 ...`: writes a deterministic random case (MATH.md §10 regimes or
// the property-test distribution) with optional varlen packing, h0 and cotangents. The same
// options and seed give the same file contents on every machine.
#include <fmt/format.h>

#include <memory>
#include <numeric>
#include <unistd.h>

#include "cli/output_path.hpp"
#include "cli/verbs.hpp"
#include "fixtures/case.hpp"
#include "fixtures/generate.hpp"

namespace qed::cli {
namespace {

struct GenerateCli {
  std::string output, variant = "qed", arm = "full", regime = "std";
  int64_t B = 1, T = 64, H = 2, K = 16, V = 16;
  uint64_t seed = 0;
  double lambda = 0.7, scale = -1;
  bool raw_keys = false, h0 = false, cotangents = false, dht = false, force = false;
  std::vector<int64_t> seqlens;
};

int run_generate(const GenerateCli& o) {
  check_output_path(o.output, "", o.force);
  fixtures::GenSpec s;
  if (!reference::parse_variant(o.variant, s.variant))
    throw qed::Error("--variant '" + o.variant + "': expected gdn2, qed, kda, gdn or deltanet");
  if (s.variant == reference::Variant::qed && !reference::parse_arm(o.arm, s.arm))
    throw qed::Error("--arm '" + o.arm + "': expected full, nogate, nogate_noproj or rand");
  s.regime = fixtures::parse_regime(o.regime);
  s.dims = {o.B, o.T, o.H, o.K, o.V};
  s.seed = o.seed;
  s.lambda = o.lambda;
  s.scale = o.scale;
  s.unit_keys = !o.raw_keys;
  s.with_h0 = o.h0;
  s.seqlens = o.seqlens;
  if (!s.seqlens.empty()) {
    if (o.B != 1) throw qed::Error("--seqlens: packed sequences need -B 1");
    int64_t sum = std::accumulate(s.seqlens.begin(), s.seqlens.end(), int64_t{0});
    if (sum != o.T) throw qed::Error(fmt::format("--seqlens: lengths sum to {}, but T = {}", sum, o.T));
  }
  // Refuse sizes that cannot fit before allocating anything (inputs, cotangents and the copy the
  // writer makes: about 12 values per token and channel).
  const long double values = static_cast<long double>(o.B) * o.T * o.H * (6.0L * o.K + 6.0L * o.V);
  const long double bytes = values * 8.0L;
  const long double avail = static_cast<long double>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<long double>(::sysconf(_SC_PAGESIZE));
  if (bytes > avail)
    throw qed::Error(fmt::format("{}: B={} T={} H={} K={} V={} needs about {:.3g} GB, more than the "
                                 "{:.3g} GB of memory (rule: a case must fit in memory)",
                                 o.output, o.B, o.T, o.H, o.K, o.V, static_cast<double>(bytes / 1e9),
                                 static_cast<double>(avail / 1e9)));
  fixtures::Case c;
  c.inputs = fixtures::generate(s);
  if (o.cotangents || o.dht) c.cotangents = fixtures::generate_cotangents(c.inputs, o.seed, o.dht);
  c.producer = "qedcheck generate";
  fixtures::validate_case(c, o.output);
  fixtures::write_case(o.output, c);
  fmt::print("wrote {} ({}{}{}, regime {}, B={} T={} H={} K={} V={}, seed {})\n", o.output, o.variant,
             s.variant == reference::Variant::qed ? "/" : "",
             s.variant == reference::Variant::qed ? o.arm : "", o.regime, o.B, o.T, o.H, o.K, o.V,
             o.seed);
  return 0;
}

const RegisterVerb register_generate(5, [](CLI::App& app, Action& action) {
  auto o = std::make_shared<GenerateCli>();
  CLI::App* sub = app.add_subcommand("generate", "Write a deterministic random case file");
  sub->add_option("-o,--output", o->output, "case file to write")->required();
  sub->add_option("--variant", o->variant, "gdn2 | qed | kda | gdn | deltanet")->capture_default_str();
  sub->add_option("--arm", o->arm, "qed arm: full | nogate | nogate_noproj | rand")->capture_default_str();
  sub->add_option("--regime", o->regime, "prop | std | mixed | hard | a1b1 | hard_corr (MATH.md §9, §10)")
      ->capture_default_str();
  sub->add_option("-B", o->B, "batch")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("-T", o->T, "tokens")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("-H", o->H, "heads")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  sub->add_option("-K", o->K, "key dim")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  sub->add_option("-V", o->V, "value dim")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  sub->add_option("--seed", o->seed, "random seed")->capture_default_str();
  sub->add_option("--lambda", o->lambda, "qed: lambda of every head (prop regime draws it)")->capture_default_str();
  sub->add_option("--scale", o->scale, "read-out scale (default K^-1/2)");
  sub->add_option("--seqlens", o->seqlens, "packed sequence lengths (B must be 1; sum = T)")->delimiter(',');
  sub->add_flag("--raw-keys", o->raw_keys, "do not normalise q and k");
  sub->add_flag("--h0", o->h0, "add an initial state");
  sub->add_flag("--cotangents", o->cotangents, "add /cotangents/do");
  sub->add_flag("--dht", o->dht, "add /cotangents/do and /cotangents/dht");
  sub->add_flag("--force", o->force, "replace OUT if it exists");
  sub->callback([o, &action] { action = [o] { return run_generate(*o); }; });
});

}  // namespace
}  // namespace qed::cli
