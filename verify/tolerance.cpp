#include "verify/tolerance.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "reference/error.hpp"

namespace qed::verify {

namespace {

bool is_set(double x) { return x == x; }

const std::vector<std::string>& known_results() {
  static const std::vector<std::string> names = {
      "outputs/o",  "outputs/ht", "grads/dq",    "grads/dk",      "grads/dv",
      "grads/dg",   "grads/db",   "grads/dw",    "grads/dbeta",   "grads/dlambda",
      "grads/dr",   "grads/dh0"};
  return names;
}

// "o" -> "outputs/o", "dq" -> "grads/dq"; full names pass through; anything else is "".
std::string canonical_name(const std::string& key) {
  for (const auto& n : known_results())
    if (key == n || key == n.substr(n.find('/') + 1)) return n;
  return "";
}

double bound_value(const nlohmann::json& v, const std::string& where, const std::string& key) {
  if (!v.is_number())
    throw qed::Error(where + ": " + key + " must be a number (rule: bounds are finite numbers >= 0)");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0)
    throw qed::Error(fmt::format("{}: {} = {} (rule: bounds are finite numbers >= 0)", where, key, x));
  return x;
}

Bound parse_entry(const nlohmann::json& e, const std::string& where, const std::string& source) {
  if (!e.is_object()) throw qed::Error(where + ": must be an object with rtol_frobenius and/or atol_max");
  Bound b;
  b.source = source;
  for (const auto& [key, value] : e.items()) {
    if (key == "rtol_frobenius") {
      b.rtol_frobenius = bound_value(value, where, key);
    } else if (key == "atol_max") {
      b.atol_max = bound_value(value, where, key);
    } else if (key == "note") {
      if (!value.is_string()) throw qed::Error(where + ": note must be a string");
    } else {
      throw qed::Error(where + ": unknown key '" + key +
                       "' (rule: an entry has rtol_frobenius, atol_max and an optional note)");
    }
  }
  if (!b.any()) throw qed::Error(where + ": needs rtol_frobenius or atol_max (or both)");
  return b;
}

}  // namespace

std::optional<Bound> ToleranceSpec::explicit_bound(const std::string& name) const {
  if (options) return options;
  if (auto it = per_dataset.find(name); it != per_dataset.end()) return it->second;
  if (wildcard) return wildcard;
  return std::nullopt;
}

ToleranceSpec tolerance_from_options(double rtol, std::optional<double> atol) {
  if (!std::isfinite(rtol) || rtol < 0)
    throw qed::Error(fmt::format("--rtol {}: must be a finite number >= 0", rtol));
  if (atol && (!std::isfinite(*atol) || *atol < 0))
    throw qed::Error(fmt::format("--atol {}: must be a finite number >= 0", *atol));
  ToleranceSpec s;
  Bound b;
  b.rtol_frobenius = rtol;
  if (atol) b.atol_max = *atol;
  b.source = "options";
  s.options = b;
  return s;
}

ToleranceSpec parse_tolerance(const std::string& text, const std::string& where) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::out_of_range& e) {
    throw qed::Error(where + ": a number does not fit a double (" + e.what() +
                     ") (rule: tolerances are finite float64 numbers)");
  } catch (const nlohmann::json::exception& e) {
    throw qed::Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (doc.is_object() && !doc.contains("datasets") && doc.contains("tolerance"))
    doc = doc["tolerance"];  // a certificate carrying its tolerance
  if (!doc.is_object()) throw qed::Error(where + ": a tolerance document is a JSON object");
  if (!doc.contains("schema") || doc["schema"] != "qedcheck.tolerance/1")
    throw qed::Error(where + ": schema must be \"qedcheck.tolerance/1\" (found " +
                     (doc.contains("schema") ? doc["schema"].dump() : std::string("none")) + ")");
  if (!doc.contains("datasets") || !doc["datasets"].is_object())
    throw qed::Error(where + ": needs an object \"datasets\" (rule: schema qedcheck.tolerance/1)");
  ToleranceSpec s;
  s.file = where;
  for (const auto& [key, entry] : doc["datasets"].items()) {
    const std::string at = where + ": datasets." + key;
    if (key == "*") {
      s.wildcard = parse_entry(entry, at, "file:" + where + "[*]");
      continue;
    }
    const std::string name = canonical_name(key);
    if (name.empty())
      throw qed::Error(at + ": not a result name (o, ht, dq, dk, dv, dg, db, dw, dbeta, dlambda, "
                            "dr, dh0, or * for all)");
    if (s.per_dataset.count(name)) throw qed::Error(at + ": " + name + " is given twice");
    s.per_dataset[name] = parse_entry(entry, at, "file:" + where + "[" + key + "]");
  }
  return s;
}

ToleranceSpec read_tolerance_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw qed::Error(path + ": cannot open tolerance file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_tolerance(ss.str(), path);
}

TwinPlan twin_plan(const std::string& dtype, int64_t candidate_chunk, int64_t longest) {
  (void)unit_roundoff(dtype);  // rejects unknown dtypes
  const auto names = implementation_names();
  const bool have_chunked =
      std::find(names.begin(), names.end(), "reference-chunked") != names.end();
  TwinPlan p;
  auto add = [&](const std::string& impl, reference::Precision prec, const std::string& operands) {
    RunOptions o;
    o.impl = impl;
    o.precision = prec;
    o.operands = operands;
    p.runs.push_back(o);
    p.labels.push_back(impl + "@" + prec.name() + (operands == "none" ? "" : "+" + operands));
  };
  const bool f64 = dtype == "float64";
  const auto prec = f64 ? reference::Precision::f64() : reference::Precision::f32();
  add("reference-recurrent", prec, "none");
  auto add_chunked = [&](const std::string& operands) {
    // a chunk's effective length: at most the longest sequence, where that is known
    auto eff = [&](int64_t c) { return longest > 0 ? std::min(c, longest) : c; };
    std::vector<int64_t> wanted(std::begin(kTwinChunks), std::end(kTwinChunks)), chunks;
    wanted.insert(wanted.end(), {4, 2, 1});
    for (const int64_t c : wanted)
      if (chunks.size() < std::size(kTwinChunks) && std::find(chunks.begin(), chunks.end(), eff(c)) == chunks.end())
        chunks.push_back(eff(c));
    const int64_t own = eff(candidate_chunk);
    if (own > 0 && std::find(chunks.begin(), chunks.end(), own) == chunks.end()) chunks.push_back(own);
    for (const int64_t c : chunks) {
      add("reference-chunked", prec, operands);
      p.runs.back().chunk = c;
      p.labels.back() += " C=" + std::to_string(c);
    }
  };
  if (dtype == "float64" || dtype == "float32") {
    if (have_chunked) add_chunked("none");
  } else {
    const std::string ops = dtype == "bfloat16" ? "bf16" : "fp16";
    if (have_chunked) {
      add_chunked(ops);
    } else {
      p.provisional = true;
      p.note = "PROVISIONAL: the " + dtype + "-operand twin (reference-chunked --operands " + ops +
               ") is not built; the float recurrent twin stands in, which is far more accurate "
               "than any " + dtype + " kernel, so the default rule is too strict for " + dtype;
    }
  }
  return p;
}

std::string twin_plan_text(const std::string& dtype) {
  const TwinPlan p = twin_plan(dtype);
  std::string s;
  for (const auto& l : p.labels) s += (s.empty() ? "" : ", ") + l;
  return s;
}

Bound twin_rule_bound(const TwinError& e, const Metrics& ref, double u, double group_scale, double factor) {
  Bound b;
  b.source = "rule:twin";
  if (ref.ref_max_abs == 0 && group_scale > 0) {
    // All-zero reference: no relative scale (rel_frobenius is then an absolute norm); one
    // rounding at the size of the group's values.
    b.atol_max = factor * std::max(e.max_abs_error, u * group_scale);
    return b;
  }
  b.rtol_frobenius = factor * std::max(e.rel_frobenius, u);
  b.atol_max = factor * std::max(e.max_abs_error, u * ref.ref_max_abs);
  return b;
}

namespace {
std::string group_of(const std::string& name) { return name.substr(0, name.find('/')); }
}  // namespace

void GroupScales::add(const Metrics& m) {
  double& x = max_[group_of(m.name)];
  x = std::max(x, m.ref_max_abs);
}

double GroupScales::of(const std::string& name) const {
  const auto it = max_.find(group_of(name));
  return it == max_.end() ? 0.0 : it->second;
}

double judge(const Metrics& m, const Bound& b) {
  if (!m.finite) return std::numeric_limits<double>::infinity();
  double score = 0;
  auto ratio = [](double metric, double bound) {
    if (metric == 0) return 0.0;
    if (bound == 0) return std::numeric_limits<double>::infinity();
    return metric / bound;
  };
  if (is_set(b.rtol_frobenius)) score = std::max(score, ratio(m.rel_frobenius, b.rtol_frobenius));
  if (is_set(b.atol_max)) score = std::max(score, ratio(m.max_abs_error, b.atol_max));
  return score;
}

std::string twin_rule_text() {
  std::string chunks;  // "64, 32, 16 and 8", from kTwinChunks
  const size_t n = std::size(kTwinChunks);
  for (size_t i = 0; i < n; ++i)
    chunks += (i == 0 ? "" : (i + 1 == n ? " and " : ", ")) + std::to_string(kTwinChunks[i]);
  return fmt::format(
      "twin rule: per dataset, rtol_frobenius = {0:g} * max(e_F, u) and atol_max = {0:g} * "
      "max(e_max, u * max|ref|), where u is the unit roundoff of /inputs@dtype (float64 2^-53, "
      "float32 2^-24, bfloat16 2^-8, float16 2^-11) and e_F, e_max are the relative Frobenius "
      "and max abs errors, against the oracle, of the worst of the reference's own "
      "implementations in that precision on the same inputs (float64: recurrent, and chunked "
      "with chunks of {1}, in double; float32: the same in float; bfloat16/float16: recurrent "
      "in float and the chunked ones with matmul operands rounded to that dtype, fp32 "
      "accumulation); a dataset passes when both bounds hold. A dataset whose reference is "
      "exactly zero everywhere is judged by atol_max = {0:g} * max(e_max, u * S) alone, S the "
      "largest |ref| of its group (outputs or grads)",
      kTwinFactor, chunks);
}

int64_t longest_sequence(const reference::Inputs<double>& in) {
  int64_t m = in.cu_seqlens.empty() ? in.dims.T : 0;  // dense: T, also where B = 0
  for (const reference::Span& s : in.spans()) m = std::max(m, s.len);
  return m;
}

}  // namespace qed::verify
