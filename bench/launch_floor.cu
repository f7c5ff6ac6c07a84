// The C++ launch floors: host time per launch of an empty kernel, in bursts of 200, median over
// bursts. Prints two numbers: the runtime's <<<>>> and the driver's cuLaunchKernelEx (what tlx's
// launchers call), both with one pointer argument.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void empty_kernel(float* x) {}

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t e = (call);                                                               \
    if (e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e));              \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

template <class F>
double median_per_call_us(F launch) {
  std::vector<double> per_call;
  for (int burst = 0; burst < 200; ++burst) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) launch();
    auto t1 = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

int main() {
  float* x;
  CHECK(cudaMalloc(&x, 1024));
  for (int i = 0; i < 1000; ++i) empty_kernel<<<1, 32>>>(x);
  CHECK(cudaDeviceSynchronize());
  double runtime_us = median_per_call_us([&] { empty_kernel<<<1, 32>>>(x); });
  CHECK(cudaGetLastError());

  cudaFunction_t fn;
  CHECK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(empty_kernel)));
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 32;
  cfg.blockDimY = cfg.blockDimZ = 1;
  void* params[] = {&x};
  CUresult bad = CUDA_SUCCESS;
  double driver_us = median_per_call_us([&] {
    CUresult r = cuLaunchKernelEx(&cfg, reinterpret_cast<CUfunction>(fn), params, nullptr);
    if (r != CUDA_SUCCESS) bad = r;
  });
  if (bad != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuLaunchKernelEx failed: %d\n", static_cast<int>(bad));
    return 1;
  }
  CHECK(cudaDeviceSynchronize());
  std::printf("%.4f %.4f\n", runtime_us, driver_us);
  return 0;
}
