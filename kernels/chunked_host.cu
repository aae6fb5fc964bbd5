// run_chunked, run_chunked_grads (kernels/chunked_host.hpp): reference inputs in, kernel outputs
// (and gradients) out.
#include "kernels/chunked_host.hpp"

#include <cuda_runtime.h>

#include <optional>
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

  DeviceProblem dev = upload_problem(in, dt);
  Problem& p = dev.problem;
  Inputs& ki = dev.inputs;

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
  // The workspace poisoned too (NaN in every fragment): a pass that reads a fragment the prep pass
  // did not write shows up as NaN.
  size_t ws_bytes = 0;
  throw_if_error(chunked_forward_workspace(fp, &ws_bytes));
  DeviceBuffer ws(ws_bytes);
  ws.fill_bytes(0xFF);
  fp.workspace = ws.get();
  fp.workspace_bytes = ws_bytes;
  throw_if_error(chunked_forward(fp));
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    throw qed::Error(std::string("cuda-chunked: forward: ") + cudaGetErrorString(e));
  res.outputs.o = from_device(o, nO, out_dt);
  res.outputs.ht = from_device(ht, nS, DType::fp32);
  if (want_cs) res.chunk_states = from_device(cs, nC, DType::fp32);
  return res;
}

namespace {

// chunked_backward on res's rounded inputs (uploaded as dev) and cotangents, into NaN-poisoned
// gradient buffers of dtype gdt, downloaded into res.grads; ws: the backward's workspace (nullptr:
// its own), saved: what chunked_forward_saving left there is used.
void backward_into(ChunkedHostRun& res, const DeviceProblem& dev, DType dt, DType gdt, void* ws,
                   size_t ws_bytes, bool saved) {
  const auto& d = res.inputs.dims;
  DeviceBuffer dO = to_device(res.cotangents.do_, dt);
  DeviceBuffer dht = to_device_f32(res.cotangents.dht);
  DeviceGrads grads(res.inputs, gdt);
  ChunkedBackwardParams bp;
  bp.problem = dev.problem;
  bp.in = dev.inputs;
  bp.do_ = seq_tensor(dO.get(), dt, d.T, d.H, d.V);
  if (!res.cotangents.dht.empty()) bp.dht = state_tensor(dht.as<float>(), d.H, d.K, d.V);
  bp.grads = grads.outputs();
  bp.workspace = ws;
  bp.workspace_bytes = ws_bytes;
  bp.saved_forward = saved;
  throw_if_error(chunked_backward(bp));
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    throw qed::Error(std::string("cuda-chunked: backward: ") + cudaGetErrorString(e));
  grads.download(res.grads);
  res.has_grads = true;
}

}  // namespace

ChunkedHostRun run_chunked_grads(const reference::Inputs<double>& in0,
                                 const reference::Cotangents<double>* cot, DType dt, DType gdt,
                                 bool want_cs) {
  ChunkedHostRun res = run_chunked(in0, dt, want_cs);
  if (!cot) return res;
  res.cotangents = round_cotangents(*cot, dt);
  const DeviceProblem dev = upload_problem(res.inputs, dt);
  backward_into(res, dev, dt, gdt, nullptr, 0, false);
  return res;
}

ChunkedHostRun run_chunked_training(const reference::Inputs<double>& in0,
                                    const reference::Cotangents<double>& cot, DType dt, DType gdt,
                                    const reference::Inputs<double>* stale) {
  throw_if_error(device_status());
  ChunkedHostRun res;
  res.inputs = round_inputs(in0, dt);
  const auto& d = res.inputs.dims;
  const int64_t N = res.inputs.num_sequences();
  res.cotangents = round_cotangents(cot, dt);
  const DeviceProblem dev = upload_problem(res.inputs, dt);
  std::optional<DeviceProblem> alt;
  if (stale) alt.emplace(upload_problem(round_inputs(*stale, dt), dt));
  const DeviceProblem& dev_fwd = alt ? *alt : dev;
  const size_t nO = static_cast<size_t>(d.B * d.T * d.H * d.V);
  const size_t nS = static_cast<size_t>(N * d.H * d.K * d.V);
  DeviceBuffer o(nO * 4), ht(nS * 4);
  o.fill_bytes(0xFF);
  ht.fill_bytes(0xFF);
  ChunkedForwardParams fp;
  fp.problem = dev_fwd.problem;
  fp.in = dev_fwd.inputs;
  fp.o = seq_tensor_out(o.get(), DType::fp32, d.T, d.H, d.V);
  fp.ht = state_tensor_out(ht.as<float>(), d.H, d.K, d.V);
  size_t ws_bytes = 0;
  throw_if_error(chunked_forward_saving_workspace(fp, &ws_bytes));
  DeviceBuffer ws(ws_bytes);
  ws.fill_bytes(0xFF);
  throw_if_error(chunked_forward_saving(fp, ws.get(), ws_bytes));
  backward_into(res, dev, dt, gdt, ws.get(), ws_bytes, true);  // synchronises
  res.outputs.o = from_device(o, nO, DType::fp32);
  res.outputs.ht = from_device(ht, nS, DType::fp32);
  return res;
}

}  // namespace qed::kernels
