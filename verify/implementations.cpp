#include "verify/implementations.hpp"

#include <algorithm>
#include <optional>

#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"
#include "verify/evaluate.hpp"
#include "verify/head_padding.hpp"

#ifdef QEDCHECK_HAVE_CUDA
#include "kernels/chunked_host.hpp"
#include "kernels/host_run.hpp"
#endif

namespace qed::verify {

using namespace qed::reference;

std::vector<std::string> implementation_names() {
  std::vector<std::string> names = {"reference-recurrent", "reference-chunked"};
#ifdef QEDCHECK_HAVE_CUDA
  names.push_back("cuda-recurrent");
  names.push_back("cuda-chunked");
#endif
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

#ifdef QEDCHECK_HAVE_CUDA
kernels::DType parse_dtype(const std::string& s) {
  if (s == "fp32") return kernels::DType::fp32;
  if (s == "bf16") return kernels::DType::bf16;
  if (s == "fp16") return kernels::DType::fp16;
  throw qed::Error("--dtype '" + s + "': expected fp32, bf16 or fp16");
}

std::string case_dtype(kernels::DType d) {
  switch (d) {
    case kernels::DType::fp32: return "float32";
    case kernels::DType::bf16: return "bfloat16";
    case kernels::DType::fp16: return "float16";
  }
  return "float32";
}

void store_plain(const std::string& name, const std::vector<double>& v, fixtures::Case& out) {
  fixtures::Dataset ds;
  ds.shape = result_shape(out, name);
  ds.data = v;
  const std::string key = name.substr(name.find('/') + 1);
  (name.rfind("outputs/", 0) == 0 ? out.outputs : out.grads)[key] = std::move(ds);
}
#endif

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
#ifdef QEDCHECK_HAVE_CUDA
  if (opt.impl == "cuda-recurrent" || opt.impl == "cuda-chunked") {
    const kernels::DType dt = parse_dtype(opt.dtype);
    out.dtype = case_dtype(dt);
    // Head sizes the kernel is not built for run zero-padded (verify/head_padding.hpp: exact).
    const reference::Dims d = c.inputs.dims;
    const HeadSizes run_at = built_head_sizes(opt.impl, d.K, d.V);
    const bool padded = run_at.K != d.K || run_at.V != d.V;
    const reference::Inputs<double> in = padded ? resize_heads(c.inputs, run_at.K, run_at.V) : c.inputs;
    std::optional<reference::Cotangents<double>> cot;
    if (c.cotangents) cot = padded ? resize_heads(*c.cotangents, c.inputs, run_at.K, run_at.V) : *c.cotangents;
    const auto finish = [&](const auto& r) {
      // Back to the case's sizes (resize_heads with the padded problem as the layout).
      out.inputs = padded ? resize_heads(r.inputs, d.K, d.V) : r.inputs;
      if (c.cotangents) out.cotangents = padded ? resize_heads(r.cotangents, r.inputs, d.K, d.V) : r.cotangents;
      const reference::Outputs<double> o = padded ? resize_heads(r.outputs, r.inputs, d.K, d.V) : r.outputs;
      store_plain("outputs/o", o.o, out);
      store_plain("outputs/ht", o.ht, out);
      if (r.has_grads) {
        const reference::Grads<double> g = padded ? resize_heads(r.grads, r.inputs, d.K, d.V) : r.grads;
        for (auto& name : grad_names(c.inputs.variant, c.inputs.arm))
          store_plain("grads/" + name, grad_field(g, name), out);
      }
    };
    if (opt.impl == "cuda-recurrent") {
      finish(kernels::run_recurrent(in, cot ? &*cot : nullptr, dt));
    } else {
      if (opt.chunk != 64)
        throw qed::Error("cuda-chunked: chunk size " + std::to_string(opt.chunk) +
                         " is not supported (the kernel uses 64)");
      finish(kernels::run_chunked_grads(in, cot ? &*cot : nullptr, dt));
    }
    out.producer = "qedcheck " + opt.impl + " dtype=" + opt.dtype;
    if (padded)
      out.producer += " (run at K=" + std::to_string(run_at.K) + " V=" + std::to_string(run_at.V) +
                      ", zero-padded from K=" + std::to_string(d.K) + " V=" + std::to_string(d.V) + ")";
    return out;
  }
#endif
  require_implementation(opt.impl);
  throw qed::Error("implementation '" + opt.impl + "' has no runner");  // a name without a branch above
}

void require_implementation(const std::string& impl) {
  const auto names = implementation_names();
  if (std::find(names.begin(), names.end(), impl) != names.end()) return;
  std::string known;
  for (auto& n : names) known += (known.empty() ? "" : ", ") + n;
  throw qed::Error("implementation '" + impl + "' is not available in this build (known: " + known + ")");
}

}  // namespace qed::verify
