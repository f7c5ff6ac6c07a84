// How many thread-block clusters of 1, 2, 4 and 8 CTAs can be resident at once on this GPU, for a CTA
// of 384 threads (one producer and two consumer warpgroups, as the grouped GEMMs) at several dynamic
// shared-memory sizes. A persistent grid of C-CTA clusters larger than this count runs its late
// clusters after the first ones finish; with C = 4 that would explain the 2 x 2 tiles' slowdown
// (bench/RESULTS.md, MegaMoE). The CUDA runtime answers (cudaOccupancyMaxActiveClusters); nothing
// is launched.
//
//   nvcc -arch=sm_90a -o /tmp/cluster_occupancy bench/cluster_occupancy.cu && /tmp/cluster_occupancy
#include <cstdio>
#include <cuda_runtime.h>

__global__ void probe_kernel(int *out) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (out) out[blockIdx.x] = smem[0];
}

static int check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

int main() {
  cudaDeviceProp prop;
  if (check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
  std::printf("# %s, %d SMs, %zu B shared memory per SM, %zu B opt-in per block\n", prop.name,
              prop.multiProcessorCount, prop.sharedMemPerMultiprocessor, prop.sharedMemPerBlockOptin);
  const int threads = 384;
  const int smem_kib[] = {100, 160, 200, 227};
  const int clusters[] = {1, 2, 4, 8};
  std::printf("| dynamic smem (KiB) | cluster size | max active clusters | CTAs resident | SMs |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (int kib : smem_kib) {
    size_t bytes = static_cast<size_t>(kib) * 1024;
    if (bytes > prop.sharedMemPerBlockOptin) bytes = prop.sharedMemPerBlockOptin;
    if (check(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
              "cudaFuncSetAttribute"))
      return 1;
    for (int c : clusters) {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(prop.multiProcessorCount / c * c);
      config.blockDim = dim3(threads);
      config.dynamicSmemBytes = bytes;
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = c;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      config.attrs = &attr;
      config.numAttrs = 1;
      int active = 0;
      if (check(cudaOccupancyMaxActiveClusters(&active, probe_kernel, &config), "cudaOccupancyMaxActiveClusters"))
        return 1;
      std::printf("| %zu | %d | %d | %d | %d |\n", bytes / 1024, c, active, active * c, prop.multiProcessorCount);
    }
  }
  return 0;
}
