// Drawing fuzz configurations well beyond the unit tests' distribution: T from 1 to 16384 (long
// sequences only with small K, V, H so that every case stays cheap on a CPU), odd K and V, many
// heads, gates at and near their limits (b, w in {0, 1} and 2^-20 off them, g = 0 and -2^-20,
// g in {-20, -80, -150}, alpha = 1 with b = 1), raw, correlated, zero and (anti-)aligned keys,
// lambda from 0 to 10 (unstable ones included: the oracle is far more precise than the
// implementation, and the twin rule scales with the conditioning), varlen packing with empty
// sequences, large h0, and cotangents.
// Configuration i of seed s depends on (s, i) only.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "fixtures/case.hpp"
#include "fuzz/impl.hpp"

namespace qed::fuzz {

// The classes a configuration falls in, for the coverage report (axis -> class).
using Classes = std::map<std::string, std::string>;

struct Config {
  uint64_t seed = 0;
  int64_t index = 0;
  fixtures::Case c;     // inputs rounded to the implementation's dtype, validated
  ImplSpec spec;        // with the drawn chunk size when the campaign draws it
  Classes classes;
};

struct DrawLimits {
  // Bound on B*T*H*max(K,V)^2-ish work units per case (see config.cpp); scaled by the oracle's
  // cost: double oracles allow the most.
  double work = 0;  // 0: chosen from the implementation's oracle precision
  int64_t max_T = 16384;
};

Config draw_config(uint64_t seed, int64_t index, const ImplSpec& spec, const DrawLimits& limits = {});

}  // namespace qed::fuzz
