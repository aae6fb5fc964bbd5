#include "fuzz/mutants.hpp"

#include <cmath>

#include "reference/recurrent.hpp"
#include "reference/scalar.hpp"
#include "verify/evaluate.hpp"

namespace qed::fuzz {

using namespace qed::reference;

namespace {

enum class Mutation { decay_after_erase, scaled_erase_q, varlen_carry, dq_readout_only };

struct Named {
  const char* name;
  Mutation m;
};
constexpr Named kMutants[] = {{"mutant-decay-after-erase", Mutation::decay_after_erase},
                              {"mutant-scaled-erase-q", Mutation::scaled_erase_q},
                              {"mutant-varlen-carry", Mutation::varlen_carry},
                              {"mutant-dq-readout-only", Mutation::dq_readout_only}};

// The forward recurrence with the mutation applied; `states` (when given) receives S_t after
// every token, [B,T,H,K,V] flattened per token and head, for the read-out gradient.
template <class S>
Outputs<S> forward(const Inputs<S>& in, Mutation mut, std::vector<S>* states) {
  const auto& d = in.dims;
  Outputs<S> out;
  out.o.assign(static_cast<size_t>(d.B * d.T * d.H * d.V), S(0));
  out.ht.assign(static_cast<size_t>(in.num_sequences() * d.H * d.K * d.V), S(0));
  if (states) states->assign(static_cast<size_t>(d.B * d.T * d.H * d.K * d.V), S(0));
  const auto lanes = lanes_of(in);
  std::vector<std::vector<S>> carry(static_cast<size_t>(d.H));  // varlen_carry: last state per head
  for (const auto& L : lanes) {
    std::vector<S> St = detail::initial_state(L);
    if (mut == Mutation::varlen_carry && !in.cu_seqlens.empty() && L.n > 0) St = carry[static_cast<size_t>(L.h)];
    std::vector<S> a(L.K), p(L.K), m(L.K), alpha(L.K), u(L.V);
    for (int64_t t = 0; t < L.span.len; ++t) {
      if (mut == Mutation::decay_after_erase) {
        L.erase_vector(t, a, p, m);
        const S* kt = L.k(t);
        const S* vt = L.v(t);
        for (int64_t j = 0; j < L.V; ++j) u[j] = L.w(t, j) * vt[j];
        for (int64_t c = 0; c < L.K; ++c)
          for (int64_t j = 0; j < L.V; ++j) u[j] -= St[c * L.V + j] * a[c];  // no decay: the bug
        for (int64_t c = 0; c < L.K; ++c) {
          using std::exp;
          const S al = exp(L.g(t, c));
          for (int64_t j = 0; j < L.V; ++j) St[c * L.V + j] = al * St[c * L.V + j] + kt[c] * u[j];
        }
      } else {
        detail::step_forward(L, t, St, a, p, m, alpha, u);
      }
      detail::read_out(L, t, St, out.o.data() + L.tok(t, L.V));
      if (states) {
        const int64_t base = L.tok(t, 1) * L.K * L.V;
        for (int64_t i = 0; i < L.K * L.V; ++i) (*states)[static_cast<size_t>(base + i)] = St[i];
      }
    }
    for (int64_t i = 0; i < L.K * L.V; ++i) out.ht[L.state_offset() + i] = St[i];
    carry[static_cast<size_t>(L.h)] = St;
  }
  return out;
}

void store(fixtures::Case& out, const std::string& name, std::vector<double> data) {
  fixtures::Dataset ds;
  ds.shape = verify::result_shape(out, name);
  ds.data = std::move(data);
  const std::string key = name.substr(name.find('/') + 1);
  (name.rfind("outputs/", 0) == 0 ? out.outputs : out.grads)[key] = std::move(ds);
}

template <class S>
std::vector<double> to_doubles(const std::vector<S>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<double>(x[i]);
  return out;
}

template <class S>
void run_as(const fixtures::Case& c, Mutation mut, fixtures::Case& out) {
  Inputs<S> in = convert_inputs<S>(c.inputs);
  if (mut == Mutation::scaled_erase_q)  // erase from (scale q): same as lambda -> scale * lambda
    for (auto& l : in.lambda) l *= in.scale;
  std::vector<S> states;
  const bool grads = mut == Mutation::dq_readout_only && c.cotangents;
  Outputs<S> o = forward(in, mut, grads ? &states : nullptr);
  store(out, "outputs/o", to_doubles(o.o));
  store(out, "outputs/ht", to_doubles(o.ht));
  if (!grads) return;
  Grads<S> g = recurrent_backward(in, convert_cotangents<S>(*c.cotangents), 1);
  // dq_t = scale S_t do_t only: the erase-vector path of q is dropped.
  const auto& d = in.dims;
  const std::vector<S> dO = convert<S>(c.cotangents->do_);
  for (int64_t tok = 0; tok < d.B * d.T * d.H; ++tok)
    for (int64_t k = 0; k < d.K; ++k) {
      S acc(0);
      for (int64_t j = 0; j < d.V; ++j) acc += states[static_cast<size_t>((tok * d.K + k) * d.V + j)] * dO[tok * d.V + j];
      g.dq[tok * d.K + k] = in.scale * acc;
    }
  for (const auto& name : verify::grad_names(c.inputs.variant, c.inputs.arm))
    store(out, "grads/" + name, to_doubles(verify::grad_field(g, name)));
}

}  // namespace

std::vector<std::string> mutant_names() {
  std::vector<std::string> names;
  for (const auto& m : kMutants) names.push_back(m.name);
  return names;
}

fixtures::Case run_mutant(const fixtures::Case& c, const verify::RunOptions& opt) {
  for (const auto& m : kMutants) {
    if (opt.impl != m.name) continue;
    fixtures::Case out = c;
    out.outputs.clear();
    out.grads.clear();
    with_scalar(opt.precision, [&]<class S>() { run_as<S>(c, m.m, out); });
    out.producer = "qedcheck " + opt.impl + " " + opt.precision.name();
    return out;
  }
  throw qed::Error("no mutant named '" + opt.impl + "'");
}

}  // namespace qed::fuzz
