// reference/rounding.hpp against independent rounders: the bf16 bit trick on floats, the
// compiler's _Float16 and float conversions (IEEE round-to-nearest-even, full exponent range),
// and MPFR at 8 bits; plus the double-rounding trap and the subnormal/overflow edges.
#include <gtest/gtest.h>
#include <mpfr.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "fixtures/generate.hpp"
#include "properties/test_chunked_support.hpp"
#include "reference/rounding.hpp"
#include "reference/scalar.hpp"

using namespace qed;
using namespace qed::reference;
using qed::chunked_test::replay;
using qed::chunked_test::test_seed;

namespace {

// The classic bf16 RNE of a finite float by integer arithmetic on its bits.
float bf16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xFFFF0000u);
}

bool same_bits(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}

// A random finite double spread over many binades (exponents -160..140), random sign.
double spread_double(fixtures::Rng& rng) {
  const double m = 1.0 + rng.uniform();
  const int e = static_cast<int>(rng.below(301)) - 160;
  return (rng.next() & 1 ? -1.0 : 1.0) * std::ldexp(m, e);
}

}  // namespace

TEST(Rounding, Bf16OfFloatMatchesBitTrick) {
  const uint64_t seed = test_seed(1);
  fixtures::Rng rng(seed);
  int64_t checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng.next()));
    if (!std::isfinite(x)) continue;
    const float want = bf16_bits(x);
    const float got = round_operand(x, Operands::bf16);
    ++checked;
    ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
        << "x=" << x << " (bits " << std::hex << std::bit_cast<uint32_t>(x) << "); "
        << replay(seed);
  }
  // Edges: largest bf16, the overflow threshold, float max, subnormals, ties.
  const float edges[] = {3.3895314e38f,
                         3.3961776e38f,
                         3.3961772e38f,
                         std::numeric_limits<float>::max(),
                         std::ldexp(1.0f, -133),
                         std::ldexp(1.0f, -134),
                         std::ldexp(3.0f, -135),
                         std::ldexp(1.0f, -149),
                         1.0f + std::ldexp(1.0f, -8),
                         1.0f + std::ldexp(3.0f, -8),
                         -0.0f,
                         0.0f,
                         -std::ldexp(1.0f, -140)};
  for (float x : edges)
    EXPECT_EQ(std::bit_cast<uint32_t>(round_operand(x, Operands::bf16)),
              std::bit_cast<uint32_t>(bf16_bits(x)))
        << "x=" << x;
  EXPECT_TRUE(std::isinf(round_operand(std::numeric_limits<float>::max(), Operands::bf16)));
  std::printf("bf16(float): %lld random finite floats bit-identical to the bit trick\n",
              static_cast<long long>(checked));
}

TEST(Rounding, Fp16AndFp32MatchCompilerConversions) {
  const uint64_t seed = test_seed(2);
  fixtures::Rng rng(seed);
  for (int i = 0; i < 1000000; ++i) {
    const double x = spread_double(rng);
    const double x16 = std::ldexp(x, -static_cast<int>(rng.below(130)));  // dense near fp16 range
#ifdef __FLT16_MAX__  // the compiler has _Float16 (gcc 12 on x86-64; clang 14 there has not)
    ASSERT_TRUE(same_bits(round_operand(x16, Operands::fp16),
                          static_cast<double>(static_cast<_Float16>(x16))))
        << "fp16(double) x=" << x16 << "; " << replay(seed);
    const float xf = static_cast<float>(x16);
    ASSERT_EQ(std::bit_cast<uint32_t>(round_operand(xf, Operands::fp16)),
              std::bit_cast<uint32_t>(static_cast<float>(static_cast<_Float16>(xf))))
        << "fp16(float) x=" << xf << "; " << replay(seed);
#else
    (void)x16;
#endif
    ASSERT_TRUE(
        same_bits(round_operand(x, Operands::fp32), static_cast<double>(static_cast<float>(x))))
        << "fp32(double) x=" << x << "; " << replay(seed);
  }
  // fp16 edges: max 65504, overflow at 65520, min subnormal 2^-24, ties at half of it.
  EXPECT_EQ(round_operand(65504.0, Operands::fp16), 65504.0);
  EXPECT_EQ(round_operand(65519.99, Operands::fp16), 65504.0);
  EXPECT_TRUE(std::isinf(round_operand(65520.0, Operands::fp16)));
  EXPECT_EQ(round_operand(std::ldexp(1.0, -25), Operands::fp16), 0.0);
  EXPECT_EQ(round_operand(std::ldexp(3.0, -26), Operands::fp16), std::ldexp(1.0, -24));
  EXPECT_EQ(round_operand(std::ldexp(3.0, -25), Operands::fp16), std::ldexp(1.0, -23));
  EXPECT_TRUE(std::signbit(round_operand(-std::ldexp(1.0, -30), Operands::fp16)));
  EXPECT_TRUE(std::isnan(round_operand(std::nan(""), Operands::bf16)));
  EXPECT_TRUE(std::isinf(round_operand(-INFINITY, Operands::fp16)));
  EXPECT_EQ(round_operand(0.1, Operands::none), 0.1);
}

TEST(Rounding, Bf16OfDoubleAndMpfrRoundOnceLikeMpfr) {
  const uint64_t seed = test_seed(3);
  fixtures::Rng rng(seed);
  mpfr_t m;
  mpfr_init2(m, 8);
  for (int i = 0; i < 300000; ++i) {
    // Normal bf16 range only: MPFR's own exponent range is unbounded.
    const double x = std::ldexp(spread_double(rng), -static_cast<int>(rng.below(20)));
    if (std::abs(x) < std::ldexp(1.0, -126) || std::abs(x) > 3.3e38) continue;
    mpfr_set_d(m, x, MPFR_RNDN);
    const double want = mpfr_get_d(m, MPFR_RNDN);
    ASSERT_TRUE(same_bits(round_operand(x, Operands::bf16), want))
        << "x=" << x << "; " << replay(seed);
  }
  mpfr_clear(m);
  // Just above a bf16 tie: one correct rounding goes up; rounding through float first would
  // land on the tie and go down to even.
  const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(round_operand(above_tie, Operands::bf16), 1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(static_cast<double>(round_operand(static_cast<float>(above_tie), Operands::bf16)), 1.0);
  // The same for a value only mpfr can hold, and the generic path on mpfr_float agrees with double.
  set_mpfr_bits(200);
  const mpfr_float y = mpfr_float(1) + pow(mpfr_float(2), -8) + pow(mpfr_float(2), -150);
  EXPECT_EQ(round_operand(y, Operands::bf16), mpfr_float(1) + pow(mpfr_float(2), -7));
  for (int i = 0; i < 2000; ++i) {
    const double x = spread_double(rng);
    for (Operands o : {Operands::bf16, Operands::fp16, Operands::fp32})
      ASSERT_EQ(static_cast<double>(round_operand(mpfr_float(x), o)), round_operand(x, o))
          << "x=" << x << " " << to_string(o) << "; " << replay(seed);
  }
}
