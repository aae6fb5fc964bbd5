#include "verify/implementations.hpp"

#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"
#include "verify/evaluate.hpp"

namespace qed::verify {

using namespace qed::reference;

std::vector<std::string> implementation_names() {
  std::vector<std::string> names = {"reference-recurrent", "reference-chunked"};
  return names;
}

namespace {

void store_named(const Named& named, int bits, fixtures::Case& out) {
  for (const auto& [name, values] : named) {
    fixtures::Dataset ds;
    ds.shape = result_shape(out, name);
    ds.data.resize(values.size());
    if (bits > 53) ds.lo.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ds.data[i] = static_cast<double>(values[i]);
      if (bits > 53) ds.lo[i] = static_cast<double>(mpfr_float(values[i] - ds.data[i]));
    }
    const std::string key = name.substr(name.find('/') + 1);
    (name.rfind("outputs/", 0) == 0 ? out.outputs : out.grads)[key] = std::move(ds);
  }
}

}  // namespace

fixtures::Case run_implementation(const fixtures::Case& c, const RunOptions& opt) {
  fixtures::Case out = c;
  out.outputs.clear();
  out.grads.clear();
  if (opt.impl == "reference-recurrent") {
    Named named = recurrent_compute(c, opt.threads)(opt.precision);
    set_mpfr_bits(opt.precision.bits + 64);
    store_named(named, opt.precision.bits, out);
    out.producer = "qedcheck reference-recurrent " + opt.precision.name();
    return out;
  }
  if (opt.impl == "reference-chunked") {
    ChunkOptions co;
    co.chunk = opt.chunk;
    co.operands = parse_operands(opt.operands);
    Named named = with_scalar(opt.precision, [&]<class S>() {
      Inputs<S> in = convert_inputs<S>(c.inputs);
      Named n;
      Outputs<S> o = chunked_forward<S>(in, co, nullptr, opt.threads);
      n.emplace_back("outputs/o", to_mpfr_vec(o.o));
      n.emplace_back("outputs/ht", to_mpfr_vec(o.ht));
      if (c.cotangents) {
        Grads<S> g = chunked_backward(in, convert_cotangents<S>(*c.cotangents), co, opt.threads);
        for (auto& name : grad_names(c.inputs.variant, c.inputs.arm))
          n.emplace_back("grads/" + name, to_mpfr_vec(grad_field(g, name)));
      }
      return n;
    });
    set_mpfr_bits(opt.precision.bits + 64);
    store_named(named, opt.precision.bits, out);
    out.producer = "qedcheck reference-chunked C=" + std::to_string(opt.chunk) + " operands=" +
                   opt.operands + " " + opt.precision.name();
    return out;
  }
  std::string known;
  for (auto& n : implementation_names()) known += (known.empty() ? "" : ", ") + n;
  throw qed::Error("implementation '" + opt.impl + "' is not available in this build (known: " +
                   known + ")");
}

}  // namespace qed::verify
