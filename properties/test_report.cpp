// `qedcheck report`: Markdown whose figures exist, a self-contained HTML page (no external
// resource; every image an embedded PNG), rendering in headless Chromium to a non-blank page
// (skipped, visibly, where Chromium is absent), and the committed reports/index.md current.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "properties/test_certify_support.hpp"

using namespace qed;
using namespace qed::verify;
using namespace qed::certify_test;

namespace {

std::string decode_base64(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  int bits = 0, acc = 0;
  for (char c : s) {
    const int v = val(c);
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// A report of a tiny certificate and a benchmark table, generated once per test binary run.
struct Generated {
  Scratch tmp{"report"};
  std::string out, log;
  int rc = -1;
  Generated() {
    CertifyOptions o = tiny_sweep(tmp / "certs", test_seed());
    o.impls = {"reference-recurrent"};
    o.unstable = true;  // the unstable family shows up in its own table
    o.families = {"gdn2"};
    run_certify(o, nullptr);
    std::filesystem::create_directories(tmp / "bench");
    std::ofstream(tmp / "bench/recurrent.md")
        << "| config | ours (ms) | fla (ms) |\n|---|---|---|\n| fwd T=4096 | 1.25 | 1.5 |\n| bwd "
           "T=4096 | 2.5 | 3.1 |\n";
    out = tmp / "out";
    rc = shell(std::string(QEDCHECK_BINARY) + " report --certificates " + (tmp / "certs") +
               " --bench " + (tmp / "bench") + " --out " + out + " > " + (tmp / "log.txt") +
               " 2>&1");
    log = read_text(tmp / "log.txt");
  }
};

const Generated& generated() {
  static Generated g;
  return g;
}

std::string find_chromium() {
  for (const char* name :
       {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
    const std::string cmd = std::string("command -v ") + name + " > /dev/null 2>&1";
    if (shell(cmd) == 0) return name;
  }
  return "";
}

}  // namespace

TEST(Report, MarkdownNamesEveryFigureItLinks) {
  const auto& g = generated();
  ASSERT_EQ(g.rc, 0) << g.log;
  const std::string md = read_text(g.out + "/index.md");
  EXPECT_NE(md.find("## reference-recurrent+fp32"), std::string::npos);
  EXPECT_NE(md.find("Growth of rel_F(o) with T"), std::string::npos);
  EXPECT_NE(md.find("| gdn2 | std | K=V=8 |"), std::string::npos) << md;
  EXPECT_NE(md.find("Reported, not certified"), std::string::npos);
  EXPECT_NE(md.find("| fwd T=4096 | 1.25 | fla (ms) | 1.5 | 1.20 |"), std::string::npos) << md;
  const std::regex link(R"(!\[[^\]]*\]\(([^)]+)\))");
  int figures = 0;
  for (auto it = std::sregex_iterator(md.begin(), md.end(), link); it != std::sregex_iterator();
       ++it) {
    ++figures;
    const std::string path = g.out + "/" + (*it)[1].str();
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
    EXPECT_EQ(read_text(path).substr(0, 8), "\x89PNG\r\n\x1a\n") << path;
  }
  EXPECT_EQ(figures, 3);  // error vs T, distribution, benchmark bars
}

TEST(Report, HtmlIsSelfContained) {
  const auto& g = generated();
  ASSERT_EQ(g.rc, 0) << g.log;
  const std::string html = read_text(g.out + "/index.html");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  // Every src= and href= is a data: URI (std::regex recurses per character: too deep for the
  // base64 of a figure, so plain searches).
  for (const std::string attr : {"src=\"", "href=\""})
    for (size_t at = html.find(attr); at != std::string::npos; at = html.find(attr, at + 1))
      EXPECT_EQ(html.compare(at + attr.size(), 5, "data:"), 0)
          << "external resource: " << html.substr(at, 80);
  const std::string prefix = "<img alt=\"";
  const std::string data = "src=\"data:image/png;base64,";
  int images = 0;
  for (size_t at = html.find(prefix); at != std::string::npos; at = html.find(prefix, at + 1)) {
    ++images;
    const size_t b = html.find(data, at);
    ASSERT_NE(b, std::string::npos);
    const size_t e = html.find('"', b + data.size());
    ASSERT_NE(e, std::string::npos);
    const std::string png = decode_base64(html.substr(b + data.size(), e - b - data.size()));
    EXPECT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n");
    EXPECT_GT(png.size(), 2000u);
  }
  EXPECT_EQ(images, 3);
}

TEST(Report, RendersInHeadlessChromium) {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed (ci/setup.sh should list the Debian package "
                    "'chromium'); the HTML was not rendered";
  const auto& g = generated();
  ASSERT_EQ(g.rc, 0) << g.log;
  struct Shot {
    double dark = -1, spread = -1;
    int h = 0, w = 0;
  };
  // Screenshot of a page, then: the fraction of pixels away from white, and the pixel spread.
  auto render = [&](const std::string& page, const std::string& name) {
    Shot s;
    const std::string shot = g.out + "/" + name + ".png";
    const std::string url = "file://" + std::filesystem::absolute(page).string();
    const std::string cmd = chromium +
                            " --headless --no-sandbox --disable-gpu --hide-scrollbars "
                            "--window-size=1200,2400 --screenshot=" +
                            shot + " " + url + " > " + g.out + "/chromium.log 2>&1";
    EXPECT_EQ(shell(cmd), 0) << cmd << "\n" << read_text(g.out + "/chromium.log");
    EXPECT_TRUE(std::filesystem::exists(shot)) << read_text(g.out + "/chromium.log");
    const std::string probe = g.out + "/" + name + ".txt";
    const std::string py =
        std::string(QEDCHECK_PYTHON) +
        " -c \"import sys, numpy as np, matplotlib.image as m; a = m.imread(sys.argv[1])[..., :3]; "
        "d = (np.abs(a - 1.0).max(axis=2) > 0.1).mean(); print('%.4f %.4f %d %d' % (d, a.std(), "
        "a.shape[0], a.shape[1]))\" " +
        shot + " > " + probe;
    EXPECT_EQ(shell(py), 0) << py;
    EXPECT_EQ(
        std::sscanf(read_text(probe).c_str(), "%lf %lf %d %d", &s.dark, &s.spread, &s.h, &s.w), 4);
    return s;
  };
  const Shot report = render(g.out + "/index.html", "screenshot");
  std::printf("screenshot %dx%d: %.1f%% non-white pixels, std %.3f\n", report.w, report.h,
              100 * report.dark, report.spread);
  EXPECT_EQ(report.w, 1200);
  EXPECT_GT(report.dark, 0.02);
  EXPECT_GT(report.spread, 0.05);
  // The check's own mutation: an empty page is blank by the same measure.
  std::ofstream(g.out + "/blank.html") << "<!DOCTYPE html><html><body></body></html>\n";
  const Shot blank = render(g.out + "/blank.html", "blank");
  EXPECT_LT(blank.dark, 0.001);
  EXPECT_LT(blank.spread, 0.01);
}

TEST(Report, CommittedReportIsCurrent) {
  const std::string src = QEDCHECK_SOURCE_DIR;
  if (!std::filesystem::exists(src + "/reports/index.md"))
    GTEST_SKIP() << "no committed reports/index.md";
  Scratch tmp("report-current");
  const std::string cmd =
      "cd " + src + " && " + QEDCHECK_BINARY +
      " report --certificates reports/certificates --bench reports/bench --out " +
      tmp.dir.string() + " > " + (tmp / "log.txt") + " 2>&1";
  ASSERT_EQ(shell(cmd), 0) << read_text(tmp / "log.txt");
  // The certificate sections only: benchmark tables are rewritten by device runs, and a stale
  // benchmark section must not fail the CPU suite.
  auto certificates_part = [](const std::string& md) {
    return md.substr(0, md.find("\n## Benchmarks"));
  };
  EXPECT_EQ(certificates_part(read_text(tmp / "index.md")),
            certificates_part(read_text(src + "/reports/index.md")))
      << "reports/index.md is stale: run `qedcheck report --out reports/` from the source folder";
}
