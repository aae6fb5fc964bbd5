// Certificates: the schema round-trips and is read by `verify --tolerance`; cell statistics,
// bounds, statuses and growth fits; and a sweep resumes after an interruption (in process and
// after SIGKILL of the CLI) without losing or re-measuring finished cells.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <thread>

#include "properties/test_certify_support.hpp"
#include "verify/certificate.hpp"
#include "verify/certify.hpp"
#include "verify/tolerance.hpp"

using namespace qed;
using namespace qed::verify;
using namespace qed::certify_test;

namespace {

CellResult synthetic_cell(const std::string& regime, int64_t T, double err, bool unstable = false) {
  CellResult c;
  c.spec.variant = "qed";
  c.spec.arm = "full";
  c.spec.lambda = 1;
  c.spec.regime = regime;
  c.spec.T = T;
  c.spec.seeds = {0, 1, 2};
  c.spec.unstable = unstable;
  c.oracle = {{"o", 14.5, 2e-16, 1e-16}, {"dq", 13.0, 5e-16, 1e-15}};
  c.oracle_min_digits = 13.0;
  c.state_norm = {3.5, 3.25, 4.0};
  for (const char* name : {"o", "dq"}) {
    DatasetStats d;
    d.name = name;
    d.rel_frobenius = {err, 0.5 * err, 0.75 * err};
    d.max_abs = {2 * err, err, 3 * err};
    d.ref_max_abs = {1.0, 1.5, 0.5};
    c.datasets.push_back(d);
  }
  return c;
}

Certificate synthetic_certificate() {
  Certificate cert;
  cert.subject = make_subject("reference-chunked", "bf16");
  cert.mode = "quick";
  cert.bound_floor = std::ldexp(1.0, -24);
  cert.machine = {"host", "cpu \"quoted\"", 2, ""};
  cert.git_commit = "0123456789012345678901234567890123456789";
  cert.created = "2025-01-01T00:00:00Z";
  cert.updated = "2025-01-02T00:00:00Z";
  for (int64_t T : {64, 128, 256}) {
    // err = 1e-3 T^0.25 exactly: the fit must find p = 0.25 with zero residual.
    cert.cells.push_back(synthetic_cell("hard", T, 1e-3 * std::pow(static_cast<double>(T), 0.25)));
    cert.cells.push_back(
        synthetic_cell("a1b1", T, 1e-2 * std::pow(1.02, static_cast<double>(T)), true));
  }
  for (auto& c : cert.cells)
    finalize_cell(c, cert.safety_factor, cert.bound_floor, std::ldexp(1.0, -8));
  return cert;
}

}  // namespace

TEST(Certificate, SchemaRoundTripsExactly) {
  const Certificate cert = synthetic_certificate();
  const std::string text = certificate_text(cert);
  const Certificate back = certificate_from_json(nlohmann::json::parse(text), "mem");
  EXPECT_EQ(certificate_text(back), text);
  ASSERT_EQ(back.cells.size(), cert.cells.size());
  EXPECT_EQ(back.cells[0].datasets[0].rel_frobenius, cert.cells[0].datasets[0].rel_frobenius);
  EXPECT_EQ(back.subject.name(), "reference-chunked+bf16");
  EXPECT_EQ(back.machine.cpu, "cpu \"quoted\"");
  // Non-finite numbers survive as strings.
  Certificate odd = cert;
  odd.cells[0].datasets[0].rel_frobenius[1] = INFINITY;
  finalize_cell(odd.cells[0], odd.safety_factor, odd.bound_floor, 1.0 / 256);
  const Certificate odd_back =
      certificate_from_json(nlohmann::json::parse(certificate_text(odd)), "mem");
  EXPECT_TRUE(std::isinf(odd_back.cells[0].datasets[0].rel_frobenius[1]));
  EXPECT_EQ(odd_back.cells[0].status, "not-certified");
  EXPECT_EQ(certificate_text(odd_back), certificate_text(odd));
  // The device name of a CUDA subject's certificate is kept; without one, no "gpu" member.
  EXPECT_EQ(nlohmann::json::parse(text)["machine"].count("gpu"), 0u);
  Certificate gpu = cert;
  gpu.machine.gpu = "NVIDIA H200";
  const std::string gpu_text = certificate_text(gpu);
  const Certificate gpu_back = certificate_from_json(nlohmann::json::parse(gpu_text), "mem");
  EXPECT_EQ(gpu_back.machine.gpu, "NVIDIA H200");
  EXPECT_EQ(certificate_text(gpu_back), gpu_text);
  // Likewise the kernels' source fingerprint: kept when recorded, absent (and read back empty,
  // as from a certificate written before it existed) when not.
  EXPECT_EQ(nlohmann::json::parse(text).count("kernel_fingerprint"), 0u);
  EXPECT_TRUE(back.kernel_fingerprint.empty());
  // The tree state: kept when known (clean or modified), absent when unknown.
  EXPECT_EQ(nlohmann::json::parse(text).count("git_tree"), 0u);
  gpu.git_tree = "modified";
  gpu.kernel_fingerprint = "0123456789abcdef";
  const std::string fp_text = certificate_text(gpu);
  const Certificate fp_back = certificate_from_json(nlohmann::json::parse(fp_text), "mem");
  EXPECT_EQ(fp_back.kernel_fingerprint, "0123456789abcdef");
  EXPECT_EQ(fp_back.git_tree, "modified");
  EXPECT_EQ(certificate_text(fp_back), fp_text);
  // The binary's build commit and tree: absent when unknown (and read back unknown, as from a
  // certificate written before they existed), kept when recorded.
  EXPECT_EQ(nlohmann::json::parse(text).count("build_commit"), 0u);
  EXPECT_EQ(back.build_commit, "unknown");
  EXPECT_EQ(back.build_tree, "unknown");
  gpu.build_commit = std::string(40, 'a');
  gpu.build_tree = "clean";
  const std::string bc_text = certificate_text(gpu);
  const Certificate bc_back = certificate_from_json(nlohmann::json::parse(bc_text), "mem");
  EXPECT_EQ(bc_back.build_commit, std::string(40, 'a'));
  EXPECT_EQ(bc_back.build_tree, "clean");
  EXPECT_EQ(certificate_text(bc_back), bc_text);
}

TEST(Certificate, IsReadAsAToleranceFile) {
  const Certificate cert = synthetic_certificate();
  const ToleranceSpec t = parse_tolerance(certificate_text(cert), "cert.json");
  ASSERT_TRUE(t.per_dataset.count("outputs/o"));
  ASSERT_TRUE(t.per_dataset.count("grads/dq"));
  // The largest certified bound: the hard cell at T = 256 (unstable a1b1 cells are excluded).
  const double worst = 1e-3 * std::pow(256.0, 0.25);
  EXPECT_DOUBLE_EQ(t.per_dataset.at("outputs/o").rtol_frobenius, 4 * worst);
  EXPECT_DOUBLE_EQ(t.per_dataset.at("outputs/o").atol_max, 4 * 3 * worst);
  EXPECT_FALSE(t.wildcard.has_value());
}

TEST(Certificate, RejectsBrokenDocumentsWithTheRule) {
  const nlohmann::json good = nlohmann::json::parse(certificate_text(synthetic_certificate()));
  auto message = [](const nlohmann::json& j) {
    try {
      (void)certificate_from_json(j, "c.json");
    } catch (const qed::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = good;
  j["schema"] = "qedcheck.certificate/2";
  EXPECT_EQ(message(j),
            "c.json: schema must be \"qedcheck.certificate/1\" (found \"qedcheck.certificate/2\")");
  j = good;
  j["git_tree"] = "dirty";
  EXPECT_EQ(message(j), "c.json.git_tree: \"dirty\" is none of clean, modified, unknown");
  j = good;
  j["build_commit"] = "8b50f65";
  EXPECT_EQ(message(j), "c.json.build_commit: \"8b50f65\" is neither 40 lower-case hex digits nor unknown");
  j["build_commit"] = std::string(40, 'f');
  j["build_tree"] = "dirty";
  EXPECT_EQ(message(j), "c.json.build_tree: \"dirty\" is none of clean, modified, unknown");
  j = good;
  j["cells"][0]["status"] = "fine";
  EXPECT_EQ(message(j),
            "c.json.cells[0].status: 'fine' (rule: certified, unstable or not-certified)");
  j = good;
  j["cells"][1]["T"] = 65;
  EXPECT_NE(message(j).find("c.json.cells[1]: key \"qed.full(l=1)/a1b1/B=1/T=64"),
            std::string::npos)
      << message(j);
  j = good;
  j["cells"][0]["datasets"][0]["max_abs"].erase(0);
  EXPECT_EQ(message(j),
            "c.json.cells[0].datasets[0]: rel_frobenius, max_abs and ref_max_abs need one value "
            "per seed");
  j = good;
  j["cells"][0].erase("seeds");
  EXPECT_EQ(message(j),
            "c.json.cells[0]: missing member \"seeds\" (schema qedcheck.certificate/1)");
}

TEST(Certificate, CellStatisticsBoundsAndStatus) {
  CellResult c = synthetic_cell("hard", 64, 1e-3);
  finalize_cell(c, 4, std::ldexp(1.0, -24), std::ldexp(1.0, -8));
  EXPECT_EQ(c.status, "certified") << c.note;
  const DatasetStats& o = *c.find("o");
  EXPECT_DOUBLE_EQ(o.max_rel_frobenius, 1e-3);
  EXPECT_DOUBLE_EQ(o.rms_rel_frobenius, 1e-3 * std::sqrt((1 + 0.25 + 0.5625) / 3));
  EXPECT_DOUBLE_EQ(o.max_eps_units, 1e-3 * 256);
  EXPECT_DOUBLE_EQ(o.bound_rel_frobenius, 4e-3);
  EXPECT_DOUBLE_EQ(o.bound_max_abs, 12e-3);

  // A zero error still gets a bound: one rounding of the float arithmetic, times the factor.
  CellResult z = synthetic_cell("std", 64, 0.0);
  finalize_cell(z, 4, std::ldexp(1.0, -24), std::ldexp(1.0, -24));
  EXPECT_DOUBLE_EQ(z.find("o")->bound_rel_frobenius, 4 * std::ldexp(1.0, -24));
  EXPECT_DOUBLE_EQ(z.find("o")->bound_max_abs, 4 * std::ldexp(1.0, -24) * 1.5);

  CellResult u = synthetic_cell("a1b1", 64, 1e-3, /*unstable=*/true);
  finalize_cell(u, 4, std::ldexp(1.0, -24), std::ldexp(1.0, -8));
  EXPECT_EQ(u.status, "unstable");
  EXPECT_TRUE(std::isnan(u.find("o")->bound_rel_frobenius));

  // An oracle certified to fewer digits than the error needs: not certified, and said why.
  CellResult w = synthetic_cell("hard", 64, 1e-7);
  w.oracle = {{"o", 7.5, 3e-8, 1e-8}};
  finalize_cell(w, 4, std::ldexp(1.0, -24), std::ldexp(1.0, -24));
  EXPECT_EQ(w.status, "not-certified");
  EXPECT_NE(w.note.find("o: oracle error rel_F 3.0e-08, max abs 1.0e-08 (7.5 digits) not below a "
                        "tenth of the measured 1.0e-07, 3.0e-07"),
            std::string::npos)
      << w.note;
  // The same oracle against a larger error is good enough.
  CellResult ok = synthetic_cell("hard", 64, 1e-6);
  ok.oracle = {{"o", 7.5, 3e-8, 1e-8}};
  finalize_cell(ok, 4, std::ldexp(1.0, -24), std::ldexp(1.0, -24));
  EXPECT_EQ(ok.status, "certified") << ok.note;
}

TEST(Certificate, PowerLawFit) {
  double c = 0, p = 0, r = 0;
  ASSERT_TRUE(
      fit_power_law({64, 256, 1024, 4096}, {3e-7 * 8, 3e-7 * 16, 3e-7 * 32, 3e-7 * 64}, c, p, r));
  EXPECT_NEAR(p, 0.5, 1e-12);
  EXPECT_NEAR(c, 3e-7, 1e-18);
  EXPECT_NEAR(r, 0, 1e-12);
  ASSERT_TRUE(fit_power_law({64, 128, 256}, {1.0, 4.0, 1.0}, c, p, r));
  EXPECT_NEAR(p, 0, 1e-12);
  // Residuals -ln4/3, 2 ln4/3, -ln4/3: RMS sqrt(2)/3 ln 4, in decades sqrt(2)/3 log10 4.
  EXPECT_NEAR(r, std::sqrt(2.0) / 3 * std::log10(4.0), 1e-12);
  EXPECT_FALSE(fit_power_law({64, 64}, {1, 2}, c, p, r));   // one length: no law
  EXPECT_FALSE(fit_power_law({64, 128}, {0, 2}, c, p, r));  // zero errors carry no exponent

  const auto fits = fit_growth(synthetic_certificate());
  int found = 0;
  for (const auto& f : fits)
    if (f.regime == "hard" && f.dataset == "o") {
      ++found;
      EXPECT_NEAR(f.p, 0.25, 1e-12);
      EXPECT_NEAR(f.c, 1e-3, 1e-15);
      EXPECT_EQ(f.points, 3);
      EXPECT_EQ(f.T_min, 64);
      EXPECT_EQ(f.T_max, 256);
    }
  EXPECT_EQ(found, 1);
}

TEST(Certify, FamiliesParseOrNameTheRule) {
  EXPECT_EQ(parse_family("qed.nogate_noproj@1.5").lambda, 1.5);
  EXPECT_EQ(parse_family("qed").arm, "full");
  EXPECT_EQ(parse_family("kda").variant, "kda");
  auto message = [](const std::string& s) {
    try {
      (void)parse_family(s);
    } catch (const qed::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("kda@1"),
            "family 'kda@1': only qed takes an arm and @lambda (e.g. qed.full@1)");
  EXPECT_EQ(message("qed.half"),
            "family 'qed.half': qed arm must be full, nogate, nogate_noproj or rand");
  EXPECT_EQ(message("mamba"), "family 'mamba': variant must be gdn2, qed, kda, gdn or deltanet");
}

// The quick plan: 63 cells (four families x five regimes x T = 64, 128, 256 at K = V = 64, and
// the unstable configuration); the CUDA kernels also get 21 at K = V = 128 (T = 64), the head size
// of their benchmarks; lengths or head sizes chosen by hand apply to every subject.
TEST(Certify, QuickPlanGivesTheCudaKernelsTheirHeadSize) {
  CertifyOptions o;
  auto count_k = [](const std::vector<CellSpec>& cells, int64_t K) {
    return std::count_if(cells.begin(), cells.end(), [&](const CellSpec& c) { return c.K == K && c.V == K; });
  };
  for (const char* impl : {"cuda-chunked", "cuda-recurrent"}) {
    const auto cells = planned_cells(o, make_subject(impl, "bf16"));
    EXPECT_EQ(cells.size(), 84u) << impl;
    EXPECT_EQ(count_k(cells, 64), 63) << impl;
    EXPECT_EQ(count_k(cells, 128), 21) << impl;
    for (const auto& c : cells) {
      if (c.K == 128) {
        EXPECT_EQ(c.T, 64) << impl << " " << c.key();
      }
    }
  }
  for (const char* impl : {"reference-chunked", "reference-recurrent"}) {
    const auto cells = planned_cells(o, make_subject(impl, "fp32"));
    EXPECT_EQ(cells.size(), 63u) << impl;
    EXPECT_EQ(count_k(cells, 64), 63) << impl;
  }
  CertifyOptions by_hand = o;
  by_hand.head_dims = {64};
  EXPECT_EQ(planned_cells(by_hand, make_subject("cuda-chunked", "bf16")).size(), 63u);
  by_hand = o;
  by_hand.Ts = {64};
  EXPECT_EQ(planned_cells(by_hand, make_subject("cuda-chunked", "bf16")).size(), 21u);
  CertifyOptions bad = o;
  bad.mode = "fast";
  EXPECT_THROW((void)planned_cells(bad, make_subject("cuda-chunked", "bf16")), qed::Error);
}

TEST(Certify, InputsAreRoundedToTheDtype) {
  CellSpec s;
  s.variant = "qed";
  s.arm = "full";
  s.lambda = 1;
  s.regime = "hard";
  s.T = 9;
  s.H = 1;
  s.K = s.V = 4;
  const auto c = certify_case(s, test_seed(), "bfloat16");
  EXPECT_EQ(c.dtype, "bfloat16");
  for (double x : c.inputs.q) EXPECT_EQ(x, static_cast<double>(static_cast<float>(x)));
  for (double x : c.inputs.b) {
    // bf16 keeps 8 significant bits: x * 2^(8 - e) is an integer.
    int e = 0;
    (void)std::frexp(x, &e);
    const double m = std::ldexp(x, 8 - e);
    EXPECT_EQ(m, std::floor(m)) << x << "; " << replay(test_seed());
  }
  ASSERT_TRUE(c.cotangents.has_value());
  EXPECT_FALSE(c.cotangents->dht.empty());
}

TEST(Certify, ResumesAfterInterruptionWithoutLosingCells) {
  const uint64_t seed = test_seed();
  Scratch tmp("certify-resume");
  CertifyOptions o = tiny_sweep(tmp.dir.string(), seed);
  o.max_new_cells = 3;
  const auto first = run_certify(o, nullptr);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.problems_measured, 3);
  EXPECT_EQ(first.problems_total, 8);
  const std::string cert_path = tmp / "reference-chunked+fp32.json";
  const Certificate partial = read_certificate(cert_path);
  ASSERT_EQ(partial.cells.size(), 3u);
  EXPECT_EQ(count_lines(journal_path(cert_path)), 3);

  // A crash in the middle of a later append leaves a torn line at the end of the journal at
  // worst (the rename makes even that impossible, but a copied or hand-edited journal can hold
  // one): it is skipped, and the certificate can be rebuilt from the journal alone.
  {
    std::ofstream j(journal_path(cert_path), std::ios::app);
    j << "{\"schema\": \"qedcheck.certificate-journal/1\", \"subject\": "
         "\"reference-chunked+fp32\", \"ce";
  }
  std::filesystem::remove(cert_path);

  o.max_new_cells = -1;
  const auto second = run_certify(o, nullptr);
  EXPECT_FALSE(second.interrupted);
  EXPECT_EQ(second.problems_measured, 5) << replay(seed);
  EXPECT_EQ(second.cells_resumed, 6);  // 3 cells x 2 subjects
  const Certificate full = read_certificate(cert_path);
  ASSERT_EQ(full.cells.size(), 8u);
  for (const auto& c : partial.cells) {
    const CellResult* again = full.find(c.spec.key());
    ASSERT_NE(again, nullptr) << c.spec.key();
    // Not re-measured: the very same record (timings included).
    EXPECT_EQ(cell_to_json(*again), cell_to_json(c)) << c.spec.key();
  }
  for (const auto& c : full.cells)
    EXPECT_EQ(c.status, "certified") << c.spec.key() << ": " << c.note;

  // A third run has nothing left to do.
  const auto third = run_certify(o, nullptr);
  EXPECT_EQ(third.problems_total, 0);
  EXPECT_EQ(third.cells_resumed, 16);
}

// A CUDA certificate is resumed only by a binary of the kernels that measured it: another
// binary would add its cells under its own fingerprint beside the old kernels' cells (certify
// applies this to every existing CUDA certificate in --out before reading its journal).
TEST(Certify, ResumeRefusesCertificatesOfOtherKernels) {
  EXPECT_NO_THROW(require_same_kernels("d/cuda-chunked+bf16.json", "f3f67a07d5b7f28b", "f3f67a07d5b7f28b"));
  // unknown on either side (a certificate from before fingerprints, a binary without kernels)
  EXPECT_NO_THROW(require_same_kernels("d/cuda-chunked+bf16.json", "", "f3f67a07d5b7f28b"));
  EXPECT_NO_THROW(require_same_kernels("d/cuda-chunked+bf16.json", "ddd5b652d26bcc3c", ""));
  try {
    require_same_kernels("d/cuda-chunked+bf16.json", "ddd5b652d26bcc3c", "f3f67a07d5b7f28b");
    ADD_FAILURE() << "a certificate of other kernels was accepted for resuming";
  } catch (const qed::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("d/cuda-chunked+bf16.json"), std::string::npos) << m;
    EXPECT_NE(m.find("ddd5b652d26bcc3c"), std::string::npos) << m;
    EXPECT_NE(m.find("f3f67a07d5b7f28b"), std::string::npos) << m;
    EXPECT_NE(m.find("--out"), std::string::npos) << m;
  }
}

// The same for the journal: a CUDA subject's lines carry the fingerprint of the kernels that
// measured them, and a binary of other kernels (or a line of unknown kernels, written before lines
// had fingerprints) is refused with the file, the line and both fingerprints, even when no
// certificate lies beside the journal (an interrupted first run leaves only the journal). Lines
// are read back through journal_read with the fingerprints a CUDA binary would pass.
TEST(Certify, JournalRefusesLinesOfOtherKernels) {
  const uint64_t seed = test_seed();
  Scratch tmp("certify-journal-kernels");
  CertifyOptions o = tiny_sweep(tmp.dir.string(), seed);
  o.max_new_cells = 2;
  run_certify(o, nullptr);
  const std::string journal = journal_path(tmp / "reference-chunked+fp32.json");
  const Subject subject = make_subject("reference-chunked", "fp32");
  ASSERT_EQ(journal_read(journal, subject).size(), 2u);  // a CPU subject: no fingerprint asked

  auto refused = [&](const std::string& current, const std::string& expect_recorded) {
    try {
      journal_read(journal, subject, nullptr, current);
      ADD_FAILURE() << "journal lines of other kernels were accepted (current " << current << ")";
    } catch (const qed::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(journal + ":1:"), std::string::npos) << m;
      EXPECT_NE(m.find(current), std::string::npos) << m;
      EXPECT_NE(m.find(expect_recorded), std::string::npos) << m;
      EXPECT_NE(m.find("--out"), std::string::npos) << m;
    }
  };
  refused("f3f67a07d5b7f28b", "none recorded");  // lines from before fingerprints

  // The same lines as a CUDA binary writes them (journal_append with a fingerprint).
  std::vector<CellResult> cells = journal_read(journal, subject);
  std::filesystem::remove(journal);
  for (const auto& c : cells) journal_append(journal, subject, c, "ddd5b652d26bcc3c");
  EXPECT_EQ(count_lines(journal), 2);
  EXPECT_EQ(journal_read(journal, subject, nullptr, "ddd5b652d26bcc3c").size(), 2u);
  refused("f3f67a07d5b7f28b", "ddd5b652d26bcc3c");
}

TEST(Certify, MeasuresWhatItClaims) {
  // The recurrent float twin on float32 inputs: errors of a few float roundings, oracle digits
  // well above what is measured, and a fit for every series of two or more lengths.
  const uint64_t seed = test_seed();
  Scratch tmp("certify-claims");
  CertifyOptions o = tiny_sweep(tmp.dir.string(), seed);
  o.impls = {"reference-recurrent"};
  run_certify(o, nullptr);
  const Certificate c = read_certificate(tmp / "reference-recurrent+fp32.json");
  ASSERT_EQ(c.cells.size(), 8u);
  for (const auto& cell : c.cells) {
    EXPECT_GT(cell.oracle_min_digits, 9) << cell.spec.key();
    ASSERT_EQ(cell.oracle.size(), cell.datasets.size());
    for (const auto& o : cell.oracle)
      EXPECT_LT(o.rel_frobenius, 1e-13) << cell.spec.key() << " " << o.name;
    EXPECT_EQ(cell.oracle_seed, seed);
    for (const auto& d : cell.datasets) {
      EXPECT_GT(d.max_rel_frobenius, 0) << cell.spec.key() << " " << d.name;
      EXPECT_LT(d.max_eps_units, 200) << cell.spec.key() << " " << d.name << "; " << replay(seed);
      EXPECT_EQ(d.rel_frobenius.size(), 2u);
    }
  }
  EXPECT_TRUE(c.git_commit.size() == 40u || c.git_commit == "unknown") << c.git_commit;
  EXPECT_TRUE(c.kernel_fingerprint.empty()) << "a CPU reference records no kernel fingerprint";
  EXPECT_TRUE(c.git_tree == "clean" || c.git_tree == "modified" || c.git_tree == "unknown") << c.git_tree;
  EXPECT_FALSE(c.machine.cpu.empty());
  EXPECT_GE(fit_growth(c).size(), 4u * 9);  // 4 series x (o, ht and 7 gdn2 gradients at least)
}

#ifdef QEDCHECK_BINARY
TEST(Certify, CliResumesAfterSigkill) {
  const uint64_t seed = test_seed();
  Scratch tmp("certify-kill");
  const std::string out = tmp.dir.string();
  const std::string journal = tmp / "reference-recurrent+fp32.journal.jsonl";
  const std::vector<std::string> args = {QEDCHECK_BINARY, "certify",
                                         "--impl",        "reference-recurrent",
                                         "--dtype",       "fp32",
                                         "--out",         out,
                                         "--T",           "32,48,64,80",
                                         "--head-dim",    "8",
                                         "--heads",       "1",
                                         "--seeds",       "2",
                                         "--first-seed",  std::to_string(seed),
                                         "--family",      "gdn2,qed.full@1,kda",
                                         "--regime",      "std,hard,a1b1",
                                         "--no-unstable", "-q"};
  std::string line;
  for (const auto& a : args) line += a + " ";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(QEDCHECK_BINARY, argv.data());
    ::_exit(127);
  }
  // Kill it as soon as two cells are on disk.
  const auto t0 = std::chrono::steady_clock::now();
  while (count_lines(journal) < 2 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const int kept = count_lines(journal);
  ASSERT_GE(kept, 2);
  const bool killed = WIFSIGNALED(status);
  std::printf("killed: %s after %d journal lines (of 36)\n", killed ? "yes" : "no, it finished",
              kept);
  // Resume: the journal's cells are kept, the rest measured.
  ASSERT_EQ(shell(line + " > " + (tmp / "resume.txt")), 0) << line;
  const std::string log = read_text(tmp / "resume.txt");
  EXPECT_NE(log.find(std::to_string(kept) + " cell(s) resumed"), std::string::npos) << log;
  const Certificate c = read_certificate(tmp / "reference-recurrent+fp32.json");
  EXPECT_EQ(c.cells.size(), 36u) << replay(seed);
  EXPECT_EQ(count_lines(journal), 36);
}
#endif
