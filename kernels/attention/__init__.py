"""Attention kernels written with ``@tlx.jit``: prefill/training (dense forward and backward,
DeepSeek-V4 sparse attention) and decode. Each kernel module sits beside its CUDA baseline
(``*.cu``) and ``reference.py`` holds the torch fp32 references."""
