"""The project's own kernels (``kernels/``) with representative parameters, for the verifier's corpus.

The kernels' owners still reshape their factories (a size becomes symbolic, a parameter
disappears), so each entry passes only the parameters its factory currently accepts.
"""

import inspect

from kernels.moe import gating, grouped_gemm, metadata, permute
from kernels.quant import block_cast, channel_cast, dequant, group_cast



def _accepted(fn, params: dict) -> dict:
    names = inspect.signature(fn.factory).parameters
    return {k: v for k, v in params.items() if k in names}


# (name, jit function, parameters, assumptions)
_TEAM = [
    ("moe.gating", gating.gating_kernel, {"n_experts": 256, "topk": 6}, ()),
    ("moe.grouped_gemm_contiguous", grouped_gemm.grouped_gemm_contiguous_kernel, {"n": 4096, "k": 2048}, ()),
    ("moe.grouped_gemm_masked", grouped_gemm.grouped_gemm_masked_kernel, {"n": 4096, "k": 2048}, ()),
    ("moe.metadata", metadata.metadata_kernel, {"topk": 6, "n_local": 32}, ()),
    ("moe.permute", permute.permute_kernel, {"hidden": 4096, "topk": 6}, ()),
    ("moe.permute_fp8", permute.permute_fp8_kernel, {"hidden": 4096, "topk": 6}, ()),
    ("moe.combine", permute.combine_kernel, {"hidden": 4096, "topk": 6}, ()),
    ("quant.block_cast", block_cast.block_cast_kernel, {"K": 4096, "block": 128, "in_dtype": "bfloat16"}, ()),
    ("quant.channel_cast", channel_cast.channel_cast_kernel, {"H": 4096, "in_dtype": "bfloat16"}, ()),
    ("quant.dequant", dequant.dequant_kernel, {"N": 4096, "in_fmt": "e4m3", "block_rows": 128, "block_cols": 128, "out_dtype": "bfloat16"}, ()),
    ("quant.group_cast", group_cast.group_cast_kernel, {"H": 4096, "group": 128, "in_mode": "plain", "in_dtype": "bfloat16"}, ()),
]

TEAM = [(name, fn, _accepted(fn, params), assume) for name, fn, params, assume in _TEAM]
