#include "fuzz/impl.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>

#include "fuzz/case_edit.hpp"
#include "fuzz/mutants.hpp"
#include "reference/rounding.hpp"

namespace qed::fuzz {

using reference::Precision;
using reference::ScalarKind;

bool ImplSpec::chunked() const { return run.impl.find("chunked") != std::string::npos; }
bool ImplSpec::is_mutant() const { return run.impl.rfind("mutant-", 0) == 0; }

std::string ImplSpec::args() const {
  std::string s = "--impl " + run.impl;
  const bool cuda = run.impl.rfind("cuda-", 0) == 0;
  if (!cuda) s += " --precision " + run.precision.name();
  if (chunked() && !draw_chunk) s += fmt::format(" --chunk {}", run.chunk);
  if (run.impl == "reference-chunked" && run.operands != "none") s += " --operands " + run.operands;
  if (cuda) s += " --dtype " + run.dtype;
  return s;
}

ImplSpec parse_impl_args(const std::string& text) {
  ImplSpec s;
  std::istringstream is(text);
  std::string key, value;
  while (is >> key) {
    if (!(is >> value)) throw qed::Error("implementation '" + text + "': " + key + " needs a value");
    if (key == "--impl") {
      s.run.impl = value;
    } else if (key == "--precision") {
      s.run.precision = reference::parse_precision(value);
    } else if (key == "--chunk") {
      char* end = nullptr;
      const long long c = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || c < 1 || c > (1LL << 30))
        throw qed::Error("implementation '" + text + "': --chunk " + value + " is not in [1, 2^30]");
      s.run.chunk = c;
    } else if (key == "--operands") {
      (void)reference::parse_operands(value);
      s.run.operands = value;
    } else if (key == "--dtype") {
      if (value != "fp32" && value != "bf16" && value != "fp16")
        throw qed::Error("implementation '" + text + "': --dtype " + value + " is not fp32, bf16 or fp16");
      s.run.dtype = value;
    } else {
      throw qed::Error("implementation '" + text + "': unknown option " + key);
    }
  }
  return s;
}

std::string case_dtype(const ImplSpec& s) {
  if (s.run.impl.rfind("cuda-", 0) == 0)
    return s.run.dtype == "bf16" ? "bfloat16" : s.run.dtype == "fp16" ? "float16" : "float32";
  if (s.run.operands == "bf16") return "bfloat16";
  if (s.run.operands == "fp16") return "float16";
  if (s.run.precision.kind == ScalarKind::f32 || s.run.operands == "fp32") return "float32";
  return "float64";
}

void round_case_to(fixtures::Case& c, const std::string& dtype) {
  c.dtype = dtype;
  if (dtype == "float64") return;
  const reference::Operands ops = dtype == "float32"    ? reference::Operands::fp32
                                  : dtype == "bfloat16" ? reference::Operands::bf16
                                                        : reference::Operands::fp16;
  for_each_tensor(c, [&](const std::string&, std::vector<double>& x) {
    for (double& e : x) e = reference::round_operand(e, ops);
  });
}

Precision oracle_precision(const ImplSpec& s) {
  if (case_dtype(s) != "float64") return Precision::f64();
  switch (s.run.precision.kind) {
    case ScalarKind::f32: return Precision::f64();
    case ScalarKind::f64: return Precision::f128();
    case ScalarKind::f128: return Precision::mpfr(2 * 113 + 64);
    case ScalarKind::mpfr: return Precision::mpfr(2 * s.run.precision.bits + 64);
  }
  return Precision::f128();
}

fixtures::Case run_impl(const fixtures::Case& c, const ImplSpec& s) {
  if (s.is_mutant()) {
    const char* env = std::getenv("QEDCHECK_ENABLE_MUTANTS");
    if (!env || std::string(env) != "1")
      throw qed::Error("implementation '" + s.run.impl +
                       "' is a deliberately broken test-only mutant; set QEDCHECK_ENABLE_MUTANTS=1 "
                       "to run it");
    return run_mutant(c, s.run);
  }
  return verify::run_implementation(c, s.run);
}

std::vector<std::string> known_impls() {
  std::vector<std::string> names = verify::implementation_names();
  const char* env = std::getenv("QEDCHECK_ENABLE_MUTANTS");
  if (env && std::string(env) == "1")
    for (const auto& m : mutant_names()) names.push_back(m);
  return names;
}

}  // namespace qed::fuzz
