#include "verify/golden_replay.hpp"

#include <chrono>
#include <filesystem>

#include "reference/error.hpp"
#include "verify/compare_golden.hpp"
#include "verify/verdict.hpp"

namespace qed::verify {

std::string default_replay_budget(const RunOptions& run) {
  const bool cuda = run.impl.rfind("cuda-", 0) == 0;
  if (cuda) return run.dtype == "fp32" ? "replay_float32.json" : "replay_bf16.json";
  if (run.operands == "bf16" || run.operands == "fp16") return "replay_bf16.json";
  return run.precision.bits >= 53 ? "replay_float64.json" : "replay_float32.json";
}

std::vector<ReplayRow> replay_golden(const std::string& dir, const RunOptions& run,
                                     const std::string& tolerance_file) {
  namespace fs = std::filesystem;
  const GoldenManifest manifest = read_golden_manifest(dir);
  VerifyOptions vo;
  vo.tolerance = read_tolerance_file(
      tolerance_file.empty() ? (fs::path(dir) / default_replay_budget(run)).string() : tolerance_file);
  vo.golden_dir = dir;
  vo.threads = run.threads;
  std::vector<ReplayRow> rows;
  for (const GoldenEntry& e : manifest.cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string path = (fs::path(dir) / e.file).string();
    fixtures::Case cand;
    try {
      cand = run_implementation(fixtures::read_case(path), run);
    } catch (const qed::Error& err) {
      throw qed::Error(path + ": " + run.impl + " cannot run this golden case: " + err.what());
    }
    cand.path = path + " (by " + run.impl + ")";
    const Verdict v = verify_candidate(cand, vo);
    ReplayRow r;
    r.name = e.name;
    r.pass = v.pass;
    r.reference_source = v.reference.source;
    r.datasets = static_cast<int>(v.datasets.size());
    for (const DatasetVerdict& d : v.datasets)
      if (r.worst_dataset.empty() || !(d.score <= r.worst_score)) {
        r.worst_score = d.score;
        r.worst_dataset = d.metrics.name;
        r.worst_rel_frobenius = d.metrics.rel_frobenius;
      }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rows.push_back(r);
  }
  return rows;
}

}  // namespace qed::verify
