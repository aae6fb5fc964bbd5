// Shared numerics of the property tests: machine epsilon per scalar type, conversions to double,
// the residual measures every check returns (bitwise, absolute, relative to a scale), and a
// per-binary table of the worst residual seen per property, printed when the tests finish.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "reference/scalar.hpp"

namespace qed::properties {

using reference::float128;
using reference::mpfr_float;

// Unit roundoff of S (half an ulp of 1). For mpfr: that of the current default precision.
template <class S>
double unit_roundoff() {
  if constexpr (std::is_same_v<S, mpfr_float>) {
    const double bits = std::ceil(mpfr_float::default_precision() / 0.30102999566398120);
    return std::ldexp(1.0, -static_cast<int>(bits));
  } else if constexpr (std::is_same_v<S, float128>) {
    return std::ldexp(1.0, -113);
  } else {
    return std::numeric_limits<S>::epsilon() / 2;
  }
}

template <class S>
double to_d(const S& x) {
  return static_cast<double>(x);
}

// Magnitude of x as a double, kept meaningful below double's range (mpfr residuals of 1e-70
// are fine in double, but 1e-400 would flush; the log scale is what the tests report).
template <class S>
double abs_d(const S& x) {
  using std::abs;
  return to_d(abs(x));
}

template <class S>
S max_abs(const std::vector<S>& x) {
  using std::abs;
  S m(0);
  for (const auto& e : x) m = std::max<S>(m, abs(e));
  return m;
}

// Max |x - y|; +inf on a size mismatch (a shape bug must never look like a pass).
template <class S>
double max_abs_diff(const std::vector<S>& x, const std::vector<S>& y) {
  using std::abs;
  if (x.size() != y.size()) return std::numeric_limits<double>::infinity();
  S m(0);
  for (size_t i = 0; i < x.size(); ++i) {
    S d = abs(x[i] - y[i]);
    if (!(d == d)) return std::numeric_limits<double>::infinity();  // NaN
    m = std::max<S>(m, d);
  }
  return to_d(m);
}

// Max |x - y| / max(max|y|, floor): the residual of MATH.md §9's tolerances.
template <class S>
double rel_max(const std::vector<S>& x, const std::vector<S>& y, double floor = 1e-300) {
  const double scale = std::max(to_d(max_abs(y)), floor);
  return max_abs_diff(x, y) / scale;
}

// 0 when x and y are identical element by element (bitwise up to the sign of zero), else the
// max absolute difference (or +inf on a size mismatch / NaN).
template <class S>
double bitwise_residual(const std::vector<S>& x, const std::vector<S>& y) {
  if (x.size() != y.size()) return std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i])) {
      double d = max_abs_diff(x, y);
      return d > 0 ? d : std::numeric_limits<double>::infinity();
    }
  return 0.0;
}

// Worst residual per property name in this binary, printed once at the end as
//   [residual] <name>: worst <r> over <n> evaluations
// so that a test log doubles as the measurement the reports quote.
class ResidualTable {
 public:
  static ResidualTable& get() {
    static ResidualTable t;
    return t;
  }
  void record(const std::string& name, double r) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& e = rows_[name];
    e.first = std::max(e.first, r);
    e.second += 1;
  }
  void print() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, e] : rows_)
      std::printf("[residual] %-48s worst %.3e over %ld evaluations\n", name.c_str(), e.first,
                  e.second);
    std::fflush(stdout);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::pair<double, long>> rows_;
};

// QEDCHECK_SLOW=1 (set by the `slow` ctest registrations) widens shapes and case counts.
inline bool slow_mode() {
  const char* e = std::getenv("QEDCHECK_SLOW");
  return e != nullptr && e[0] != '\0' && e[0] != '0';
}

inline double record(const std::string& name, double r) {
  ResidualTable::get().record(name, r);
  return r;
}

namespace detail {
class ResidualPrinter : public ::testing::Environment {
 public:
  void TearDown() override { ResidualTable::get().print(); }
};
inline ::testing::Environment* const residual_printer =
    ::testing::AddGlobalTestEnvironment(new ResidualPrinter);
}  // namespace detail

}  // namespace qed::properties
