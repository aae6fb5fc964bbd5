#include "verify/certificate.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "reference/error.hpp"

namespace qed::verify {

std::string Subject::name() const { return impl + "+" + dtype; }

std::string Subject::case_dtype() const { return dtype == "bf16" ? "bfloat16" : "float32"; }

Subject make_subject(const std::string& impl, const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16")
    throw qed::Error("--dtype '" + dtype + "': certify knows fp32 and bf16");
  Subject s;
  s.impl = impl;
  s.dtype = dtype;
  if (impl == "reference-recurrent") {
    s.precision = "float";
    s.operands = "none";
  } else if (impl == "reference-chunked") {
    // The CPU twin of a tensor-core kernel: float arithmetic, operands stored in the dtype.
    s.precision = "float";
    s.operands = dtype;
  } else if (impl == "cuda-recurrent" || impl == "cuda-chunked") {
    s.precision = "device";
    s.operands = "none";
  } else {
    throw qed::Error("--impl '" + impl +
                     "': certify knows reference-recurrent, reference-chunked, cuda-recurrent, "
                     "cuda-chunked");
  }
  return s;
}

std::string CellSpec::family() const {
  if (variant != "qed") return variant;
  return fmt::format("qed.{}(l={:g})", arm, lambda);
}

std::string CellSpec::key() const {
  return fmt::format("{}/{}/B={}/T={}/H={}/K={}/V={}", family(), regime, B, T, H, K, V);
}

const DatasetStats* CellResult::find(const std::string& name) const {
  for (const auto& d : datasets)
    if (d.name == name) return &d;
  return nullptr;
}

const CellResult* Certificate::find(const std::string& key) const {
  for (const auto& c : cells)
    if (c.spec.key() == key) return &c;
  return nullptr;
}

nlohmann::json json_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

double number_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
  }
  if (j.is_null()) return std::nan("");
  throw qed::Error(where + ": expected a number (or \"inf\", \"-inf\", \"nan\"), found " +
                   j.dump());
}

namespace {

const nlohmann::json& member(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key))
    throw qed::Error(
        fmt::format("{}: missing member \"{}\" (schema {})", where, key, kCertificateSchema));
  return j.at(key);
}

double num(const nlohmann::json& j, const char* key, const std::string& where) {
  return number_from_json(member(j, key, where), where + "." + key);
}

std::string str(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = member(j, key, where);
  if (!v.is_string()) throw qed::Error(fmt::format("{}.{}: expected a string", where, key));
  return v.get<std::string>();
}

// A tree state member (git_tree, build_tree): clean, modified or unknown.
std::string tree_state(const nlohmann::json& j, const char* key, const std::string& where) {
  std::string v = str(j, key, where);
  if (v != "clean" && v != "modified" && v != "unknown")
    throw qed::Error(where + "." + key + ": \"" + v + "\" is none of clean, modified, unknown");
  return v;
}

int64_t integer(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = member(j, key, where);
  if (!v.is_number_integer())
    throw qed::Error(fmt::format("{}.{}: expected an integer", where, key));
  return v.get<int64_t>();
}

nlohmann::json numbers(const std::vector<double>& x) {
  nlohmann::json a = nlohmann::json::array();
  for (double v : x) a.push_back(json_number(v));
  return a;
}

std::vector<double> numbers_from(const nlohmann::json& j, const char* key,
                                 const std::string& where) {
  const auto& v = member(j, key, where);
  if (!v.is_array()) throw qed::Error(fmt::format("{}.{}: expected an array", where, key));
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(number_from_json(v[i], fmt::format("{}.{}[{}]", where, key, i)));
  return out;
}

}  // namespace

nlohmann::json cell_to_json(const CellResult& c) {
  const CellSpec& s = c.spec;
  nlohmann::json j = {{"key", s.key()},
                      {"variant", s.variant},
                      {"arm", s.arm},
                      {"lambda", s.lambda},
                      {"regime", s.regime},
                      {"B", s.B},
                      {"T", s.T},
                      {"H", s.H},
                      {"K", s.K},
                      {"V", s.V},
                      {"seeds", s.seeds},
                      {"unstable", s.unstable},
                      {"status", c.status},
                      {"note", c.note},
                      {"seconds", c.seconds}};
  nlohmann::json oracle = nlohmann::json::object();
  for (const auto& o : c.oracle)
    oracle[o.name] = {{"digits", json_number(o.digits)},
                      {"rel_frobenius", json_number(o.rel_frobenius)},
                      {"max_abs", json_number(o.max_abs)}};
  j["oracle"] = {{"seed", c.oracle_seed},
                 {"min_digits", json_number(c.oracle_min_digits)},
                 {"datasets", oracle}};
  j["state_norm"] = numbers(c.state_norm);
  nlohmann::json ds = nlohmann::json::array();
  for (const auto& d : c.datasets) {
    ds.push_back({{"name", d.name},
                  {"samples", d.rel_frobenius.size()},
                  {"rel_frobenius", numbers(d.rel_frobenius)},
                  {"max_abs", numbers(d.max_abs)},
                  {"ref_max_abs", numbers(d.ref_max_abs)},
                  {"max_rel_frobenius", json_number(d.max_rel_frobenius)},
                  {"rms_rel_frobenius", json_number(d.rms_rel_frobenius)},
                  {"max_max_abs", json_number(d.max_max_abs)},
                  {"rms_max_abs", json_number(d.rms_max_abs)},
                  {"max_eps_units", json_number(d.max_eps_units)},
                  {"rms_eps_units", json_number(d.rms_eps_units)},
                  {"bound_rel_frobenius", json_number(d.bound_rel_frobenius)},
                  {"bound_max_abs", json_number(d.bound_max_abs)},
                  {"finite", d.finite}});
  }
  j["datasets"] = ds;
  return j;
}

CellResult cell_from_json(const nlohmann::json& j, const std::string& where) {
  CellResult c;
  CellSpec& s = c.spec;
  s.variant = str(j, "variant", where);
  s.arm = str(j, "arm", where);
  s.lambda = num(j, "lambda", where);
  s.regime = str(j, "regime", where);
  s.B = integer(j, "B", where);
  s.T = integer(j, "T", where);
  s.H = integer(j, "H", where);
  s.K = integer(j, "K", where);
  s.V = integer(j, "V", where);
  for (const auto& seed : member(j, "seeds", where)) {
    if (!seed.is_number_unsigned()) throw qed::Error(where + ".seeds: expected unsigned integers");
    s.seeds.push_back(seed.get<uint64_t>());
  }
  s.unstable = member(j, "unstable", where).get<bool>();
  if (j.contains("key") && j["key"] != s.key())
    throw qed::Error(fmt::format("{}: key \"{}\" does not match the cell's members ({})", where,
                                 j["key"].get<std::string>(), s.key()));
  c.status = str(j, "status", where);
  if (c.status != "certified" && c.status != "unstable" && c.status != "not-certified")
    throw qed::Error(where + ".status: '" + c.status +
                     "' (rule: certified, unstable or not-certified)");
  c.note = str(j, "note", where);
  c.seconds = num(j, "seconds", where);
  const auto& o = member(j, "oracle", where);
  c.oracle_seed = member(o, "seed", where + ".oracle").get<uint64_t>();
  c.oracle_min_digits = num(o, "min_digits", where + ".oracle");
  for (const auto& [name, d] : member(o, "datasets", where + ".oracle").items()) {
    const std::string at = where + ".oracle.datasets." + name;
    c.oracle.push_back(
        {name, num(d, "digits", at), num(d, "rel_frobenius", at), num(d, "max_abs", at)});
  }
  c.state_norm = numbers_from(j, "state_norm", where);
  const auto& ds = member(j, "datasets", where);
  for (size_t i = 0; i < ds.size(); ++i) {
    const std::string at = fmt::format("{}.datasets[{}]", where, i);
    DatasetStats d;
    d.name = str(ds[i], "name", at);
    d.rel_frobenius = numbers_from(ds[i], "rel_frobenius", at);
    d.max_abs = numbers_from(ds[i], "max_abs", at);
    d.ref_max_abs = numbers_from(ds[i], "ref_max_abs", at);
    if (d.max_abs.size() != d.rel_frobenius.size() ||
        d.ref_max_abs.size() != d.rel_frobenius.size())
      throw qed::Error(at + ": rel_frobenius, max_abs and ref_max_abs need one value per seed");
    d.max_rel_frobenius = num(ds[i], "max_rel_frobenius", at);
    d.rms_rel_frobenius = num(ds[i], "rms_rel_frobenius", at);
    d.max_max_abs = num(ds[i], "max_max_abs", at);
    d.rms_max_abs = num(ds[i], "rms_max_abs", at);
    d.max_eps_units = num(ds[i], "max_eps_units", at);
    d.rms_eps_units = num(ds[i], "rms_eps_units", at);
    d.bound_rel_frobenius = num(ds[i], "bound_rel_frobenius", at);
    d.bound_max_abs = num(ds[i], "bound_max_abs", at);
    d.finite = member(ds[i], "finite", at).get<bool>();
    c.datasets.push_back(std::move(d));
  }
  return c;
}

nlohmann::json certificate_to_json(const Certificate& cert) {
  const Subject& s = cert.subject;
  nlohmann::json j = {{"schema", kCertificateSchema}, {"qedcheck", cert.qedcheck_version}};
  j["subject"] = {{"name", s.name()},         {"impl", s.impl},
                  {"dtype", s.dtype},         {"case_dtype", s.case_dtype()},
                  {"precision", s.precision}, {"operands", s.operands},
                  {"chunk", s.chunk}};
  j["mode"] = cert.mode;
  j["safety_factor"] = cert.safety_factor;
  j["bound_floor"] = cert.bound_floor;
  j["oracle"] = {
      {"implementation", cert.oracle_impl},
      {"precision", cert.oracle_precision},
      {"check_precision", cert.oracle_check},
      {"justification",
       "the double recurrent pass on the same rounded inputs; its certified digits (agreement "
       "with a float128 pass on the cell's first seed) are recorded per cell, and a cell is "
       "certified only when the oracle's error is below a tenth of the measured error"}};
  j["machine"] = {{"hostname", cert.machine.hostname},
                  {"cpu", cert.machine.cpu},
                  {"cores", cert.machine.cores}};
  if (!cert.machine.gpu.empty()) j["machine"]["gpu"] = cert.machine.gpu;
  j["git_commit"] = cert.git_commit;
  if (cert.git_tree != "unknown") j["git_tree"] = cert.git_tree;
  if (cert.build_commit != "unknown") {
    j["build_commit"] = cert.build_commit;
    j["build_tree"] = cert.build_tree;
  }
  if (!cert.kernel_fingerprint.empty()) j["kernel_fingerprint"] = cert.kernel_fingerprint;
  j["created"] = cert.created;
  j["updated"] = cert.updated;
  nlohmann::json cells = nlohmann::json::array();
  int certified = 0, unstable = 0, not_certified = 0;
  int64_t samples = 0;
  for (const auto& c : cert.cells) {
    cells.push_back(cell_to_json(c));
    certified += c.status == "certified";
    unstable += c.status == "unstable";
    not_certified += c.status == "not-certified";
    samples += static_cast<int64_t>(c.spec.seeds.size());
  }
  j["cells"] = cells;
  nlohmann::json fits = nlohmann::json::array();
  for (const auto& f : fit_growth(cert))
    fits.push_back({{"variant", f.variant},
                    {"arm", f.arm},
                    {"lambda", f.lambda},
                    {"regime", f.regime},
                    {"H", f.H},
                    {"K", f.K},
                    {"V", f.V},
                    {"dataset", f.dataset},
                    {"metric", f.metric},
                    {"c", json_number(f.c)},
                    {"p", json_number(f.p)},
                    {"residual_log10", json_number(f.residual_log10)},
                    {"points", f.points},
                    {"T_min", f.T_min},
                    {"T_max", f.T_max},
                    {"unstable", f.unstable}});
  j["fits"] = fits;
  j["summary"] = {{"cells", cert.cells.size()},
                  {"certified", certified},
                  {"unstable", unstable},
                  {"not_certified", not_certified},
                  {"samples", samples}};
  j["tolerance"] = tolerance_of(cert);
  return j;
}

Certificate certificate_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw qed::Error(where + ": a certificate is a JSON object");
  if (!j.contains("schema") || j["schema"] != kCertificateSchema)
    throw qed::Error(fmt::format("{}: schema must be \"{}\" (found {})", where, kCertificateSchema,
                                 j.contains("schema") ? j["schema"].dump() : std::string("none")));
  Certificate cert;
  const auto& s = member(j, "subject", where);
  cert.subject =
      make_subject(str(s, "impl", where + ".subject"), str(s, "dtype", where + ".subject"));
  cert.subject.precision = str(s, "precision", where + ".subject");
  cert.subject.operands = str(s, "operands", where + ".subject");
  cert.subject.chunk = integer(s, "chunk", where + ".subject");
  cert.qedcheck_version = str(j, "qedcheck", where);
  cert.mode = str(j, "mode", where);
  cert.safety_factor = num(j, "safety_factor", where);
  cert.bound_floor = num(j, "bound_floor", where);
  const auto& o = member(j, "oracle", where);
  cert.oracle_impl = str(o, "implementation", where + ".oracle");
  cert.oracle_precision = str(o, "precision", where + ".oracle");
  cert.oracle_check = str(o, "check_precision", where + ".oracle");
  const auto& m = member(j, "machine", where);
  cert.machine.hostname = str(m, "hostname", where + ".machine");
  cert.machine.cpu = str(m, "cpu", where + ".machine");
  cert.machine.cores = static_cast<int>(integer(m, "cores", where + ".machine"));
  if (m.contains("gpu")) cert.machine.gpu = str(m, "gpu", where + ".machine");
  cert.git_commit = str(j, "git_commit", where);
  if (j.contains("git_tree")) cert.git_tree = tree_state(j, "git_tree", where);
  if (j.contains("build_commit")) {
    cert.build_commit = str(j, "build_commit", where);
    const bool hex = cert.build_commit.size() == 40 &&
                     cert.build_commit.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!hex && cert.build_commit != "unknown")
      throw qed::Error(where + ".build_commit: \"" + cert.build_commit +
                       "\" is neither 40 lower-case hex digits nor unknown");
    cert.build_tree = j.contains("build_tree") ? tree_state(j, "build_tree", where) : "unknown";
  }
  if (j.contains("kernel_fingerprint")) cert.kernel_fingerprint = str(j, "kernel_fingerprint", where);
  cert.created = str(j, "created", where);
  cert.updated = str(j, "updated", where);
  const auto& cells = member(j, "cells", where);
  if (!cells.is_array()) throw qed::Error(where + ".cells: expected an array");
  for (size_t i = 0; i < cells.size(); ++i)
    cert.cells.push_back(cell_from_json(cells[i], fmt::format("{}.cells[{}]", where, i)));
  return cert;
}

Certificate read_certificate(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw qed::Error(path + ": cannot open certificate");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw qed::Error(path + ": not valid JSON (" + e.what() + ")");
  }
  return certificate_from_json(j, path);
}

std::string certificate_text(const Certificate& cert) {
  // One top-level member, cell, fit or tolerance entry per line: readable diffs in git.
  const nlohmann::json j = certificate_to_json(cert);
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : j.items()) {
    out.append(first ? "\n " : ",\n ");
    first = false;
    out.append(nlohmann::json(key).dump()).append(": ");
    if (value.is_array() && !value.empty()) {
      out.append("[");
      for (size_t i = 0; i < value.size(); ++i) {
        out.append(i ? ",\n  " : "\n  ");
        out.append(value[i].dump());
      }
      out.append("\n ]");
    } else if (key == "tolerance" && value.is_object()) {
      out.append("{");
      bool f2 = true;
      for (const auto& [k2, v2] : value.items()) {
        out.append(f2 ? "\n  " : ",\n  ");
        f2 = false;
        out.append(nlohmann::json(k2).dump()).append(": ");
        if (v2.is_object() && !v2.empty()) {
          out.append("{");
          bool f3 = true;
          for (const auto& [k3, v3] : v2.items()) {
            out.append(f3 ? "\n   " : ",\n   ");
            f3 = false;
            out.append(nlohmann::json(k3).dump()).append(": ").append(v3.dump());
          }
          out.append("\n  }");
        } else {
          out.append(v2.dump());
        }
      }
      out.append("\n }");
    } else {
      out.append(value.dump());
    }
  }
  out.append("\n}\n");
  return out;
}

void write_certificate(const std::string& path, const Certificate& cert) {
  write_file_atomic(path, certificate_text(cert));
}

}  // namespace qed::verify
