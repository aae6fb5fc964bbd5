// Runs the recurrent reference on a case at any precision and names its results the way case
// files do (/outputs/o, /outputs/ht, /grads/d*). This is the bridge between the oracle, which
// knows nothing of files, and every verb that reads or writes cases.
#pragma once

#include <string>
#include <vector>

#include "fixtures/case.hpp"
#include "reference/oracle.hpp"
#include "reference/scalar.hpp"

namespace qed::verify {

// Gradient dataset names (without the group) that a variant/arm carries, in CASE_FORMAT order.
std::vector<std::string> grad_names(reference::Variant v, reference::Arm a);

// "o", "ht" and, when the case has cotangents, "grads/dq", ... ; results are prefixed with
// "outputs/" or "grads/" so both groups travel in one list.
std::vector<std::string> result_names(const fixtures::Case& c);

// The gradient tensor of a Grads struct by its case-file name ("dq", "dh0", ...).
template <class S>
const std::vector<S>& grad_field(const reference::Grads<S>& g, const std::string& name) {
  if (name == "dq") return g.dq;
  if (name == "dk") return g.dk;
  if (name == "dv") return g.dv;
  if (name == "dg") return g.dg;
  if (name == "db") return g.db;
  if (name == "dw") return g.dw;
  if (name == "dbeta") return g.dbeta;
  if (name == "dlambda") return g.dlambda;
  if (name == "dr") return g.dr;
  if (name == "dh0") return g.dh0;
  throw qed::Error("unknown gradient dataset '" + name + "'");
}

// A Compute for the oracle: forward (and backward when the case has cotangents) of the
// recurrent reference at the requested precision, with the case's inputs converted exactly.
reference::Compute recurrent_compute(const fixtures::Case& c, int threads = 0);

// Shape of a result dataset ("outputs/o", "outputs/ht", "grads/dq", ...) for a case.
std::vector<int64_t> result_shape(const fixtures::Case& c, const std::string& name);

// Stores certified results (values, low parts when beyond double, digits) into c.outputs and
// c.grads, replacing what was there.
void store_results(const reference::OracleReport& rep, fixtures::Case& c);

// Parsed --precision: a fixed precision, or auto with a digit target.
struct PrecisionChoice {
  bool automatic = true;
  double target_digits = 30;
  reference::Precision fixed;
  std::string text() const;
};
PrecisionChoice parse_precision_choice(const std::string& s);

}  // namespace qed::verify
