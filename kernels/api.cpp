// Descriptor helpers and the argument checks shared by every kernel entry point.
#include "kernels/api.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <sstream>

namespace qed::kernels {

const char* to_string(DType d) {
  switch (d) {
    case DType::fp32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
  }
  return "?";
}

int dtype_bytes(DType d) { return d == DType::fp32 ? 4 : 2; }

SeqTensor seq_tensor(const void* data, DType dtype, int64_t T, int64_t H, int64_t D) {
  return {data, dtype, T * H * D, H * D, D};
}
SeqTensorOut seq_tensor_out(void* data, DType dtype, int64_t T, int64_t H, int64_t D) {
  return {data, dtype, T * H * D, H * D, D};
}
StateTensor state_tensor(const float* data, int64_t H, int64_t K, int64_t V) {
  return {data, H * K * V, K * V, V};
}
StateTensorOut state_tensor_out(float* data, int64_t H, int64_t K, int64_t V) {
  return {data, H * K * V, K * V, V};
}

namespace {

template <class... A>
Status fail(StatusCode code, const char* fn, const A&... parts) {
  std::ostringstream os;
  os << fn << ": ";
  (os << ... << parts);
  return {code, os.str()};
}

bool valid_dtype(DType d) { return d == DType::fp32 || d == DType::bf16 || d == DType::fp16; }

// Strides of a [B,T,H,D] tensor: non-negative, and positive along every axis longer than 1.
template <class Tn>
Status check_seq(const char* fn, const char* name, const Tn& t, const Problem& p, bool required,
                 bool allowed) {
  if (!t.data) {
    if (required) return fail(StatusCode::invalid_argument, fn, name, " is required for variant ",
                              reference::to_string(p.variant), " but is nullptr");
    return {};
  }
  if (!allowed)
    return fail(StatusCode::invalid_argument, fn, name, " must be nullptr for variant ",
                reference::to_string(p.variant), " (arm ", reference::to_string(p.arm),
                "): it has no such tensor");
  if (!valid_dtype(t.dtype))
    return fail(StatusCode::invalid_argument, fn, name, ".dtype = ", static_cast<int>(t.dtype),
                " is not fp32, bf16 or fp16");
  const int64_t strides[3] = {t.stride_b, t.stride_t, t.stride_h};
  const int64_t extents[3] = {p.B, p.T, p.H};
  const char* axes[3] = {"stride_b", "stride_t", "stride_h"};
  for (int i = 0; i < 3; ++i) {
    if (strides[i] < 0 || (extents[i] > 1 && strides[i] == 0))
      return fail(StatusCode::invalid_argument, fn, name, ".", axes[i], " = ", strides[i],
                  " must be positive (axis of length ", extents[i], ")");
  }
  return {};
}

template <class St>
Status check_state(const char* fn, const char* name, const St& s) {
  if (!s.data) return {};
  if (reinterpret_cast<uintptr_t>(s.data) % 16 != 0)
    return fail(StatusCode::invalid_argument, fn, name,
                ".data is not 16-byte aligned (states move in 16-byte pieces)");
  const int64_t strides[3] = {s.stride_n, s.stride_h, s.stride_k};
  const char* axes[3] = {"stride_n", "stride_h", "stride_k"};
  for (int i = 0; i < 3; ++i)
    if (strides[i] < 0 || strides[i] % 4 != 0)
      return fail(StatusCode::invalid_argument, fn, name, ".", axes[i], " = ", strides[i],
                  " must be a non-negative multiple of 4");
  return {};
}

}  // namespace

Status validate_problem(const char* fn, const Problem& p) {
  using reference::Arm;
  using reference::Variant;
  switch (p.variant) {
    case Variant::gdn2: case Variant::qed: case Variant::kda: case Variant::gdn:
    case Variant::deltanet: break;
    default:
      return fail(StatusCode::invalid_argument, fn, "variant = ", static_cast<int>(p.variant),
                  " is not one of gdn2, qed, kda, gdn, deltanet");
  }
  if (p.variant == Variant::qed) {
    if (p.arm != Arm::full && p.arm != Arm::nogate && p.arm != Arm::nogate_noproj &&
        p.arm != Arm::rand)
      return fail(StatusCode::invalid_argument, fn,
                  "variant qed needs arm full, nogate, nogate_noproj or rand (got ",
                  reference::to_string(p.arm), ")");
  } else if (p.arm != Arm::none) {
    return fail(StatusCode::invalid_argument, fn, "arm must be none for variant ",
                reference::to_string(p.variant), " (got ", reference::to_string(p.arm), ")");
  }
  if (p.B < 1 || p.T < 0 || p.H < 1)
    return fail(StatusCode::invalid_argument, fn, "shape B=", p.B, " T=", p.T, " H=", p.H,
                ": need B >= 1, T >= 0, H >= 1");
  if (p.H > 65535)
    return fail(StatusCode::unsupported, fn, "H = ", p.H, " exceeds 65535 (grid limit)");
  if (p.K != 16 && p.K != 32 && p.K != 64 && p.K != 128 && p.K != 256)
    return fail(StatusCode::unsupported, fn, "K = ", p.K,
                " is not built; supported K: 16, 32, 64, 128, 256");
  if (p.V < 4 || p.V % 4 != 0 || p.V > 4096)
    return fail(StatusCode::unsupported, fn, "V = ", p.V,
                " is not supported; V must be a multiple of 4 in [4, 4096]");
  if (!std::isfinite(p.scale))
    return fail(StatusCode::invalid_argument, fn, "scale = ", p.scale, " is not finite");
  if (p.cu_seqlens) {
    if (p.B != 1)
      return fail(StatusCode::invalid_argument, fn, "cu_seqlens needs B = 1 (got B = ", p.B,
                  ")");
    if (p.num_seqs < 1 || p.num_seqs > (int64_t{1} << 31) - 1)
      return fail(StatusCode::invalid_argument, fn, "num_seqs = ", p.num_seqs,
                  " must be in [1, 2^31 - 1] when cu_seqlens is given");
    if (p.cu_seqlens_host) {
      const int64_t* c = p.cu_seqlens_host;
      if (c[0] != 0)
        return fail(StatusCode::invalid_argument, fn, "cu_seqlens[0] = ", c[0], " must be 0");
      for (int64_t n = 0; n < p.num_seqs; ++n)
        if (c[n + 1] < c[n])
          return fail(StatusCode::invalid_argument, fn, "cu_seqlens[", n + 1, "] = ", c[n + 1],
                      " is smaller than cu_seqlens[", n, "] = ", c[n]);
      if (c[p.num_seqs] != p.T)
        return fail(StatusCode::invalid_argument, fn, "cu_seqlens[", p.num_seqs, "] = ",
                    c[p.num_seqs], " must equal T = ", p.T);
    }
  } else if (p.B > (int64_t{1} << 31) - 1) {
    return fail(StatusCode::unsupported, fn, "B = ", p.B, " exceeds 2^31 - 1");
  }
  return {};
}

Status validate_inputs(const char* fn, const Problem& p, const Inputs& in) {
  const reference::Layout lay = reference::layout_of(p.variant, p.arm);
  Status s;
  if (!(s = check_seq(fn, "q", in.q, p, true, true)).ok()) return s;
  if (!(s = check_seq(fn, "k", in.k, p, true, true)).ok()) return s;
  if (!(s = check_seq(fn, "v", in.v, p, true, true)).ok()) return s;
  const bool has_g = lay.channel_g || lay.scalar_g;
  if (!(s = check_seq(fn, "g", in.g, p, has_g, has_g)).ok()) return s;
  if (!(s = check_seq(fn, "b", in.b, p, lay.has_bw, lay.has_bw)).ok()) return s;
  if (!(s = check_seq(fn, "w", in.w, p, lay.has_bw, lay.has_bw)).ok()) return s;
  if (!(s = check_seq(fn, "beta", in.beta, p, lay.has_beta, lay.has_beta)).ok()) return s;
  if (lay.has_lambda != (in.lambda != nullptr))
    return fail(StatusCode::invalid_argument, fn, "lambda must be ",
                lay.has_lambda ? "given" : "nullptr", " for variant ",
                reference::to_string(p.variant));
  if (lay.has_r != (in.r != nullptr))
    return fail(StatusCode::invalid_argument, fn, "r must be ", lay.has_r ? "given" : "nullptr",
                " for variant ", reference::to_string(p.variant), " arm ",
                reference::to_string(p.arm));
  return check_state(fn, "h0", in.h0);
}

Status validate_grads(const char* fn, const Problem& p, const GradOutputs& gr) {
  const reference::Layout lay = reference::layout_of(p.variant, p.arm);
  Status s;
  if (!(s = check_seq(fn, "dq", gr.dq, p, true, true)).ok()) return s;
  if (!(s = check_seq(fn, "dk", gr.dk, p, true, true)).ok()) return s;
  if (!(s = check_seq(fn, "dv", gr.dv, p, true, true)).ok()) return s;
  const bool has_g = lay.channel_g || lay.scalar_g;
  if (!(s = check_seq(fn, "dg", gr.dg, p, has_g, has_g)).ok()) return s;
  if (!(s = check_seq(fn, "db", gr.db, p, lay.has_bw, lay.has_bw)).ok()) return s;
  if (!(s = check_seq(fn, "dw", gr.dw, p, lay.has_bw, lay.has_bw)).ok()) return s;
  if (!(s = check_seq(fn, "dbeta", gr.dbeta, p, lay.has_beta, lay.has_beta)).ok()) return s;
  if (lay.has_lambda != (gr.dlambda != nullptr))
    return fail(StatusCode::invalid_argument, fn, "dlambda must be ",
                lay.has_lambda ? "given" : "nullptr", " for variant ",
                reference::to_string(p.variant));
  if (lay.has_r != (gr.dr != nullptr))
    return fail(StatusCode::invalid_argument, fn, "dr must be ", lay.has_r ? "given" : "nullptr",
                " for variant ", reference::to_string(p.variant), " arm ",
                reference::to_string(p.arm));
  if (!gr.dh0.data) return fail(StatusCode::invalid_argument, fn, "dh0 is required");
  return check_state(fn, "dh0", gr.dh0);
}

Status validate_output(const char* fn, const char* name, const Problem& p,
                       const SeqTensorOut& t) {
  return check_seq(fn, name, t, p, true, true);
}
Status validate_state(const char* fn, const char* name, const StateTensor& s) {
  return check_state(fn, name, s);
}
Status validate_state(const char* fn, const char* name, const StateTensorOut& s) {
  return check_state(fn, name, s);
}

Status device_status() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return {StatusCode::no_device, std::string("no CUDA device: ") + cudaGetErrorString(e)};
  }
  if (n == 0) return {StatusCode::no_device, "no CUDA device: cudaGetDeviceCount returned 0"};
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 9)
    return {StatusCode::no_device,
            "no usable CUDA device: kernels are built for sm_90, device has compute capability " +
                std::to_string(major) + ".x"};
  return {};
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

}  // namespace qed::kernels
