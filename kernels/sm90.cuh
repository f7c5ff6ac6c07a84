// Hopper (sm_90a) building blocks shared by the CUDA baselines of every kernel family: the
// 128-byte shared-memory swizzle, the wgmma matrix descriptor for it, and the e4m3 and bf16 wgmma tiles.
// Included by relative path ("../sm90.cuh"); build_baseline hashes it with the source.
#pragma once

#include <cstdint>

// Byte offset of (row, byte) in a tile of 128-byte rows with the 128-byte swizzle
// (16-byte chunk c of row r stored at chunk c ^ (r % 8)); the tile starts 1024-aligned.
__device__ __forceinline__ int swizzle128(int row, int byte) {
  return row * 128 + ((((byte >> 4) ^ (row & 7))) << 4) + (byte & 15);
}

// sm_90 shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle: start
// address, leading / stride byte offsets (all >> 4) and the layout type (1) in bits 62-63.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  uint64_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t(1) << 16;          // leading byte offset (unused for swizzled K-major)
  desc |= uint64_t(1024 >> 4) << 32;  // stride byte offset: 8 rows x 128 bytes
  desc |= uint64_t(1) << 62;          // 128-byte swizzle
  return desc;
}

// The 32 fp32 accumulator registers of one warpgroup's m64n64 wgmma tile, as asm operands
// %0..%31 (read and written: the tile accumulates onto them).
#define SM90_WGMMA_ACC32(d)                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),            \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define SM90_WGMMA_ACC32_LIST                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "              \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "

// d += A(64 x 32, e4m3) * B(64 x 32, e4m3)^T for one warpgroup, both operands in shared memory.
__device__ __forceinline__ void wgmma_m64n64k32(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " SM90_WGMMA_ACC32_LIST
      "%32, %33, p, 1, 1;\n"
      "}\n"
      : SM90_WGMMA_ACC32(d)
      : "l"(da), "l"(db), "r"(1));  // scale-d = 1: accumulate onto the registers
}

// d += A(64 x 16, bf16) * B(64 x 16, bf16)^T for one warpgroup, both operands K-major in shared memory.
__device__ __forceinline__ void wgmma_bf16_m64n64k16(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " SM90_WGMMA_ACC32_LIST
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : SM90_WGMMA_ACC32(d)
      : "l"(da), "l"(db), "r"(1));
}
