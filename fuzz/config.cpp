#include "fuzz/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fixtures/generate.hpp"

namespace qed::fuzz {

using fixtures::Rng;
using reference::Arm;
using reference::Variant;

namespace {

uint64_t mix(uint64_t seed, uint64_t index) {  // splitmix64 of the pair
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t in_range(Rng& r, int64_t lo, int64_t hi) { return lo + r.below(hi - lo + 1); }

template <class T>
T pick(Rng& r, const std::vector<T>& xs) {
  return xs[static_cast<size_t>(r.below(static_cast<int64_t>(xs.size())))];
}

std::string bucket_T(int64_t T) {
  if (T == 1) return "1";
  if (T <= 16) return "2-16";
  if (T <= 256) return "17-256";
  if (T <= 4096) return "257-4096";
  return "4097-16384";
}

double default_work(const ImplSpec& spec) {
  const auto p = oracle_precision(spec);
  if (p.kind == reference::ScalarKind::f64) return 4e5;
  if (p.kind == reference::ScalarKind::f128) return 1e5;
  return 2e4;
}

}  // namespace

Config draw_config(uint64_t seed, int64_t index, const ImplSpec& spec, const DrawLimits& limits) {
  Rng r(mix(seed, static_cast<uint64_t>(index)));
  Config cfg;
  cfg.seed = seed;
  cfg.index = index;
  cfg.spec = spec;
  Classes& cls = cfg.classes;

  fixtures::GenSpec g;
  g.variant = pick(r, std::vector<Variant>{Variant::gdn2, Variant::qed, Variant::qed, Variant::kda,
                                           Variant::gdn, Variant::deltanet});
  if (g.variant == Variant::qed)
    g.arm = pick(r, std::vector<Arm>{Arm::full, Arm::nogate, Arm::nogate_noproj, Arm::rand});
  cls["variant"] = std::string(reference::to_string(g.variant)) +
                   (g.variant == Variant::qed ? "/" + std::string(reference::to_string(g.arm)) : "");

  // Shape class, then the work bound trims T.
  auto& d = g.dims;
  const double u = r.uniform();
  std::string shape;
  if (u < 0.25) {
    shape = "tiny";
    d = {in_range(r, 1, 2), in_range(r, 1, 8), in_range(r, 1, 3), in_range(r, 1, 5), in_range(r, 1, 5)};
  } else if (u < 0.55) {
    shape = "small";
    d = {in_range(r, 1, 3), in_range(r, 1, 64), in_range(r, 1, 4), in_range(r, 1, 17), in_range(r, 1, 17)};
  } else if (u < 0.70) {
    shape = "medium";
    d = {in_range(r, 1, 2), in_range(r, 65, 512), in_range(r, 1, 2), in_range(r, 1, 33), in_range(r, 1, 33)};
  } else if (u < 0.82) {
    shape = "long";
    const double lt = std::log(513.0) + r.uniform() * (std::log(static_cast<double>(limits.max_T)) - std::log(513.0));
    d = {1, static_cast<int64_t>(std::exp(lt)), in_range(r, 1, 2), in_range(r, 1, 4), in_range(r, 1, 4)};
  } else if (u < 0.90) {
    shape = "wide";
    d = {1, in_range(r, 1, 16), 1, in_range(r, 33, 80), in_range(r, 33, 80)};
  } else {
    shape = "many-heads";
    d = {in_range(r, 1, 2), in_range(r, 1, 32), in_range(r, 8, 32), in_range(r, 1, 8), in_range(r, 1, 8)};
  }
  if (r.uniform() < 0.5) d.K |= 1;  // odd dimensions are where tiling code breaks
  if (r.uniform() < 0.5) d.V |= 1;
  const bool cot = r.uniform() < 0.4;
  const double work = limits.work > 0 ? limits.work : default_work(spec);
  const double per_token = static_cast<double>(d.B * d.H * d.K * d.V) * (cot ? 3.0 : 1.0);
  d.T = std::max<int64_t>(1, std::min<int64_t>({d.T, limits.max_T, static_cast<int64_t>(work / per_token)}));
  cls["shape"] = shape;
  cls["T"] = bucket_T(d.T);
  cls["K,V parity"] = std::string(d.K % 2 ? "odd" : "even") + "," + (d.V % 2 ? "odd" : "even");
  cls["H"] = d.H == 1 ? "1" : d.H <= 4 ? "2-4" : "5-32";

  // Packed sequences, some of them empty.
  cls["varlen"] = "none";
  if (d.B == 1 && r.uniform() < 0.3) {
    const int64_t N = in_range(r, 1, 6);
    std::vector<int64_t> cuts = {0, d.T};
    for (int64_t i = 0; i + 1 < N; ++i) cuts.push_back(r.below(d.T + 1));
    if (N > 1 && r.uniform() < 0.3) cuts.push_back(cuts[2 + static_cast<size_t>(r.below(N - 1))]);
    std::sort(cuts.begin(), cuts.end());
    bool empty = false;
    for (size_t i = 1; i < cuts.size(); ++i) {
      g.seqlens.push_back(cuts[i] - cuts[i - 1]);
      empty = empty || g.seqlens.back() == 0;
    }
    cls["varlen"] = empty ? "packed+empty" : "packed";
  }

  g.regime = pick(r, std::vector<fixtures::Regime>{fixtures::Regime::prop, fixtures::Regime::std_,
                                                    fixtures::Regime::mixed, fixtures::Regime::hard,
                                                    fixtures::Regime::a1b1, fixtures::Regime::hard_corr});
  cls["regime"] = fixtures::to_string(g.regime);
  const double ku = r.uniform();
  g.unit_keys = ku < 0.6;
  const double key_gain = ku < 0.85 ? 1.0 : 3.0;  // raw keys with |k|^2 > 2: eigenvalues leave [-1, 1]
  std::string keys = g.unit_keys ? "unit" : key_gain > 1 ? "raw-large" : "raw";
  if (g.regime == fixtures::Regime::hard_corr) keys += "+correlated";

  // lambda: stable, at the edge, and unstable.
  const double lu = r.uniform();
  std::string lam_class = "none";
  double lam = 0;
  if (lu < 0.1) lam = 0, lam_class = "0";
  else if (lu < 0.6) lam = r.uniform(), lam_class = "(0,1)";
  else if (lu < 0.7) lam = 1, lam_class = "1";
  else if (lu < 0.85) lam = 1 + r.uniform(), lam_class = "(1,2) unstable";
  else lam = r.uniform() < 0.5 ? 3 : 10, lam_class = "3-10 unstable";
  g.lambda = lam;
  if (g.regime == fixtures::Regime::prop && lam_class != "(0,1)") g.regime = fixtures::Regime::std_;
  if (g.variant == Variant::qed) cls["lambda"] = lam_class;

  const double hu = r.uniform();
  g.with_h0 = hu < 0.6;
  const double h0_gain = hu < 0.4 ? 1.0 : 2000.0;
  cls["h0"] = !g.with_h0 ? "none" : h0_gain > 1 ? "large" : "normal";
  g.seed = r.next();
  g.scale = pick(r, std::vector<double>{-1, -1, -1, -1, 1.0, 0.125});

  fixtures::Case& c = cfg.c;
  c.inputs = fixtures::generate(g);
  auto& in = c.inputs;
  for (double& e : in.k) e *= key_gain;
  for (double& e : in.q) e *= key_gain;
  for (double& e : in.h0) e *= h0_gain;
  if (g.variant == Variant::qed && r.uniform() < 0.3) {  // per-head strengths
    for (double& e : in.lambda) e = lam * 2 * r.uniform();
    cls["lambda"] += " per-head";
  }

  // Gates at and near their limits.
  const std::vector<std::string> gate_modes = {"drawn", "drawn", "b,w at/near {0,1}", "g at/near 0",
                                               "g in {-20,-80,-150}", "alpha = 1, b = 1", "all edges"};
  const std::string gates = pick(r, gate_modes);
  cls["gates"] = gates;
  const double tiny = 0x1p-20;  // "near": survives float rounding, not bf16's
  auto edge01 = [&](std::vector<double>& x, double p) {
    for (double& e : x)
      if (r.uniform() < p) e = pick(r, std::vector<double>{0.0, 1.0, 0.0, 1.0, tiny, 1.0 - tiny});
  };
  auto gneg = [&](double p) {
    for (double& e : in.g)
      if (r.uniform() < p) e = pick(r, std::vector<double>{-20.0, -80.0, -150.0});
  };
  if (gates == "b,w at/near {0,1}" || gates == "all edges") {
    edge01(in.b, 0.5);
    edge01(in.w, 0.5);
    edge01(in.beta, 0.5);
  }
  if (gates == "g at/near 0" || gates == "all edges")
    for (double& e : in.g)
      if (r.uniform() < 0.5) e = r.uniform() < 0.7 ? 0.0 : -tiny;
  if (gates == "g in {-20,-80,-150}" || gates == "all edges") gneg(0.3);
  if (gates == "alpha = 1, b = 1") {
    std::fill(in.g.begin(), in.g.end(), 0.0);
    std::fill(in.b.begin(), in.b.end(), 1.0);
    std::fill(in.beta.begin(), in.beta.end(), 1.0);
  }

  // Key edits: zero keys (P_perp(0) convention) and q = +-k (nogate_noproj's unstable direction).
  const double eu = r.uniform();
  if (eu < 0.12) {
    for (size_t t = 0; t < in.k.size(); t += static_cast<size_t>(d.K))
      if (r.uniform() < 0.3) std::fill(in.k.begin() + static_cast<ptrdiff_t>(t), in.k.begin() + static_cast<ptrdiff_t>(t) + d.K, 0.0);
    keys += "+zero rows";
  } else if (eu < 0.24) {
    for (size_t t = 0; t < in.k.size(); t += static_cast<size_t>(d.K)) {
      const double s = r.uniform() < 0.5 ? 1.0 : -1.0;
      if (r.uniform() < 0.5)
        for (int64_t i = 0; i < d.K; ++i) in.q[t + static_cast<size_t>(i)] = s * in.k[t + static_cast<size_t>(i)];
    }
    keys += "+q=+-k";
  }
  cls["keys"] = keys;
  // Exponentially unstable: raw keys (|k|^2 > 2 puts the erase eigenvalue outside [-1, 1]),
  // lambda > 1, or nogate_noproj (its eigenvalue reaches 1 + lambda), MATH.md §8.2-8.3.
  const bool unstable = !g.unit_keys || lam > 1 ||
                        (g.variant == Variant::qed && g.arm == Arm::nogate_noproj && lam > 0);
  cls["stability"] = unstable ? "unstable" : "bounded";

  if (cot) {
    const bool dht = r.uniform() < 0.5;
    c.cotangents = fixtures::generate_cotangents(in, g.seed, dht);
    cls["grads"] = dht ? "do+dht" : "do";
  } else {
    cls["grads"] = "none";
  }
  round_case_to(c, case_dtype(spec));
  c.producer = fmt::format("qedcheck fuzz --seed {} config {}", seed, index);

  if (spec.draw_chunk) {
    // At most 64, the chunk of verify's twin: longer chunks are legitimately less accurate
    // (cumulative log-decays and the UT substitution over C rows; reports/fuzz/README.md), so
    // the twin rule would flag them. Fuzz a long chunk on purpose with --chunk N.
    const int64_t cap = std::min<int64_t>(d.T, 64);
    const std::vector<int64_t> chunks = {1, 2, 3, 5, 7, 16, 63, 64, cap, 1 + r.below(cap)};
    cfg.spec.run.chunk = std::max<int64_t>(1, pick(r, chunks));
    const int64_t C = cfg.spec.run.chunk;
    cls["chunk"] = C == 1 ? "1" : C < d.T ? (d.T % C ? "ragged" : "divides T") : "C >= T";
    cfg.spec.draw_chunk = false;  // this configuration's chunk is fixed now (and named in args())
  }
  try {
    fixtures::validate_case(c, "fuzz config");
  } catch (const qed::Error& e) {
    throw qed::Error(fmt::format("fuzz: seed {} config {} drew an invalid case (a fuzzer bug): {}", seed,
                                 index, e.what()));
  }
  return cfg;
}

}  // namespace qed::fuzz
