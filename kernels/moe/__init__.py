"""MoE building blocks: gating, routing metadata, permute/combine, FP8 grouped GEMM, pipeline."""
