// Finite-difference machinery of the gradient properties: the loss L = sum(do*o) + sum(dht*ht) of
// CASE_FORMAT.md, the list of differentiable inputs paired with their gradients, central
// differences on every entry (P16) and along one random direction (u^T J v), and the per-entry
// comparison that reports the worst relative error and where it occurred.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fixtures/generate.hpp"
#include "properties/support/numerics.hpp"
#include "reference/parallel.hpp"
#include "reference/types.hpp"

namespace qed::properties {

using reference::Cotangents;
using reference::Grads;
using reference::Inputs;
using reference::Outputs;

template <class S>
S loss(const Outputs<S>& out, const Cotangents<S>& cot) {
  S acc(0);
  for (size_t i = 0; i < out.o.size(); ++i) acc += cot.do_[i] * out.o[i];
  for (size_t i = 0; i < cot.dht.size(); ++i) acc += cot.dht[i] * out.ht[i];
  return acc;
}

template <class S>
struct Param {
  std::string name;
  std::vector<S>* x;
  std::vector<S>* dx;
};

// Every input tensor the case carries, with its gradient; h0 always (zero when absent: the
// caller makes it explicit so that dh0 is checked as well).
template <class S>
std::vector<Param<S>> params(Inputs<S>& in, Grads<S>& g) {
  std::vector<Param<S>> p;
  auto add = [&](const char* n, std::vector<S>& x, std::vector<S>& dx) {
    if (!x.empty()) p.push_back({n, &x, &dx});
  };
  add("q", in.q, g.dq);
  add("k", in.k, g.dk);
  add("v", in.v, g.dv);
  add("g", in.g, g.dg);
  add("b", in.b, g.db);
  add("w", in.w, g.dw);
  add("beta", in.beta, g.dbeta);
  add("lambda", in.lambda, g.dlambda);
  add("r", in.r, g.dr);
  add("h0", in.h0, g.dh0);
  return p;
}

template <class S>
Inputs<S> with_explicit_h0(Inputs<S> in) {
  if (in.h0.empty()) in.h0.assign(static_cast<size_t>(in.num_sequences() * in.dims.H * in.dims.K * in.dims.V), S(0));
  return in;
}

// Central differences (L(x + h e_i) - L(x - h e_i)) / (2h) on every entry of every input; the
// denominator is the difference of the two perturbed values as stored, so that rounding of
// x +- h does not enter. `forward` must be safe to call from several threads at once.
template <class S, class F>
Grads<S> fd_gradient(F&& forward, const Inputs<S>& in0, const Cotangents<S>& cot, const S& h, int threads = 0) {
  const Inputs<S> in = with_explicit_h0(in0);
  Grads<S> g;
  Inputs<S> shape = in;
  std::vector<std::pair<std::vector<S>*, std::vector<S>*>> slots;  // (dx, x) of `shape`, in order
  for (auto& p : params(shape, g)) {
    p.dx->assign(p.x->size(), S(0));
    slots.push_back({p.dx, p.x});
  }
  // Entries are split into `threads` strided groups, each perturbing its own copy of the inputs.
  const int n = threads > 0 ? threads : reference::default_threads();
  reference::parallel_for(
      n,
      [&](int64_t worker) {
        Inputs<S> mine = in;
        Grads<S> unused;
        auto ps = params(mine, unused);
        int64_t flat = 0;
        for (size_t t = 0; t < ps.size(); ++t)
          for (size_t i = 0; i < ps[t].x->size(); ++i, ++flat) {
            if (flat % n != worker) continue;
            const S x0 = (*ps[t].x)[i];
            const S xp = x0 + h, xm = x0 - h;
            (*ps[t].x)[i] = xp;
            const S lp = loss(forward(mine), cot);
            (*ps[t].x)[i] = xm;
            const S lm = loss(forward(mine), cot);
            (*ps[t].x)[i] = x0;
            (*slots[t].first)[i] = (lp - lm) / (xp - xm);
          }
      },
      n);
  return g;
}

struct GradError {
  double worst = 0;   // max over entries of |adj - fd| / max(|fd|, floor)
  std::string where;  // tensor[index] of the worst entry
  double min_digits() const { return worst > 0 ? -std::log10(worst) : std::numeric_limits<double>::infinity(); }
};

// Per-entry relative error of `adj` against `fd` over every tensor both carry. The floor keeps
// entries whose true value is (near) zero from dividing by nothing: floor_rel * max|fd| over all
// tensors. Missing or mis-sized gradient tensors count as infinitely wrong.
template <class S>
GradError compare_grads(Grads<S> adj, Grads<S> fd, const Inputs<S>& in0, double floor_rel) {
  Inputs<S> in = with_explicit_h0(in0);
  Inputs<S> in2 = in;
  auto pa = params(in, adj);
  auto pf = params(in2, fd);
  double gmax = 0;
  for (auto& p : pf)
    for (const auto& e : *p.dx) gmax = std::max(gmax, abs_d(e));
  const double floor = std::max(floor_rel * gmax, 1e-300);
  GradError err;
  for (size_t t = 0; t < pa.size(); ++t) {
    const auto& a = *pa[t].dx;
    const auto& f = *pf[t].dx;
    if (a.size() != f.size()) {
      err.worst = std::numeric_limits<double>::infinity();
      err.where = pa[t].name + " (size " + std::to_string(a.size()) + " vs " + std::to_string(f.size()) + ")";
      return err;
    }
    for (size_t i = 0; i < a.size(); ++i) {
      const double e = abs_d(a[i] - f[i]) / std::max(abs_d(f[i]), floor);
      if (!(e <= err.worst)) {
        err.worst = e;
        err.where = pa[t].name + "[" + std::to_string(i) + "]";
      }
    }
  }
  return err;
}

// P16 on every entry: adjoint against central differences of `forward`.
template <class S, class F, class B>
GradError check_P16_entries(F&& forward, B&& backward, const Inputs<S>& in, const Cotangents<S>& cot, const S& h,
                            double floor_rel) {
  return compare_grads(backward(in, cot), fd_gradient(forward, in, cot, h), in, floor_rel);
}

// u^T J v: the adjoint's <grad, delta> against the directional derivative of L along a random
// delta over every input entry (h0 included), taken as the Richardson combination
// (4 D(h) - D(2h)) / 3 of central differences D(h) = (L(x + h delta) - L(x - h delta)) / 2h, which
// cancels the h^2 term (it dominates for unstable cases whose states reach 1e88). Residual
// relative to sum |grad_i delta_i|.
template <class S, class F, class B>
double check_directional(F&& forward, B&& backward, const Inputs<S>& in0, const Cotangents<S>& cot, uint64_t seed,
                         const S& h) {
  Inputs<S> in = with_explicit_h0(in0);
  Grads<S> adj = backward(in, cot);
  fixtures::Rng rng(seed);
  Grads<S> unused;
  auto pa = params(in, adj);
  std::vector<std::vector<S>> delta(pa.size());
  S dot(0), mag(0);
  using std::abs;
  for (size_t t = 0; t < pa.size(); ++t) {
    if (pa[t].dx->size() != pa[t].x->size()) return std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < pa[t].x->size(); ++i) {
      delta[t].push_back(S(rng.normal()));
      dot += (*pa[t].dx)[i] * delta[t].back();
      mag += abs((*pa[t].dx)[i] * delta[t].back());
    }
  }
  auto central = [&](const S& step) {
    Inputs<S> plus = in, minus = in;
    auto pp = params(plus, unused);
    auto pm = params(minus, unused);
    for (size_t t = 0; t < pp.size(); ++t)
      for (size_t i = 0; i < pp[t].x->size(); ++i) {
        (*pp[t].x)[i] += step * delta[t][i];
        (*pm[t].x)[i] -= step * delta[t][i];
      }
    return S((loss(forward(plus), cot) - loss(forward(minus), cot)) / (S(2) * step));
  };
  const S fd = (S(4) * central(h) - central(S(2) * h)) / S(3);
  return abs_d(fd - dot) / std::max(to_d(mag), 1e-300);
}

}  // namespace qed::properties
