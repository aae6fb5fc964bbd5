// The precision-escalating oracle. A computation is run at two precisions; for every dataset the
// number of significant decimal digits on which the two agree is certified for the result. In
// auto mode the pair of precisions is raised until the requested digits are certified for every
// dataset, or a cap is reached (then the report says so and shows what was certified).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "reference/error.hpp"
#include "reference/scalar.hpp"

namespace qed::reference {

// Named tensors of one evaluation, kept in mpfr so that any scalar type converts exactly.
using Named = std::vector<std::pair<std::string, std::vector<mpfr_float>>>;

template <class S>
mpfr_float to_mpfr(const S& x) {
  if constexpr (std::is_same_v<S, mpfr_float>) {
    return x;
  } else if constexpr (std::is_same_v<S, float128>) {
    // Exact: split into two doubles (float128 has 113 bits, two doubles hold 106 + the rest).
    double hi = static_cast<double>(x);
    float128 r1 = x - float128(hi);
    double mid = static_cast<double>(r1);
    double lo = static_cast<double>(r1 - float128(mid));
    return mpfr_float(hi) + mpfr_float(mid) + mpfr_float(lo);
  } else {
    return mpfr_float(static_cast<double>(x));
  }
}

template <class S>
std::vector<mpfr_float> to_mpfr_vec(const std::vector<S>& x) {
  std::vector<mpfr_float> out;
  out.reserve(x.size());
  for (const auto& e : x) out.push_back(to_mpfr(e));
  return out;
}

struct CertifiedDataset {
  std::string name;
  std::vector<double> hi, lo;  // double-double value hi + lo of the certified result
  double digits = 0;           // certified significant decimal digits of hi + lo
  double max_abs = 0;
  int64_t worst_index = -1;    // element with the fewest agreeing digits (-1: all exact)
};

struct OracleReport {
  Precision precision;  // precision of the reported values
  Precision check;      // precision they were compared against
  double target_digits = 0;
  bool target_met = true;
  std::string note;
  std::vector<CertifiedDataset> datasets;
  double seconds = 0;
  int escalations = 0;
};

// Digits of double-double storage: relative rounding 2^-106 per element.
// The most any dataset can be certified to (storage_digits of an exact value: 31.909), rounded
// down: auto mode refuses to aim higher, which it could never reach.
inline constexpr double kMaxCertifiedDigits = 31.9;
inline double storage_digits(double certified) {
  const double dd = std::ldexp(1.0, -106);
  return -std::log10(std::pow(10.0, -certified) + dd);
}

// Element-wise agreement of `value` with `check`: min over elements of -log10(|v - c| / |c|).
// An element whose check value is below 10^-P * max|check| (P = value's decimal digits) is judged
// against 10^-P * max|check| instead, so that exact zeros and rounding-level residues do not
// block certification; `cap` bounds the answer by what the value's precision can carry.
inline double agreement_digits(const std::vector<mpfr_float>& value,
                               const std::vector<mpfr_float>& check, double cap,
                               int64_t* worst = nullptr) {
  mpfr_float maxabs(0);
  for (const auto& c : check) maxabs = std::max<mpfr_float>(maxabs, abs(c));
  if (worst) *worst = -1;
  if (maxabs == 0) {
    for (size_t i = 0; i < value.size(); ++i)
      if (value[i] != 0) {
        if (worst) *worst = static_cast<int64_t>(i);
        return 0;
      }
    return cap;
  }
  const mpfr_float floor_abs = maxabs * pow(mpfr_float(10), -mpfr_float(cap));
  double best = cap;
  for (size_t i = 0; i < value.size(); ++i) {
    mpfr_float diff = abs(value[i] - check[i]);
    if (diff == 0) continue;
    mpfr_float denom = std::max<mpfr_float>(abs(check[i]), floor_abs);
    double d = -static_cast<double>(log10(diff / denom));
    if (d < best) {
      best = d;
      if (worst) *worst = static_cast<int64_t>(i);
    }
  }
  return std::max(0.0, std::min(best, cap));
}

// The precision used to check a fixed-precision result.
inline Precision check_precision_for(const Precision& p) {
  switch (p.kind) {
    case ScalarKind::f32: return Precision::f64();
    case ScalarKind::f64: return Precision::f128();
    case ScalarKind::f128: return Precision::mpfr(2 * 113 + 32);
    case ScalarKind::mpfr: return Precision::mpfr(2 * p.bits + 32);
  }
  return Precision::f128();
}

using Compute = std::function<Named(const Precision&)>;

namespace detail {

inline OracleReport compare(const Named& value, const Named& check, const Precision& pv,
                            const Precision& pc) {
  OracleReport rep;
  rep.precision = pv;
  rep.check = pc;
  set_mpfr_bits(std::max(pv.bits, pc.bits) + 64);
  for (size_t d = 0; d < value.size(); ++d) {
    CertifiedDataset cd;
    cd.name = value[d].first;
    const auto& v = value[d].second;
    const auto& c = check[d].second;
    double raw = agreement_digits(v, c, pv.decimal_digits(), &cd.worst_index);
    cd.digits = pv.bits > 53 ? storage_digits(raw) : raw;
    cd.hi.resize(v.size());
    cd.lo.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      double hi = static_cast<double>(v[i]);
      cd.hi[i] = hi;
      cd.lo[i] = pv.bits > 53 ? static_cast<double>(mpfr_float(v[i] - hi)) : 0.0;
      cd.max_abs = std::max(cd.max_abs, std::abs(hi));
    }
    rep.datasets.push_back(std::move(cd));
  }
  return rep;
}

}  // namespace detail

// One precision, checked against a higher one (check_precision_for).
inline OracleReport evaluate_fixed(const Compute& compute, const Precision& p) {
  auto t0 = std::chrono::steady_clock::now();
  Precision pc = check_precision_for(p);
  Named check = compute(pc);
  Named value = compute(p);
  OracleReport rep = detail::compare(value, check, p, pc);
  rep.target_digits = 0;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

// Auto mode: start near the target, compare with a precision at least 64 bits (and 50%) higher,
// and raise the pair until every dataset has at least `target_digits` certified digits or the
// next precision would pass `cap_bits`.
// The cap bounds every precision computed, the first pair's included: a cap below the first
// check precision is refused (qed::Error) before anything is computed.
inline int auto_start_bits(double target_digits) {
  return static_cast<int>(std::ceil(target_digits / 0.30102999566398120)) + 40;
}
inline int auto_check_bits(int bits) { return std::max(bits + 64, bits * 3 / 2); }

inline OracleReport evaluate_auto(const Compute& compute, double target_digits,
                                  int cap_bits = 4096) {
  auto t0 = std::chrono::steady_clock::now();
  if (!(target_digits >= 1 && target_digits <= kMaxCertifiedDigits)) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "auto mode: %g digits asked (rule: 1 to %.1f digits; results are stored as "
                  "double-double, 106 bits)",
                  target_digits, kMaxCertifiedDigits);
    throw qed::Error(buf);
  }
  Precision lo = Precision::mpfr(auto_start_bits(target_digits));
  if (auto_check_bits(lo.bits) > cap_bits) {
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "--cap-bits %d: certifying %g digits starts at mpfr:%d checked against mpfr:%d "
                  "(rule: the precision cap is at least auto mode's first check precision)",
                  cap_bits, target_digits, lo.bits, auto_check_bits(lo.bits));
    throw qed::Error(buf);
  }
  Named lo_val = compute(lo);
  OracleReport rep;
  int escalations = 0;
  for (;;) {
    Precision hi = Precision::mpfr(auto_check_bits(lo.bits));
    Named hi_val = compute(hi);
    // The reported values are the higher-precision ones; their digits are certified by the
    // agreement with the lower precision, which cannot exceed what the lower one resolves.
    rep = detail::compare(hi_val, lo_val, hi, lo);
    double worst = std::numeric_limits<double>::infinity();
    for (auto& d : rep.datasets) {
      d.digits = std::min(d.digits, lo.decimal_digits());
      worst = std::min(worst, d.digits);
    }
    if (rep.datasets.empty() || worst >= target_digits) break;
    if (auto_check_bits(hi.bits) > cap_bits) {
      rep.target_met = false;
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "precision cap of %d bits reached: %.1f digits certified, %.1f requested",
                    cap_bits, worst, target_digits);
      rep.note = buf;
      break;
    }
    ++escalations;
    lo = hi;
    lo_val = std::move(hi_val);
  }
  rep.target_digits = target_digits;
  rep.escalations = escalations;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace qed::reference
