// chunked_twin_table: measures the CPU twins of a tensor-core chunked kernel against the oracle
// and prints markdown tables (reports/chunked_twin/README.md). Forward: rel_F of o and ht for the
// float recurrent pass (rec32), the float chunked pass (chunk32) and the chunked pass with bf16
// and fp16 matmul operands (chunkbf, chunkh), against the double recurrent pass on the same
// float inputs, which is itself checked against float128 on seed 0 at the largest T. Backward:
// rel_F of every gradient for rec32, chunk32 and chunkbf against the double recurrent backward.
//
// usage: chunked_twin_table [--seeds N] [--fwd-T 64,256,...] [--bwd-T 256,1024] [--chunk C]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fixtures/generate.hpp"
#include "properties/test_chunked_support.hpp"
#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"
#include "reference/scalar.hpp"

using namespace qed;
using namespace qed::reference;
using qed::chunked_test::grad_fields;
using qed::chunked_test::rel_fro;

namespace {

struct Config {
  const char* name;
  Variant variant;
  Arm arm;
  fixtures::Regime regime;
  double lambda;
};

const Config kConfigs[] = {
    {"std, gdn2", Variant::gdn2, Arm::none, fixtures::Regime::std_, 0.0},
    {"std, qed full (lambda=1)", Variant::qed, Arm::full, fixtures::Regime::std_, 1.0},
    {"hard, gdn2", Variant::gdn2, Arm::none, fixtures::Regime::hard, 0.0},
    {"hard, qed full (lambda=1)", Variant::qed, Arm::full, fixtures::Regime::hard, 1.0},
};

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

// Inputs rounded to float (what the kernels receive) and the same values widened to double.
struct Case {
  Inputs<float> f;
  Inputs<double> d;
};

Case make_case(const Config& c, int64_t T, uint64_t seed) {
  fixtures::GenSpec s;
  s.variant = c.variant;
  s.arm = c.arm;
  s.dims = {1, T, 1, 64, 64};
  s.regime = c.regime;
  s.lambda = c.lambda;
  s.seed = seed;
  Case k;
  k.f = convert_inputs<float>(fixtures::generate(s));
  k.d = convert_inputs<double>(k.f);
  return k;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// Cancellation in dlambda = sum_t abar_t . p_t (MATH.md §5.2), from the chunk-level gradients of
// the double chunked backward (one lane, C = 64): sum_t |abar_t . p_t| / |dlambda| (across
// tokens) and sum_t |abar_t| |p_t| / |dlambda| (within tokens too).
std::pair<double, double> dlambda_cancellation(const Inputs<double>& in,
                                               const Cotangents<double>& cot) {
  const LaneView<double> Lv = lanes_of(in)[0];
  const ChunkOptions opt{64};
  std::vector<Chunk<double>> chunks;
  std::vector<std::vector<double>> states{detail::initial_state(Lv)};
  for (int64_t t0 = 0; t0 < Lv.span.len; t0 += opt.chunk) {
    chunks.push_back(build_chunk(Lv, t0, std::min(opt.chunk, Lv.span.len - t0), opt));
    std::vector<double> St = states.back();
    chunk_advance_state(chunks.back(), chunk_pseudo_values(chunks.back(), St), St);
    states.push_back(St);
  }
  std::vector<double> Sh(static_cast<size_t>(in.dims.K * in.dims.V), 0.0);
  double sum = 0, abs_sum = 0, norm_sum = 0;
  for (int64_t ci = static_cast<int64_t>(chunks.size()) - 1; ci >= 0; --ci) {
    const auto& ch = chunks[ci];
    std::vector<double> ob(static_cast<size_t>(ch.n * in.dims.V));
    for (int64_t r = 0; r < ch.n; ++r)
      for (int64_t j = 0; j < in.dims.V; ++j)
        ob[r * in.dims.V + j] = cot.do_[Lv.tok(ch.t0 + r, in.dims.V) + j];
    auto g = chunk_backward(ch, states[ci], states[ci + 1], Sh, ob, in.scale);
    for (int64_t r = 0; r < ch.n; ++r) {
      double d = 0, na = 0, np = 0;
      for (int64_t c = 0; c < in.dims.K; ++c) {
        const double a = g.abar[r * in.dims.K + c], p = ch.p[r * in.dims.K + c];
        d += a * p;
        na += a * a;
        np += p * p;
      }
      sum += d;
      abs_sum += std::abs(d);
      norm_sum += std::sqrt(na * np);
    }
    Sh = std::move(g.Sh);
  }
  return {abs_sum / std::abs(sum), norm_sum / std::abs(sum)};
}

int main(int argc, char** argv) {
  int seeds = 3;
  int64_t C = 64;
  std::vector<int64_t> fwdT = {64, 256, 1024, 4096}, bwdT = {256, 1024};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seeds"))
      seeds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--fwd-T"))
      fwdT = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bwd-T"))
      bwdT = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--chunk"))
      C = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const auto t_start = std::chrono::steady_clock::now();
  ChunkOptions c32{C}, cbf{C, Operands::bf16}, ch16{C, Operands::fp16};

  std::printf("## Forward: rel_F(o) and rel_F(ht), max over %d seeds, K=V=64, C=%lld\n\n", seeds,
              static_cast<long long>(C));
  std::printf(
      "| config | T | rec32 o | chunk32 o | chunkbf o | chunkh o | rec32 ht | chunk32 ht | "
      "chunkbf ht | chunkh ht |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> oracle_notes;
  for (const Config& cf : kConfigs) {
    for (int64_t T : fwdT) {
      double e[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int sd = 0; sd < seeds; ++sd) {
        const Case k = make_case(cf, T, static_cast<uint64_t>(sd));
        const auto ref = recurrent_forward(k.d);
        const Outputs<float> runs[4] = {recurrent_forward(k.f), chunked_forward(k.f, c32),
                                        chunked_forward(k.f, cbf), chunked_forward(k.f, ch16)};
        for (int r = 0; r < 4; ++r) {
          e[r] = std::max(e[r], rel_fro(runs[r].o, ref.o));
          e[4 + r] = std::max(e[4 + r], rel_fro(runs[r].ht, ref.ht));
        }
        if (sd == 0 && T == fwdT.back()) {
          const auto q = recurrent_forward(convert_inputs<float128>(k.d));
          char buf[200];
          std::snprintf(buf, sizeof buf,
                        "%s, T=%lld: double vs float128 recurrent rel_F(o) %.1e, "
                        "rel_F(ht) %.1e",
                        cf.name, static_cast<long long>(T), rel_fro(ref.o, q.o),
                        rel_fro(ref.ht, q.ht));
          oracle_notes.push_back(buf);
        }
      }
      std::printf("| %s | %lld |", cf.name, static_cast<long long>(T));
      for (double x : e) std::printf(" %.1e |", x);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  std::printf("\nOracle check (seed 0):\n\n");
  for (const auto& s : oracle_notes) std::printf("- %s\n", s.c_str());

  std::printf("\n## Backward: rel_F of each gradient, max over %d seeds, do ~ N(0,1), dht = 0\n\n",
              seeds);
  std::printf(
      "| config | T | kernel | dq | dk | dv | dg | db | dw | dlambda | dh0 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  const char* names[3] = {"rec32", "chunk32", "chunkbf"};
  std::vector<std::string> cancel_notes;
  for (const Config& cf : kConfigs) {
    for (int64_t T : bwdT) {
      std::vector<std::vector<double>> e(3, std::vector<double>(10, 0.0));
      for (int sd = 0; sd < seeds; ++sd) {
        const Case k = make_case(cf, T, static_cast<uint64_t>(sd));
        const auto cot_d = convert_cotangents<double>(convert_cotangents<float>(
            fixtures::generate_cotangents(k.d, static_cast<uint64_t>(sd), false)));
        const auto cot_f = convert_cotangents<float>(cot_d);
        const auto ref = recurrent_backward(k.d, cot_d);
        if (sd == 0 && cf.variant == Variant::qed) {
          char buf[240];
          const auto [across, within] = dlambda_cancellation(k.d, cot_d);
          std::snprintf(buf, sizeof buf,
                        "%s, T=%lld, seed 0: sum_t |abar_t . p_t| / |dlambda| = %.0f, "
                        "sum_t |abar_t| |p_t| / |dlambda| = %.0f",
                        cf.name, static_cast<long long>(T), across, within);
          cancel_notes.push_back(buf);
        }
        const Grads<float> runs[3] = {recurrent_backward(k.f, cot_f),
                                      chunked_backward(k.f, cot_f, c32),
                                      chunked_backward(k.f, cot_f, cbf)};
        const auto fr = grad_fields(ref);
        for (int r = 0; r < 3; ++r) {
          const auto fx = grad_fields(runs[r]);
          for (size_t i = 0; i < fx.size(); ++i)
            if (!fr[i].second->empty())
              e[r][i] = std::max(e[r][i], rel_fro(*fx[i].second, *fr[i].second));
        }
      }
      const auto fr_names = grad_fields(Grads<double>{});
      for (int r = 0; r < 3; ++r) {
        std::printf("| %s | %lld | %s |", cf.name, static_cast<long long>(T), names[r]);
        for (size_t i = 0; i < fr_names.size(); ++i) {
          const std::string& nm = fr_names[i].first;
          if (nm == "dbeta" || nm == "dr") continue;
          if (nm == "dlambda" && cf.variant != Variant::qed)
            std::printf(" - |");
          else
            std::printf(" %.1e |", e[r][i]);
        }
        std::printf("\n");
      }
      std::fflush(stdout);
    }
  }
  std::printf("\nCancellation in the dlambda reduction:\n\n");
  for (const auto& s : cancel_notes) std::printf("- %s\n", s.c_str());
  std::printf("\n(total %.0f s)\n", seconds_since(t_start));
  return 0;
}
