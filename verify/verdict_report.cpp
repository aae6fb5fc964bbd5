// Printing a verdict as a table and as JSON (schema in verdict.hpp).
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "reference/error.hpp"
#include "verify/verdict.hpp"

namespace qed::verify {

namespace {

std::string sci(double x) {
  if (x != x) return "-";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt::format("{:.2e}", x);
}

nlohmann::json number(double x) {
  if (std::isfinite(x)) return x;
  return x != x ? "nan" : (x > 0 ? "inf" : "-inf");
}

nlohmann::json location(const Location& l) {
  if (l.flat < 0) return nullptr;
  return {{"flat", l.flat}, {"index", l.index}, {"axes", l.labels}};
}

std::string why_failed(const DatasetVerdict& d) {
  const auto& m = d.metrics;
  if (!m.finite)
    return fmt::format("non-finite value {} at {}", m.nonfinite_value, m.first_nonfinite.text());
  std::string s;
  if (d.bound.rtol_frobenius == d.bound.rtol_frobenius && m.rel_frobenius > d.bound.rtol_frobenius)
    s = fmt::format("rel. Frobenius error {} > rtol_frobenius {}", sci(m.rel_frobenius),
                    sci(d.bound.rtol_frobenius));
  if (d.bound.atol_max == d.bound.atol_max && m.max_abs_error > d.bound.atol_max)
    s += fmt::format("{}max abs error {} at {} > atol_max {}", s.empty() ? "" : "; ",
                     sci(m.max_abs_error), m.max_abs_at.text(), sci(d.bound.atol_max));
  return s;
}

void print_wrapped(std::FILE* out, const std::string& indent, const std::string& text, size_t width) {
  std::string line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(pos, end - pos);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      fmt::print(out, "{}{}\n", indent, line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    pos = end + 1;
  }
  if (!line.empty()) fmt::print(out, "{}{}\n", indent, line);
}

}  // namespace

void print_verdict(std::FILE* out, const Verdict& v) {
  fmt::print(out, "candidate  {}  ({}{}{}, B={} T={} H={} K={} V={}, N={}, dtype {}{})\n",
             v.candidate_path, v.variant, v.arm == "none" ? "" : " arm ", v.arm == "none" ? "" : v.arm,
             v.dims.B, v.dims.T, v.dims.H, v.dims.K, v.dims.V, v.N, v.dtype,
             v.producer.empty() ? "" : ", producer \"" + v.producer + "\"");
  if (v.reference.source == "golden")
    fmt::print(out, "reference  golden {} (inputs {} match bit for bit; >= {:.1f} digits)\n",
               v.reference.path, v.input_hash, v.reference.min_digits);
  else
    fmt::print(out, "reference  oracle {} checked against {}: >= {:.1f} digits certified ({:.2f} s)\n",
               v.reference.precision, v.reference.check_precision, v.reference.min_digits,
               v.reference.seconds);
  if (v.tolerance_source == "options") {
    fmt::print(out, "tolerance  --rtol/--atol for every dataset\n");
  } else if (v.tolerance_source == "file") {
    fmt::print(out, "tolerance  file {}\n", v.tolerance_file);
  } else {
    std::string twins;
    for (const auto& l : v.twins.labels) twins += (twins.empty() ? "" : ", ") + l;
    fmt::print(out, "tolerance  {}twin rule, F = {:g}; twins {} ({:.2f} s)\n",
               v.tolerance_source == "mixed" ? "file " + v.tolerance_file + ", elsewhere the " : "",
               kTwinFactor, twins, v.twin_seconds);
    print_wrapped(out, "           ", twin_rule_text(), 100);
  }
  fmt::print(out, "           max rel is over elements with |ref| >= {:g} * max|ref|; eps = "
                  "rel_frob / u, u = {:.3g}\n",
             kSignificantFraction, v.unit_roundoff);
  fmt::print(out, "{:<14} {:<14} {:>9} {:>9} {:>9} {:>8} {:<24} {:>9} {:>9} {:>7}  {}\n", "dataset",
             "shape", "rel_frob", "max_abs", "max_rel", "eps", "worst at", "tol_frob", "tol_abs",
             "score", "verdict");
  for (const auto& d : v.datasets) {
    const auto& m = d.metrics;
    fmt::print(out, "{:<14} {:<14} {:>9} {:>9} {:>9} {:>8} {:<24} {:>9} {:>9} {:>7}  {}\n", m.name,
               fmt::format("[{}]", fmt::join(m.axes.shape, ",")), sci(m.rel_frobenius),
               sci(m.max_abs_error), sci(m.max_rel_error),
               std::isfinite(m.eps_units) ? fmt::format("{:.1f}", m.eps_units) : "inf",
               m.finite ? m.max_abs_at.text() : "NaN/Inf " + m.first_nonfinite.text(),
               sci(d.bound.rtol_frobenius), sci(d.bound.atol_max),
               std::isfinite(d.score) ? fmt::format("{:.3g}", d.score) : "inf",
               d.pass ? "pass" : "FAIL");
  }
  for (const auto& w : v.warnings) fmt::print(out, "warning    {}\n", w);
  if (v.pass) {
    fmt::print(out, "verdict    PASS: {} datasets within tolerance (exit 0)\n", v.datasets.size());
  } else {
    for (const auto& d : v.datasets)
      if (!d.pass) fmt::print(out, "FAIL       {}: {}\n", d.metrics.name, why_failed(d));
    size_t failed = 0;
    for (const auto& d : v.datasets) failed += d.pass ? 0 : 1;
    fmt::print(out, "verdict    FAIL: {} of {} datasets out of tolerance (exit 1)\n", failed,
               v.datasets.size());
  }
}

nlohmann::json verdict_json(const Verdict& v) {
  nlohmann::json j;
  j["schema"] = kVerdictSchema;
  j["qedcheck"] = "0.1.0";
  j["candidate"] = {{"path", v.candidate_path},
                    {"variant", v.variant},
                    {"arm", v.arm},
                    {"dtype", v.dtype},
                    {"producer", v.producer},
                    {"dims", {{"B", v.dims.B}, {"T", v.dims.T}, {"H", v.dims.H}, {"K", v.dims.K},
                              {"V", v.dims.V}, {"N", v.N}}},
                    {"input_hash", v.input_hash},
                    {"unit_roundoff", v.unit_roundoff},
                    {"warnings", v.warnings}};
  j["reference"] = {{"source", v.reference.source},
                    {"path", v.reference.path},
                    {"precision", v.reference.precision},
                    {"check_precision", v.reference.check_precision},
                    {"min_digits", number(v.reference.min_digits)},
                    {"target_met", v.reference.target_met},
                    {"seconds", v.reference.seconds}};
  j["tolerance"] = {{"source", v.tolerance_source},
                    {"file", v.tolerance_file},
                    {"rule", v.twins_run ? twin_rule_text() : ""},
                    {"factor", kTwinFactor},
                    {"twins", v.twins_run ? v.twins.labels : std::vector<std::string>{}},
                    {"provisional", v.twins_run && v.twins.provisional},
                    {"note", v.twins_run ? v.twins.note : ""},
                    {"seconds", v.twin_seconds}};
  nlohmann::json ds = nlohmann::json::array();
  for (const auto& d : v.datasets) {
    const auto& m = d.metrics;
    nlohmann::json e = {{"name", m.name},
                        {"shape", m.axes.shape},
                        {"axes", m.axes.labels},
                        {"count", m.count},
                        {"ref_frobenius", number(m.ref_frobenius)},
                        {"ref_max_abs", number(m.ref_max_abs)},
                        {"rel_frobenius", number(m.rel_frobenius)},
                        {"err_frobenius", number(m.err_frobenius)},
                        {"max_abs_error", number(m.max_abs_error)},
                        {"max_abs_at", location(m.max_abs_at)},
                        {"max_rel_error", number(m.max_rel_error)},
                        {"max_rel_at", location(m.max_rel_at)},
                        {"significant_floor", number(m.significant_floor)},
                        {"eps_units", number(m.eps_units)},
                        {"finite", m.finite},
                        {"first_nonfinite", location(m.first_nonfinite)},
                        {"score", number(d.score)},
                        {"pass", d.pass}};
    e["twin"] = d.twin ? nlohmann::json{{"rel_frobenius", number(d.twin->rel_frobenius)},
                                        {"max_abs_error", number(d.twin->max_abs_error)},
                                        {"worst", d.twin->worst_twin}}
                       : nlohmann::json(nullptr);
    e["tolerance"] = {{"rtol_frobenius", d.bound.rtol_frobenius == d.bound.rtol_frobenius
                                             ? nlohmann::json(d.bound.rtol_frobenius)
                                             : nlohmann::json(nullptr)},
                      {"atol_max", d.bound.atol_max == d.bound.atol_max ? nlohmann::json(d.bound.atol_max)
                                                                         : nlohmann::json(nullptr)},
                      {"source", d.bound.source}};
    ds.push_back(std::move(e));
  }
  j["datasets"] = std::move(ds);
  j["pass"] = v.pass;
  j["exit_code"] = v.exit_code;
  j["seconds"] = v.seconds;
  return j;
}

nlohmann::json error_json(const std::string& candidate_path, const std::string& message) {
  return {{"schema", kVerdictSchema},
          {"qedcheck", "0.1.0"},
          {"candidate", {{"path", candidate_path}}},
          {"pass", false},
          {"exit_code", 2},
          {"error", message}};
}

void write_json_atomic(const std::string& path, const nlohmann::json& j) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw qed::Error(path + ": folder " + dir.string() + " does not exist");
  const std::string tmp =
      (dir / (".tmp-" + fs::path(path).filename().string() + "-" + std::to_string(::getpid()))).string();
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump(2) << "\n";
    f.flush();
    if (!f) {
      fs::remove(tmp, ec);
      throw qed::Error(path + ": cannot write (temporary " + tmp + ")");
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw qed::Error(path + ": cannot rename the temporary file into place");
  }
}

}  // namespace qed::verify
