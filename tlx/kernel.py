"""The compiled kernel a user calls with torch tensors."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["Kernel"]


class Kernel:
    """A kernel loaded from a tlx build directory (a disk-cache entry).

    ``kernel(*inputs)`` launches on the current torch stream; with ``out_idx`` the outputs
    are allocated here and returned, otherwise every argument is passed by the caller.
    ``kernel.launch`` is the generated launcher itself (a ``tvm_ffi.Function`` taking every
    argument): the lowest-overhead way to call.
    """

    def __init__(self, directory: Path, metadata: dict, launch):
        self.directory = directory
        self.metadata = metadata
        self.launch = launch
        self.name = metadata["name"]
        params = sorted(metadata["params"], key=lambda p: p["index"])
        self._num_params = len(params)
        self._outputs = [p for p in params if p.get("output")]
        if self._outputs:
            self._inputs = [p["index"] for p in params if not p.get("output")]
            self._dims = metadata["symbolic_dims"]
            self._index_of = {p["name"]: p["index"] for p in params}
            self._call = self._call_allocating
        else:
            self._call = launch

    @classmethod
    def load(cls, directory: Path) -> Kernel:
        import tvm_ffi

        metadata = json.loads((directory / "metadata.json").read_text())
        module = tvm_ffi.load_module(str(directory / "launcher.so"))
        return cls(directory, metadata, module["launch"])

    def __call__(self, *args):
        return self._call(*args)

    def _call_allocating(self, *inputs):
        import torch

        if len(inputs) != len(self._inputs):
            names = [p["name"] for p in sorted(self.metadata["params"], key=lambda p: p["index"]) if not p.get("output")]
            raise TypeError(f"{self.name}: expected {len(self._inputs)} inputs ({', '.join(names)}), got {len(inputs)}")
        full: list = [None] * self._num_params
        for i, value in zip(self._inputs, inputs):
            full[i] = value
        env = {}
        for var, where in self._dims.items():
            src = full[self._index_of[where["tensor"]]]
            if src is not None and hasattr(src, "shape"):
                env[var] = int(src.shape[where["dim"]])
        device = next((a.device for a in inputs if isinstance(a, torch.Tensor)), None)
        if device is None or len(env) < len(self._dims):
            self.launch(*full)  # an input is not a tensor: the launcher names it (outputs are still None)
            raise TypeError(f"{self.name}: the inputs do not determine the output shapes")
        outs = []
        for p in self._outputs:
            shape = [_eval_dim(d, env, self.name, p["name"]) for d in p["shape"]]
            t = torch.empty(shape, dtype=_torch_dtype(p["dtype"]), device=device)
            full[p["index"]] = t
            outs.append(t)
        self.launch(*full)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @property
    def device_source(self) -> str:
        return (self.directory / "kernel.cu").read_text()

    @property
    def host_source(self) -> str:
        return (self.directory / "launcher.cc").read_text()

    def __repr__(self) -> str:
        return f"<tlx.Kernel {self.name} ({self.directory.name})>"


def _eval_dim(text: str, env: dict, kernel: str, output: str) -> int:
    """An output extent: an integer, a symbolic dimension bound by an input, or an expression of them."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text in env:
        return env[text]
    import ast

    try:
        tree = ast.parse(text, mode="eval")
        return int(_eval_ast(tree.body, env))
    except (KeyError, ValueError, SyntaxError) as e:
        raise ValueError(f"{kernel}: cannot size output {output} from extent {text!r}: {e}") from None


def _eval_ast(node, env):
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _eval_ast(node.left, env), _eval_ast(node.right, env)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    raise ValueError(f"unsupported extent expression {ast.dump(node)}")


_TORCH_DTYPES = {
    "float8_e4m3": "float8_e4m3fn",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "float8_e8m0fnu": "float8_e8m0fnu",
}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES.get(name, name))
