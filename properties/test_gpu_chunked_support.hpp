// Shared pieces of the CUDA chunked-forward tests: case description, references on the exact
// inputs the kernel consumed, relative Frobenius errors, the device guard and the seed.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fixtures/generate.hpp"
#include "kernels/chunked_host.hpp"
#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"

namespace qed::gpu_chunked {

using kernels::DType;
using reference::Arm;
using reference::Variant;

#define REQUIRE_DEVICE()                                                      \
  do {                                                                        \
    const qed::kernels::Status st_ = qed::kernels::device_status();           \
    if (!st_.ok()) GTEST_SKIP() << "skipped, no usable GPU: " << st_.message; \
  } while (0)

inline uint64_t base_seed() {
  const char* s = std::getenv("QED_GPU_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20250101ull;
}
// QED_GPU_QUICK set to anything but "" or "0" trims the sweeps (T = 4096 -> 1000, ...).
inline bool quick() {
  const char* q = std::getenv("QED_GPU_QUICK");
  return q && *q && std::string(q) != "0";
}

// ||x - r||_F / ||r||_F; NaN anywhere (an unwritten, poisoned element) gives NaN, which fails
// every `<=` check.
inline double rel_err(const std::vector<double>& x, const std::vector<double>& r) {
  if (x.size() != r.size()) return NAN;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - r[i]) * (x[i] - r[i]);
    den += r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

inline std::string describe(const fixtures::GenSpec& g, DType dt) {
  char buf[320];
  std::string lens;
  for (int64_t l : g.seqlens) lens += std::to_string(l) + ",";
  std::snprintf(buf, sizeof buf,
                "%s/%s B=%lld T=%lld H=%lld K=%lld V=%lld regime=%s lambda=%.2f h0=%d seqlens=[%s] "
                "%s seed=%llu",
                std::string(reference::to_string(g.variant)).c_str(),
                std::string(reference::to_string(g.arm)).c_str(), (long long)g.dims.B,
                (long long)g.dims.T, (long long)g.dims.H, (long long)g.dims.K, (long long)g.dims.V,
                fixtures::to_string(g.regime).c_str(), g.lambda, g.with_h0, lens.c_str(),
                kernels::to_string(dt), (unsigned long long)g.seed);
  return buf;
}

// One GPU run and its references on the same (rounded) inputs.
struct Result {
  kernels::ChunkedHostRun gpu;
  reference::Outputs<double> ref;  // double recurrent
  double eo = 0, eht = 0;          // relF of the GPU against ref
  double eo32 = 0, eht32 = 0;      // relF of the CPU float recurrent against ref (when asked)
};

inline Result run_case(const fixtures::GenSpec& g, DType dt, bool with_cpu32,
                       bool chunk_states = false, DType out_dt = DType::fp32) {
  Result r;
  r.gpu = kernels::run_chunked(fixtures::generate(g), dt, chunk_states, out_dt);
  r.ref = reference::recurrent_forward(r.gpu.inputs);
  r.eo = rel_err(r.gpu.outputs.o, r.ref.o);
  r.eht = rel_err(r.gpu.outputs.ht, r.ref.ht);
  if (with_cpu32) {
    const auto f = reference::recurrent_forward(reference::convert_inputs<float>(r.gpu.inputs));
    r.eo32 = rel_err(reference::convert<double>(f.o), r.ref.o);
    r.eht32 = rel_err(reference::convert<double>(f.ht), r.ref.ht);
  }
  return r;
}

inline std::vector<std::pair<Variant, Arm>> all_variants() {
  return {{Variant::gdn2, Arm::none},  {Variant::qed, Arm::full},
          {Variant::qed, Arm::nogate}, {Variant::qed, Arm::nogate_noproj},
          {Variant::qed, Arm::rand},   {Variant::kda, Arm::none},
          {Variant::gdn, Arm::none},   {Variant::deltanet, Arm::none}};
}

// Sets an environment variable for one scope (the kernels' mutant hook reads it per call).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// Every variant and arm, four (K, V) pairs each, cycling K, V, T, B, H, h0, regime and one varlen
// packing each.
inline std::vector<fixtures::GenSpec> variant_sweep(uint64_t seed) {
  const int64_t Ts[] = {1, 63, 64, 65, 200};
  using fixtures::Regime;
  const Regime regimes[] = {Regime::prop, Regime::std_, Regime::mixed, Regime::hard};
  std::vector<fixtures::GenSpec> out;
  int i = 0;
  for (auto [v, a] : all_variants()) {
    for (int kv = 0; kv < 4; ++kv, ++i) {
      fixtures::GenSpec g;
      g.variant = v;
      g.arm = a;
      const int64_t K = kv & 1 ? 128 : 64, V = kv & 2 ? 128 : 64;
      if (kv == 3) {
        g.seqlens = {0, 1, 63, 64, 65, 0, 130};
        g.dims = {1, 323, 2, K, V};
      } else {
        g.dims = {1 + i % 2, Ts[i % 5], 1 + (i / 2) % 2, K, V};
      }
      g.with_h0 = i % 2 == 0;
      g.regime = regimes[i % 4];
      g.lambda = 0.8;
      g.seed = seed + static_cast<uint64_t>(i) * 7919;
      out.push_back(g);
    }
  }
  return out;
}

// MATH.md §10 regimes at K = V = 128 with H heads, arms gdn2 and QED full / nogate_noproj at
// lambda = 1.
inline std::vector<fixtures::GenSpec> regime_sweep(int64_t T, int64_t H, uint64_t seed) {
  using fixtures::Regime;
  std::vector<fixtures::GenSpec> out;
  int i = 0;
  for (Regime r : {Regime::std_, Regime::mixed, Regime::hard, Regime::a1b1, Regime::hard_corr})
    for (auto [v, a] : std::vector<std::pair<Variant, Arm>>{{Variant::gdn2, Arm::none},
                                                            {Variant::qed, Arm::full},
                                                            {Variant::qed, Arm::nogate_noproj}}) {
      fixtures::GenSpec g;
      g.variant = v;
      g.arm = a;
      g.dims = {1, T, H, 128, 128};
      g.regime = r;
      g.lambda = 1.0;
      g.seed = seed + static_cast<uint64_t>(i++) * 104729;
      out.push_back(g);
    }
  return out;
}

}  // namespace qed::gpu_chunked
