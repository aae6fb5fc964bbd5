// Smoke test of the recurrent reference: double against mpfr on one small case of every variant.
#include <gtest/gtest.h>

#include "fixtures/generate.hpp"
#include "reference/recurrent.hpp"
#include "reference/scalar.hpp"

using namespace qed;
using namespace qed::reference;

TEST(RecurrentSmoke, DoubleMatchesMpfrEveryVariant) {
  const std::pair<Variant, Arm> all[] = {
      {Variant::gdn2, Arm::none},   {Variant::qed, Arm::full},         {Variant::qed, Arm::nogate},
      {Variant::qed, Arm::nogate_noproj}, {Variant::qed, Arm::rand},   {Variant::kda, Arm::none},
      {Variant::gdn, Arm::none},    {Variant::deltanet, Arm::none}};
  for (auto [v, a] : all) {
    fixtures::GenSpec s;
    s.variant = v;
    s.arm = a;
    s.dims = {2, 13, 2, 5, 3};
    s.with_h0 = true;
    s.seed = 7;
    auto in = fixtures::generate(s);
    auto od = recurrent_forward(in);
    set_mpfr_bits(200);
    auto om = recurrent_forward(convert_inputs<mpfr_float>(in));
    double worst = 0;
    for (size_t i = 0; i < od.o.size(); ++i)
      worst = std::max(worst, std::abs(od.o[i] - static_cast<double>(om.o[i])));
    EXPECT_LT(worst, 1e-13) << to_string(v) << "/" << to_string(a);
  }
}
