"""CPU check: the launch preconditions the bounds verifier derives for the block, channel and
dequant kernels admit every realistic size. A possible overflow the verifier cannot rule out
becomes a precondition on the dynamic dim; one that is really data-dependent (uint32 bit
arithmetic on a scale) once collapsed to ``N <= 127``, which the launcher then enforced.
"""

import re

import pytest

from kernels.quant.block_cast import block_cast_kernel
from kernels.quant.channel_cast import channel_cast_kernel
from kernels.quant.dequant import dequant_kernel

ROWS = 1 << 20  # rows (or 16-token groups) every kernel must accept

CASES = [
    (block_cast_kernel, (7168, 128, "e2m1", True)),
    (block_cast_kernel, (7168, 32, "e2m1", True)),
    (block_cast_kernel, (2048, 128, "float32", True)),
    (block_cast_kernel, (7168, 128, "bfloat16", False)),
    (channel_cast_kernel, (7168, "bfloat16", False)),
    (channel_cast_kernel, (7168, "float32", True)),
    (dequant_kernel, (7168, "e2m1", 1, 32, "bfloat16")),
    (dequant_kernel, (7168, "e4m3", 128, 128, "float32")),
]


@pytest.mark.parametrize("factory, args", CASES, ids=[f"{f.__name__}{a}" for f, a in CASES])
def test_preconditions_admit_model_sizes(factory, args):
    for pre in factory(*args).metadata["preconditions"]:
        m = re.fullmatch(r"(\w+) <= (\d+)", pre["text"])
        assert m, f"unexpected precondition {pre['text']!r}"
        assert int(m.group(2)) >= ROWS, f"{pre['text']}: rejects realistic sizes"
