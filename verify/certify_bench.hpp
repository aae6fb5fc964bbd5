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
// Markdown (what the CUDA benchmarks write to reports/bench/*.md): every pipe table in the file;
// the row name is the first column; our times are in columns whose header says "ours" or names a
// time unit, never one saying peer, fla, vs, ratio, speedup, floor, target, note or "/"; the peer
// time is the first column saying peer or fla. Rows without a time are skipped; a name seen twice
// is prefixed with the nearest heading above its table. Several "ours ..." columns give one row
// each, named "<first column> / <header>". Times carry their unit in the cell ("3.58 ms", "4.31 us
// (0.49 TB/s)"), in the header ("ours (ms)"), or in the text between the previous table and this
// one ("Times in ms"); a table with none of these is not timed (an accuracy table) and is skipped.
// The first heading stands for the machine.
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
