// The decode step (states in a pool, updated in place, through a state-index indirection with a
// skipped padding entry) equals the whole-sequence forward run one token at a time: bitwise for
// the tile kernel, to a stated rounding bound for the row kernel that large batches use;
// the backward is bitwise reproducible across runs; invalid arguments are refused with messages
// that name the rule. Replay: QED_GPU_SEED=<seed> ./test_gpu_recurrent_decode
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fixtures/generate.hpp"
#include "kernels/host_run.hpp"

namespace {

using namespace qed;
using kernels::DType;
using reference::Arm;
using reference::Variant;

#define REQUIRE_DEVICE()                                                            \
  do {                                                                              \
    const kernels::Status st_ = kernels::device_status();                           \
    if (!st_.ok()) GTEST_SKIP() << "skipped, no usable GPU: " << st_.message;        \
  } while (0)

uint64_t base_seed() {
  const char* s = std::getenv("QED_GPU_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 777ull;
}

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 8) == 0);
}

// How the decode step must match the forward: bitwise (the tile kernel runs the forward's own
// step), or to rounding (the row kernel sums over rows in another order). For the latter the
// bound is T K 2^-23 relative to max(1, max |forward|): each step's two sums over K rows, taken
// in a different order, differ by at most about K unit roundoffs of their terms, and the
// transitions do not amplify (|S| stays of order 1 on these inputs); the same call also asserts
// that some value differs, so that a silent fallback to the tile kernel cannot pass as the row
// kernel. Returns the largest relative difference seen.
enum class Match { bitwise, rounding };

double decode_matches_forward(Variant variant, Arm arm, int64_t K, int64_t V, DType dt,
                              Match match = Match::bitwise) {
  const int64_t B = 5, T = 9, H = 3, P = 8;
  fixtures::GenSpec g;
  g.variant = variant;
  g.arm = arm;
  g.dims = {B, T, H, K, V};
  g.seed = base_seed() + static_cast<uint64_t>(K + V);
  g.with_h0 = true;
  const auto in = fixtures::generate(g);
  const auto whole = kernels::run_recurrent(in, nullptr, dt);
  const auto& ri = whole.inputs;
  const reference::Layout lay = reference::layout_of(variant, arm);

  // Pool of P slots; sequence i lives in slot idx[i]; a sixth, padding entry (-1) is skipped.
  const std::vector<int32_t> idx = {3, 7, 0, 5, 1, -1};
  const int64_t KV = K * V;
  std::vector<double> pool(static_cast<size_t>(P * H * KV));
  for (size_t i = 0; i < pool.size(); ++i)  // fp32 values: the pool is fp32 on the device
    pool[i] = static_cast<float>(0.25 * std::sin(0.37 * static_cast<double>(i)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < H * KV; ++e) pool[idx[b] * H * KV + e] = ri.h0[b * H * KV + e];
  const std::vector<double> pool0 = pool;

  // Inputs padded with a sixth batch row (the skipped entry).
  auto pad = [&](const std::vector<double>& x, int64_t D) {
    std::vector<double> out = x;
    for (int64_t i = 0; i < T * H * D; ++i) out.push_back(0.5);
    return out;
  };
  const int64_t Bp = B + 1;
  kernels::DeviceBuffer q = kernels::to_device(pad(ri.q, K), dt), k = kernels::to_device(pad(ri.k, K), dt),
                        v = kernels::to_device(pad(ri.v, V), dt);
  kernels::DeviceBuffer gg = kernels::to_device(pad(ri.g, lay.channel_g ? K : 1), dt);
  kernels::DeviceBuffer bb = kernels::to_device(pad(ri.b, K), dt), ww = kernels::to_device(pad(ri.w, V), dt);
  kernels::DeviceBuffer beta = kernels::to_device(pad(ri.beta, 1), dt);
  kernels::DeviceBuffer lam = kernels::to_device_f32(ri.lambda), r = kernels::to_device_f32(ri.r);
  kernels::DeviceBuffer st = kernels::to_device_f32(pool);
  kernels::DeviceBuffer o(static_cast<size_t>(Bp * T * H * V) * 4);
  o.fill_bytes(0xFF);
  kernels::DeviceBuffer di(idx.size() * 4);
  di.upload(idx.data(), idx.size() * 4);

  const int esz = kernels::dtype_bytes(dt);
  for (int64_t t = 0; t < T; ++t) {
    auto view = [&](const kernels::DeviceBuffer& buf, int64_t D) {
      kernels::SeqTensor s = kernels::seq_tensor(static_cast<const char*>(buf.get()) + t * H * D * esz, dt, T, H, D);
      return s;
    };
    kernels::RecurrentDecodeParams p;
    p.problem.variant = variant;
    p.problem.arm = arm;
    p.problem.B = Bp;
    p.problem.T = 1;
    p.problem.H = H;
    p.problem.K = K;
    p.problem.V = V;
    p.problem.scale = static_cast<float>(ri.scale);
    p.in.q = view(q, K);
    p.in.k = view(k, K);
    p.in.v = view(v, V);
    if (lay.channel_g) p.in.g = view(gg, K);
    if (lay.scalar_g) p.in.g = view(gg, 1);
    if (lay.has_bw) {
      p.in.b = view(bb, K);
      p.in.w = view(ww, V);
    }
    if (lay.has_beta) p.in.beta = view(beta, 1);
    if (lay.has_lambda) p.in.lambda = lam.as<float>();
    if (lay.has_r) p.in.r = r.as<float>();
    p.o = kernels::seq_tensor_out(o.as<char>() + t * H * V * 4, DType::fp32, T, H, V);
    p.state = kernels::state_tensor_out(st.as<float>(), H, K, V);
    p.state_indices = di.as<int32_t>();
    p.num_state_slots = P;
    kernels::throw_if_error(kernels::recurrent_decode(p));
  }
  const auto od = kernels::from_device(o, static_cast<size_t>(Bp * T * H * V), DType::fp32);
  const auto pd = kernels::from_device(st, pool.size(), DType::fp32);
  const std::vector<double> o_real(od.begin(), od.begin() + B * T * H * V);
  for (int64_t i = B * T * H * V; i < Bp * T * H * V; ++i) {
    EXPECT_TRUE(std::isnan(od[i])) << "the skipped entry (index -1) wrote o[" << i << "]";
    if (!std::isnan(od[i])) break;
  }
  double scale = 1.0;
  for (double x : whole.outputs.o) scale = std::max(scale, std::abs(x));
  for (double x : whole.outputs.ht) scale = std::max(scale, std::abs(x));
  const double bound = static_cast<double>(T * K) * std::ldexp(1.0, -23);
  double worst = 0.0;
  bool any_differs = false;
  auto compare = [&](double got, double want, const std::string& where) {
    if (got != want) any_differs = true;
    const double rel = std::abs(got - want) / scale;
    worst = std::max(worst, std::isnan(rel) ? INFINITY : rel);
    if (match == Match::bitwise && got != want) {
      ADD_FAILURE() << where << ": " << got << " != " << want << " (bitwise expected)";
      return false;
    }
    if (match == Match::rounding && !(rel <= bound)) {
      ADD_FAILURE() << where << ": " << got << " vs " << want << ", " << rel << " of the scale > bound " << bound;
      return false;
    }
    return true;
  };
  for (size_t i = 0; i < o_real.size(); ++i)
    if (!compare(o_real[i], whole.outputs.o[i], "o[" + std::to_string(i) + "]")) return worst;
  for (int64_t slot = 0; slot < P; ++slot) {
    int64_t b = -1;
    for (int64_t j = 0; j < B; ++j)
      if (idx[j] == slot) b = j;
    for (int64_t e = 0; e < H * KV; ++e) {
      const double got = pd[slot * H * KV + e];
      if (b < 0) {  // an untouched slot stays bitwise what it was
        if (got != pool0[slot * H * KV + e]) {
          ADD_FAILURE() << "untouched slot " << slot << " element " << e << " changed";
          return worst;
        }
        continue;
      }
      if (!compare(got, whole.outputs.ht[b * H * KV + e],
                   "slot " + std::to_string(slot) + " element " + std::to_string(e) + " (final state)"))
        return worst;
    }
  }
  if (match == Match::rounding) {
    EXPECT_TRUE(any_differs) << "every value equals the forward's bitwise: the row kernel did not run";
  }
  return worst;
}

// Sets an environment variable for the life of a scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

TEST(GpuDecode, EqualsForwardTokenByToken) {
  REQUIRE_DEVICE();
  ScopedEnv tile("QED_REC_DECODE_KERNEL", "tile");
  decode_matches_forward(Variant::gdn2, Arm::none, 128, 128, DType::bf16);
  decode_matches_forward(Variant::qed, Arm::full, 64, 32, DType::fp32);
  decode_matches_forward(Variant::qed, Arm::rand, 32, 64, DType::fp32);
  decode_matches_forward(Variant::gdn, Arm::none, 16, 16, DType::fp16);
  decode_matches_forward(Variant::deltanet, Arm::none, 256, 64, DType::bf16);
}

// The launch picks one-warp blocks for small batches; every grid order and block width the
// tuning overrides can select must give the same step (V = 48 leaves a partial value block).
TEST(GpuDecode, EveryLaunchShapeEqualsForward) {
  REQUIRE_DEVICE();
  ScopedEnv tile("QED_REC_DECODE_KERNEL", "tile");
  for (const char* grid : {"flat", "nhz"})
    for (const char* warps : {"1", "2", "4", "8"}) {
      SCOPED_TRACE(std::string("grid ") + grid + ", warps " + warps);
      setenv("QED_REC_DECODE_GRID", grid, 1);
      setenv("QED_REC_DECODE_WARPS", warps, 1);
      decode_matches_forward(Variant::gdn2, Arm::none, 128, 128, DType::bf16);
      decode_matches_forward(Variant::qed, Arm::nogate, 64, 48, DType::fp32);
      decode_matches_forward(Variant::kda, Arm::none, 256, 40, DType::bf16);
    }
  unsetenv("QED_REC_DECODE_GRID");
  unsetenv("QED_REC_DECODE_WARPS");
}

// The cases both row kernels run, for every launch shape: every K they are built for, one and
// several value blocks, all dtypes, every variant and QED arm; equal to the forward to rounding.
// Returns the largest difference seen.
double row_kernel_cases() {
  return std::max({decode_matches_forward(Variant::gdn2, Arm::none, 128, 128, DType::bf16, Match::rounding),
                   decode_matches_forward(Variant::qed, Arm::full, 64, 64, DType::fp32, Match::rounding),
                   decode_matches_forward(Variant::qed, Arm::rand, 256, 64, DType::fp32, Match::rounding),
                   decode_matches_forward(Variant::qed, Arm::nogate, 128, 256, DType::fp16, Match::rounding),
                   decode_matches_forward(Variant::qed, Arm::nogate_noproj, 64, 192, DType::bf16, Match::rounding),
                   decode_matches_forward(Variant::kda, Arm::none, 128, 192, DType::bf16, Match::rounding),
                   decode_matches_forward(Variant::gdn, Arm::none, 64, 128, DType::fp16, Match::rounding),
                   decode_matches_forward(Variant::deltanet, Arm::none, 256, 128, DType::fp32, Match::rounding),
                   decode_matches_forward(Variant::deltanet, Arm::none, 64, 128, DType::fp32, Match::rounding)});
}

// The row kernel (one block per sequence, head and value block): every launch shape.
TEST(GpuDecode, RowKernelMatchesForwardToRounding) {
  REQUIRE_DEVICE();
  ScopedEnv rows("QED_REC_DECODE_KERNEL", "rows");
  double worst = 0.0;
  // Under compute-sanitizer (QED_GPU_QUICK=1) the two shapes that differ in columns per lane.
  const bool quick = std::getenv("QED_GPU_QUICK") != nullptr;
  const std::vector<const char*> shapes =
      quick ? std::vector<const char*>{"8x2", "8x4"} : std::vector<const char*>{"8x2", "4x2", "16x2", "8x4", "16x4"};
  for (const char* shape : shapes) {
    SCOPED_TRACE(std::string("row shape ") + shape);
    ScopedEnv s("QED_REC_DECODE_ROWS", shape);
    worst = std::max(worst, row_kernel_cases());
  }
  std::printf("[decode rows] worst difference from the forward: %.3g of max(1, |forward|)\n", worst);
}

// The pipelined row kernel: every shape, and grids capped at 1 and 3 blocks so that a block walks
// many tiles (stage reuse, commit-group counting, the padding entry in the middle of a walk).
TEST(GpuDecode, StreamKernelMatchesForwardToRounding) {
  REQUIRE_DEVICE();
  ScopedEnv kernel("QED_REC_DECODE_KERNEL", "stream");
  double worst = 0.0;
  const bool quick = std::getenv("QED_GPU_QUICK") != nullptr;
  // Under compute-sanitizer (QED_GPU_QUICK=1): the default shape and a three-stage one, the full
  // grid and a 3-block grid.
  const std::vector<const char*> shapes = quick ? std::vector<const char*>{"8x2x2", "8x2x3"}
                                                : std::vector<const char*>{"8x2x2", "8x2x3", "8x2x4", "4x2x3", "8x4x2"};
  const std::vector<const char*> grids =
      quick ? std::vector<const char*>{"0", "3"} : std::vector<const char*>{"0", "1", "3"};
  for (const char* blocks : grids)
    for (const char* shape : shapes) {
      SCOPED_TRACE(std::string("stream shape ") + shape + ", blocks " + blocks);
      ScopedEnv s("QED_REC_DECODE_STREAM", shape);
      std::unique_ptr<ScopedEnv> cap;
      if (std::string(blocks) != "0") cap = std::make_unique<ScopedEnv>("QED_REC_DECODE_STREAM_BLOCKS", blocks);
      worst = std::max(worst, row_kernel_cases());
    }
  std::printf("[decode stream] worst difference from the forward: %.3g of max(1, |forward|)\n", worst);
}

TEST(GpuBackward, BitwiseDeterministic) {
  REQUIRE_DEVICE();
  for (auto [v, a] : std::vector<std::pair<Variant, Arm>>{{Variant::qed, Arm::rand},
                                                          {Variant::gdn, Arm::none}}) {
    fixtures::GenSpec g;
    g.variant = v;
    g.arm = a;
    g.dims = {1, 300, 4, 64, 128};
    g.seqlens = {100, 0, 137, 63};
    g.seed = base_seed() + 5;
    g.with_h0 = true;
    const auto in = fixtures::generate(g);
    const auto cot = fixtures::generate_cotangents(in, g.seed, true);
    const auto r0 = kernels::run_recurrent(in, &cot, DType::bf16);
    for (int rep = 1; rep < 3; ++rep) {
      const auto r1 = kernels::run_recurrent(in, &cot, DType::bf16);
      const auto& A = r0.grads;
      const auto& B = r1.grads;
      EXPECT_TRUE(bitwise_equal(A.dq, B.dq) && bitwise_equal(A.dk, B.dk) &&
                  bitwise_equal(A.dv, B.dv) && bitwise_equal(A.dg, B.dg) &&
                  bitwise_equal(A.db, B.db) && bitwise_equal(A.dw, B.dw) &&
                  bitwise_equal(A.dbeta, B.dbeta) && bitwise_equal(A.dlambda, B.dlambda) &&
                  bitwise_equal(A.dr, B.dr) && bitwise_equal(A.dh0, B.dh0) &&
                  bitwise_equal(r0.outputs.o, r1.outputs.o))
          << reference::to_string(v) << ": run " << rep << " differs from run 0";
    }
  }
}

// Argument checks need no device: they fail before anything is launched.
kernels::RecurrentForwardParams valid_forward(void* fake) {
  kernels::RecurrentForwardParams p;
  p.problem.variant = Variant::gdn2;
  p.problem.B = 2;
  p.problem.T = 8;
  p.problem.H = 2;
  p.problem.K = 64;
  p.problem.V = 64;
  p.problem.scale = 0.125f;
  p.in.q = kernels::seq_tensor(fake, DType::bf16, 8, 2, 64);
  p.in.k = p.in.q;
  p.in.v = p.in.q;
  p.in.g = p.in.q;
  p.in.b = p.in.q;
  p.in.w = p.in.q;
  p.o = kernels::seq_tensor_out(fake, DType::bf16, 8, 2, 64);
  return p;
}

void expect_refused(const kernels::Status& s, kernels::StatusCode code, const std::string& words) {
  EXPECT_EQ(static_cast<int>(s.code), static_cast<int>(code)) << s.message;
  EXPECT_NE(s.message.find(words), std::string::npos)
      << "message '" << s.message << "' does not mention '" << words << "'";
}

TEST(KernelApi, RefusesBadArguments) {
  alignas(16) static float fake[64];
  using SC = kernels::StatusCode;
  auto p = valid_forward(fake);
  p.problem.K = 48;
  expect_refused(kernels::recurrent_forward(p), SC::unsupported, "K = 48");
  p = valid_forward(fake);
  p.in.g = {};
  expect_refused(kernels::recurrent_forward(p), SC::invalid_argument, "g is required");
  p = valid_forward(fake);
  p.problem.variant = Variant::deltanet;
  expect_refused(kernels::recurrent_forward(p), SC::invalid_argument, "g must be nullptr");
  p = valid_forward(fake);
  p.problem.variant = Variant::qed;
  expect_refused(kernels::recurrent_forward(p), SC::invalid_argument, "arm");
  p = valid_forward(fake);
  p.in.q.stride_t = 0;
  expect_refused(kernels::recurrent_forward(p), SC::invalid_argument, "q.stride_t");
  p = valid_forward(fake);
  p.in.h0 = kernels::state_tensor(fake + 1, 2, 64, 64);
  expect_refused(kernels::recurrent_forward(p), SC::invalid_argument, "16-byte aligned");
  p = valid_forward(fake);
  p.o = {};
  expect_refused(kernels::recurrent_forward(p), SC::invalid_argument, "o is required");
  p = valid_forward(fake);
  const int64_t cu[] = {0, 5, 3};
  p.problem.B = 1;
  p.problem.cu_seqlens = cu;
  p.problem.cu_seqlens_host = cu;
  p.problem.num_seqs = 2;
  expect_refused(kernels::recurrent_forward(p), SC::invalid_argument, "cu_seqlens[2]");
  kernels::RecurrentDecodeParams d;
  d.problem = valid_forward(fake).problem;
  d.in = valid_forward(fake).in;
  d.o = valid_forward(fake).o;
  expect_refused(kernels::recurrent_decode(d), SC::invalid_argument, "T = 1");
}

}  // namespace

// The pipelined row kernel with bulk tensor copies: loads only (QED_REC_DECODE_KERNEL=tma), loads
// refilling a stage as soon as it is read (=tmae), and loads and stores (=tmas, each warp storing
// its contiguous rows from the stage; with and without an L2 evict-first policy): every shape, and
// grids capped at 1 and 3 blocks (stage reuse, the per-stage barrier phases, a padding entry that
// issues no copy in the middle of a walk, stores still reading a stage that the next load refills).
TEST(GpuDecode, TmaKernelMatchesForwardToRounding) {
  REQUIRE_DEVICE();
  const bool quick = std::getenv("QED_GPU_QUICK") != nullptr;
  const std::vector<const char*> grids =
      quick ? std::vector<const char*>{"0", "3"} : std::vector<const char*>{"0", "1", "3"};
  for (const char* kernel : {"tma", "tmae", "tmas", "tmas+hint"}) {
    const bool hint = std::string(kernel) == "tmas+hint";
    ScopedEnv k("QED_REC_DECODE_KERNEL", hint ? "tmas" : kernel);
    std::unique_ptr<ScopedEnv> h;
    if (hint) h = std::make_unique<ScopedEnv>("QED_REC_DECODE_L2HINT", "1");
    double worst = 0.0;
    const bool stores = std::string(kernel).rfind("tmas", 0) == 0;
    const std::vector<const char*> shapes =
        quick ? std::vector<const char*>{stores ? "8x2x2" : "8x2x3", "16x4x2"}
              : (stores ? std::vector<const char*>{"8x2x2", "8x2x3", "16x4x2"}
                        : std::vector<const char*>{"8x2x2", "8x2x3", "8x2x4", "16x4x2"});
    for (const char* blocks : grids)
      for (const char* shape : shapes) {
        SCOPED_TRACE(std::string(kernel) + " shape " + shape + ", blocks " + blocks);
        ScopedEnv s("QED_REC_DECODE_TMA", shape);
        std::unique_ptr<ScopedEnv> cap;
        if (std::string(blocks) != "0") cap = std::make_unique<ScopedEnv>("QED_REC_DECODE_STREAM_BLOCKS", blocks);
        worst = std::max(worst, row_kernel_cases());
      }
    std::printf("[decode %s] worst difference from the forward: %.3g of max(1, |forward|)\n", kernel, worst);
  }
}

// The small-batch kernel (QED_REC_DECODE_KERNEL=lat): every launch shape, the row kernels' cases
// plus K = 32 and a V that is a multiple of 16 only.
TEST(GpuDecode, LatKernelMatchesForwardToRounding) {
  REQUIRE_DEVICE();
  ScopedEnv kernel("QED_REC_DECODE_KERNEL", "lat");
  double worst = 0.0;
  const bool quick = std::getenv("QED_GPU_QUICK") != nullptr;
  const std::vector<const char*> shapes = quick ? std::vector<const char*>{"4x16", "8x16", "2x8", "16x16"}
                                                : std::vector<const char*>{"4x16", "8x16", "4x8", "8x8", "16x16", "2x16", "2x8"};
  for (const char* shape : shapes) {
    SCOPED_TRACE(std::string("lat shape ") + shape);
    ScopedEnv s("QED_REC_DECODE_LAT", shape);
    worst = std::max({worst, row_kernel_cases(),
                      decode_matches_forward(Variant::qed, Arm::full, 32, 48, DType::bf16, Match::rounding),
                      decode_matches_forward(Variant::gdn, Arm::none, 32, 16, DType::fp32, Match::rounding)});
  }
  std::printf("[decode lat] worst difference from the forward: %.3g of max(1, |forward|)\n", worst);
}

// The default choice (QED_REC_DECODE_KERNEL unset): the tests' batches are small, so the
// small-batch kernel runs (equal to the forward to rounding, and not bitwise: the check that a
// value differs shows it is not the tile kernel's step); where that kernel is not built (K = 16,
// or V = 40, not a multiple of 16) the tile kernel's bitwise step.
TEST(GpuDecode, DefaultKernelMatchesForward) {
  REQUIRE_DEVICE();
  unsetenv("QED_REC_DECODE_KERNEL");
  const double worst = std::max(decode_matches_forward(Variant::gdn2, Arm::none, 128, 128, DType::bf16, Match::rounding),
                                decode_matches_forward(Variant::qed, Arm::full, 64, 64, DType::fp32, Match::rounding));
  decode_matches_forward(Variant::gdn, Arm::none, 16, 16, DType::fp16);
  decode_matches_forward(Variant::qed, Arm::nogate, 64, 40, DType::fp32);
  std::printf("[decode default] worst difference from the forward: %.3g of max(1, |forward|)\n", worst);
}
