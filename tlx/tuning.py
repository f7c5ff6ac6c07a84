"""``tlx.autotune``: TileLang's autotuner over ``@tlx.jit`` kernels, with the choice pinned.

``@tilelang.autotune`` stacks on ``@tlx.jit`` as it is (a ``JITFunction`` is a TileLang
``JITImpl``). ``@tlx.autotune`` takes the same arguments plus ``pin=PATH`` and differs in two
ways:

- TileLang's on-disk autotune cache is not used: it is keyed on the function's source, so it
  would hand back a kernel TileLang compiled for the same source; tlx's own disk cache already
  keeps every candidate's build.
- With ``pin``, the chosen configuration is recorded in the pin file under ``"autotune"``
  (one entry per call signature). A later call with a recorded entry compiles that
  configuration directly, without tuning, so a rebuild elsewhere gives the same kernel and the
  same bits. Delete the entry (or the file) to tune again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilelang.autotuner.tuner import AutoTuneImpl

from tlx.jit import JITFunction, param_key

__all__ = ["AutoTune", "autotune"]

_RESERVED = ("pass_configs",)  # a config key TileLang's autotuner reads, not a kernel argument


@dataclass
class AutoTune(AutoTuneImpl):
    pin: str | None = None

    def get_tunner(self):
        tuner = super().get_tunner()
        tuner.generate_cache_key = lambda *_: None  # no TileLang result cache (see the module doc)
        return tuner

    def __call__(self, *args, **kwargs):
        return_kernel = kwargs.pop("__return_kernel", False)
        key = call_key(self.jit_impl, args, kwargs)
        chosen = read_choice(self.pin, key) if self.pin else None
        if chosen is not None:
            return self._run_config(chosen, args, kwargs, return_kernel)
        before = set(self._tuner_cache)
        result = super().__call__(*args, **kwargs, __return_kernel=return_kernel)
        if self.pin:
            new = [k for k in self._tuner_cache if k not in before]
            if new:
                kernel, config = self._tuner_cache[new[0]]
                record_choice(self.pin, key, config, kernel)
        return result

    def _run_config(self, config: dict, args: tuple, kwargs: dict, return_kernel: bool):
        """Compile (and in eager mode run) the pinned configuration, as the tuner would have."""
        jit = self.jit_impl
        mode = jit.initialize_jit_mode(*args, **kwargs)
        merged = {**kwargs, **{k: v for k, v in config.items() if k not in _RESERVED}}
        saved = jit.pass_configs
        if config.get("pass_configs"):
            jit.pass_configs = {**(saved or {}), **config["pass_configs"]}
        try:
            kernel = jit.compile(*args, **merged)
        finally:
            jit.pass_configs = saved
        kernel.config = config
        if mode == "lazy" or return_kernel:
            return kernel
        _, kernel_args = jit.func.parse_args(*args, **merged)
        return kernel(*kernel_args.values())


def call_key(jit: JITFunction, args: tuple, kwargs: dict) -> str:
    """One call signature as text: the bound arguments by name, tensors by dtype and shape.

    A keyword that names no parameter is a ``T.const`` value given at the call
    (``kernel.compile(M=1024, ...)``), which TileLang's binder accepts too: it is keyed under
    ``"T.const"`` by name, apart from the parameters, so it can never shadow one.
    """
    params = jit.signature.parameters
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    consts = {} if takes_any_keyword else {k: v for k, v in kwargs.items() if k not in params}
    named = {k: v for k, v in kwargs.items() if k not in consts}
    bound = jit.signature.bind_partial(*args, **named)
    key = {k: _describe(v) for k, v in bound.arguments.items()}
    if consts:
        key["T.const"] = {k: _describe(v) for k, v in consts.items()}
    return json.dumps(key, sort_keys=True, default=str)


def _describe(v: Any):
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(v, (int, float, str)):
        return {"tensor": [int(d) for d in shape], "dtype": str(dtype)}
    return param_key(v)


def read_choice(path: str, key: str) -> dict | None:
    p = Path(path)
    if not p.is_file():
        return None
    entry = json.loads(p.read_text()).get("autotune", {}).get(key)
    return None if entry is None else entry["config"]


def record_choice(path: str, key: str, config: dict, kernel) -> None:
    """Add (or replace) one call signature's chosen configuration in the pin file, atomically."""
    import tilelang

    from tlx.numerics.pin import PIN_VERSION

    p = Path(path)
    data = json.loads(p.read_text()) if p.is_file() else {"version": PIN_VERSION}
    data.setdefault("autotune", {})[key] = {
        "config": config,
        "kernel": getattr(kernel, "name", None),
        "latency_ms": getattr(kernel, "latency", None),
        "tilelang": tilelang.__version__,
    }
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, p)


def autotune(func: Callable | None = None, *, configs, pin: str | None = None, **tuning: Any):
    """``tilelang.autotune`` for ``@tlx.jit`` functions (same arguments), plus ``pin``: the
    file where the chosen configuration is recorded and from which it is re-applied."""
    if func is not None:
        raise ValueError("tlx.autotune: use it with arguments, @tlx.autotune(configs=...), above @tlx.jit")

    def decorator(impl):
        if not isinstance(impl, JITFunction):
            raise TypeError(f"tlx.autotune: expected a @tlx.jit function, got {type(impl).__name__}")
        return AutoTune(jit_impl=impl, configs=configs, pin=None if pin is None else str(pin), **tuning)

    return decorator
