// The gate's exactness properties: identities that hold exactly, so any regression shows as a
// discrepancy far above zero (or above 1e-60 in 256-bit arithmetic).
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "fixtures/generate.hpp"
#include "reference/chunked.hpp"
#include "reference/oracle.hpp"
#include "reference/recurrent.hpp"
#include "reference/rounding.hpp"
#include "verify/certify_gate.hpp"
#include "verify/evaluate.hpp"

namespace qed::verify {

namespace {

using reference::mpfr_float;

struct Tiny {
  reference::Inputs<double> in;
  reference::Cotangents<double> cot;
};

Tiny tiny_case(reference::Variant v, reference::Arm a, uint64_t seed) {
  fixtures::GenSpec g;
  g.variant = v;
  g.arm = a;
  g.dims = {1, 10, 2, 4, 3};  // T = 10 with chunk 4: two full chunks and a partial one
  g.regime = fixtures::Regime::prop;
  g.seed = seed;
  g.with_h0 = true;
  Tiny t;
  t.in = fixtures::generate(g);
  t.cot = fixtures::generate_cotangents(t.in, seed, /*with_dht=*/true);
  return t;
}

std::vector<std::pair<std::string, std::vector<mpfr_float>>> evaluate(const Tiny& t, bool chunked,
                                                                      int bits) {
  reference::set_mpfr_bits(bits);
  const auto in = reference::convert_inputs<mpfr_float>(t.in);
  const auto cot = reference::convert_cotangents<mpfr_float>(t.cot);
  reference::ChunkOptions co;
  co.chunk = 4;
  std::vector<std::pair<std::string, std::vector<mpfr_float>>> out;
  const auto fwd = chunked ? reference::chunked_forward(
                                 in, co, static_cast<std::vector<mpfr_float>*>(nullptr), 1)
                           : reference::recurrent_forward(in, 1);
  out.emplace_back("o", fwd.o);
  out.emplace_back("ht", fwd.ht);
  const auto gr = chunked ? reference::chunked_backward(in, cot, co, 1)
                          : reference::recurrent_backward(in, cot, 1);
  for (const auto& name : grad_names(in.variant, in.arm))
    out.emplace_back(name, grad_field(gr, name));
  return out;
}


}  // namespace

ExactCheck exact_chunked_vs_recurrent(int bits_chunked, int bits_recurrent, uint64_t seed) {
  ExactCheck r;
  r.name = fmt::format("chunked == recurrent (mpfr {}/{} bits, T=10, C=4, fwd+bwd)", bits_chunked,
                       bits_recurrent);
  r.limit = 1e-60;
  std::string worst = "-";
  double measured = 0;
  for (const auto& [v, a] : {std::pair{reference::Variant::qed, reference::Arm::full},
                             std::pair{reference::Variant::gdn2, reference::Arm::none}}) {
    const Tiny t = tiny_case(v, a, seed);
    const auto ch = evaluate(t, true, bits_chunked);
    const auto re = evaluate(t, false, bits_recurrent);
    reference::set_mpfr_bits(std::max(bits_chunked, bits_recurrent) + 64);
    for (size_t d = 0; d < re.size(); ++d) {
      mpfr_float scale(0), diff(0);
      for (size_t i = 0; i < re[d].second.size(); ++i) {
        scale = std::max<mpfr_float>(scale, abs(re[d].second[i]));
        diff = std::max<mpfr_float>(diff, abs(ch[d].second[i] - re[d].second[i]));
      }
      const double rel = scale > 0 ? static_cast<double>(diff / scale) : static_cast<double>(diff);
      if (!(rel <= measured)) {
        measured = rel;
        worst = fmt::format("{} {}", reference::to_string(v), re[d].first);
      }
    }
  }
  r.measured = measured;
  r.pass = measured <= r.limit;
  r.detail = fmt::format("max |chunked - recurrent| / max |recurrent| = {:.2e} at {} (seed {})",
                         measured, worst, seed);
  return r;
}

ExactCheck exact_lambda0_is_gdn2(const RunOptions& qed_run, const RunOptions& gdn2_run,
                                 uint64_t seed) {
  ExactCheck r;
  auto label = [](const RunOptions& o) {
    if (o.impl.rfind("cuda-", 0) == 0) return o.impl + " " + o.dtype;
    return o.impl + " " + o.precision.name() +
           (o.impl == "reference-chunked" ? " operands=" + o.operands : "");
  };
  r.name = "qed(lambda=0) == gdn2 value for value, " + label(qed_run) +
           (label(qed_run) == label(gdn2_run) ? "" : " vs " + label(gdn2_run));
  r.limit = 0;
  auto make = [&](reference::Variant v) {
    fixtures::GenSpec g;
    g.variant = v;
    g.arm = v == reference::Variant::qed ? reference::Arm::full : reference::Arm::none;
    // Two chunks of 64, the second partial. The CUDA chunked kernel is built for K, V in
    // {64, 128} only; everything else runs the small heads.
    const bool chunked_cuda = qed_run.impl == "cuda-chunked" || gdn2_run.impl == "cuda-chunked";
    g.dims = chunked_cuda ? reference::Dims{1, 80, 2, 64, 64} : reference::Dims{1, 80, 2, 16, 8};
    g.regime = fixtures::Regime::hard;
    g.lambda = 0.0;
    g.seed = seed;
    fixtures::Case c;
    c.inputs = fixtures::generate(g);
    c.cotangents = fixtures::generate_cotangents(c.inputs, seed, true);
    const auto f = reference::format_of(reference::Operands::fp32);
    auto& in = c.inputs;
    for (auto* x : {&in.q, &in.k, &in.v, &in.g, &in.b, &in.w, &in.lambda, &c.cotangents->do_,
                    &c.cotangents->dht})
      for (auto& e : *x) e = reference::round_to_format(e, f);
    c.dtype = "float32";
    return c;
  };
  // Same seed: the generator draws q, k, v, g, b, w identically for both (lambda is not drawn).
  const fixtures::Case cq = make(reference::Variant::qed), cg = make(reference::Variant::gdn2);
  const fixtures::Case oq = run_implementation(cq, qed_run), og = run_implementation(cg, gdn2_run);
  double worst = 0;
  std::string where = "-";
  int64_t differing = 0, compared = 0;
  for (const std::string name : {"outputs/o", "outputs/ht", "grads/dq", "grads/dk", "grads/dv", "grads/dg",
                                  "grads/db", "grads/dw", "grads/dh0"}) {
    const auto* a = find_result(oq, name);
    const auto* b = find_result(og, name);
    if (!a || !b) continue;
    for (size_t i = 0; i < a->data.size() && i < b->data.size(); ++i) {
      ++compared;
      const double d = std::abs(a->data[i] - b->data[i]);
      if (a->data[i] != b->data[i]) {
        ++differing;
        if (!(d <= worst)) {
          worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
          where = fmt::format("{}[{}]: {:.9g} vs {:.9g}", name, i, a->data[i], b->data[i]);
        }
      }
    }
  }
  r.measured = worst;
  r.pass = differing == 0 && compared > 0;
  r.detail = differing == 0
                 ? fmt::format("{} values equal (seed {})", compared, seed)
                 : fmt::format("{} of {} values differ, largest |diff| {:.3e} at {} (seed {})",
                               differing, compared, worst, where, seed);
  return r;
}

}  // namespace qed::verify
