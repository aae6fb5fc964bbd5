// The regression gate: passes on the certified implementation, fails on a degraded one (bf16
// operands where fp32 was certified) and on a tightened certificate; the exactness properties
// hold and catch their own mutations; benchmark tables parse and a slowdown past the margin fails.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "properties/test_certify_support.hpp"
#include "verify/certificate.hpp"
#include "verify/certify_gate.hpp"

using namespace qed;
using namespace qed::verify;
using namespace qed::certify_test;

namespace {

// One tiny certificate of reference-chunked+fp32 per test binary run.
const std::string& tiny_certificate() {
  static Scratch tmp("gate-cert");
  static const std::string path = [] {
    CertifyOptions o = tiny_sweep(tmp.dir.string(), test_seed());
    o.impls = {"reference-chunked"};
    run_certify(o, nullptr);
    return tmp / "reference-chunked+fp32.json";
  }();
  return path;
}

GateOptions gate_on(const std::string& cert) {
  GateOptions g;
  g.certificates = {cert};
  g.exact = false;
  g.threads = 1;
  return g;
}

}  // namespace

TEST(Gate, PassesOnTheCertifiedImplementation) {
  GateOptions g = gate_on(tiny_certificate());
  g.all_cells = true;
  const GateResult r = run_gate(g, nullptr);
  EXPECT_TRUE(r.pass) << replay(test_seed());
  EXPECT_EQ(r.cells, 8);
  EXPECT_EQ(r.runs, 16);
  for (const auto& row : r.rows) {
    // Same machine, same seeds: the very numbers the certificate recorded.
    EXPECT_EQ(row.measured, row.recorded) << row.cell << " " << row.dataset;
    EXPECT_LE(row.measured, row.bound);
  }
  // By default only the smallest T is re-measured.
  const GateResult fast = run_gate(gate_on(tiny_certificate()), nullptr);
  EXPECT_TRUE(fast.pass);
  EXPECT_EQ(fast.cells, 4);
}

TEST(Gate, FailsOnBf16OperandsWhereFp32WasCertified) {
  GateOptions g = gate_on(tiny_certificate());
  g.operands = "bf16";
  const GateResult r = run_gate(g, nullptr);
  EXPECT_FALSE(r.pass) << replay(test_seed());
  int failing = 0;
  for (const auto& row : r.rows) {
    failing += !row.pass;
    if (row.dataset == "o" && row.metric == "rel_frobenius") {
      EXPECT_GT(row.measured, 100 * row.bound);
    }
  }
  EXPECT_GT(failing, static_cast<int>(r.rows.size()) / 2);
  // The report names the candidate and the failures.
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* mem = ::open_memstream(&buf, &len);
  print_gate(mem, r);
  std::fclose(mem);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_NE(text.find("operands=bf16 on float32 inputs (certificate's subject: reference-chunked "
                      "precision=float chunk=64 operands=fp32)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("above their certified bound"), std::string::npos) << text;
  EXPECT_NE(text.find("gate: FAIL"), std::string::npos) << text;
}

TEST(Gate, FailsWhenTheCertificateIsTighterThanTheMeasurement) {
  Certificate c = read_certificate(tiny_certificate());
  // Tighten one bound of one dataset below what was measured: exactly that check must fail.
  for (auto& cell : c.cells)
    if (cell.spec.T == 16 && cell.spec.regime == "hard" && cell.spec.variant == "qed")
      for (auto& d : cell.datasets)
        if (d.name == "dlambda") d.bound_max_abs = 0.5 * d.max_max_abs;
  Scratch tmp("gate-tight");
  write_certificate(tmp / "tight.json", c);
  const GateResult r = run_gate(gate_on(tmp / "tight.json"), nullptr);
  EXPECT_FALSE(r.pass);
  int failing = 0;
  for (const auto& row : r.rows)
    if (!row.pass) {
      ++failing;
      EXPECT_EQ(row.dataset, "dlambda");
      EXPECT_EQ(row.metric, "max_abs");
    }
  EXPECT_GE(failing, 1);
}

TEST(Gate, SkipsImplementationsThatCannotRunHereUnlessRequired) {
  GateOptions g = gate_on(tiny_certificate());
  g.impl = "no-such-kernel";  // what a CUDA certificate is on a machine without a device
  const GateResult skipped = run_gate(g, nullptr);
  EXPECT_TRUE(skipped.pass);
  EXPECT_EQ(skipped.cells, 0);
  ASSERT_FALSE(skipped.notes.empty());
  EXPECT_NE(skipped.notes.back().find("cannot run here"), std::string::npos)
      << skipped.notes.back();
  EXPECT_NE(skipped.notes.back().find("skipped"), std::string::npos) << skipped.notes.back();
  g.require_all = true;
  EXPECT_FALSE(run_gate(g, nullptr).pass);
}

TEST(Gate, ExactnessPropertiesHoldAndCatchTheirMutations) {
  const uint64_t seed = test_seed();
  const ExactCheck ok = exact_chunked_vs_recurrent(256, 256, seed);
  EXPECT_TRUE(ok.pass) << ok.detail << "; " << replay(seed);
  EXPECT_LT(ok.measured, 1e-70) << ok.detail;
  // One side at 128 bits: the discrepancy is ~1e-38, far above 1e-60.
  const ExactCheck low = exact_chunked_vs_recurrent(128, 256, seed);
  EXPECT_FALSE(low.pass) << low.detail;
  EXPECT_GT(low.measured, 1e-45);

  RunOptions rec;
  rec.impl = "reference-recurrent";
  rec.precision = reference::Precision::f32();
  rec.threads = 1;
  RunOptions ch = rec;
  ch.impl = "reference-chunked";
  ch.operands = "fp32";
  for (const RunOptions& r : {rec, ch}) {
    const ExactCheck e = exact_lambda0_is_gdn2(r, r, seed);
    EXPECT_TRUE(e.pass) << e.name << ": " << e.detail << "; " << replay(seed);
  }
  // qed through one implementation, gdn2 through another: values differ, and the check says so.
  const ExactCheck mixed = exact_lambda0_is_gdn2(ch, rec, seed);
  EXPECT_FALSE(mixed.pass) << mixed.detail;
  EXPECT_NE(mixed.detail.find("values differ"), std::string::npos) << mixed.detail;
}

TEST(GateBench, MarkdownAndJsonTablesParse) {
  const std::string md =
      "# Recurrent kernels\n\nSome text | with a pipe.\n\n"
      "| config | ours (ms) | fla (ms) | speedup |\n|---|---:|---:|---|\n"
      "| fwd T=4096 | 1.25 | 1.50 | 1.2x |\n| bwd T=4096 | **2.5** | 3.0 | 1.2x |\n"
      "| broken | n/a | 1 | - |\n\n"
      "## Decode\n\n| config | median ms |\n|---|---|\n| fwd T=4096 | 0.5 |\n";
  const BenchTable t = parse_bench_markdown(md, "r.md");
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.rows[0].name, "Recurrent kernels / fwd T=4096");  // duplicate names get their heading
  EXPECT_EQ(t.rows[0].ms, 1.25);
  EXPECT_EQ(t.rows[0].peer_ms, 1.5);
  EXPECT_EQ(t.rows[1].name, "bwd T=4096");
  EXPECT_EQ(t.rows[1].ms, 2.5);
  EXPECT_EQ(t.rows[2].name, "Decode / fwd T=4096");
  EXPECT_EQ(t.rows[2].ms, 0.5);
  EXPECT_TRUE(std::isnan(t.rows[2].peer_ms));

  // The shapes reports/bench/*.md take: units in the cells, several of our columns with the unit
  // given in the text above, ratio/floor/target columns, and an accuracy table that is not timed.
  const std::string cells_with_units =
      "| benchmark | ours | peer | ratio | target | note |\n| --- | --- | --- | --- | --- | --- |\n"
      "| forward bf16 | 3.580 ms | 10.240 ms | 2.86x faster | >= 2x | ok |\n"
      "| backward | 30.09 ms | (none) | 8.4x | report | |\n"
      "| decode B=1 | 4.31 us (0.49 TB/s) | 3.86 us (0.55 TB/s) | 0.90x | no slower | |\n";
  const BenchTable u = parse_bench_markdown(cells_with_units, "u.md");
  ASSERT_EQ(u.rows.size(), 3u);
  EXPECT_EQ(u.rows[0].name, "forward bf16");
  EXPECT_DOUBLE_EQ(u.rows[0].ms, 3.58);
  EXPECT_DOUBLE_EQ(u.rows[0].peer_ms, 10.24);
  EXPECT_TRUE(std::isnan(u.rows[1].peer_ms));
  EXPECT_DOUBLE_EQ(u.rows[2].ms, 4.31e-3);
  EXPECT_DOUBLE_EQ(u.rows[2].peer_ms, 3.86e-3);
  const std::string several =
      "# Chunked forward\n\nTimes in ms, median of 15.\n\n"
      "| shape | floor | ours GDN-2 | ours QED full | peer chunk_gdn2 | ours vs peer |\n"
      "| --- | --- | --- | --- | --- | --- |\n| [8,4096,16,128] | 0.230 | 3.373 | 3.868 | 2.139 | "
      "0.63x |\n\n"
      "Accuracy against float64:\n\n| regime | ours o | ours ht | peer o |\n| --- | --- | --- | "
      "--- |\n"
      "| std | 3.35e-3 | 3.38e-6 | 3.33e-3 |\n";
  const BenchTable v = parse_bench_markdown(several, "v.md");
  ASSERT_EQ(v.rows.size(), 2u);
  EXPECT_EQ(v.rows[0].name, "[8,4096,16,128] / ours GDN-2");
  EXPECT_DOUBLE_EQ(v.rows[0].ms, 3.373);
  EXPECT_DOUBLE_EQ(v.rows[0].peer_ms, 2.139);
  EXPECT_EQ(v.rows[0].peer, "peer chunk_gdn2");
  EXPECT_EQ(v.rows[1].name, "[8,4096,16,128] / ours QED full");
  EXPECT_DOUBLE_EQ(v.rows[1].ms, 3.868);

  const BenchTable j = parse_bench_json(
      R"({"schema": "qedcheck.bench/1", "machine": "H200", "unit": "ms",
          "rows": [{"name": "a", "ms": 2.0, "peer": "fla", "peer_ms": 2.5}, {"name": "b", "ms": 1.0}]})",
      "b.json");
  ASSERT_EQ(j.rows.size(), 2u);
  EXPECT_EQ(j.machine, "H200");
  EXPECT_EQ(j.rows[0].peer, "fla");
  auto message = [](const std::string& text) {
    try {
      (void)parse_bench_json(text, "b.json");
    } catch (const qed::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"({"schema": "x", "rows": []})"),
            "b.json: schema must be \"qedcheck.bench/1\"");
  EXPECT_EQ(message(R"({"schema": "qedcheck.bench/1", "rows": [{"name": "a", "ms": 0}]})"),
            "b.json: rows[0]: needs \"ms\", a number > 0");
  EXPECT_EQ(
      message(
          R"({"schema": "qedcheck.bench/1", "rows": [{"name": "a", "ms": 1}, {"name": "a", "ms": 2}]})"),
      "b.json: rows[1]: name 'a' appears twice");
  try {
    (void)parse_bench_markdown("no table here\n", "e.md");
    ADD_FAILURE() << "no error";
  } catch (const qed::Error& e) {
    EXPECT_NE(std::string(e.what()).find("e.md: no benchmark rows"), std::string::npos);
  }
}

TEST(GateBench, SlowdownPastTheMarginFails) {
  BenchTable base, fresh;
  base.rows = {{"a", 1.0, "", NAN}, {"b", 2.0, "", NAN}, {"gone", 1.0, "", NAN}};
  fresh.rows = {{"a", 1.09, "", NAN}, {"b", 2.3, "", NAN}, {"new", 5.0, "", NAN}};
  const auto d = compare_bench(base, fresh, 0.10);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].status, "ok");
  EXPECT_TRUE(d[0].pass);
  EXPECT_EQ(d[1].status, "slower");
  EXPECT_FALSE(d[1].pass);
  EXPECT_NEAR(d[1].ratio, 1.15, 1e-12);
  EXPECT_EQ(d[2].status, "missing");
  EXPECT_TRUE(d[2].pass);
  EXPECT_EQ(d[3].status, "new");

  // Through the gate, with files: the committed JSON against a fresh Markdown table.
  Scratch tmp("gate-bench");
  {
    std::ofstream(tmp / "base.json")
        << R"({"schema": "qedcheck.bench/1", "rows": [{"name": "fwd", "ms": 1.0}]})";
    std::ofstream(tmp / "fresh_ok.md") << "| bench | ms |\n|---|---|\n| fwd | 1.05 |\n";
    std::ofstream(tmp / "fresh_slow.md") << "| bench | ms |\n|---|---|\n| fwd | 1.2 |\n";
  }
  GateOptions g;
  g.exact = false;
  g.bench_baseline = tmp / "base.json";
  g.bench_table = tmp / "fresh_ok.md";
  EXPECT_TRUE(run_gate(g, nullptr).pass);
  g.bench_table = tmp / "fresh_slow.md";
  const GateResult r = run_gate(g, nullptr);
  EXPECT_FALSE(r.pass);
  ASSERT_EQ(r.bench.size(), 1u);
  EXPECT_EQ(r.bench[0].status, "slower");
}
