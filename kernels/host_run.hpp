// Runs the CUDA recurrent kernels on a reference problem given in double: rounds the inputs to the
// kernel's dtype, uploads, runs forward (and backward when cotangents are given) and returns the
// results in double together with the rounded inputs the kernels consumed. Used by
// `qedcheck run --impl cuda-recurrent`, the GPU tests and the benchmarks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/api.hpp"
#include "reference/types.hpp"

namespace qed::kernels {

// Nearest value of dtype (round to nearest even; via fp32 for the 16-bit types), as a double.
double round_to(double x, DType d);
std::vector<double> round_all(const std::vector<double>& x, DType d);

// The inputs exactly as the kernels read them: sequence tensors (q k v g b w beta) and lambda, r
// rounded to dtype; h0 and scale rounded to fp32.
reference::Inputs<double> round_inputs(const reference::Inputs<double>& in, DType d);
// do rounded to dtype, dht to fp32.
reference::Cotangents<double> round_cotangents(const reference::Cotangents<double>& c, DType d);

struct HostRun {
  reference::Inputs<double> inputs;          // as consumed (round_inputs)
  reference::Cotangents<double> cotangents;  // as consumed; empty without cotangents
  reference::Outputs<double> outputs;        // o and ht, computed and stored in fp32
  reference::Grads<double> grads;            // fp32; filled when cotangents were given
  bool has_grads = false;
};

// Throws qed::Error("no CUDA device: ...") without a usable device, and qed::Error with the API's
// message on any invalid argument or CUDA failure.
HostRun run_recurrent(const reference::Inputs<double>& in,
                      const reference::Cotangents<double>* cot, DType dtype);

// Owning device allocation (cudaMalloc), for tests and benchmarks.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  void* get() const { return p_; }
  size_t bytes() const { return n_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

  void upload(const void* src, size_t bytes);
  void download(void* dst, size_t bytes) const;
  void fill_bytes(int value);

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Values converted to dtype (already representable values stay exact) and uploaded.
DeviceBuffer to_device(const std::vector<double>& x, DType d);
DeviceBuffer to_device_f32(const std::vector<double>& x);
std::vector<double> from_device(const DeviceBuffer& b, size_t count, DType d);

// A problem's inputs uploaded in a dtype: the owning buffers, the Problem (shape, variant, arm,
// scale, cu_seqlens) and the Inputs descriptors pointing into the buffers. It owns everything its
// descriptors point at: Problem::cu_seqlens_host points into its own cu_host (a moved vector keeps
// its storage, so moving a DeviceProblem keeps the pointer valid).
struct DeviceProblem {
  Problem problem;
  Inputs inputs;
  std::vector<int64_t> cu_host;
  DeviceBuffer cu, q, k, v, g, b, w, beta, lambda, r, h0;
};
DeviceProblem upload_problem(const reference::Inputs<double>& in, DType dt);

// Device buffers for every gradient the problem's variant has, poisoned with 0xFF bytes (NaN in
// fp32, bf16 and fp16) so that an element a backward kernel does not write cannot pass a check;
// per-token gradients in `dt`, dlambda, dr and dh0 in fp32. outputs() describes them for a
// backward call; download() copies them into a Grads record after it.
class DeviceGrads {
 public:
  DeviceGrads(const reference::Inputs<double>& in, DType dt);
  GradOutputs outputs() const;
  void download(reference::Grads<double>& G) const;

 private:
  reference::Dims d_;
  reference::Layout lay_;
  DType dt_;
  size_t nK_, nV_, nTok_, nS_;
  DeviceBuffer dq_, dk_, dv_, dg_, db_, dw_, dbeta_, dlam_, dr_, dh0_;
};

// Throws qed::Error with the status message when !s.ok().
void throw_if_error(const Status& s);

}  // namespace qed::kernels
