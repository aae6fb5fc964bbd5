// The CUDA chunked backward (kernels/chunked_api.hpp, chunked_backward) against the double
// recurrent reference on the exact inputs and cotangents the kernel consumed: every variant and
// QED arm, K, V in {64, 128}, T in {1, 63, 64, 65, 200, 1000, 4096}, varlen with empty
// sequences, h0 and dht present or absent, the MATH.md §10 regimes, g = -20; against the CUDA
// recurrent backward and against the host emulation of the same block functions on the GPU's
// own chunk states; bitwise determinism over three runs; the training pair (saved forward)
// against the recomputing backward; argument checks; mutants. bf16 inputs
// have two pipelines (kernels/chunked_api.hpp): these tests run the default one,
// BothPipelinesAllVariantsBf16 runs both, and QEDCHECK_CHUNKED_BWD_IMPL=v1|v2 in the environment
// picks one for every test of the file.
// Tolerance rule, per gradient X, relF(x, r) = ||x - r||_F / ||r||_F (NaN never passes):
//  fp32 inputs: relF(X) <= 8 max(relF_twin32(X), relF_rec32(X)) + 2e-6, twin32 = the float
//               chunked reference (C = 64, operands none), rec32 = the float recurrence, both
//               on the same inputs (the CPU test of the same functions passes 4x + 1e-6 with
//               reference chunk states; 8x + 2e-6 leaves room for the GPU forward's states and
//               expf, as test_gpu_chunked.cpp does for the forward).
//  bf16 inputs: relF(X) <= max(2 relF_twinbf16(X), fp32 bound), twinbf16 = the same twin with
//               every matmul operand rounded to bf16 (README default rule for bf16 candidates);
//               with bf16 inputs the kernel's products carry 16 bits (two bf16 terms per
//               operand), the rest is fp32.
// Replay: QED_GPU_SEED=<seed> ./test_gpu_chunked_backward --gtest_filter=<test>
#include <algorithm>
#include <cstring>
#include <optional>

#include "kernels/chunked_api.hpp"
#include "kernels/host_run.hpp"
#include "properties/test_chunked_backward_support.hpp"
#include "properties/test_gpu_chunked_support.hpp"

namespace {

using namespace qed;
using namespace qed::gpu_chunked;
namespace cbt = qed::chunked_bwd_test;
using fixtures::Regime;

constexpr double kFactor = 8.0, kFloor = 2e-6;

struct Judged {
  kernels::ChunkedHostRun gpu;
  std::vector<cbt::GradCheck> checks;
  bool ok = true;
};

Judged judge(const fixtures::GenSpec& g, DType dt, bool dht, bool expect = true) {
  Judged J;
  const auto in = fixtures::generate(g);
  const auto cot = fixtures::generate_cotangents(in, g.seed + 1, dht);
  J.gpu = kernels::run_chunked_grads(in, &cot, dt);
  const cbt::Refs R = cbt::references(J.gpu.inputs, J.gpu.cotangents);
  J.checks = cbt::check_grads(J.gpu.grads, R, kFactor, kFloor);
  std::vector<double> bf_err;
  if (dt == DType::bf16) {
    reference::ChunkOptions opt;
    opt.operands = reference::Operands::bf16;
    const auto t =
        reference::chunked_backward(reference::convert_inputs<float>(J.gpu.inputs),
                                    reference::convert_cotangents<float>(J.gpu.cotangents), opt);
    reference::Grads<double> td;
    td.dq = reference::convert<double>(t.dq), td.dk = reference::convert<double>(t.dk);
    td.dv = reference::convert<double>(t.dv), td.dg = reference::convert<double>(t.dg);
    td.db = reference::convert<double>(t.db), td.dw = reference::convert<double>(t.dw);
    td.dbeta = reference::convert<double>(t.dbeta),
    td.dlambda = reference::convert<double>(t.dlambda);
    td.dr = reference::convert<double>(t.dr), td.dh0 = reference::convert<double>(t.dh0);
    const auto ft = cbt::fields(td), fe = cbt::fields(R.exact);
    for (size_t i = 0; i < J.checks.size(); ++i)
      J.checks[i].bound = std::max(J.checks[i].bound, 2 * cbt::relF(*ft[i].second, *fe[i].second));
  }
  std::string line;
  char buf[96];
  for (const auto& c : J.checks) {
    std::snprintf(buf, sizeof buf, " %s %.1e(<=%.1e)", c.name.c_str(), c.err, c.bound);
    line += buf;
    J.ok = J.ok && c.ok();
    if (expect) {
      EXPECT_TRUE(c.ok()) << describe(g, dt) << " dht=" << dht << ": " << c.name
                          << " relF = " << c.err << " > " << c.bound << " (twin32 " << c.twin32
                          << ", rec32 " << c.rec32 << ")";
    }
  }
  std::printf("[%s] %s dht=%d |%s\n", dt == DType::fp32 ? "fp32" : "bf16", describe(g, dt).c_str(),
              dht, line.c_str());
  return J;
}

// The problem of the comparisons between two runs of the gradient pass below: one packed row of
// four sequences (one empty, none a whole number of chunks but one), two heads, K = V, h0.
fixtures::GenSpec packed_spec(Variant v, Arm a, int64_t K, uint64_t seed) {
  fixtures::GenSpec g;
  g.variant = v;
  g.arm = a;
  g.dims = {1, 300, 2, K, K};
  g.seqlens = {65, 0, 171, 64};
  g.with_h0 = true;
  g.seed = seed;
  return g;
}

TEST(GpuChunkedBackward, AllVariantsFp32) {
  REQUIRE_DEVICE();
  int i = 0;
  for (const auto& g : variant_sweep(base_seed() + 100)) judge(g, DType::fp32, i++ % 2 == 0);
}

TEST(GpuChunkedBackward, AllVariantsBf16) {
  REQUIRE_DEVICE();
  int i = 0;
  for (const auto& g : variant_sweep(base_seed() + 101)) judge(g, DType::bf16, i++ % 2 == 1);
}

// bf16 inputs have two pipelines (kernels/chunked_api.hpp); whichever is not the default runs here.
TEST(GpuChunkedBackward, BothPipelinesAllVariantsBf16) {
  REQUIRE_DEVICE();
  for (const char* impl : {"v1", "v2"}) {
    ScopedEnv env("QEDCHECK_CHUNKED_BWD_IMPL", impl);
    std::printf("[pipeline %s]\n", impl);
    int i = 0;
    for (const auto& g : variant_sweep(base_seed() + 105)) judge(g, DType::bf16, i++ % 2 == 0);
  }
}

TEST(GpuChunkedBackward, RegimesBf16T4096) {
  REQUIRE_DEVICE();
  for (const auto& g : regime_sweep(quick() ? 1000 : 4096, 1, base_seed() + 102))
    judge(g, DType::bf16, true);
}

TEST(GpuChunkedBackward, RegimesFp32T1000) {
  REQUIRE_DEVICE();
  for (const auto& g : regime_sweep(quick() ? 300 : 1000, 1, base_seed() + 103))
    judge(g, DType::fp32, false);
}

TEST(GpuChunkedBackward, SequenceLengthsWithAndWithoutDht) {
  REQUIRE_DEVICE();
  int i = 0;
  for (int64_t T : {1, 63, 64, 65, 1000, 4096}) {
    if (quick() && T > 1000) continue;
    fixtures::GenSpec g;
    g.variant = i % 2 ? Variant::qed : Variant::gdn2;
    g.arm = i % 2 ? Arm::full : Arm::none;
    g.dims = {2, T, 1, 128, 128};
    g.regime = Regime::std_;
    g.with_h0 = true;
    g.seed = base_seed() + 104 + static_cast<uint64_t>(i++);
    for (bool dht : {false, true}) {
      judge(g, DType::bf16, dht);
      judge(g, DType::fp32, dht);
    }
  }
}

// The kernels against the host emulation of the same block functions fed with the GPU forward's
// chunk states: only expf, fmaf contraction and (bf16 inputs) the products' 16-bit operands
// differ, so a larger gap (1e-5 with fp32 inputs, 1e-4 with bf16 ones) is a kernel plumbing bug
// (indexing, staging, synchronisation), not mathematics.
TEST(GpuChunkedBackward, MatchesHostEmulation) {
  REQUIRE_DEVICE();
  int i = 0;
  for (auto [v, a] : all_variants()) {
    fixtures::GenSpec g;
    g.variant = v;
    g.arm = a;
    g.dims = {1, 200, 2, 64, 128};
    g.seqlens = {70, 0, 130};
    g.with_h0 = true;
    g.lambda = 0.8;
    g.seed = base_seed() + 110 + static_cast<uint64_t>(i++);
    for (DType dt : {DType::fp32, DType::bf16}) {
      const auto in = fixtures::generate(g);
      const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
      const auto r = kernels::run_chunked_grads(in, &cot, dt, DType::fp32, true);
      cbt::EmulOptions eo;
      eo.bf16 = dt == DType::bf16;
      eo.chunk_states = &r.chunk_states;
      const auto em = cbt::emulate(r.inputs, r.cotangents, eo);
      const auto fg = cbt::fields(r.grads), fe = cbt::fields(em);
      ASSERT_EQ(fg.size(), fe.size());
      for (size_t j = 0; j < fg.size(); ++j) {
        const double e = cbt::relF(*fg[j].second, *fe[j].second), tol = dt == DType::bf16 ? 1e-4 : 1e-5;
        EXPECT_TRUE(e <= tol) << describe(g, dt) << ": " << fg[j].first
                               << " GPU vs host emulation relF " << e;
      }
    }
  }
}

TEST(GpuChunkedBackward, AgreesWithRecurrentKernel) {
  REQUIRE_DEVICE();
  for (DType dt : {DType::fp32, DType::bf16}) {
    fixtures::GenSpec g;
    g.variant = Variant::qed;
    g.arm = Arm::nogate;
    g.dims = {2, 333, 2, 128, 64};
    g.regime = Regime::mixed;
    g.with_h0 = true;
    g.seed = base_seed() + 120;
    const Judged J = judge(g, dt, true);
    const auto in = fixtures::generate(g);
    const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
    const auto rr = kernels::run_recurrent(in, &cot, dt);
    const cbt::Refs R = cbt::references(rr.inputs, rr.cotangents);
    const auto fc = cbt::fields(J.gpu.grads), fr = cbt::fields(rr.grads), fe = cbt::fields(R.exact);
    for (size_t j = 0; j < fc.size(); ++j) {
      const double e = cbt::relF(*fc[j].second, *fr[j].second);
      const double bound = J.checks[j].bound + cbt::relF(*fr[j].second, *fe[j].second) + kFloor;
      std::printf("[vs cuda-recurrent] %s %s: relF %.2e (bound %.2e)\n", describe(g, dt).c_str(),
                  fc[j].first.c_str(), e, bound);
      EXPECT_TRUE(e <= bound) << describe(g, dt) << ": " << fc[j].first
                              << " chunked vs recurrent kernel " << e;
    }
  }
}

TEST(GpuChunkedBackward, BitwiseDeterministicThreeRuns) {
  REQUIRE_DEVICE();
  fixtures::GenSpec g;
  g.variant = Variant::qed;
  g.arm = Arm::rand;
  g.seqlens = {65, 0, 1, 128, 70};
  g.dims = {1, 264, 2, 128, 128};
  g.with_h0 = true;
  g.seed = base_seed() + 130;
  const auto in = fixtures::generate(g);
  const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
  const auto a = kernels::run_chunked_grads(in, &cot, DType::bf16);
  for (int run = 1; run < 3; ++run) {
    const auto b = kernels::run_chunked_grads(in, &cot, DType::bf16);
    const auto fa = cbt::fields(a.grads), fb = cbt::fields(b.grads);
    for (size_t j = 0; j < fa.size(); ++j)
      EXPECT_TRUE(cbt::same_bits(*fa[j].second, *fb[j].second))
          << describe(g, DType::bf16) << ": " << fa[j].first << " differs between run 0 and run "
          << run;
  }
}

TEST(GpuChunkedBackward, SteepDecaysStayFiniteAndAccurate) {
  REQUIRE_DEVICE();
  int i = 0;
  for (auto [v, a] :
       std::vector<std::pair<Variant, Arm>>{{Variant::gdn2, Arm::none}, {Variant::qed, Arm::full}})
    for (DType dt : {DType::fp32, DType::bf16})
      for (bool uniform : {false, true}) {
        fixtures::GenSpec g;
        g.variant = v;
        g.arm = a;
        g.dims = {1, 200, 2, 128, 128};
        g.lambda = 1.0;
        g.with_h0 = true;
        g.seed = base_seed() + 140 + static_cast<uint64_t>(i++);
        auto in = fixtures::generate(g);
        fixtures::Rng rng(g.seed + 99);
        for (auto& x : in.g) x = uniform ? -20.0 * rng.uniform() : -20.0;
        const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
        const auto r = kernels::run_chunked_grads(in, &cot, dt);
        const auto checks =
            cbt::check_grads(r.grads, cbt::references(r.inputs, r.cotangents), kFactor, kFloor);
        for (const auto& c : checks) {
          EXPECT_TRUE(std::isfinite(c.err)) << describe(g, dt) << ": " << c.name << " not finite";
          // bf16: the forward's 16-bit chunk states; 1e-3 is far below a wrong term.
          const double bound = dt == DType::fp32 ? c.bound : std::max(c.bound, 1e-3);
          EXPECT_TRUE(c.err <= bound) << describe(g, dt) << (uniform ? " g~U[-20,0]" : " g=-20")
                                      << ": " << c.name << " relF = " << c.err << " > " << bound;
        }
      }
}

TEST(GpuChunkedBackward, PoisonedGradientsFullyOverwritten) {
  REQUIRE_DEVICE();
  for (auto [v, a] : all_variants()) {
    fixtures::GenSpec g;
    g.variant = v;
    g.arm = a;
    g.seqlens = {0, 3, 64, 0, 129, 1};
    g.dims = {1, 197, 2, 64, 64};
    g.seed = base_seed() + 150;
    const auto in = fixtures::generate(g);
    const auto cot = fixtures::generate_cotangents(in, g.seed + 1, false);
    const auto r = kernels::run_chunked_grads(in, &cot, DType::bf16, DType::bf16);
    for (const auto& [n, p] : cbt::fields(r.grads))
      EXPECT_TRUE(all_finite(*p)) << describe(g, DType::bf16) << ": " << n
                                  << " has unwritten elements";
  }
}

// The training pair (chunked_forward_saving, then chunked_backward with saved_forward): the same
// gradients, bit for bit, as the backward that recomputes, on every pipeline; o as the plain
// forward's (v2's saving forward reads out with the backward's two-term M, so o may differ in
// its last bf16 bits: relF <= 4e-3), ht the same. A stale saved workspace (the saving forward
// run on other inputs) must change the gradients: the comparison can fail.
TEST(GpuChunkedBackward, SavedForwardMatchesRecompute) {
  REQUIRE_DEVICE();
  struct Case {
    Variant v;
    Arm a;
    DType dt;
    const char* impl;
  };
  const Case cases[] = {{Variant::gdn2, Arm::none, DType::bf16, "v2"},
                        {Variant::qed, Arm::full, DType::bf16, "v2"},
                        {Variant::kda, Arm::none, DType::bf16, "v2"},
                        {Variant::qed, Arm::rand, DType::bf16, "v1"},
                        {Variant::gdn2, Arm::none, DType::fp32, "v1"}};
  int i = 0;
  for (const Case& c : cases) {
    ScopedEnv env("QEDCHECK_CHUNKED_BWD_IMPL", c.impl);
    fixtures::GenSpec g;
    g.variant = c.v;
    g.arm = c.a;
    g.dims = {1, 300, 2, 128, 128};
    g.seqlens = {65, 0, 171, 64};
    g.with_h0 = true;
    g.seed = base_seed() + 170 + static_cast<uint64_t>(i++);
    const auto in = fixtures::generate(g);
    const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
    const auto a = kernels::run_chunked_grads(in, &cot, c.dt);
    const auto b = kernels::run_chunked_training(in, cot, c.dt);
    const std::string what = describe(g, c.dt) + " " + c.impl;
    const auto fa = cbt::fields(a.grads), fb = cbt::fields(b.grads);
    ASSERT_EQ(fa.size(), fb.size());
    for (size_t j = 0; j < fa.size(); ++j)
      EXPECT_TRUE(cbt::same_bits(*fa[j].second, *fb[j].second))
          << what << ": " << fa[j].first << " differs between the saved and the recomputing backward";
    const double eo = cbt::relF(b.outputs.o, a.outputs.o), eh = cbt::relF(b.outputs.ht, a.outputs.ht);
    std::printf("[saved] %s | o relF %.2e, ht relF %.2e vs the plain forward\n", what.c_str(), eo, eh);
    EXPECT_TRUE(eo <= 4e-3) << what << ": saving forward's o relF " << eo << " from the plain forward's";
    EXPECT_TRUE(eh <= 1e-6) << what << ": saving forward's ht relF " << eh << " from the plain forward's";
    if (c.dt == DType::bf16 && std::strcmp(c.impl, "v2") == 0) {  // the stale workspace
      fixtures::GenSpec g2 = g;
      g2.seed += 1000;
      const auto other = fixtures::generate(g2);
      const auto s = kernels::run_chunked_training(in, cot, c.dt, DType::fp32, &other);
      const auto fs = cbt::fields(s.grads);
      double worst = 0;
      for (size_t j = 0; j < fa.size(); ++j) worst = std::max(worst, cbt::relF(*fs[j].second, *fa[j].second));
      EXPECT_GT(worst, 1e-2) << what << ": a stale saved workspace went unnoticed by the comparison";
    }
  }
}

// v2's gradient pass on eight or sixteen warps (QEDCHECK_CHUNKED_GRADS_WARPS): the same products
// in the same order, so every gradient agrees bit for bit, except where a per-token sum over channels
// enters (dbeta of the scalar-beta variants, QED's k.ā terms and dlambda), which sixteen warps add in
// 8-channel rather than 16-channel partials: there within relF 1e-6.
TEST(GpuChunkedBackward, GradsWarpSplitsAgree) {
  REQUIRE_DEVICE();
  ScopedEnv impl("QEDCHECK_CHUNKED_BWD_IMPL", "v2");
  int i = 0;
  for (auto [v, a] : all_variants()) {
    const fixtures::GenSpec g = packed_spec(v, a, 128, base_seed() + 180 + static_cast<uint64_t>(i++));
    const auto in = fixtures::generate(g);
    const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
    reference::Grads<double> w8, w16;
    {
      ScopedEnv w("QEDCHECK_CHUNKED_GRADS_WARPS", "8");
      w8 = kernels::run_chunked_grads(in, &cot, DType::bf16).grads;
    }
    {
      ScopedEnv w("QEDCHECK_CHUNKED_GRADS_WARPS", "16");
      w16 = kernels::run_chunked_grads(in, &cot, DType::bf16).grads;
    }
    // every variant but GDN-2 has one: dbeta (scalar beta: KDA, GDN, DeltaNet) or QED's k.ā, dlambda
    const bool sums = v != Variant::gdn2;
    const auto f8 = cbt::fields(w8), f16 = cbt::fields(w16);
    for (size_t j = 0; j < f8.size(); ++j) {
      const double e = cbt::relF(*f16[j].second, *f8[j].second);
      const bool same = cbt::same_bits(*f8[j].second, *f16[j].second);
      if (sums)
        EXPECT_TRUE(e <= 1e-6) << describe(g, DType::bf16) << ": " << f8[j].first << " 16 vs 8 warps relF " << e;
      else
        EXPECT_TRUE(same) << describe(g, DType::bf16) << ": " << f8[j].first
                          << " differs between 8 and 16 warps (relF " << e << ")";
    }
  }
}

// bf16 gradient outputs (what a bf16 training loop and the benchmark ask for; the accuracy tests
// above ask for fp32 ones): every variant and arm, K = 64 and 128, varlen, h0, dht. The kernel
// computes in fp32 and rounds at the store, so each bf16 gradient must be the fp32-output run's
// value rounded to nearest even, bit for bit (dlambda, dr, dh0 are fp32 in both: equal), except
// QED's projected arms' dq, dk, db, whose partial values are rounded once before the final pass
// adds the en terms of MATH.md §5.2: relF <= 1e-2 there. The check must see a wrong bf16 gradient:
// the khat mutant on the bf16 run alone must break it.
TEST(GpuChunkedBackward, Bf16GradientsAreRoundedFp32Gradients) {
  REQUIRE_DEVICE();
  ScopedEnv impl("QEDCHECK_CHUNKED_BWD_IMPL", "v2");
  // mismatches of b against f (see above); `rel` collects the relF of the exempt fields
  auto compare = [](const reference::Grads<double>& b, const reference::Grads<double>& f, bool projected,
                    std::string& what) {
    const auto fb = cbt::fields(b), ff = cbt::fields(f);
    size_t bad = fb.size() == ff.size() ? 0 : 1;
    for (size_t j = 0; j < fb.size() && j < ff.size(); ++j) {
      const std::string& n = fb[j].first;
      const auto &x = *fb[j].second, &y = *ff[j].second;
      if (n != ff[j].first || x.size() != y.size()) {
        ++bad, what += " " + n + ": shapes differ;";
        continue;
      }
      if (projected && (n == "dq" || n == "dk" || n == "db")) {
        const double e = cbt::relF(x, y);
        if (!(e <= 1e-2)) ++bad, what += " " + n + ": relF " + std::to_string(e) + ";";
        continue;
      }
      const bool wide = n == "dlambda" || n == "dr" || n == "dh0";
      size_t m = 0, first = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double want = wide ? y[i] : static_cast<double>(cbt::round_bf16(y[i]));
        if (!(x[i] == want) && m++ == 0) first = i;
      }
      if (m) bad += m, what += " " + n + ": " + std::to_string(m) + " elements differ (first at " + std::to_string(first) + ");";
    }
    return bad;
  };
  int i = 0;
  for (auto [v, a] : all_variants()) {
    for (int64_t K : {64, 128}) {
      const fixtures::GenSpec g = packed_spec(v, a, K, base_seed() + 200 + static_cast<uint64_t>(i++));
      const auto in = fixtures::generate(g);
      const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
      const auto f = kernels::run_chunked_grads(in, &cot, DType::bf16, DType::fp32).grads;
      const auto b = kernels::run_chunked_grads(in, &cot, DType::bf16, DType::bf16).grads;
      const bool projected = v == Variant::qed && a != Arm::nogate_noproj;
      std::string what;
      EXPECT_EQ(compare(b, f, projected, what), 0u) << describe(g, DType::bf16) << ":" << what;
      if (v == Variant::gdn2 && K == 128) {
        reference::Grads<double> m;
        {
          ScopedEnv mut("QEDCHECK_CHUNKED_BWD_MUTANT", "khat");
          m = kernels::run_chunked_grads(in, &cot, DType::bf16, DType::bf16).grads;
        }
        std::string w;
        EXPECT_GT(compare(m, f, false, w), 0u) << "the khat mutant's bf16 gradients pass as rounded fp32 ones";
      }
    }
  }
}

// QED's projected arms with bf16 gradients (what a bf16 training loop and the benchmark ask for):
// the gradient pass keeps the partial dq, dk, db of the slabs before the last in the registers of
// the thread that finishes them (GradArgs::hold) instead of storing and reading them back. The
// gradients must be bit for bit those of QEDCHECK_CHUNKED_GRADS_HOLD=0, and within bf16 rounding
// (relF <= 1e-2: the partial and the final value each rounded once) of the fp32-gradient run,
// which the oracle tests above judge and which never holds. The `hold` mutant (the slots not
// shifted along: two of the four slabs' partials lost at K = 128) must fail both.
TEST(GpuChunkedBackward, HeldPartialsAgreeBitwise) {
  REQUIRE_DEVICE();
  ScopedEnv impl("QEDCHECK_CHUNKED_BWD_IMPL", "v2");
  auto run = [](const reference::Inputs<double>& in, const reference::Cotangents<double>& cot,
                DType gdt, const char* hold, const char* mutant) {
    std::optional<ScopedEnv> h, m;
    if (hold) h.emplace("QEDCHECK_CHUNKED_GRADS_HOLD", hold);
    if (mutant) m.emplace("QEDCHECK_CHUNKED_BWD_MUTANT", mutant);
    return kernels::run_chunked_grads(in, &cot, DType::bf16, gdt).grads;
  };
  int i = 0;
  for (Arm a : {Arm::full, Arm::nogate, Arm::rand, Arm::nogate_noproj}) {
    for (int64_t K : {64, 128}) {
      const fixtures::GenSpec g = packed_spec(Variant::qed, a, K, base_seed() + 190 + static_cast<uint64_t>(i++));
      const auto in = fixtures::generate(g);
      const auto cot = fixtures::generate_cotangents(in, g.seed + 1, true);
      const auto held = run(in, cot, DType::bf16, nullptr, nullptr);
      const auto plain = run(in, cot, DType::bf16, "0", nullptr);
      const auto wide = run(in, cot, DType::fp32, nullptr, nullptr);
      const auto fh = cbt::fields(held), fp = cbt::fields(plain), fw = cbt::fields(wide);
      for (size_t j = 0; j < fh.size(); ++j) {
        const auto& x = *fh[j].second;
        EXPECT_TRUE(cbt::same_bits(x, *fp[j].second)) << describe(g, DType::bf16) << ": " << fh[j].first
                          << " differs with the partials held (relF " << cbt::relF(x, *fp[j].second) << ")";
        const double e = cbt::relF(x, *fw[j].second);
        EXPECT_TRUE(e <= 1e-2) << describe(g, DType::bf16) << ": " << fh[j].first
                               << " bf16 gradients against fp32 ones: relF " << e;
      }
      if (a == Arm::full && K == 128) {  // the mutant must be seen by both checks
        const auto mut = run(in, cot, DType::bf16, nullptr, "hold");
        const auto fm = cbt::fields(mut);
        bool differs = false, far = false;
        for (size_t j = 0; j < fm.size(); ++j) {
          differs = differs || !cbt::same_bits(*fm[j].second, *fp[j].second);
          far = far || !(cbt::relF(*fm[j].second, *fw[j].second) <= 1e-2);
        }
        EXPECT_TRUE(differs && far) << "the hold mutant is not caught (bitwise " << differs
                                    << ", against fp32 " << far << ")";
      }
    }
  }
}

TEST(GpuChunkedBackward, ArgumentChecks) {
  // Validation runs before any device work, so this needs no GPU.
  alignas(256) static unsigned char dummy[64 * 64 * 4];
  kernels::ChunkedBackwardParams p;
  p.problem.B = 1;
  p.problem.T = 64;
  p.problem.H = 1;
  p.problem.K = 32;
  p.problem.V = 64;
  auto set_k = [&](int64_t K) {
    p.problem.K = K;
    p.in.q = kernels::seq_tensor(dummy, DType::bf16, 64, 1, K);
    p.in.k = kernels::seq_tensor(dummy, DType::bf16, 64, 1, K);
    p.in.g = kernels::seq_tensor(dummy, DType::bf16, 64, 1, K);
    p.in.b = kernels::seq_tensor(dummy, DType::bf16, 64, 1, K);
    p.grads.dq = kernels::seq_tensor_out(dummy, DType::fp32, 64, 1, K);
    p.grads.dk = kernels::seq_tensor_out(dummy, DType::fp32, 64, 1, K);
    p.grads.dg = kernels::seq_tensor_out(dummy, DType::fp32, 64, 1, K);
    p.grads.db = kernels::seq_tensor_out(dummy, DType::fp32, 64, 1, K);
  };
  set_k(32);
  p.in.v = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  p.in.w = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  p.do_ = kernels::seq_tensor(dummy, DType::bf16, 64, 1, 64);
  p.grads.dv = kernels::seq_tensor_out(dummy, DType::fp32, 64, 1, 64);
  p.grads.dw = kernels::seq_tensor_out(dummy, DType::fp32, 64, 1, 64);
  p.grads.dh0 = kernels::state_tensor_out(reinterpret_cast<float*>(dummy), 1, 64, 64);
  size_t bytes = 0;
  kernels::Status s = kernels::chunked_backward_workspace(p, &bytes);
  EXPECT_EQ(s.code, kernels::StatusCode::unsupported) << s.message;
  EXPECT_EQ(s.message, "chunked_backward: K = 32 is not built (K must be 64 or 128)");
  set_k(64);
  s = kernels::chunked_backward_workspace(p, &bytes);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_GT(bytes, 0u);
  p.do_.dtype = DType::fp32;
  s = kernels::chunked_backward_workspace(p, &bytes);
  EXPECT_EQ(s.code, kernels::StatusCode::invalid_argument) << s.message;
  EXPECT_EQ(s.message,
            "chunked_backward: do_ dtype fp32 differs from q dtype bf16 (q, k, v, b, w, beta, do_ "
            "share one dtype)");
  p.do_.dtype = DType::bf16;
  p.grads.dv.dtype = DType::fp16;
  s = kernels::chunked_backward_workspace(p, &bytes);
  EXPECT_EQ(s.code, kernels::StatusCode::unsupported) << s.message;
  EXPECT_EQ(s.message, "chunked_backward: dv dtype fp16 (fp32 or bf16 only)");
  p.grads.dv.dtype = DType::fp32;
  p.do_.data = nullptr;
  s = kernels::chunked_backward_workspace(p, &bytes);
  EXPECT_EQ(s.message, "chunked_backward: do_ is required");
  p.do_.data = dummy;
  p.grads.dh0.data = nullptr;
  s = kernels::chunked_backward_workspace(p, &bytes);
  EXPECT_EQ(s.message, "chunked_backward: dh0 is required");
  p.grads.dh0.data = reinterpret_cast<float*>(dummy);
  p.saved_forward = true;
  s = kernels::chunked_backward(p);
  if (s.code != kernels::StatusCode::no_device) {
    EXPECT_EQ(s.message, "chunked_backward: saved_forward needs the workspace chunked_forward_saving "
                         "filled (workspace is nullptr)");
  }
  // The saving forward's own checks.
  kernels::ChunkedForwardParams f;
  f.problem = p.problem;
  f.in = p.in;
  f.o = kernels::seq_tensor_out(dummy, DType::bf16, 64, 1, 64);
  f.chunk_states = kernels::state_tensor_out(reinterpret_cast<float*>(dummy), 1, 64, 64);
  s = kernels::chunked_forward_saving(f, dummy, sizeof dummy);
  EXPECT_EQ(s.message, "chunked_forward_saving: chunk_states must be absent (the states stay in the "
                       "backward's workspace)");
  f.chunk_states = {};
  s = kernels::chunked_forward_saving(f, nullptr, 0);
  EXPECT_EQ(s.message, "chunked_forward_saving: bwd_workspace is nullptr");
  ASSERT_TRUE(kernels::chunked_forward_saving_workspace(f, &bytes).ok());
  s = kernels::chunked_forward_saving(f, dummy, bytes - 1);
  EXPECT_EQ(s.message, "chunked_forward_saving: bwd_workspace_bytes = " + std::to_string(bytes - 1) +
                           " is smaller than the " + std::to_string(bytes) +
                           " bytes chunked_backward_workspace asks for");
}

// A kernel without the K̂̄ term of k̄ must fail the accuracy rule.
TEST(GpuChunkedBackward, MutantIsCaught) {
  REQUIRE_DEVICE();
  ScopedEnv env("QEDCHECK_CHUNKED_BWD_MUTANT", "khat");
  fixtures::GenSpec g;
  g.variant = Variant::gdn2;
  g.dims = {1, 300, 1, 64, 64};
  g.regime = Regime::std_;
  g.seed = base_seed() + 160;
  const Judged J = judge(g, DType::fp32, true, false);
  EXPECT_FALSE(J.ok) << "the khat mutant passes the tolerance rule: the check is too weak";
}

// The same for the bf16 pipeline v2 (kernels/chunked_bwd_grads.cu): without the K̂̄ term of k̄, or
// without ρ in the decay gradient, it must fail the bf16 rule. ρ enters ḡ scaled by the chunk's
// whole decay, e^-45 or so in the std regime, so that mutant runs with slow decays.
TEST(GpuChunkedBackward, MutantsAreCaughtBf16) {
  REQUIRE_DEVICE();
  ScopedEnv impl("QEDCHECK_CHUNKED_BWD_IMPL", "v2");
  for (const char* m : {"khat", "rho"}) {
    ScopedEnv env("QEDCHECK_CHUNKED_BWD_MUTANT", m);
    fixtures::GenSpec g;
    g.variant = Variant::gdn2;
    g.dims = {1, 300, 1, 128, 128};
    g.regime = std::strcmp(m, "rho") == 0 ? Regime::hard : Regime::std_;
    g.seed = base_seed() + 161;
    const Judged J = judge(g, DType::bf16, true, false);
    EXPECT_FALSE(J.ok) << "the " << m << " mutant passes the bf16 tolerance rule: the check is too weak";
  }
}

}  // namespace
