// Structural edits of a case's inputs and cotangents, for the shrinker: keep a subset of batch
// rows, tokens, heads, key or value channels, or packed sequences, with every tensor, h0/dht row
// and cu_seqlens entry following along. Results and grads are dropped (they no longer apply).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fixtures/case.hpp"

namespace qed::fuzz {

// Indices to keep along each axis (nullopt: keep all). Tokens index the T axis of every batch
// row; with cu_seqlens the packed sequences shrink by the tokens removed from them. N names
// sequences (batch rows without cu_seqlens, where B and N must agree).
struct Keep {
  std::optional<std::vector<int64_t>> B, T, H, K, V, N;
};

fixtures::Case apply_keep(const fixtures::Case& c, const Keep& keep);

// Removes sequence n (its tokens, its cu_seqlens entry, its h0/dht rows).
fixtures::Case drop_sequence(const fixtures::Case& c, int64_t n);

// Every value tensor of the case (inputs and cotangents) by name, for value simplification.
// Names: q k v g b w beta lambda r h0 do dht; absent tensors are skipped.
void for_each_tensor(fixtures::Case& c, const std::function<void(const std::string&, std::vector<double>&)>& f);
std::vector<double>* tensor(fixtures::Case& c, const std::string& name);

// Number of value elements (inputs and cotangents): the shrinker's measure of size.
int64_t element_count(const fixtures::Case& c);

// Rounds x to `bits` significand bits (round to nearest, ties away), keeping sign and exponent.
double round_bits(double x, int bits);

// One-line description: "qed/full B=1 T=5 H=1 K=2 V=1 N=1 h0 do dtype=float32".
std::string describe(const fixtures::Case& c);

}  // namespace qed::fuzz
