// Round-to-nearest-even into a narrower binary floating-point format (bf16, fp16, fp32), for any
// scalar type, with the target's exponent range: gradual underflow to subnormals and zero, and
// overflow to infinity. Used by the chunked twin to model tensor-core operand storage.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "reference/error.hpp"

namespace qed::reference {

// Storage type of matrix-product operands; `none` keeps them in the computation's scalar type.
enum class Operands { none, fp32, bf16, fp16 };

inline std::string_view to_string(Operands o) {
  switch (o) {
    case Operands::none: return "none";
    case Operands::fp32: return "fp32";
    case Operands::bf16: return "bf16";
    case Operands::fp16: return "fp16";
  }
  return "?";
}

inline Operands parse_operands(std::string_view s) {
  for (Operands o : {Operands::none, Operands::fp32, Operands::bf16, Operands::fp16})
    if (s == to_string(o)) return o;
  throw qed::Error("operands '" + std::string(s) + "': expected none, fp32, bf16 or fp16");
}

// A binary format: `digits` significand bits (implicit bit included), normal exponents
// emin..emax in the frexp-free convention x = 1.f * 2^e.
struct BinaryFormat {
  int digits;
  int emin;
  int emax;
};

inline constexpr BinaryFormat format_of(Operands o) {
  switch (o) {
    case Operands::fp32: return {24, -126, 127};
    case Operands::bf16: return {8, -126, 127};
    case Operands::fp16: return {11, -14, 15};
    case Operands::none: break;
  }
  return {0, 0, 0};
}

// Rounds x to the nearest value of format f, ties to even, in one step (no double rounding even
// when S is wider than double). NaN stays NaN, infinities stay, the sign of zero is kept.
// Only frexp/ldexp/floor and comparisons are used, so this is exact for every scalar type.
template <class S>
S round_to_format(const S& x, const BinaryFormat& f) {
  using std::floor;
  using std::frexp;
  using std::ldexp;
  if (x != x) return x;     // NaN
  if (x == S(0)) return x;  // keeps the sign of zero
  const bool neg = x < S(0);
  const S ax = neg ? S(-x) : x;
  // Largest finite value: (2 - 2^(1-digits)) 2^emax; anything at or above max + half an ulp,
  // (2 - 2^-digits) 2^emax, rounds to infinity. When S cannot hold that threshold (fp32 into
  // float) it becomes infinity itself, and correctly so: then no finite x of S overflows.
  const S overflow = ldexp(S(2) - ldexp(S(1), -f.digits), f.emax);
  if (ax >= overflow) {
    const S inf =
        std::numeric_limits<S>::has_infinity ? std::numeric_limits<S>::infinity() : S(1) / S(0);
    return neg ? S(-inf) : inf;
  }
  int e2 = 0;
  (void)frexp(ax, &e2);  // ax = m 2^e2, m in [0.5, 1): leading bit has weight 2^(e2-1)
  const int e = e2 - 1 < f.emin ? f.emin : e2 - 1;  // subnormals share the quantum of emin
  const int shift = e - f.digits + 1;               // quantum = 2^shift
  const S y = ldexp(ax, -shift);                    // exact: a power-of-two scaling
  S n = floor(y);
  const S frac = y - n;  // exact: y and n differ below 2^digits
  if (frac > S(0.5)) {
    n += S(1);
  } else if (frac == S(0.5)) {
    // n < 2^digits <= 2^24 fits a long long exactly.
    if (static_cast<long long>(n) % 2 != 0) n += S(1);
  }
  const S r = ldexp(n, shift);
  return neg ? S(-r) : r;
}

// Rounds x to the operand storage type o (identity for Operands::none).
template <class S>
S round_operand(const S& x, Operands o) {
  if (o == Operands::none) return x;
  return round_to_format(x, format_of(o));
}

}  // namespace qed::reference
