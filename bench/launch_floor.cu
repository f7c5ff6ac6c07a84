// The C++ launch floor: host time per <<<>>> launch of an empty kernel, in bursts of 200.
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

int main() {
  float* x;
  CHECK(cudaMalloc(&x, 1024));
  for (int i = 0; i < 1000; ++i) empty_kernel<<<1, 32>>>(x);
  CHECK(cudaDeviceSynchronize());
  std::vector<double> per_call;
  for (int burst = 0; burst < 200; ++burst) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) empty_kernel<<<1, 32>>>(x);
    auto t1 = std::chrono::steady_clock::now();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
  }
  std::sort(per_call.begin(), per_call.end());
  std::printf("%.4f\n", per_call[per_call.size() / 2]);
  return 0;
}
