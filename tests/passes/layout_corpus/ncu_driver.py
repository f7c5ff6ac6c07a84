"""Launch one NCU_CASES kernel once on the GPU (run under ``ncu``): ``python ncu_driver.py NAME``."""

import sys

import tilelang
import torch

from tests.passes.layout_corpus.kernels import NCU_CASES

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def main(name: str) -> None:
    func, configs = NCU_CASES[name]()
    kernel = tilelang.compile(func, target={"kind": "cuda", "arch": "sm_90a"}, pass_configs=configs)
    args = []
    for param in func.params:
        buf = func.buffer_map[param]
        shape = [int(d) for d in buf.shape]
        args.append(torch.randn(shape, device="cuda").to(TORCH_DTYPES[str(buf.dtype)]))
    kernel(*args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
