#include "kernels/host_run.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>

#include "reference/error.hpp"

namespace qed::kernels {

namespace {

uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw qed::Error(std::string("cuda-recurrent: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

double round_to(double x, DType d) {
  const float f = static_cast<float>(x);
  switch (d) {
    case DType::fp32: return f;
    case DType::bf16: return from_bf16_bits(to_bf16_bits(f));
    case DType::fp16: return __half2float(__float2half_rn(f));
  }
  return f;
}

std::vector<double> round_all(const std::vector<double>& x, DType d) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = round_to(x[i], d);
  return out;
}

reference::Inputs<double> round_inputs(const reference::Inputs<double>& in, DType d) {
  reference::Inputs<double> o = in;
  o.scale = static_cast<float>(in.scale);
  for (auto* t : {&o.q, &o.k, &o.v, &o.g, &o.b, &o.w, &o.beta, &o.lambda, &o.r}) *t = round_all(*t, d);
  o.h0 = round_all(in.h0, DType::fp32);
  return o;
}

reference::Cotangents<double> round_cotangents(const reference::Cotangents<double>& c, DType d) {
  return {round_all(c.do_, d), round_all(c.dht, DType::fp32)};
}

void throw_if_error(const Status& s) {
  if (!s.ok()) throw qed::Error(s.message);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : n_(bytes) {
  if (bytes) check_cuda(cudaMalloc(&p_, bytes), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
  o.p_ = nullptr;
  o.n_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}
void DeviceBuffer::upload(const void* src, size_t bytes) {
  if (bytes > n_) throw qed::Error("DeviceBuffer::upload: more bytes than allocated");
  if (bytes) check_cuda(cudaMemcpy(p_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
void DeviceBuffer::download(void* dst, size_t bytes) const {
  if (bytes > n_) throw qed::Error("DeviceBuffer::download: more bytes than allocated");
  if (bytes) check_cuda(cudaMemcpy(dst, p_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
void DeviceBuffer::fill_bytes(int value) {
  if (n_) check_cuda(cudaMemset(p_, value, n_), "cudaMemset");
}

DeviceBuffer to_device(const std::vector<double>& x, DType d) {
  DeviceBuffer b(x.size() * dtype_bytes(d));
  if (x.empty()) return b;
  if (d == DType::fp32) {
    std::vector<float> h(x.begin(), x.end());
    b.upload(h.data(), h.size() * 4);
  } else {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float f = static_cast<float>(x[i]);
      if (d == DType::bf16) {
        h[i] = to_bf16_bits(f);
      } else {
        h[i] = static_cast<__half_raw>(__float2half_rn(f)).x;
      }
    }
    b.upload(h.data(), h.size() * 2);
  }
  return b;
}

DeviceBuffer to_device_f32(const std::vector<double>& x) { return to_device(x, DType::fp32); }

std::vector<double> from_device(const DeviceBuffer& b, size_t count, DType d) {
  std::vector<double> out(count);
  if (!count) return out;
  if (d == DType::fp32) {
    std::vector<float> h(count);
    b.download(h.data(), count * 4);
    for (size_t i = 0; i < count; ++i) out[i] = h[i];
  } else {
    std::vector<uint16_t> h(count);
    b.download(h.data(), count * 2);
    for (size_t i = 0; i < count; ++i) {
      if (d == DType::bf16) {
        out[i] = from_bf16_bits(h[i]);
      } else {
        __half_raw raw;
        raw.x = h[i];
        out[i] = __half2float(__half(raw));
      }
    }
  }
  return out;
}

DeviceProblem upload_problem(const reference::Inputs<double>& in, DType dt) {
  const auto& d = in.dims;
  const reference::Layout lay = reference::layout_of(in.variant, in.arm);
  DeviceProblem dp;
  Problem& p = dp.problem;
  p.variant = in.variant;
  p.arm = in.arm;
  p.B = d.B;
  p.T = d.T;
  p.H = d.H;
  p.K = d.K;
  p.V = d.V;
  p.scale = static_cast<float>(in.scale);
  if (!in.cu_seqlens.empty()) {
    dp.cu = DeviceBuffer(in.cu_seqlens.size() * sizeof(int64_t));
    dp.cu.upload(in.cu_seqlens.data(), in.cu_seqlens.size() * sizeof(int64_t));
    p.cu_seqlens = dp.cu.as<int64_t>();
    dp.cu_host = in.cu_seqlens;
    p.cu_seqlens_host = dp.cu_host.data();
    p.num_seqs = in.num_sequences();
  }
  dp.q = to_device(in.q, dt);
  dp.k = to_device(in.k, dt);
  dp.v = to_device(in.v, dt);
  dp.g = to_device(in.g, dt);
  dp.b = to_device(in.b, dt);
  dp.w = to_device(in.w, dt);
  dp.beta = to_device(in.beta, dt);
  dp.lambda = to_device_f32(in.lambda);
  dp.r = to_device_f32(in.r);
  dp.h0 = to_device_f32(in.h0);
  Inputs& ki = dp.inputs;
  ki.q = seq_tensor(dp.q.get(), dt, d.T, d.H, d.K);
  ki.k = seq_tensor(dp.k.get(), dt, d.T, d.H, d.K);
  ki.v = seq_tensor(dp.v.get(), dt, d.T, d.H, d.V);
  if (lay.channel_g) ki.g = seq_tensor(dp.g.get(), dt, d.T, d.H, d.K);
  if (lay.scalar_g) ki.g = seq_tensor(dp.g.get(), dt, d.T, d.H, 1);
  if (lay.has_bw) {
    ki.b = seq_tensor(dp.b.get(), dt, d.T, d.H, d.K);
    ki.w = seq_tensor(dp.w.get(), dt, d.T, d.H, d.V);
  }
  if (lay.has_beta) ki.beta = seq_tensor(dp.beta.get(), dt, d.T, d.H, 1);
  if (lay.has_lambda) ki.lambda = dp.lambda.as<float>();
  if (lay.has_r) ki.r = dp.r.as<float>();
  if (!in.h0.empty()) ki.h0 = state_tensor(dp.h0.as<float>(), d.H, d.K, d.V);
  return dp;
}

DeviceGrads::DeviceGrads(const reference::Inputs<double>& in, DType dt)
    : d_(in.dims),
      lay_(reference::layout_of(in.variant, in.arm)),
      dt_(dt),
      nK_(static_cast<size_t>(d_.B * d_.T * d_.H * d_.K)),
      nV_(static_cast<size_t>(d_.B * d_.T * d_.H * d_.V)),
      nTok_(static_cast<size_t>(d_.B * d_.T * d_.H)),
      nS_(static_cast<size_t>(in.num_sequences() * d_.H * d_.K * d_.V)) {
  const size_t e = static_cast<size_t>(dtype_bytes(dt));
  dq_ = DeviceBuffer(nK_ * e);
  dk_ = DeviceBuffer(nK_ * e);
  dv_ = DeviceBuffer(nV_ * e);
  dg_ = DeviceBuffer((lay_.channel_g ? nK_ : nTok_) * e);
  db_ = DeviceBuffer(nK_ * e);
  dw_ = DeviceBuffer(nV_ * e);
  dbeta_ = DeviceBuffer(nTok_ * e);
  dlam_ = DeviceBuffer(static_cast<size_t>(d_.H) * 4);
  dr_ = DeviceBuffer(static_cast<size_t>(d_.H * d_.K) * 4);
  dh0_ = DeviceBuffer(nS_ * 4);
  for (DeviceBuffer* x : {&dq_, &dk_, &dv_, &dg_, &db_, &dw_, &dbeta_, &dlam_, &dr_, &dh0_})
    x->fill_bytes(0xFF);
}

GradOutputs DeviceGrads::outputs() const {
  GradOutputs gr;
  gr.dq = seq_tensor_out(dq_.get(), dt_, d_.T, d_.H, d_.K);
  gr.dk = seq_tensor_out(dk_.get(), dt_, d_.T, d_.H, d_.K);
  gr.dv = seq_tensor_out(dv_.get(), dt_, d_.T, d_.H, d_.V);
  if (lay_.channel_g) gr.dg = seq_tensor_out(dg_.get(), dt_, d_.T, d_.H, d_.K);
  if (lay_.scalar_g) gr.dg = seq_tensor_out(dg_.get(), dt_, d_.T, d_.H, 1);
  if (lay_.has_bw) {
    gr.db = seq_tensor_out(db_.get(), dt_, d_.T, d_.H, d_.K);
    gr.dw = seq_tensor_out(dw_.get(), dt_, d_.T, d_.H, d_.V);
  }
  if (lay_.has_beta) gr.dbeta = seq_tensor_out(dbeta_.get(), dt_, d_.T, d_.H, 1);
  if (lay_.has_lambda) gr.dlambda = dlam_.as<float>();
  if (lay_.has_r) gr.dr = dr_.as<float>();
  gr.dh0 = state_tensor_out(dh0_.as<float>(), d_.H, d_.K, d_.V);
  return gr;
}

void DeviceGrads::download(reference::Grads<double>& G) const {
  const DType f32 = DType::fp32;
  G.dq = from_device(dq_, nK_, dt_);
  G.dk = from_device(dk_, nK_, dt_);
  G.dv = from_device(dv_, nV_, dt_);
  if (lay_.channel_g) G.dg = from_device(dg_, nK_, dt_);
  if (lay_.scalar_g) G.dg = from_device(dg_, nTok_, dt_);
  if (lay_.has_bw) {
    G.db = from_device(db_, nK_, dt_);
    G.dw = from_device(dw_, nV_, dt_);
  }
  if (lay_.has_beta) G.dbeta = from_device(dbeta_, nTok_, dt_);
  if (lay_.has_lambda) G.dlambda = from_device(dlam_, static_cast<size_t>(d_.H), f32);
  if (lay_.has_r) G.dr = from_device(dr_, static_cast<size_t>(d_.H * d_.K), f32);
  G.dh0 = from_device(dh0_, nS_, f32);
}

HostRun run_recurrent(const reference::Inputs<double>& in0,
                      const reference::Cotangents<double>* cot, DType dt) {
  throw_if_error(device_status());
  HostRun res;
  res.inputs = round_inputs(in0, dt);
  const auto& in = res.inputs;
  const auto& d = in.dims;
  const int64_t N = in.num_sequences();

  DeviceProblem dev = upload_problem(in, dt);
  Problem& p = dev.problem;
  Inputs& ki = dev.inputs;

  const size_t nO = static_cast<size_t>(d.B * d.T * d.H * d.V);
  const size_t nS = static_cast<size_t>(N * d.H * d.K * d.V);
  DeviceBuffer o(nO * 4), ht(nS * 4);
  o.fill_bytes(0xFF);  // NaN poison: an element the kernel fails to write cannot pass a check
  ht.fill_bytes(0xFF);
  RecurrentForwardParams fp;
  fp.problem = p;
  fp.in = ki;
  fp.o = seq_tensor_out(o.get(), DType::fp32, d.T, d.H, d.V);
  fp.ht = state_tensor_out(ht.as<float>(), d.H, d.K, d.V);
  throw_if_error(recurrent_forward(fp));
  check_cuda(cudaDeviceSynchronize(), "forward");
  res.outputs.o = from_device(o, nO, DType::fp32);
  res.outputs.ht = from_device(ht, nS, DType::fp32);
  if (!cot) return res;

  res.cotangents = round_cotangents(*cot, dt);
  DeviceBuffer dO = to_device(res.cotangents.do_, dt);
  DeviceBuffer dht = to_device_f32(res.cotangents.dht);
  DeviceGrads grads(in, DType::fp32);
  RecurrentBackwardParams bp;
  bp.problem = p;
  bp.in = ki;
  bp.do_ = seq_tensor(dO.get(), dt, d.T, d.H, d.V);
  if (!res.cotangents.dht.empty()) bp.dht = state_tensor(dht.as<float>(), d.H, d.K, d.V);
  bp.grads = grads.outputs();
  throw_if_error(recurrent_backward(bp));
  check_cuda(cudaDeviceSynchronize(), "backward");
  grads.download(res.grads);
  res.has_grads = true;
  return res;
}

}  // namespace qed::kernels
