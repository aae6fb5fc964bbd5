// Gradient reductions (MATH.md §2 reductions, differentiated): the literal KDA / Gated DeltaNet /
// DeltaNet rules, differentiated by their own central differences in mpfr (256 bits, h = 1e-20),
// against (a) GDN-2's adjoint through gate tying (db and dw summed into dbeta; channel dg summed
// for the scalar-decay variant) and (b) the adjoint of the kda / gdn / deltanet variants.
#include <gtest/gtest.h>

#include "fixtures/generate.hpp"
#include "properties/support/cases.hpp"
#include "properties/support/checks_forward.hpp"
#include "properties/support/fd.hpp"
#include "reference/literal.hpp"
#include "reference/recurrent.hpp"

using namespace qed::properties;

namespace {

using M = mpfr_float;

// GDN-2 gradients of the tied case mapped back onto the variant's own inputs.
Grads<M> untie(const Inputs<M>& in, const Grads<M>& g2) {
  const auto& d = in.dims;
  const size_t BTH = static_cast<size_t>(d.B * d.T * d.H);
  Grads<M> g;
  g.dq = g2.dq;
  g.dk = g2.dk;
  g.dv = g2.dv;
  g.dh0 = g2.dh0;
  g.dbeta.assign(BTH, M(0));
  for (size_t i = 0; i < BTH; ++i) {
    for (int64_t c = 0; c < d.K; ++c) g.dbeta[i] += g2.db[i * d.K + c];
    for (int64_t j = 0; j < d.V; ++j) g.dbeta[i] += g2.dw[i * d.V + j];
  }
  if (in.variant == Variant::kda) g.dg = g2.dg;
  if (in.variant == Variant::gdn) {
    g.dg.assign(BTH, M(0));
    for (size_t i = 0; i < BTH; ++i)
      for (int64_t c = 0; c < d.K; ++c) g.dg[i] += g2.dg[i * d.K + c];
  }
  return g;
}

}  // namespace

TEST(GradReductions, LiteralFdAgainstTiedGdn2AndVariants) {
  for (Variant v : {Variant::kda, Variant::gdn, Variant::deltanet}) {
    for (bool varlen : {false, true}) {
      CaseSpec s;
      s.variant = v;
      s.B = varlen ? 1 : 2;
      s.H = 2;
      s.T = 6;
      s.K = 3;
      s.V = 2;
      if (varlen) s.seqlens = {2, 0, 4};
      s.h0 = true;
      s.unit_keys = !varlen;
      s.seed = 70 + static_cast<uint64_t>(v) * 2 + varlen;
      SCOPED_TRACE(replay_line(s));
      const auto in = inputs_as<M>(s, 256);
      const auto cot = qed::reference::convert_cotangents<M>(qed::fixtures::generate_cotangents(make_inputs(s), s.seed, true));
      const auto lit = fd_gradient<M>([](const Inputs<M>& x) { return qed::reference::literal::forward(x); }, in, cot,
                                      M("1e-20"));
      const auto tied = untie(in, qed::reference::recurrent_backward(tied_gdn2(in), cot, 1));
      const auto own = qed::reference::recurrent_backward(in, cot, 1);
      const auto e_tied = compare_grads(tied, lit, in, 1e-30);
      const auto e_own = compare_grads(own, lit, in, 1e-30);
      record("grad reduction: gdn2 tied vs literal FD (rel)", e_tied.worst);
      record("grad reduction: variant adjoint vs literal FD (rel)", e_own.worst);
      EXPECT_GE(e_tied.min_digits(), 25) << "worst at " << e_tied.where;
      EXPECT_GE(e_own.min_digits(), 25) << "worst at " << e_own.where;
    }
  }
}
