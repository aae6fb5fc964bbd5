// Gradient identities of MATH.md §9 (P13, the Euler identities) as check functions over any
// backward implementation: residual = |lhs - rhs| / (sum of the magnitudes of the terms), so a
// residual of a few units of roundoff means the identity holds to the precision of S.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "properties/support/checks_forward.hpp"
#include "properties/support/fd.hpp"
#include "properties/support/numerics.hpp"

namespace qed::properties {

template <class S>
struct Inner {
  S value = S(0), magnitude = S(0);
  void add(const S& x) {
    using std::abs;
    value += x;
    magnitude += abs(x);
  }
};

template <class S>
Inner<S> inner(const std::vector<S>& x, const std::vector<S>& y) {
  Inner<S> r;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) r.add(x[i] * y[i]);
  return r;
}

struct EulerResidual {
  double value_identity = 0;  // <dv, v> + <dh0, h0> = L
  double write_identity = 0;  // <dw, w> = <dv, v>           (gdn2, qed)
  double query_identity = 0;  // <dq, q> = sum do.o (+ lambda dlambda where q enters the erase)
  double max() const { return std::max({value_identity, write_identity, query_identity}); }
};

template <class S, class F, class B>
EulerResidual check_P13_euler(F&& forward, B&& backward, const Inputs<S>& in, const Cotangents<S>& cot) {
  using std::abs;
  const auto out = forward(in);
  const auto g = backward(in, cot);
  auto rel = [](const S& lhs, const S& rhs, const S& mag) {
    using std::abs;
    return to_d(abs(lhs - rhs)) / std::max(to_d(mag), 1e-300);
  };
  EulerResidual r;
  if (g.dv.size() != in.v.size() || g.dq.size() != in.q.size()) {
    r.value_identity = std::numeric_limits<double>::infinity();
    return r;
  }
  const auto dvv = inner(g.dv, in.v), dhh = inner(g.dh0, in.h0);
  const auto ooo = inner(cot.do_, out.o), hht = inner(cot.dht, out.ht);
  const S L = ooo.value + hht.value;
  r.value_identity = rel(dvv.value + dhh.value, L, dvv.magnitude + dhh.magnitude + ooo.magnitude + hht.magnitude);
  if (!in.w.empty()) {
    const auto dww = inner(g.dw, in.w);
    r.write_identity = g.dw.size() == in.w.size() ? rel(dww.value, dvv.value, dww.magnitude + dvv.magnitude)
                                                   : std::numeric_limits<double>::infinity();
  }
  const auto dqq = inner(g.dq, in.q);
  Inner<S> rhs = ooo;
  if (q_in_erase(in.variant, in.arm))
    for (size_t h = 0; h < in.lambda.size(); ++h) rhs.add(in.lambda[h] * g.dlambda.at(h));
  r.query_identity = rel(dqq.value, rhs.value, dqq.magnitude + rhs.magnitude);
  return r;
}

}  // namespace qed::properties
