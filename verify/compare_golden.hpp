// Finding a case's reference in the golden corpus: a content hash of a case's inputs, exact
// (bit for bit) comparison of inputs and cotangents, and the corpus manifest
// (fixtures/golden/MANIFEST.json, schema "qedcheck.golden/1") that maps hashes to files.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fixtures/case.hpp"

namespace qed::verify {

// 16 hex digits: FNV-1a (64-bit) over variant, arm, dims, the bits of scale and every /inputs
// array (name, length, IEEE bytes) in CASE_FORMAT order. /inputs@dtype is not hashed: it does
// not change the function. A hit is always confirmed with same_inputs.
std::string input_hash(const fixtures::Case& c);
bool same_inputs(const fixtures::Case& a, const fixtures::Case& b);      // bit for bit
bool same_cotangents(const fixtures::Case& a, const fixtures::Case& b);  // both absent, or equal

struct GoldenEntry {
  std::string name;
  std::string file;  // relative to the corpus folder
  std::string input_hash;
  std::string description;
};

struct GoldenManifest {
  std::string dir;
  double digits = 0;  // digits every dataset of the corpus certifies (at least)
  std::vector<GoldenEntry> cases;
};

inline constexpr const char* kGoldenManifest = "MANIFEST.json";

// Reads DIR/MANIFEST.json; throws qed::Error naming the file and the rule broken.
GoldenManifest read_golden_manifest(const std::string& dir);

// The golden case whose inputs equal c's bit for bit (and whose cotangents equal c's when
// `need_cotangents`), read from disk, with its path; nullopt when there is none or `dir` has no
// manifest.
struct GoldenHit {
  fixtures::Case c;
  std::string path;
  std::string name;
};
std::optional<GoldenHit> find_golden(const std::string& dir, const fixtures::Case& c,
                                     bool need_cotangents);

}  // namespace qed::verify
