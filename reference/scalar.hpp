// The scalar types the reference is instantiated for, and a run-time precision choice
// (float, double, float128, mpfr with a bit count) with a dispatcher that calls a generic
// functor with the matching type.
#pragma once

#include <boost/multiprecision/float128.hpp>
#include <boost/multiprecision/mpfr.hpp>
#include <cmath>
#include <cstdint>
#include <string>

#include "reference/error.hpp"

namespace qed::reference {

using float128 = boost::multiprecision::float128;
using mpfr_float = boost::multiprecision::mpfr_float;

enum class ScalarKind { f32, f64, f128, mpfr };

struct Precision {
  ScalarKind kind = ScalarKind::f64;
  int bits = 53;  // significand bits (mpfr: the requested precision)

  static Precision f32() { return {ScalarKind::f32, 24}; }
  static Precision f64() { return {ScalarKind::f64, 53}; }
  static Precision f128() { return {ScalarKind::f128, 113}; }
  static Precision mpfr(int b) { return {ScalarKind::mpfr, b}; }

  // Unit roundoff 2^-bits expressed in decimal digits.
  double decimal_digits() const { return bits * 0.30102999566398120; }

  std::string name() const {
    switch (kind) {
      case ScalarKind::f32: return "float";
      case ScalarKind::f64: return "double";
      case ScalarKind::f128: return "float128";
      case ScalarKind::mpfr: return "mpfr:" + std::to_string(bits);
    }
    return "?";
  }
};

// Parses float | double | float128 | mpfr:BITS (16 <= BITS <= 1<<20).
inline Precision parse_precision(const std::string& s) {
  if (s == "float" || s == "fp32" || s == "float32") return Precision::f32();
  if (s == "double" || s == "fp64" || s == "float64") return Precision::f64();
  if (s == "float128") return Precision::f128();
  if (s.rfind("mpfr:", 0) == 0) {
    const std::string num = s.substr(5);
    char* end = nullptr;
    long b = std::strtol(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || b < 16 || b > (1L << 20))
      throw Error("precision '" + s + "': mpfr:BITS needs an integer BITS in [16, 1048576]");
    return Precision::mpfr(static_cast<int>(b));
  }
  throw Error("precision '" + s + "': expected float, double, float128, mpfr:BITS or auto:DIGITS");
}

// Sets the default precision of newly created mpfr_float values to at least `bits` bits.
// Boost 1.74 keeps one process-wide default: set it before any parallel work starts.
inline void set_mpfr_bits(int bits) {
  // Boost takes decimal digits and converts them to bits (rounding up).
  unsigned d10 = static_cast<unsigned>(std::ceil(bits * 0.30102999566398120));
  mpfr_float::default_precision(d10 < 2 ? 2 : d10);
}

// Calls f.template operator()<S>() with the scalar type of p (after setting the mpfr precision).
template <class F>
decltype(auto) with_scalar(const Precision& p, F&& f) {
  // Results are converted to mpfr_float at the current default precision: keep it at least wide
  // enough to hold a float128 exactly, whatever an earlier evaluation left.
  if (p.kind != ScalarKind::mpfr) set_mpfr_bits(128);
  switch (p.kind) {
    case ScalarKind::f32: return f.template operator()<float>();
    case ScalarKind::f64: return f.template operator()<double>();
    case ScalarKind::f128: return f.template operator()<float128>();
    case ScalarKind::mpfr:
      set_mpfr_bits(p.bits);
      return f.template operator()<mpfr_float>();
  }
  return f.template operator()<double>();
}

// Conversions to double for any scalar type (explicit for the multiprecision ones).
template <class S>
double to_double(const S& x) {
  return static_cast<double>(x);
}

}  // namespace qed::reference
