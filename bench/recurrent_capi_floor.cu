// Floor kernels for the decode benchmark (bench/bench_recurrent.py): empty kernels launched like a
// small-batch decode step, under the same CUDA-graph replay, to measure what a step costs before
// it does any work, with a small (16-byte) and a RecArgs-sized (624-byte) argument. Each reads
// fields spread over its argument so that the argument is really fetched, and writes nothing.
#include <cuda_runtime.h>

#include "kernels/recurrent_common.cuh"

namespace {

struct SmallArg {
  float* p;
  int n;
};

__global__ void floor_small_kernel(SmallArg a) {
  if (a.n < 0) a.p[threadIdx.x] = 0.f;  // never taken (n >= 0)
}

__global__ void floor_big_kernel(qed::kernels::detail::RecArgs A) {
  if (A.N < 0 && A.slots && A.o.p && A.ht.p) A.ht.p[threadIdx.x] = 0.f;  // never taken (N >= 0)
}

}  // namespace

// which: 0 small argument, 1 RecArgs. Returns a cudaError_t.
extern "C" int qed_floor_kernel(int which, unsigned blocks, unsigned threads, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (which == 0) {
    floor_small_kernel<<<blocks, threads, 0, st>>>(SmallArg{nullptr, 1});
  } else {
    qed::kernels::detail::RecArgs A;
    A.N = 1;
    floor_big_kernel<<<blocks, threads, 0, st>>>(A);
  }
  return static_cast<int>(cudaGetLastError());
}
