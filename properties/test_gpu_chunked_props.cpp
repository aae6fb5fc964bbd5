// Properties of the CUDA chunked forward beyond accuracy: state passing across calls (P2),
// packed sequences equal separate calls bit for bit, determinism, steep decays (g = -20 per step:
// finite and accurate) and alpha = 1, poisoned outputs fully overwritten, agreement with the
// CUDA recurrent kernel, the 8-warp state pass bitwise equal to the 4-warp one, the overlapped
// forward bitwise equal to the passes in series, argument checks, and mutants (one bf16 term on
// the state path; no element-wise path for steep decays; no wait for the prep pass's blobs) that
// the accuracy, decay and overlap checks must catch.
// Replay: QED_GPU_SEED=<seed> ./test_gpu_chunked_props --gtest_filter=<test>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "kernels/chunked_api.hpp"
#include "kernels/host_run.hpp"
#include "properties/test_gpu_chunked_support.hpp"

namespace {

using namespace qed;
using namespace qed::gpu_chunked;
using fixtures::Regime;

reference::Inputs<double> slice(const reference::Inputs<double>& in, int64_t t0, int64_t t1) {
  // Tokens [t0, t1) of a B = N dense case (no cu_seqlens).
  reference::Inputs<double> o = in;
  const auto& d = in.dims;
  o.dims.T = t1 - t0;
  auto cut = [&](const std::vector<double>& x, int64_t D) {
    if (x.empty()) return x;
    std::vector<double> y;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t i = 0; i < d.H * D; ++i) y.push_back(x[((b * d.T + t) * d.H) * D + i]);
    return y;
  };
  o.q = cut(in.q, d.K);
  o.k = cut(in.k, d.K);
  o.v = cut(in.v, d.V);
  o.g = cut(in.g, in.g.size() == static_cast<size_t>(d.B * d.T * d.H) ? 1 : d.K);
  o.b = cut(in.b, d.K);
  o.w = cut(in.w, d.V);
  o.beta = cut(in.beta, 1);
  return o;
}

// The comparisons of two forwards that must agree bit for bit: o, ht and every chunk state; and
// one forward (chunk states kept) under one setting of an environment knob.
bool same_bits(const kernels::ChunkedHostRun& a, const kernels::ChunkedHostRun& b) {
  return a.outputs.o == b.outputs.o && a.outputs.ht == b.outputs.ht && a.chunk_states == b.chunk_states;
}
// Where two forwards that should agree bit for bit differ: for o, ht and the chunk states, how
// many elements differ, the largest difference and the first differing index (NaN counts as a
// difference, so an element one side never wrote shows up here).
std::string bit_diff(const kernels::ChunkedHostRun& a, const kernels::ChunkedHostRun& b) {
  std::string r;
  auto one = [&](const char* name, const std::vector<double>& x, const std::vector<double>& y) {
    if (x.size() != y.size()) {
      r += std::string(" ") + name + ": sizes " + std::to_string(x.size()) + " and " + std::to_string(y.size()) + ";";
      return;
    }
    size_t n = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] == y[i]) continue;
      if (n++ == 0) first = i;
      const double d = std::abs(x[i] - y[i]);
      worst = std::isnan(d) || d > worst ? d : worst;
    }
    if (n)
      r += std::string(" ") + name + ": " + std::to_string(n) + " of " + std::to_string(x.size()) +
           " differ, largest " + std::to_string(worst) + ", first at " + std::to_string(first) + " (" +
           std::to_string(x[first]) + " vs " + std::to_string(y[first]) + ");";
  };
  one("o", a.outputs.o, b.outputs.o);
  one("ht", a.outputs.ht, b.outputs.ht);
  one("chunk states", a.chunk_states, b.chunk_states);
  return r;
}
kernels::ChunkedHostRun run_with(const reference::Inputs<double>& in, DType dt, const char* knob, const char* value) {
  ScopedEnv e(knob, value);
  return kernels::run_chunked(in, dt, true);
}

// The i-th problem of the state-pass comparisons over every variant and arm: K and V of 64 or 128
// (by i), packed sequences of 130, 0, 64, 1 and 305 tokens (0, 1, 3 and 5 chunks and a partial
// one), hard or mixed regime, h0.
fixtures::GenSpec state_pass_spec(Variant v, Arm a, int i, uint64_t seed) {
  fixtures::GenSpec g;
  g.variant = v;
  g.arm = a;
  g.dims = {1, 500, 2, i % 3 ? 128 : 64, i % 2 ? 128 : 64};
  g.seqlens = {130, 0, 64, 1, 305};
  g.regime = i % 2 ? Regime::hard : Regime::mixed;
  g.with_h0 = true;
  g.seed = seed;
  return g;
}

// P2: [0, tau) then [tau, T) from the first part's ht equals one run, for tau not a multiple of 64.
TEST(GpuChunkedProps, StatePassingAcrossCalls) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::fp32, DType::bf16}) {
    fixtures::GenSpec g;
    g.variant = Variant::qed;
    g.arm = Arm::full;
    g.dims = {2, 300, 2, 128, 64};
    g.regime = Regime::hard;
    g.lambda = 0.9;
    g.with_h0 = true;
    g.seed = base_seed() + 20;
    const auto whole = kernels::run_chunked(fixtures::generate(g), dt);
    const auto& in = whole.inputs;
    const int64_t tau = 137;
    const auto first = kernels::run_chunked(slice(in, 0, tau), dt);
    auto second_in = slice(in, tau, g.dims.T);
    second_in.h0 = first.outputs.ht;
    const auto second = kernels::run_chunked(second_in, dt);
    std::vector<double> o_cat;
    const int64_t row = g.dims.H * g.dims.V;
    for (int64_t b = 0; b < g.dims.B; ++b) {
      const auto* a = first.outputs.o.data() + b * tau * row;
      const auto* c = second.outputs.o.data() + b * (g.dims.T - tau) * row;
      o_cat.insert(o_cat.end(), a, a + tau * row);
      o_cat.insert(o_cat.end(), c, c + (g.dims.T - tau) * row);
    }
    const double eo = rel_err(o_cat, whole.outputs.o), eh = rel_err(second.outputs.ht, whole.outputs.ht);
    // bf16: o carries one bf16 rounding of Q̃ and M (about 3e-3 relF, MATH.md §10 chunkbf), and
    // moving the chunk boundaries changes which values are rounded, so two bf16 runs differ by
    // about that much in o; ht is accumulated in fp32 from split operands.
    const double to = dt == DType::fp32 ? 1e-5 : 1e-2, th = dt == DType::fp32 ? 1e-5 : 5e-4;
    std::printf("[P2] %s | o %.2e ht %.2e\n", describe(g, dt).c_str(), eo, eh);
    EXPECT_TRUE(eo <= to) << describe(g, dt) << ": split-run o differs by " << eo << " > " << to;
    EXPECT_TRUE(eh <= th) << describe(g, dt) << ": split-run ht differs by " << eh << " > " << th;
  }
}

// Chunks never straddle sequences: a packed call equals separate calls exactly, and two calls
// give identical bits (no atomics, fixed reduction orders).
TEST(GpuChunkedProps, PackedEqualsSeparateAndDeterministic) {
  REQUIRE_DEVICE();
  fixtures::GenSpec g;
  g.variant = Variant::qed;
  g.arm = Arm::rand;
  g.seqlens = {65, 0, 1, 128, 70};
  g.dims = {1, 264, 2, 64, 64};
  g.with_h0 = true;
  g.seed = base_seed() + 21;
  const auto packed = kernels::run_chunked(fixtures::generate(g), DType::bf16);
  const auto again = kernels::run_chunked(fixtures::generate(g), DType::bf16);
  EXPECT_TRUE(packed.outputs.o == again.outputs.o && packed.outputs.ht == again.outputs.ht)
      << describe(g, DType::bf16) << ": two identical calls differ";
  const auto& in = packed.inputs;
  const int64_t row = g.dims.H * g.dims.V, srow = g.dims.H * g.dims.K * g.dims.V;
  for (size_t n = 0; n + 1 < in.cu_seqlens.size(); ++n) {
    const int64_t a = in.cu_seqlens[n], b = in.cu_seqlens[n + 1];
    if (a == b) continue;
    reference::Inputs<double> one = slice(in, a, b);
    one.cu_seqlens.clear();
    one.h0.assign(in.h0.begin() + n * srow, in.h0.begin() + (n + 1) * srow);
    const auto sep = kernels::run_chunked(one, DType::bf16);
    const std::vector<double> po(packed.outputs.o.begin() + a * row, packed.outputs.o.begin() + b * row);
    const std::vector<double> ph(packed.outputs.ht.begin() + n * srow,
                                 packed.outputs.ht.begin() + (n + 1) * srow);
    EXPECT_TRUE(po == sep.outputs.o && ph == sep.outputs.ht)
        << describe(g, DType::bf16) << ": sequence " << n << " differs from its separate call";
  }
}

// The bf16 modes' prep pass runs eight warps per block; its four-warp launch
// (QEDCHECK_CHUNKED_PREP_WARPS=4, kept for side-by-side timing) does the same arithmetic in the
// same order, so both must agree bit for bit: every variant and arm, K = 64 and 128, varlen, both
// bf16 modes (the single-term mutant is the other mode). A wrong work split (a missing T/M tile,
// a W_a or W_z block computed twice or never) changes bits here even where it stays inside the
// accuracy tolerances.
TEST(GpuChunkedProps, PrepWarpSplitsAgreeBitwise) {
  REQUIRE_DEVICE();
  int i = 0;
  for (const auto& [v, a] : all_variants()) {
    for (const char* mode : {"", "single"}) {
      fixtures::GenSpec g;
      g.variant = v;
      g.arm = a;
      g.dims = {1, 300, 2, i % 2 ? 64 : 128, i % 3 ? 128 : 64};
      g.seqlens = {70, 0, 64, 166};
      g.regime = i % 2 ? Regime::hard : Regime::mixed;
      g.with_h0 = true;
      g.seed = base_seed() + 70 + static_cast<uint64_t>(i++);
      const auto in = fixtures::generate(g);
      ScopedEnv mutant("QEDCHECK_CHUNKED_MUTANT", mode);
      const auto eight = kernels::run_chunked(in, DType::bf16, true);
      const auto four = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_PREP_WARPS", "4");
      EXPECT_TRUE(all_finite(eight.outputs.o) && all_finite(eight.outputs.ht))
          << describe(g, DType::bf16) << " mode '" << mode << "': non-finite outputs";
      EXPECT_TRUE(same_bits(eight, four))
          << describe(g, DType::bf16) << " mode '" << mode << "': 8-warp and 4-warp prep differ (o "
          << rel_err(eight.outputs.o, four.outputs.o) << ", ht " << rel_err(eight.outputs.ht, four.outputs.ht)
          << ")";
    }
  }
}

// The state pass on eight warps (QEDCHECK_CHUNKED_STATE_WARPS=8, K = 128) gives every warp half
// the chunk rows and half the key channels of the four-warp launch (the default) but runs each output's mma chain
// in the same order, so the two must agree bit for bit: every variant and arm, V = 64 and 128,
// every value-tile width (QEDCHECK_CHUNKED_MT), both input dtypes and the single-term mode, varlen
// with an empty sequence and h0. A wrongly placed fragment (a K̂ or W_a slot of the other half, a
// Uᵀ half written over its neighbour) changes bits here.
TEST(GpuChunkedProps, StateWarpSplitsAgreeBitwise) {
  REQUIRE_DEVICE();
  int i = 0;
  for (const auto& [v, a] : all_variants()) {
    for (const char* mode : {"", "single", "fp32"}) {
      const DType dt = std::string(mode) == "fp32" ? DType::fp32 : DType::bf16;
      fixtures::GenSpec g;
      g.variant = v;
      g.arm = a;
      g.dims = {1, 300, 2, 128, i % 2 ? 128 : 64};
      g.seqlens = {70, 0, 64, 166};
      g.regime = i % 2 ? Regime::hard : Regime::mixed;
      g.with_h0 = true;
      g.seed = base_seed() + 170 + static_cast<uint64_t>(i++);
      const auto in = fixtures::generate(g);
      ScopedEnv mutant("QEDCHECK_CHUNKED_MUTANT", dt == DType::fp32 ? "" : mode);
      for (const char* mt : {"1", "2", "4"}) {
        if (dt == DType::fp32 && std::string(mt) == "4") continue;  // fp32 tiles are 32 columns at most
        ScopedEnv tile("QEDCHECK_CHUNKED_MT", mt);
        ScopedEnv load("QEDCHECK_CHUNKED_STATE_LOAD", "cpasync");  // the warp split alone
        const auto eight = run_with(in, dt, "QEDCHECK_CHUNKED_STATE_WARPS", "8");
        const auto four = run_with(in, dt, "QEDCHECK_CHUNKED_STATE_WARPS", "4");
        EXPECT_TRUE(all_finite(eight.outputs.o) && all_finite(eight.outputs.ht))
            << describe(g, dt) << " mode '" << mode << "' MT " << mt << ": non-finite outputs";
        EXPECT_TRUE(same_bits(eight, four))
            << describe(g, dt) << " mode '" << mode << "' MT " << mt << ": 8-warp and 4-warp state pass differ (o "
            << rel_err(eight.outputs.o, four.outputs.o) << ", ht " << rel_err(eight.outputs.ht, four.outputs.ht)
            << ")";
      }
    }
  }
}

// The state pass's fragments arrive by bulk copies on per-warp mbarriers (the default with four
// warps at K = 128) or by cp.async (QEDCHECK_CHUNKED_STATE_LOAD=bulk|cpasync): the same bytes in
// the same places, so the two must agree bit for bit: every variant and arm, K = 64 and 128 (four
// and, at K = 128, eight warps), V = 64 and 128, every tile width, bf16, the single-term mode and
// fp32, varlen with sequences of 0, 1, 3 and 5 chunks and h0. A
// segment placed wrongly, a byte count that lets a warp read before its copy lands, or a parity
// off by one changes bits here. Its mutant (the chunk decay never loaded) must differ.
TEST(GpuChunkedProps, StateLoadPathsAgreeBitwise) {
  REQUIRE_DEVICE();
  int i = 0;
  for (const auto& [v, a] : all_variants()) {
    for (const char* mode : {"", "single", "fp32"}) {
      const DType dt = std::string(mode) == "fp32" ? DType::fp32 : DType::bf16;
      const auto g = state_pass_spec(v, a, i, base_seed() + 270 + static_cast<uint64_t>(i));
      ++i;
      const auto in = fixtures::generate(g);
      ScopedEnv mutant("QEDCHECK_CHUNKED_MUTANT", dt == DType::fp32 ? "" : mode);
      for (const char* mt : {"1", "2", "4"}) {
        if (dt == DType::fp32 && std::string(mt) == "4") continue;  // fp32 tiles are 32 columns at most
        ScopedEnv tile("QEDCHECK_CHUNKED_MT", mt);
        for (const char* nw : {"4", "8"}) {
          if (g.dims.K != 128 && std::string(nw) == "8") continue;  // eight warps only at K = 128
          ScopedEnv warps("QEDCHECK_CHUNKED_STATE_WARPS", nw);
          const auto bulk = run_with(in, dt, "QEDCHECK_CHUNKED_STATE_LOAD", "bulk");
          const auto cp = run_with(in, dt, "QEDCHECK_CHUNKED_STATE_LOAD", "cpasync");
          EXPECT_TRUE(all_finite(bulk.outputs.o) && all_finite(bulk.outputs.ht))
              << describe(g, dt) << " mode '" << mode << "' MT " << mt << " warps " << nw << ": non-finite outputs";
          EXPECT_TRUE(same_bits(bulk, cp))
              << describe(g, dt) << " mode '" << mode << "' MT " << mt << " warps " << nw
              << ": bulk-copy and cp.async state pass differ (o " << rel_err(bulk.outputs.o, cp.outputs.o)
              << ", ht " << rel_err(bulk.outputs.ht, cp.outputs.ht) << ")";
        }
      }
    }
  }
  // Mutation check: the same comparison must see the missing decay.
  fixtures::GenSpec g;
  g.variant = Variant::qed;
  g.arm = Arm::full;
  g.dims = {1, 500, 2, 128, 128};
  g.seqlens = {130, 0, 64, 1, 305};
  g.seed = base_seed() + 299;
  const auto in = fixtures::generate(g);
  kernels::ChunkedHostRun cp, bad;
  {
    ScopedEnv load("QEDCHECK_CHUNKED_STATE_LOAD", "cpasync");
    cp = kernels::run_chunked(in, DType::bf16, true);
  }
  {
    ScopedEnv load("QEDCHECK_CHUNKED_STATE_LOAD", "bulk");
    ScopedEnv mutant("QEDCHECK_CHUNKED_MUTANT", "bulkload");
    bad = kernels::run_chunked(in, DType::bf16, true);
  }
  EXPECT_FALSE(cp.outputs.o == bad.outputs.o && cp.outputs.ht == bad.outputs.ht)
      << "the bulkload mutant was not detected";
}

// The ILP instance of the state pass (one value tile, two-term bf16 products, K = 128; shorter
// dependent mma chains; the default, QEDCHECK_CHUNKED_STATE_ILP=0 the former instance): the same
// values as the former instance up to the order of fp32 additions, bitwise the same on four and
// eight warps, and really the default (its final states differ from the former's in the last bits).
TEST(GpuChunkedProps, StateIlpAgreesWithDefault) {
  REQUIRE_DEVICE();
  int i = 0, differs = 0;
  for (const auto& [v, a] : all_variants()) {
    fixtures::GenSpec g;
    g.variant = v;
    g.arm = a;
    g.dims = {1, 500, 2, 128, i % 2 ? 128 : 64};
    g.seqlens = {130, 0, 64, 1, 305};
    g.regime = i % 2 ? Regime::hard : Regime::mixed;
    g.with_h0 = true;
    g.seed = base_seed() + 330 + static_cast<uint64_t>(i++);
    const auto in = fixtures::generate(g);
    ScopedEnv tile("QEDCHECK_CHUNKED_MT", "1");
    for (const char* load : {"bulk", "cpasync"}) {
      ScopedEnv ld("QEDCHECK_CHUNKED_STATE_LOAD", load);
      kernels::ChunkedHostRun base, ilp4, ilp8;
      {
        ScopedEnv off("QEDCHECK_CHUNKED_STATE_ILP", "0");
        base = kernels::run_chunked(in, DType::bf16, true);
      }
      {
        ilp4 = kernels::run_chunked(in, DType::bf16, true);  // the default
        ScopedEnv warps("QEDCHECK_CHUNKED_STATE_WARPS", "8");
        ilp8 = kernels::run_chunked(in, DType::bf16, true);
      }
      const std::string what = describe(g, DType::bf16) + " load " + load;
      EXPECT_TRUE(same_bits(ilp4, ilp8))
          << what << ": the ILP pass differs between four and eight warps";
      // o is stored in bf16: a changed fp32 rounding moves an element by one bf16 step at most
      EXPECT_LT(rel_err(ilp4.outputs.o, base.outputs.o), 1e-3) << what;
      EXPECT_LT(rel_err(ilp4.outputs.ht, base.outputs.ht), 1e-5) << what;
      EXPECT_LT(rel_err(ilp4.chunk_states, base.chunk_states), 1e-5) << what;
      differs += ilp4.outputs.ht != base.outputs.ht;
    }
  }
  EXPECT_GT(differs, 0) << "the default state pass at one value tile is not the ILP instance";
  // Mutation check: the tolerance must see a state pass that drops the chunk decay.
  fixtures::GenSpec g;
  g.variant = Variant::gdn2;
  g.dims = {1, 500, 2, 128, 128};
  g.seqlens = {130, 0, 64, 1, 305};
  g.seed = base_seed() + 359;
  const auto in = fixtures::generate(g);
  ScopedEnv tile("QEDCHECK_CHUNKED_MT", "1");
  ScopedEnv ld("QEDCHECK_CHUNKED_STATE_LOAD", "bulk");
  kernels::ChunkedHostRun base;
  {
    ScopedEnv off("QEDCHECK_CHUNKED_STATE_ILP", "0");
    base = kernels::run_chunked(in, DType::bf16, true);
  }
  ScopedEnv mutant("QEDCHECK_CHUNKED_MUTANT", "bulkload");
  const auto bad = kernels::run_chunked(in, DType::bf16, true);
  EXPECT_GT(rel_err(bad.outputs.ht, base.outputs.ht), 1e-5) << "the bulkload mutant was not detected";
}

// The overlapped forward's test problems: packed (five sequences, one empty; V = 64 every other
// case) or dense (three sequences of 300), mixed and hard regimes in turn, h0 given.
fixtures::GenSpec overlap_case(Variant v, Arm a, bool packed, int i, uint64_t seed) {
  fixtures::GenSpec g;
  g.variant = v;
  g.arm = a;
  g.dims = packed ? reference::Dims{1, 500, 2, 128, i % 2 ? 128 : 64} : reference::Dims{3, 300, 2, 128, 128};
  if (packed) g.seqlens = {130, 0, 64, 1, 305};
  g.regime = i % 2 ? Regime::hard : Regime::mixed;
  g.with_h0 = true;
  g.seed = seed;
  return g;
}

// QED's training pair (bf16, packed, h0) run twice, under two settings of environment knobs
// (name, value pairs): whether every gradient and o agree bit for bit.
using Knobs = std::vector<std::pair<const char*, const char*>>;
bool training_pairs_agree(uint64_t seed, const Knobs& first, const Knobs& second) {
  fixtures::GenSpec g;
  g.variant = Variant::qed;
  g.arm = Arm::full;
  g.dims = {1, 300, 2, 128, 128};
  g.seqlens = {65, 0, 171, 64};
  g.with_h0 = true;
  g.seed = seed;
  const auto in = fixtures::generate(g);
  const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
  auto run = [&](const Knobs& knobs) {
    std::list<ScopedEnv> set;
    for (const auto& [name, value] : knobs) set.emplace_back(name, value);
    return kernels::run_chunked_training(in, cot, DType::bf16);
  };
  const auto a = run(first), b = run(second);
  return a.grads.dq == b.grads.dq && a.grads.dk == b.grads.dk && a.grads.dv == b.grads.dv &&
         a.grads.dg == b.grads.dg && a.grads.db == b.grads.db && a.grads.dw == b.grads.dw &&
         a.grads.dh0 == b.grads.dh0 && a.outputs.o == b.outputs.o;
}

// The training pair with its saving forward overlapped (and the knob `knob` set to `value`, if
// given) against the passes in series.
bool training_pair_overlap_agrees(uint64_t seed, const char* knob, const char* value) {
  Knobs overlapped{{"QEDCHECK_CHUNKED_OVERLAP", "1"}};
  if (knob) overlapped.emplace_back(knob, value);
  return training_pairs_agree(seed, {{"QEDCHECK_CHUNKED_OVERLAP", "0"}}, overlapped);
}

// The overlapped forward (the state pass launched beside a persistent prep pass, waiting on one
// flag per blob) against the passes one after the other: the same arithmetic in the same order,
// so bitwise equal, whether the prep pass takes the chunks in their order within each sequence
// (no cu_seqlens) or in global order (packed), at every tile width, both dtypes, and through the
// training pair's saving forward. Its mutant: MutantNoWaitIsCaught below.
TEST(GpuChunkedProps, OverlappedForwardAgreesBitwise) {
  REQUIRE_DEVICE();
  int i = 0;
  for (const auto& [v, a] : all_variants()) {
    for (const bool packed : {true, false}) {
      const fixtures::GenSpec g = overlap_case(v, a, packed, i, base_seed() + 370 + static_cast<uint64_t>(i));
      ++i;
      const auto in = fixtures::generate(g);
      for (const DType dt : {DType::bf16, DType::fp32}) {
        for (const char* mt : {"1", "2", "4"}) {
          if (dt == DType::fp32 && std::strcmp(mt, "4") == 0) continue;  // fp32 tiles: 1 and 2
          if (g.dims.V == 64 && std::strcmp(mt, "4") == 0) continue;
          ScopedEnv tile("QEDCHECK_CHUNKED_MT", mt);
          const auto serial = run_with(in, dt, "QEDCHECK_CHUNKED_OVERLAP", "0");
          const auto overlapped = run_with(in, dt, "QEDCHECK_CHUNKED_OVERLAP", "1");
          EXPECT_TRUE(same_bits(serial, overlapped))
              << describe(g, dt) << " MT " << mt << ": the overlapped forward differs from the serial one:"
              << bit_diff(serial, overlapped);
          EXPECT_TRUE(all_finite(overlapped.outputs.o) && all_finite(overlapped.outputs.ht)) << describe(g, dt);
        }
      }
    }
  }
  // the training pair (the saving forward writes the backward's blobs and U as well)
  EXPECT_TRUE(training_pair_overlap_agrees(base_seed() + 390, nullptr, nullptr))
      << "the training pair differs with the overlapped forward";
}

// The state pass's plan for a dense GDN-2 problem of B = 1, T = 64, H heads, K = V = 128 in dtype dt
// (host-side dummy pointers: the plan reads shapes and dtypes only).
kernels::ChunkedForwardPlan forward_plan(int64_t H, DType dt) {
  static std::vector<float> dummy(size_t{64} * 256 * 128);  // T = 64, up to 256 heads of 128 floats
  kernels::ChunkedForwardParams p;
  p.problem.variant = Variant::gdn2;
  p.problem.B = 1;
  p.problem.T = 64;
  p.problem.H = H;
  p.problem.K = 128;
  p.problem.V = 128;
  p.problem.scale = 0.088f;
  for (kernels::SeqTensor* t : {&p.in.q, &p.in.k, &p.in.v, &p.in.g, &p.in.b, &p.in.w})
    *t = kernels::seq_tensor(dummy.data(), dt, 64, H, 128);
  p.o = kernels::seq_tensor_out(dummy.data(), dt, 64, H, 128);
  kernels::ChunkedForwardPlan plan;
  const kernels::Status s = kernels::chunked_forward_plan(p, &plan);
  EXPECT_TRUE(s.ok()) << "H " << H << ": " << s.message;
  return plan;
}

// The plan: where four state warps would walk one 16-column tile (serial) but eight fill the
// machine with a wider tile, the bf16 forward takes the wider tile on eight warps (run 32:
// [2,16384,16,128] 1.846 ms against 1.948); fp32 inputs keep four. The default forward is then
// bitwise the forward with those knobs set and not the one-tile forward (the ILP instance, whose
// sums run in another order), so the plan is what runs. Where four warps would take 64 columns and
// fill the machine, eight take the 128-column tile instead (run 34: [8,4096,16,128] 1.661 ms
// against 1.776), from some head count on for every larger one. Mutation check: without the
// first rule no head count takes eight warps on a narrow tile and the ASSERT on `found` fails;
// without the second the ASSERT on `wide` fails.
TEST(GpuChunkedProps, PlanTakesEightWarpsWhereFourWalkOneTile) {
  REQUIRE_DEVICE();
  int64_t found = 0, wide = 0;
  for (int64_t H = 1; H <= 256; ++H) {
    kernels::ChunkedForwardPlan dflt = forward_plan(H, DType::bf16), four;
    {
      ScopedEnv w("QEDCHECK_CHUNKED_STATE_WARPS", "4");
      four = forward_plan(H, DType::bf16);
    }
    EXPECT_EQ(four.walking_warps, 4) << "H " << H;
    const bool one_tile = four.tile_columns == 16 && !four.overlapped;
    if (wide) {  // once the 128-column tile fills the machine, every larger head count takes it
      EXPECT_EQ(dflt.tile_columns, 128) << "H " << H << " (128 columns from H " << wide << ")";
    }
    if (dflt.tile_columns == 128) {
      // the 128-column tile (WideStateTileAgreesBitwise): eight warps, one tile a head, and only
      // where four warps would take 64 columns (as many blocks a multiprocessor as two of them)
      EXPECT_EQ(dflt.walking_warps, 8) << "H " << H;
      EXPECT_EQ(dflt.state_blocks, H) << "H " << H;
      EXPECT_FALSE(dflt.overlapped) << "H " << H;
      EXPECT_EQ(four.tile_columns, 64) << "H " << H;
      EXPECT_LT(forward_plan(H, DType::fp32).tile_columns, 128) << "H " << H << ": fp32 inputs";
      if (!wide) wide = H;
    } else if (dflt.walking_warps == 8 && !dflt.overlapped) {
      EXPECT_TRUE(one_tile) << "H " << H << ": eight warps where four would not walk one tile";
      EXPECT_GT(dflt.tile_columns, 16) << "H " << H;
      EXPECT_EQ(dflt.state_blocks, H * 128 / dflt.tile_columns) << "H " << H;
      const kernels::ChunkedForwardPlan f32 = forward_plan(H, DType::fp32);
      EXPECT_EQ(f32.walking_warps, 4) << "H " << H << ": fp32 inputs";
      if (!found) found = H;
    } else {
      EXPECT_EQ(dflt.tile_columns, four.tile_columns) << "H " << H;
      EXPECT_EQ(dflt.overlapped, four.overlapped) << "H " << H;
    }
  }
  ASSERT_GT(found, 0) << "no head count up to 256 takes eight state warps on a narrow tile";
  ASSERT_GT(wide, 0) << "no head count up to 256 takes the 128-column tile";
  fixtures::GenSpec g;
  g.variant = Variant::qed;
  g.arm = Arm::full;
  g.dims = {1, 130, found, 128, 128};
  g.with_h0 = true;
  g.seed = base_seed() + 475;
  const auto in = fixtures::generate(g);
  const kernels::ChunkedForwardPlan pl = forward_plan(found, DType::bf16);
  const std::string mt = std::to_string(pl.tile_columns / 16);
  const auto dflt = kernels::run_chunked(in, DType::bf16, true);
  kernels::ChunkedHostRun forced, one;
  {
    ScopedEnv tile("QEDCHECK_CHUNKED_MT", mt.c_str());
    forced = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_STATE_WARPS", "8");
  }
  one = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_STATE_WARPS", "4");
  EXPECT_TRUE(same_bits(dflt, forced)) << describe(g, DType::bf16) << " H " << found << ": the default differs from MT "
                                       << mt << " on eight warps:" << bit_diff(dflt, forced);
  EXPECT_FALSE(same_bits(dflt, one)) << describe(g, DType::bf16) << ": the default is the one-tile forward";
  EXPECT_TRUE(all_finite(dflt.outputs.o) && all_finite(dflt.outputs.ht)) << describe(g, DType::bf16);
}

// The 128-column state tile (QEDCHECK_CHUNKED_MT=8: bf16, K = V = 128, eight warps, one block a
// multiprocessor) keeps every output's mma chain in the 64-column tile's order (one accumulator
// set), so it must agree bit for bit with the default four-warp MT=4 forward: o, ht and every chunk
// state, for every variant and arm, packed sequences of 0, 1, 3 and 5 chunks with h0, by both load
// paths. The plan must say that the knob took effect (else the comparison would be the default
// against itself), and V = 64 or fp32 inputs must not take it. The two-column-tile forward (MT=2,
// two accumulator sets) rounds in another order: the comparison sees that difference, which shows
// it can fail.
TEST(GpuChunkedProps, WideStateTileAgreesBitwise) {
  REQUIRE_DEVICE();
  {
    ScopedEnv tile("QEDCHECK_CHUNKED_MT", "8");
    const kernels::ChunkedForwardPlan pl = forward_plan(16, DType::bf16);
    ASSERT_EQ(pl.tile_columns, 128) << "QEDCHECK_CHUNKED_MT=8 was not taken";
    EXPECT_EQ(pl.walking_warps, 8);
    EXPECT_EQ(pl.state_blocks, 16);
    EXPECT_FALSE(pl.overlapped);
    EXPECT_LT(forward_plan(16, DType::fp32).tile_columns, 128) << "fp32 inputs took the bf16-only tile";
  }
  int i = 0;
  for (const auto& [v, a] : all_variants()) {
    fixtures::GenSpec g;
    g.variant = v;
    g.arm = a;
    g.dims = {1, 500, 2, 128, 128};
    g.seqlens = {130, 0, 64, 1, 305};
    g.regime = i % 2 ? Regime::hard : Regime::mixed;
    g.with_h0 = true;
    g.seed = base_seed() + 560 + static_cast<uint64_t>(i++);
    const auto in = fixtures::generate(g);
    kernels::ChunkedHostRun ref;
    {
      ScopedEnv tile("QEDCHECK_CHUNKED_MT", "4");
      ref = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_STATE_WARPS", "4");
    }
    ScopedEnv tile("QEDCHECK_CHUNKED_MT", "8");
    for (const char* load : {"bulk", "cpasync"}) {
      const auto wide = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_STATE_LOAD", load);
      EXPECT_TRUE(all_finite(wide.outputs.o) && all_finite(wide.outputs.ht)) << describe(g, DType::bf16) << " " << load;
      EXPECT_TRUE(same_bits(wide, ref)) << describe(g, DType::bf16) << " loads " << load
                                        << ": 128-column and 64-column tiles differ:" << bit_diff(wide, ref);
    }
  }
  // Through the training pair: the saving forward's recompute on the wide tile, every gradient and
  // o bitwise those of the 64-column tile.
  EXPECT_TRUE(training_pairs_agree(base_seed() + 580,
                                   {{"QEDCHECK_CHUNKED_MT", "4"}, {"QEDCHECK_CHUNKED_STATE_WARPS", "4"}},
                                   {{"QEDCHECK_CHUNKED_MT", "8"}}))
      << "QED full, packed, h0: the training pair differs between the 128- and 64-column tiles";
  // V = 64 has no 128-column tile: the knob leaves the plan as it was.
  fixtures::GenSpec g;
  g.variant = Variant::qed;
  g.arm = Arm::full;
  g.dims = {1, 200, 2, 128, 64};
  g.with_h0 = true;
  g.seed = base_seed() + 590;
  const auto in64 = fixtures::generate(g);
  const auto dflt64 = kernels::run_chunked(in64, DType::bf16, true);
  EXPECT_TRUE(same_bits(run_with(in64, DType::bf16, "QEDCHECK_CHUNKED_MT", "8"), dflt64)) << describe(g, DType::bf16);
  // Sensitivity: another summation order (MT=2) must show up in the same comparison.
  g.dims.V = 128;
  const auto in = fixtures::generate(g);
  kernels::ChunkedHostRun wide, two;
  {
    ScopedEnv tile("QEDCHECK_CHUNKED_MT", "8");
    wide = kernels::run_chunked(in, DType::bf16, true);
  }
  two = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_MT", "2");
  EXPECT_FALSE(same_bits(wide, two)) << describe(g, DType::bf16) << ": MT=8 and MT=2 agree bit for bit";
}

// The overlapped forward's state pass with read-out warps (the SPLIT instance, its default for
// bf16 at one value tile: four walking warps carry the state and U, four more form o one chunk
// behind them) against the passes one after the other: the read-out's products in the same order
// and the decay's multiply kept apart from the add after it (run 28: fused into one FFMA in the
// walkers, the states differed in their last bits), so bitwise equal, for every variant and arm,
// packed and dense, V = 128 and 64, and through the training pair's saving forward; the same for
// the eight-warp instance that QEDCHECK_CHUNKED_STATE_SPLIT=0 keeps. Mutation check: read-out
// warps that read the other chunk's copies of the state and U (=splitparity) must be caught, which
// also shows that the instance really ran.
TEST(GpuChunkedProps, SplitReadOutAgreesBitwise) {
  REQUIRE_DEVICE();
  ScopedEnv tile("QEDCHECK_CHUNKED_MT", "1");
  int i = 0;
  for (const auto& [v, a] : all_variants()) {
    for (const bool packed : {true, false}) {
      const fixtures::GenSpec g = overlap_case(v, a, packed, i, base_seed() + 395 + static_cast<uint64_t>(i));
      ++i;
      const auto in = fixtures::generate(g);
      const auto serial = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_OVERLAP", "0");
      ScopedEnv on("QEDCHECK_CHUNKED_OVERLAP", "1");
      const auto split = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_STATE_SPLIT", "1");
      EXPECT_TRUE(same_bits(serial, split)) << describe(g, DType::bf16) << ": the read-out warps differ:"
                                            << bit_diff(serial, split);
      EXPECT_TRUE(all_finite(split.outputs.o)) << describe(g, DType::bf16);
      // and the eight-warp instance the overlapped forward takes with the knob off
      const auto eight = run_with(in, DType::bf16, "QEDCHECK_CHUNKED_STATE_SPLIT", "0");
      EXPECT_TRUE(same_bits(serial, eight)) << describe(g, DType::bf16) << ": the eight-warp overlapped pass differs:"
                                            << bit_diff(serial, eight);
    }
  }
  EXPECT_TRUE(training_pair_overlap_agrees(base_seed() + 420, "QEDCHECK_CHUNKED_STATE_SPLIT", "1"))
      << "the training pair differs with the read-out warps";
  EXPECT_TRUE(training_pair_overlap_agrees(base_seed() + 422, "QEDCHECK_CHUNKED_STATE_SPLIT", "0"))
      << "the training pair differs with the eight-warp overlapped instance";
  fixtures::GenSpec g;
  g.variant = Variant::gdn2;
  g.dims = {1, 700, 2, 128, 128};
  g.with_h0 = true;
  g.seed = base_seed() + 421;
  const auto in = fixtures::generate(g);
  ScopedEnv on("QEDCHECK_CHUNKED_OVERLAP", "1");
  ScopedEnv sp("QEDCHECK_CHUNKED_STATE_SPLIT", "1");
  const auto good = kernels::run_chunked(in, DType::bf16, false);
  ScopedEnv mutant("QEDCHECK_CHUNKED_MUTANT", "splitparity");
  const auto bad = kernels::run_chunked(in, DType::bf16, false);
  EXPECT_FALSE(bad.outputs.o == good.outputs.o) << "the splitparity mutant was not detected";
  EXPECT_TRUE(bad.outputs.ht == good.outputs.ht) << "the splitparity mutant changed the state (only o should move)";
}

// Mutation check of the overlapped forward's hand-over: without the wait the state pass reads
// blobs the prep pass has not written yet (the workspace is NaN-poisoned). Only while the passes
// really overlap: under compute-sanitizer or a profiler the state pass starts after the prep pass
// and the mutant is harmless, so this test is not in the sanitized subsets.
TEST(GpuChunkedProps, MutantNoWaitIsCaught) {
  REQUIRE_DEVICE();
  fixtures::GenSpec g;
  g.variant = Variant::gdn2;
  g.dims = {1, 4096, 2, 128, 128};
  g.seed = base_seed() + 391;
  const auto in = fixtures::generate(g);
  ScopedEnv on("QEDCHECK_CHUNKED_OVERLAP", "1");
  const auto good = kernels::run_chunked(in, DType::bf16, false);
  ScopedEnv mutant("QEDCHECK_CHUNKED_MUTANT", "nowait");
  const auto bad = kernels::run_chunked(in, DType::bf16, false);
  EXPECT_FALSE(bad.outputs.o == good.outputs.o && bad.outputs.ht == good.outputs.ht)
      << "the nowait mutant was not detected (under a sanitizer or profiler it cannot be)";
}

fixtures::GenSpec steep(Variant v, Arm a, uint64_t seed) {
  fixtures::GenSpec g;
  g.variant = v;
  g.arm = a;
  g.dims = {1, 200, 2, 128, 128};
  g.lambda = 1.0;
  g.with_h0 = true;
  g.seed = seed;
  return g;
}

// g = -20 on every step and channel, or uniform in [-20, 0]: no overflow, no NaN, and the usual
// accuracy; g = 0 exactly (alpha = 1) is the a1b1 regime of test_gpu_chunked.
Result run_steep(const fixtures::GenSpec& g, DType dt, bool uniform) {
  auto in = fixtures::generate(g);
  fixtures::Rng rng(g.seed + 99);
  for (auto& x : in.g) x = uniform ? -20.0 * rng.uniform() : -20.0;
  Result r;
  r.gpu = kernels::run_chunked(in, dt);
  r.ref = reference::recurrent_forward(r.gpu.inputs);
  r.eo = rel_err(r.gpu.outputs.o, r.ref.o);
  r.eht = rel_err(r.gpu.outputs.ht, r.ref.ht);
  return r;
}

TEST(GpuChunkedProps, SteepDecaysStayFiniteAndAccurate) {
  REQUIRE_DEVICE();
  int i = 0;
  for (auto [v, a] : std::vector<std::pair<Variant, Arm>>{{Variant::gdn2, Arm::none},
                                                         {Variant::qed, Arm::full}})
    for (DType dt : {DType::fp32, DType::bf16})
      for (bool uniform : {false, true}) {
        const auto g = steep(v, a, base_seed() + 30 + static_cast<uint64_t>(i++));
        const Result r = run_steep(g, dt, uniform);
        const double to = dt == DType::fp32 ? 1e-5 : 1.5e-2, th = dt == DType::fp32 ? 1e-5 : 2.4e-4;
        std::printf("[steep %s] %s | o %.2e ht %.2e\n", uniform ? "uniform" : "-20",
                    describe(g, dt).c_str(), r.eo, r.eht);
        EXPECT_TRUE(all_finite(r.gpu.outputs.o) && all_finite(r.gpu.outputs.ht)) << describe(g, dt);
        EXPECT_TRUE(r.eo <= to) << describe(g, dt) << ": relF(o) = " << r.eo;
        EXPECT_TRUE(r.eht <= th) << describe(g, dt) << ": relF(ht) = " << r.eht;
      }
}

TEST(GpuChunkedProps, PoisonedOutputsFullyOverwritten) {
  REQUIRE_DEVICE();
  for (DType out : {DType::fp32, DType::bf16}) {
    fixtures::GenSpec g;
    g.variant = Variant::kda;
    g.seqlens = {0, 3, 64, 0, 129, 1};
    g.dims = {1, 197, 3, 128, 128};
    g.seed = base_seed() + 40;
    const auto r = kernels::run_chunked(fixtures::generate(g), DType::bf16, true, out);
    EXPECT_TRUE(all_finite(r.outputs.o)) << describe(g, DType::bf16) << ": o has unwritten elements";
    EXPECT_TRUE(all_finite(r.outputs.ht)) << describe(g, DType::bf16) << ": ht has unwritten elements";
    EXPECT_TRUE(all_finite(r.chunk_states)) << describe(g, DType::bf16) << ": chunk states unwritten";
  }
}

TEST(GpuChunkedProps, AgreesWithRecurrentKernel) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::fp32, DType::bf16}) {
    fixtures::GenSpec g;
    g.variant = Variant::qed;
    g.arm = Arm::nogate_noproj;
    g.dims = {2, 333, 2, 128, 128};
    g.regime = Regime::mixed;
    g.with_h0 = true;
    g.seed = base_seed() + 50;
    const auto in = fixtures::generate(g);
    const auto c = kernels::run_chunked(in, dt);
    const auto rr = kernels::run_recurrent(in, nullptr, dt);
    const double eo = rel_err(c.outputs.o, rr.outputs.o), eh = rel_err(c.outputs.ht, rr.outputs.ht);
    const double tol = dt == DType::fp32 ? 1e-5 : 2e-2;
    std::printf("[vs cuda-recurrent] %s | o %.2e ht %.2e\n", describe(g, dt).c_str(), eo, eh);
    EXPECT_TRUE(eo <= tol) << describe(g, dt) << ": chunked vs recurrent kernel o " << eo;
    EXPECT_TRUE(eh <= (dt == DType::fp32 ? 1e-5 : 5e-4)) << describe(g, dt) << ": ht " << eh;
  }
}

TEST(GpuChunkedProps, ArgumentChecks) {
  // Validation runs before any device work, so this needs no GPU.
  kernels::ChunkedForwardParams p;
  p.problem.B = 1;
  p.problem.T = 64;
  p.problem.H = 1;
  p.problem.K = 32;
  p.problem.V = 64;
  alignas(16) static unsigned char dummy[64 * 64 * 4];
  p.in.q = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 32);
  p.in.k = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 32);
  p.in.v = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  p.in.g = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 32);
  p.in.b = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 32);
  p.in.w = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  p.o = kernels::seq_tensor_out(dummy, DType::bf16, 64, 1, 64);
  size_t bytes = 0;
  kernels::Status s = kernels::chunked_forward_workspace(p, &bytes);
  EXPECT_EQ(s.code, kernels::StatusCode::unsupported) << s.message;
  EXPECT_NE(s.message.find("K = 32"), std::string::npos) << s.message;
  p.problem.K = 64;
  p.in.q = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  p.in.k = kernels::seq_tensor(dummy, DType::fp32, 64, 1, 64);
  p.in.g = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  p.in.b = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  s = kernels::chunked_forward_workspace(p, &bytes);
  EXPECT_EQ(s.code, kernels::StatusCode::invalid_argument) << s.message;
  EXPECT_NE(s.message.find("k dtype"), std::string::npos) << s.message;
  p.in.k = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  s = kernels::chunked_forward_workspace(p, &bytes);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_GT(bytes, 0u);
}

// Mutants: the accuracy and steep-decay checks above must fail on these kernels.
TEST(GpuChunkedProps, MutantSingleBf16TermFailsHtTolerance) {
  REQUIRE_DEVICE();
  ScopedEnv env("QEDCHECK_CHUNKED_MUTANT", "single");
  fixtures::GenSpec g;
  g.variant = Variant::gdn2;
  g.dims = {1, quick() ? 1000 : 2000, 2, 128, 128};
  g.regime = Regime::hard;
  g.seed = base_seed() + 60;
  const Result r = run_case(g, DType::bf16, false);
  std::printf("[mutant single] %s | o %.2e ht %.2e\n", describe(g, DType::bf16).c_str(), r.eo, r.eht);
  EXPECT_GT(r.eht, 5.2e-4) << "the single-term mutant passes the ht tolerance: the check is too weak";
}

TEST(GpuChunkedProps, MutantNoSteepDecayFallbackIsCaught) {
  REQUIRE_DEVICE();
  ScopedEnv env("QEDCHECK_CHUNKED_MUTANT", "nofallback");
  const auto g = steep(Variant::gdn2, Arm::none, base_seed() + 61);
  const Result r = run_steep(g, DType::fp32, false);
  std::printf("[mutant nofallback] %s | o %.2e ht %.2e\n", describe(g, DType::fp32).c_str(), r.eo,
              r.eht);
  EXPECT_FALSE(all_finite(r.gpu.outputs.o) && r.eo <= 1e-5)
      << "the no-fallback mutant passes the steep-decay check";
}

}  // namespace
