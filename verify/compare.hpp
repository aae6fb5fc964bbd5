// Error metrics of one candidate dataset against a reference dataset: relative Frobenius error,
// max abs error, max relative error over significant elements, error in units of the candidate
// dtype's unit roundoff, and where the worst (and the first non-finite) element sits, named by
// its axes ((b,t,h,k) for q-shaped data, (n,h,k,v) for states, (h) for dlambda, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fixtures/case.hpp"

namespace qed::verify {

// Unit roundoff of a case dtype: float64 2^-53, float32 2^-24, bfloat16 2^-8, float16 2^-11.
// Throws qed::Error for any other name.
double unit_roundoff(const std::string& dtype);

// Elements whose |reference| is below this fraction of max|reference| are left out of the max
// relative error: near-zeros of a dataset carry no relative accuracy worth judging.
inline constexpr double kSignificantFraction = 1e-3;

// Expected shape and axis names of a result dataset ("outputs/o", "grads/dk", ...) of a case.
struct Axes {
  std::vector<int64_t> shape;
  std::vector<std::string> labels;  // "b","t","h","k" | "n","h","k","v" | "h" | ...
};
Axes result_axes(const fixtures::Case& c, const std::string& name);

// A flat index together with its multi-index along named axes.
struct Location {
  int64_t flat = -1;  // -1: none
  std::vector<int64_t> index;
  std::vector<std::string> labels;
  std::string text() const;  // "(b=0, t=3, h=1, k=2)" or "-"
};
Location locate(const Axes& axes, int64_t flat);

struct Metrics {
  std::string name;  // "outputs/o", "grads/dk", ...
  Axes axes;
  int64_t count = 0;
  double ref_frobenius = 0;   // ||ref||_F
  double ref_max_abs = 0;     // max |ref|
  double err_frobenius = 0;   // ||cand - ref||_F
  double rel_frobenius = 0;   // err_frobenius / ref_frobenius (err_frobenius when ref is all 0)
  double max_abs_error = 0;   // max |cand - ref|
  Location max_abs_at;
  double max_rel_error = 0;   // max |cand - ref| / |ref| over |ref| >= significant_floor
  Location max_rel_at;
  double significant_floor = 0;  // kSignificantFraction * ref_max_abs
  double eps_units = 0;       // rel_frobenius / unit roundoff of the candidate dtype
  bool finite = true;         // every candidate element finite
  Location first_nonfinite;
  double nonfinite_value = 0;
};

// Compares candidate values (data + lo) with reference values (data + lo). Shapes must agree
// with `axes` (the caller validates candidates; this throws qed::Error naming `name` otherwise).
// Differences are formed as (c.hi - r.hi) + (c.lo - r.lo), so a double-double candidate is
// judged at its full precision and a reference's low part is never lost.
Metrics compare_dataset(const std::string& name, const Axes& axes, const fixtures::Dataset& candidate,
                        const fixtures::Dataset& reference, double unit_roundoff);

}  // namespace qed::verify
