// run_chunked (kernels/chunked_host.hpp): reference inputs in, kernel outputs out.
#include "kernels/chunked_host.hpp"

#include <cuda_runtime.h>

#include <string>

#include "kernels/chunked_api.hpp"
#include "kernels/host_run.hpp"
#include "reference/error.hpp"

namespace qed::kernels {

ChunkedHostRun run_chunked(const reference::Inputs<double>& in0, DType dt, bool want_cs,
                           DType out_dt) {
  throw_if_error(device_status());
  ChunkedHostRun res;
  res.inputs = round_inputs(in0, dt);
  const auto& in = res.inputs;
  const auto& d = in.dims;
  const int64_t N = in.num_sequences();
  const reference::Layout lay = reference::layout_of(in.variant, in.arm);

  Problem p;
  p.variant = in.variant;
  p.arm = in.arm;
  p.B = d.B;
  p.T = d.T;
  p.H = d.H;
  p.K = d.K;
  p.V = d.V;
  p.scale = static_cast<float>(in.scale);
  DeviceBuffer cu;
  if (!in.cu_seqlens.empty()) {
    cu = DeviceBuffer(in.cu_seqlens.size() * sizeof(int64_t));
    cu.upload(in.cu_seqlens.data(), in.cu_seqlens.size() * sizeof(int64_t));
    p.cu_seqlens = cu.as<int64_t>();
    p.cu_seqlens_host = in.cu_seqlens.data();
    p.num_seqs = N;
  }
  DeviceBuffer q = to_device(in.q, dt), k = to_device(in.k, dt), v = to_device(in.v, dt);
  DeviceBuffer g = to_device(in.g, dt), b = to_device(in.b, dt), w = to_device(in.w, dt);
  DeviceBuffer beta = to_device(in.beta, dt);
  DeviceBuffer lam = to_device_f32(in.lambda), r = to_device_f32(in.r);
  DeviceBuffer h0 = to_device_f32(in.h0);
  Inputs ki;
  ki.q = seq_tensor(q.get(), dt, d.T, d.H, d.K);
  ki.k = seq_tensor(k.get(), dt, d.T, d.H, d.K);
  ki.v = seq_tensor(v.get(), dt, d.T, d.H, d.V);
  if (lay.channel_g) ki.g = seq_tensor(g.get(), dt, d.T, d.H, d.K);
  if (lay.scalar_g) ki.g = seq_tensor(g.get(), dt, d.T, d.H, 1);
  if (lay.has_bw) {
    ki.b = seq_tensor(b.get(), dt, d.T, d.H, d.K);
    ki.w = seq_tensor(w.get(), dt, d.T, d.H, d.V);
  }
  if (lay.has_beta) ki.beta = seq_tensor(beta.get(), dt, d.T, d.H, 1);
  if (lay.has_lambda) ki.lambda = lam.as<float>();
  if (lay.has_r) ki.r = r.as<float>();
  if (!in.h0.empty()) ki.h0 = state_tensor(h0.as<float>(), d.H, d.K, d.V);

  int64_t chunks = 0;
  for (const auto& sp : in.spans()) chunks += (sp.len + 63) / 64;
  const size_t nO = static_cast<size_t>(d.B * d.T * d.H * d.V);
  const size_t nS = static_cast<size_t>(N * d.H * d.K * d.V);
  const size_t nC = static_cast<size_t>(chunks * d.H * d.K * d.V);
  DeviceBuffer o(nO * dtype_bytes(out_dt)), ht(nS * 4), cs(want_cs ? nC * 4 : 0);
  o.fill_bytes(0xFF);  // NaN in fp32, bf16 and fp16
  ht.fill_bytes(0xFF);
  cs.fill_bytes(0xFF);
  ChunkedForwardParams fp;
  fp.problem = p;
  fp.in = ki;
  fp.o = seq_tensor_out(o.get(), out_dt, d.T, d.H, d.V);
  fp.ht = state_tensor_out(ht.as<float>(), d.H, d.K, d.V);
  if (want_cs && nC) fp.chunk_states = state_tensor_out(cs.as<float>(), d.H, d.K, d.V);
  throw_if_error(chunked_forward(fp));
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    throw qed::Error(std::string("cuda-chunked: forward: ") + cudaGetErrorString(e));
  res.outputs.o = from_device(o, nO, out_dt);
  res.outputs.ht = from_device(ht, nS, DType::fp32);
  if (want_cs) res.chunk_states = from_device(cs, nC, DType::fp32);
  return res;
}

}  // namespace qed::kernels
