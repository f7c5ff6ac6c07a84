"""Quantization kernels of a DeepSeek-V4-class model, written with ``@tlx.jit``.

Each module holds the TileLang kernel factory and its Python wrapper; the CUDA baseline of the
same name sits beside it (``*.cu``) and ``reference.py`` states the rounding rules in torch.

- ``group_cast``: per-token-group FP8 cast, fused SwiGLU + cast, MXFP4 cast, FP4 -> FP8 re-blocking
- ``block_cast``: per-block (128x128 / 32x32) FP8 cast of weights
- ``dequant``: e4m3 / e2m1 plus scales -> bf16 / fp32
- ``channel_cast``: per-channel cast with transpose (128 tokens per scale)
"""
