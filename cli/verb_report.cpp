// `qedcheck report [--certificates DIR] [--bench DIR] --out DIR`: validates every certificate and
// benchmark table, bundles them into one JSON file and runs the Python generator
// (reports/report/make_report.py, Debian's matplotlib) that writes DIR/index.md, a
// self-contained DIR/index.html and DIR/report/figures/*.png.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cli/verbs.hpp"
#include "reference/error.hpp"
#include "verify/certificate.hpp"
#include "verify/certify_bench.hpp"

extern char** environ;

namespace qed::cli {
namespace {

namespace fs = std::filesystem;

struct ReportCli {
  std::string certificates = "reports/certificates", bench = "reports/bench", out, generator,
              python;
};

// The generator next to the sources: from the working folder, or above the binary (build/cli/).
std::string find_generator() {
  const fs::path rel = "reports/report/make_report.py";
  std::vector<fs::path> starts = {fs::current_path()};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  for (fs::path p : starts)
    for (; !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / rel)) return (p / rel).string();
      if (p == p.root_path()) break;
    }
  throw qed::Error("cannot find " + rel.string() +
                   " from the working folder or the qedcheck binary; give --generator PATH");
}

std::vector<fs::path> files_in(const std::string& dir, std::initializer_list<const char*> exts) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (std::find(exts.begin(), exts.end(), ext) != exts.end()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int run_report(const ReportCli& o) {
  nlohmann::json bundle = {{"certificates", nlohmann::json::array()},
                           {"bench", nlohmann::json::array()}};
  if (!fs::is_directory(o.certificates))
    throw qed::Error("--certificates " + o.certificates + ": not a folder");
  for (const auto& p : files_in(o.certificates, {".json"})) {
    // Display paths stay as the user spelled the folder, so a committed report is reproducible.
    const std::string shown = (fs::path(o.certificates) / p.filename()).string();
    auto j = verify::certificate_to_json(verify::read_certificate(p.string()));
    j["path"] = shown;
    bundle["certificates"].push_back(j);
  }
  for (const auto& p : files_in(o.bench, {".json", ".md"})) {
    if (p.filename() == "README.md") continue;
    try {
      const auto t = verify::read_bench_table(p.string());
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& r : t.rows) {
        nlohmann::json row = {{"name", r.name}, {"ms", r.ms}, {"peer", r.peer}};
        row["peer_ms"] =
            r.peer_ms == r.peer_ms ? nlohmann::json(r.peer_ms) : nlohmann::json(nullptr);
        rows.push_back(row);
      }
      bundle["bench"].push_back({{"path", (fs::path(o.bench) / p.filename()).string()},
                                 {"machine", t.machine},
                                 {"git_commit", t.git_commit},
                                 {"created", t.created},
                                 {"rows", rows}});
    } catch (const qed::Error& e) {
      fmt::print(stderr, "report: skipping {}: {}\n", p.string(), e.what());
    }
  }
  fs::create_directories(o.out);
  const std::string bundle_path =
      (fs::temp_directory_path() /
       fmt::format("qedcheck-report-{}.json", static_cast<long>(::getpid())))
          .string();
  verify::write_file_atomic(bundle_path, bundle.dump());
  const std::string gen = o.generator.empty() ? find_generator() : o.generator;
  std::string py = o.python;
  if (py.empty())
    py = std::getenv("QEDCHECK_PYTHON") ? std::getenv("QEDCHECK_PYTHON") : "/usr/bin/python3";
  std::vector<std::string> args = {py, gen, "--bundle", bundle_path, "--out", o.out};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = ::posix_spawnp(&pid, py.c_str(), nullptr, nullptr, argv.data(), environ);
  if (err != 0) {
    fs::remove(bundle_path);
    throw qed::Error("cannot start " + py + " (" + std::strerror(err) + ")");
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  fs::remove(bundle_path);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw qed::Error(fmt::format("report generator {} failed (status {})", gen, status));
  fmt::print("report: {} certificate(s), {} benchmark table(s) -> {}/index.md, {}/index.html\n",
             bundle["certificates"].size(), bundle["bench"].size(), o.out, o.out);
  return 0;
}

const RegisterVerb register_report(50, [](CLI::App& app, Action& action) {
  auto o = std::make_shared<ReportCli>();
  CLI::App* sub = app.add_subcommand(
      "report", "Markdown and self-contained HTML report (plots) from certificates and benchmarks");
  sub->add_option("--certificates", o->certificates, "folder of certificates")
      ->capture_default_str();
  sub->add_option("--bench", o->bench, "folder of benchmark tables (*.json, *.md)")
      ->capture_default_str();
  sub->add_option("--out", o->out, "output folder (index.md, index.html, report/figures/)")
      ->required();
  sub->add_option("--generator", o->generator, "path of reports/report/make_report.py");
  sub->add_option("--python", o->python,
                  "Python with matplotlib (default $QEDCHECK_PYTHON or /usr/bin/python3)");
  sub->callback([o, &action] { action = [o] { return run_report(*o); }; });
});

}  // namespace
}  // namespace qed::cli
