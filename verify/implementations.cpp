#include "verify/implementations.hpp"

#include "reference/chunked.hpp"
#include "reference/recurrent.hpp"
#include "verify/evaluate.hpp"

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
    if (opt.impl == "cuda-recurrent") {
      kernels::HostRun r = kernels::run_recurrent(
          c.inputs, c.cotangents ? &*c.cotangents : nullptr, dt);
      out.inputs = r.inputs;
      if (c.cotangents) out.cotangents = r.cotangents;
      store_plain("outputs/o", r.outputs.o, out);
      store_plain("outputs/ht", r.outputs.ht, out);
      if (r.has_grads)
        for (auto& name : grad_names(c.inputs.variant, c.inputs.arm))
          store_plain("grads/" + name, grad_field(r.grads, name), out);
    } else {
      if (opt.chunk != 64)
        throw qed::Error("cuda-chunked: chunk size " + std::to_string(opt.chunk) +
                         " is not supported (the kernel uses 64)");
      kernels::ChunkedHostRun r =
          kernels::run_chunked_grads(c.inputs, c.cotangents ? &*c.cotangents : nullptr, dt);
      out.inputs = r.inputs;
      if (c.cotangents) out.cotangents = r.cotangents;
      store_plain("outputs/o", r.outputs.o, out);
      store_plain("outputs/ht", r.outputs.ht, out);
      if (r.has_grads)
        for (auto& name : grad_names(c.inputs.variant, c.inputs.arm))
          store_plain("grads/" + name, grad_field(r.grads, name), out);
    }
    out.producer = "qedcheck " + opt.impl + " dtype=" + opt.dtype;
    return out;
  }
#endif
  std::string known;
  for (auto& n : implementation_names()) known += (known.empty() ? "" : ", ") + n;
  throw qed::Error("implementation '" + opt.impl + "' is not available in this build (known: " +
                   known + ")");
}

}  // namespace qed::verify
