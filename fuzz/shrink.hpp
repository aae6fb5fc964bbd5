// Shrinking a failing case while it still fails: fewer cotangents, sequences, tokens, heads, key
// and value channels, no h0, scale 1, then simpler values (whole tensors to 0 or 1, elements to
// 0, rounding to 1, 2, 4 or 8 significand bits). Greedy and deterministic: passes repeat until a
// whole round changes nothing or the budget (evaluations, seconds) is spent. Every candidate is
// validated by the case rules first, so the result is always a valid case.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>

#include "fixtures/case.hpp"

namespace qed::fuzz {

using Predicate = std::function<bool(const fixtures::Case&)>;

struct ShrinkOptions {
  double seconds = 120;
  int64_t max_evals = 20000;
  std::FILE* log = nullptr;  // one line per accepted step when set
};

struct ShrinkStats {
  int64_t evals = 0;     // predicate evaluations
  int64_t accepted = 0;  // steps that kept the failure
  double seconds = 0;
  bool budget_hit = false;  // stopped by the budget, not by a fixed point
};

fixtures::Case shrink(const fixtures::Case& failing, const Predicate& still_fails, const ShrinkOptions& opt,
                      ShrinkStats* stats = nullptr);

}  // namespace qed::fuzz
