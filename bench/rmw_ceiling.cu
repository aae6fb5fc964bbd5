// What an in-place pass over a decode-sized state pool can reach on this GPU, with no decode
// arithmetic: the ceiling against which issue 5's 3.9 TB/s (B = 512, H = 16, K = V = 128, fp32:
// 512 MiB read and written in place) is judged. Standalone (nvcc -O3 -arch=sm_90 -std=c++17
// bench/rmw_ceiling.cu -o rmw_ceiling; ci/device.sh builds it as $BUILD/rmw_ceiling); measured in
// reports/device/recurrent.md run G.
// Every variant multiplies each value by 1 - 2^-20 and adds 2^-30, so the pass cannot be elided.
// Prints one line per variant: microseconds (median of 15) and TB/s counting bytes read + written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "rmw_ceiling: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr float kMul = 1.f - 9.5367431640625e-07f, kAdd = 9.313225746154785e-10f;

// Grid-stride float4 pass, U independent loads in flight per thread before the first use.
template <int U>
__global__ void vec_pass(const float4* __restrict__ src, float4* __restrict__ dst, int64_t n4) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n4; i += U * stride) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      x[u].x = x[u].x * kMul + kAdd, x[u].y = x[u].y * kMul + kAdd;
      x[u].z = x[u].z * kMul + kAdd, x[u].w = x[u].w * kMul + kAdd;
      __stcs(dst + i + u * stride, x[u]);
    }
  }
  for (; i < n4; i += stride) {
    float4 x = __ldcs(src + i);
    x.x = x.x * kMul + kAdd, x.y = x.y * kMul + kAdd, x.z = x.z * kMul + kAdd, x.w = x.w * kMul + kAdd;
    __stcs(dst + i, x);
  }
}

__device__ __forceinline__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Persistent walk over contiguous tiles of TB bytes with ST shared-memory stages: each tile comes
// in by one bulk copy on its stage's mbarrier, every thread updates its part in shared memory,
// and thread 0 stores the tile back by one bulk copy (the decode kernel's "tmas" memory pattern
// without its sums). A stage is refilled once its store has read it.
template <int TB, int ST>
__global__ void __launch_bounds__(256) bulk_pass(float* pool, int64_t tiles) {
  extern __shared__ __align__(128) unsigned char sm[];
  __shared__ __align__(8) uint64_t bar[ST];
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(sa(&bar[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int64_t G = gridDim.x;
  auto issue = [&](int64_t t, int s) {
    if (tid != 0 || t >= tiles) return;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sa(&bar[s])), "r"(TB) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(sa(sm + s * TB)), "l"(reinterpret_cast<char*>(pool) + t * TB), "r"(TB), "r"(sa(&bar[s]))
                 : "memory");
  };
  for (int s = 0; s < ST - 1; ++s) issue(blockIdx.x + s * G, s);
  uint32_t phase = 0;
  int64_t it = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += G, ++it) {
    const int s = static_cast<int>(it % ST);
    // Refill the stage of the previous step with the tile ST - 1 ahead: its store must have read it.
    if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    __syncthreads();
    issue(t + (ST - 1) * G, static_cast<int>((it + ST - 1) % ST));
    const uint32_t par = (phase >> s) & 1u;
    asm volatile(
        "{\n\t.reg .pred p;\n"
        "W_%=:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
        "@!p bra W_%=;\n\t}\n" ::"r"(sa(&bar[s])), "r"(par)
        : "memory");
    phase ^= 1u << s;
    float4* x = reinterpret_cast<float4*>(sm + s * TB);
    for (int i = tid; i < TB / 16; i += 256) {
      float4 v = x[i];
      v.x = v.x * kMul + kAdd, v.y = v.y * kMul + kAdd, v.z = v.z * kMul + kAdd, v.w = v.w * kMul + kAdd;
      x[i] = v;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (tid == 0) {
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                   ::"l"(reinterpret_cast<char*>(pool) + t * TB), "r"(sa(sm + s * TB)), "r"(TB)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
  }
  if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

template <class F>
float median_us(F&& f, int reps = 15) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000.f);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ts[ts.size() / 2];
}

int sms() {
  int v = 0;
  CK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
  return v;
}

template <int TB, int ST>
void run_bulk(float* pool, size_t bytes, double traffic) {
  const int smem = TB * ST;
  CK(cudaFuncSetAttribute(bulk_pass<TB, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, bulk_pass<TB, ST>, 256, smem));
  const int64_t tiles = static_cast<int64_t>(bytes / TB);
  const int grid = static_cast<int>(std::min<int64_t>(tiles, int64_t{per} * sms()));
  const float us = median_us([&] { bulk_pass<TB, ST><<<grid, 256, smem>>>(pool, tiles); });
  std::printf("| bulk in place, %d KB tiles, %d stages, %d blocks/SM | %.1f | %.3f |\n", TB / 1024, ST, per, us,
              traffic / us * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  // Default: the decode pool of issue 5 (512 x 16 x 128 x 128 fp32).
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{512} * 16 * 128 * 128 * 4;
  float *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 0, bytes));
  CK(cudaMemset(b, 0, bytes));
  const double traffic = 2.0 * static_cast<double>(bytes);  // read + write
  const int64_t n4 = static_cast<int64_t>(bytes / 16);
  std::printf("pool %zu bytes, %d multiprocessors\n\n| variant | us | TB/s |\n| --- | --- | --- |\n", bytes, sms());
  {
    const float us = median_us([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
    std::printf("| cudaMemcpy device to device | %.1f | %.3f |\n", us, traffic / us * 1e-6);
  }
  auto vec = [&](auto kern, int U, int per_sm, bool inplace) {
    const int grid = per_sm * sms();
    const float us = median_us([&] { kern<<<grid, 256>>>(reinterpret_cast<const float4*>(a), reinterpret_cast<float4*>(inplace ? a : b), n4); });
    std::printf("| float4 %s, %d loads in flight, %d x 256 threads/SM | %.1f | %.3f |\n", inplace ? "in place" : "a -> b", U,
                per_sm, us, traffic / us * 1e-6);
  };
  for (int per : {4, 8}) {
    vec(vec_pass<1>, 1, per, true);
    vec(vec_pass<2>, 2, per, true);
    vec(vec_pass<4>, 4, per, true);
    vec(vec_pass<4>, 4, per, false);
  }
  run_bulk<32768, 2>(a, bytes, traffic);
  run_bulk<32768, 3>(a, bytes, traffic);
  run_bulk<16384, 3>(a, bytes, traffic);
  run_bulk<16384, 4>(a, bytes, traffic);
  run_bulk<65536, 2>(a, bytes, traffic);
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 0;
}
