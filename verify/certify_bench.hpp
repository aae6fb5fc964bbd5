// Benchmark tables for the gate: the JSON format "qedcheck.bench/1" defined here, and the
// Markdown tables of reports/bench/*.md; and the comparison of a fresh table with a committed one.
//
// JSON, schema "qedcheck.bench/1":
//   {"schema": "qedcheck.bench/1", "machine": "NVIDIA H200 ...", "git_commit": "...",
//    "created": "2025-01-01T00:00:00Z", "unit": "ms",
//    "rows": [{"name": "cuda-chunked fwd bf16 B=4 T=4096 H=16 K=V=128", "ms": 1.23,
//              "peer": "fla", "peer_ms": 1.41}, ...]}
// "name" identifies a row across tables; "ms" is the time to compare (median of repeats, lower is
// better); "peer"/"peer_ms" are optional (a reference kernel measured in the same run).
// Markdown: every pipe table in the file; the row name is the first column; the time is the
// first column whose header mentions ms and not peer, fla, ratio or speedup; the peer time is a
// column whose header mentions ms and peer (or fla). Rows without a numeric time are skipped;
// a name seen twice is prefixed with the nearest heading above its table.
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace qed::verify {

inline constexpr const char* kBenchSchema = "qedcheck.bench/1";
// A row fails the gate when fresh_ms > baseline_ms * (1 + margin).
inline constexpr double kBenchMargin = 0.10;

struct BenchEntry {
  std::string name;
  double ms = 0;
  std::string peer;
  double peer_ms = std::numeric_limits<double>::quiet_NaN();
};

struct BenchTable {
  std::string path, machine, git_commit, created;
  std::vector<BenchEntry> rows;
};

BenchTable read_bench_table(const std::string& path);  // .json or .md (throws qed::Error)
BenchTable parse_bench_markdown(const std::string& text, const std::string& where);
BenchTable parse_bench_json(const std::string& text, const std::string& where);

struct BenchDiff {
  std::string name;
  double baseline_ms = 0, fresh_ms = 0, ratio = 0;  // ratio = fresh / baseline
  std::string status;  // ok | slower | missing (in the fresh table) | new
  bool pass = true;
};
std::vector<BenchDiff> compare_bench(const BenchTable& baseline, const BenchTable& fresh,
                                     double margin = kBenchMargin);

}  // namespace qed::verify
