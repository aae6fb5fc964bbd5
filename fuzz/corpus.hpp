// The counterexample corpus: every shrunk failing case is saved as a case file under a name
// derived from its content (a hash of the inputs, cotangents, dtype and the implementation's
// options), never overwriting: an existing name is the same case. The fuzz run's facts travel in
// root attributes that read_case ignores (fuzz_impl, fuzz_seed, fuzz_config, fuzz_found,
// fuzz_original), so one file is enough to replay it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fixtures/case.hpp"

namespace qed::fuzz {

struct CorpusMeta {
  std::string impl_args;  // ImplSpec::args() of the implementation that failed
  uint64_t seed = 0;      // campaign seed and configuration index it came from
  int64_t config = -1;
  std::string found;      // one-line failure summary of the shrunk case
  std::string original;   // describe() of the case before shrinking
};

// 16 hex digits (FNV-1a, 64 bits) over dtype, variant, arm, dims, scale, every input and
// cotangent (IEEE bytes), cu_seqlens and `impl_args`.
std::string content_hash(const fixtures::Case& c, const std::string& impl_args);

struct Saved {
  std::string path;
  bool existed = false;  // the same case was already in the corpus
};

// Saves `c` (inputs and cotangents only) as DIR/<impl>-<hash>.h5, creating DIR if needed.
Saved save_counterexample(const std::string& dir, const fixtures::Case& c, const CorpusMeta& meta);

struct CorpusEntry {
  fixtures::Case c;
  CorpusMeta meta;
};
CorpusEntry read_counterexample(const std::string& path);

// The *.h5 files of a corpus folder, sorted by name (empty if the folder does not exist).
std::vector<std::string> corpus_files(const std::string& dir);

}  // namespace qed::fuzz
