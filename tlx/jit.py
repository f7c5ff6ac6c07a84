"""``@tlx.jit``: the decorator kernel authors use in place of ``@tilelang.jit``.

The decorated function is a kernel factory: called with its parameters it returns a
``@T.prim_func``. ``@tlx.jit`` compiles each distinct parameter set once (in memory,
then on disk) and returns a callable :class:`tlx.kernel.Kernel`.
"""

from __future__ import annotations

import functools
import os
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from tlx.options import Options, freeze

__all__ = ["JITFunction", "Options", "compile", "jit", "param_key"]


def _tilelang_jit_impl():
    from tilelang.jit import JITImpl

    return JITImpl


class JITFunction(_tilelang_jit_impl()):
    """A kernel factory plus tlx options; calling it returns a compiled kernel.

    It is a TileLang ``JITImpl`` whose compile step is tlx's, so everything ``tilelang.jit``
    accepts works unchanged: lazy factories returning a ``@T.prim_func``, the eager style
    (``T.const``/``T.empty``, called with tensors: compiles, launches and returns the outputs),
    ``.compile``, ``get_tir``, ``par_compile``, ``get_kernel_source`` and
    ``@tilelang.autotune`` stacked on top (``@tlx.autotune`` is the same tuner without TileLang's
    source-keyed result cache, and pins its choice: see ``tlx.tuning``). Each returns or runs a
    :class:`tlx.kernel.Kernel`.
    """

    def __init__(self, factory: Callable, options: Options):
        frontend, mode = _frontend(factory)
        super().__init__(
            out_idx=list(options.out_idx) if options.out_idx else None,
            execution_backend=None,
            target=options.target_dict(),
            target_host=None,
            verbose=None,
            pass_configs=options.pass_config_dict() or None,
            debug_root_path=None,
            compile_flags=None,
            func_source="",
            signature=inspect.signature(factory),
            mode=mode,
            func=frontend,
        )
        self.factory = factory
        self.options = options
        self._kernels: dict[tuple, Any] = {}
        self._by_call: dict[tuple, Any] = {}  # raw (args, kwargs) -> kernel, for repeat calls
        self._source_hash: str | None = None
        functools.update_wrapper(self, factory)

    __hash__ = object.__hash__  # identity, as for any function (the dataclass base sets None)
    __eq__ = object.__eq__

    def _key(self, args, kwargs) -> tuple:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple((k, param_key(v)) for k, v in bound.arguments.items())

    def _fingerprint(self) -> str:
        """The factory's program: its code and everything it reaches (``tlx.fingerprint``), once per process."""
        if self._source_hash is None:
            from tlx.fingerprint import program_fingerprint

            self._source_hash = f"{self.factory.__module__}.{self.factory.__qualname__}:{program_fingerprint(self.factory)}"
        return self._source_hash

    def build_options(self, prim_func) -> Options:
        """The options a build of ``prim_func`` (from this factory) takes: the decorator's, with what
        the program itself declares (``program_options``). ``tlx check`` / ``host`` / ``device`` use
        them too, so that they analyse and print the kernel that is compiled."""
        return program_options(self.options, prim_func, self.pass_configs or {})

    def _label(self, args, kwargs) -> str:
        """The call as ``$TLX_BUILD_LOG`` names it: the factory and its arguments (tensors by type)."""
        shown = [repr(a) if _keyable(a) else type(a).__name__ for a in args]
        shown += [f"{k}={v!r}" if _keyable(v) else f"{k}={type(v).__name__}" for k, v in kwargs.items()]
        return f"{self.factory.__name__}({', '.join(shown)})"

    def compile(self, *args, **kwargs):
        """Build (or load from the disk cache) the kernel for these arguments; like
        ``tilelang.jit(...).compile`` but returns a :class:`tlx.kernel.Kernel`.

        A lazy factory with plain arguments is keyed by its fingerprint and arguments, so a hit
        in a fresh process never builds the TIR; otherwise (eager style, tensors among the
        arguments, pass configs set by an autotuner) the key is the TIR text itself.
        """
        from tlx.compiler import compile_kernel

        self.initialize_jit_mode(*args, **kwargs)
        options = self.options if (self.pass_configs or None) == (self.options.pass_config_dict() or None) else None
        if self.mode == "lazy" and options is not None and not self.debug_root_path and all(_keyable(v) for v in (*args, *kwargs.values())):
            program_key = self._fingerprint() + repr(self._key(args, kwargs))
            return compile_kernel(lambda: self._tir_and_options(args, kwargs), options, name=self.factory.__name__,
                                  program_key=program_key, label=self._label(args, kwargs))
        prim_func, options = self._tir_and_options(args, kwargs)
        kernel = compile_kernel(prim_func, options, name=self.factory.__name__, label=self._label(args, kwargs))
        kernel.prim_func = prim_func
        if self.debug_root_path:
            os.makedirs(self.debug_root_path, exist_ok=True)
            with open(os.path.join(self.debug_root_path, f"tilelang_jit_kernel_{self.factory.__name__}.c"), "w") as f:
                f.write(kernel.get_kernel_source())
            with open(os.path.join(self.debug_root_path, f"tilelang_jit_program_{self.factory.__name__}.py"), "w") as f:
                f.write(prim_func.script())
        return kernel

    def par_compile(self, configs, num_workers: int | None = None, ignore_error: bool = False) -> list:
        """Compile each configuration (a dict of keyword arguments or a tuple of positional ones),
        like ``tilelang.jit(...).par_compile``. One at a time: tlx's analyses share one Z3
        context, which is not thread-safe (``num_workers`` is accepted for compatibility).
        With ``ignore_error`` a failed configuration gives ``None`` and a warning."""
        import warnings

        kernels = []
        for cfg in configs:
            if not isinstance(cfg, (tuple, dict)):
                raise ValueError(f"par_compile: expected a tuple or dict per configuration, got {type(cfg).__name__}")
            try:
                kernels.append(self.compile(*cfg) if isinstance(cfg, tuple) else self.compile(**cfg))
            except Exception as e:
                if not ignore_error:
                    raise
                warnings.warn(f"{self.factory.__name__}: configuration {cfg!r} failed: {e}", RuntimeWarning, stacklevel=2)
                kernels.append(None)
        return kernels

    def _tir_and_options(self, args, kwargs):
        prim_func = self.get_tir(*args, **kwargs)
        return prim_func, self.build_options(prim_func)

    def __call__(self, *args, **kwargs):
        # Hot path: a repeat lazy call with plain values (ints, strings, ...) is one dict lookup,
        # no signature binding; other arguments (symbolic dims, lists) take the general path.
        call = (args, tuple(sorted(kwargs.items()))) if kwargs else (args, ())
        plain = all(type(v) in _PLAIN for v in args) and all(type(v) in _PLAIN for v in kwargs.values())
        kernel = self._by_call.get(call) if plain else None
        if kernel is not None:
            return kernel
        if "__tune_params" in kwargs or "__return_compile_arguments" in kwargs or self.initialize_jit_mode(*args, **kwargs) == "eager":
            return super().__call__(*args, **kwargs)  # TileLang's own call: parse tensors, compile, launch
        key = self._key(args, kwargs)
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self.compile(*args, **kwargs)
        if plain:
            self._by_call[call] = kernel
        return kernel


class _LazyFactory:
    """The front end for a factory whose source TileLang cannot read (``python -c``, stdin,
    ``exec`` without ``linecache``): it can only be lazy, calling the factory for its
    ``@T.prim_func`` (itself defined where source exists)."""

    tensor_args: dict = {}

    def __init__(self, factory: Callable):
        self.orig_func = factory

    def __call__(self, *args, **kwargs):
        return self.orig_func(*args, **kwargs)

    def set_mode(self, mode: str) -> None:
        if mode != "lazy":
            raise ValueError(f"{self.orig_func.__qualname__}: the eager style needs the function's source, which Python cannot find")

    def parse_args(self, *args, **kwargs):
        return (args, tuple(sorted(kwargs.items()))), {}


def _frontend(factory: Callable):
    """TileLang's front end for ``factory`` (it reads the source to tell lazy from eager),
    or the lazy-only stand-in where there is no source to read."""
    from tilelang.language.eager import prim_func

    try:
        return prim_func(factory, eager_jit=True), "auto"
    except (OSError, TypeError):
        return _LazyFactory(factory), "lazy"


def program_options(options: Options, prim_func, pass_configs: dict) -> Options:
    """One compile's options: the decorator's, with what the program itself declares
    (``T.empty`` outputs, function-level pass configs and flags), merged as ``tilelang.compile``
    does; ``pass_configs`` (the decorator's, or an autotuner's) win over the program's."""
    import dataclasses

    attrs = prim_func.attrs or {}
    out_idx = options.out_idx
    if "tilelang_out_idx" in attrs:
        if out_idx:
            raise ValueError("out_idx: the decorator names outputs and the program returns T.empty tensors; use one")
        out_idx = tuple(int(i) for i in attrs["tilelang_out_idx"])
    merged = {str(k): v for k, v in attrs["tilelang_pass_configs"].items()} if "tilelang_pass_configs" in attrs else {}
    merged.update(pass_configs)
    if "tilelang_compile_flags" in attrs:
        merged = _with_compile_flags(merged, [str(f) for f in attrs["tilelang_compile_flags"]])
    return dataclasses.replace(options, out_idx=out_idx, pass_configs=_freeze_configs(merged))


def compile(func, out_idx=None, target=None, pass_configs: dict | None = None, compile_flags=None, **options: Any):
    """``tilelang.compile`` through tlx: a ``PrimFunc`` in, a :class:`tlx.kernel.Kernel` out.
    Takes ``tilelang.compile``'s arguments (``execution_backend``, ``target_host`` and
    ``verbose`` are ignored, as by :func:`jit`) and tlx's options."""
    from tlx.compiler import compile_kernel

    opts = jit_options(dict(options, out_idx=out_idx, target=target, pass_configs=pass_configs), compile_flags)
    return compile_kernel(func, program_options(opts, func, opts.pass_config_dict()))


def _keyable(v) -> bool:
    """An argument that ``param_key`` identifies by value (not a tensor or other object)."""
    if isinstance(v, (list, tuple)):
        return all(_keyable(x) for x in v)
    if isinstance(v, dict):
        return all(_keyable(x) for x in v.values())
    key = param_key(v)
    return not isinstance(key, str) or isinstance(v, str)


def _freeze_configs(pass_configs: dict) -> tuple:
    return tuple(sorted((k, freeze(v)) for k, v in pass_configs.items()))


_PLAIN = (int, float, str, bool, type(None))


def param_key(v):
    """A hashable, printable stand-in for one factory argument (symbolic dims by name)."""
    try:
        from tilelang import tvm

        if isinstance(v, tvm.tirx.Var):
            return ("var", v.name, str(v.dtype))
    except Exception:
        pass
    if isinstance(v, (list, tuple)):
        return tuple(param_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, param_key(x)) for k, x in v.items()))
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


# tilelang.jit options with no meaning for tlx: its own launcher replaces TileLang's execution
# backends (and their host target), and it logs nothing extra. Accepted so code runs unchanged.
_IGNORED_TILELANG_OPTIONS = ("execution_backend", "target_host", "verbose")


def jit(fn: Callable | None = None, *, compile_flags: str | Sequence[str] | None = None, debug_root_path: str | None = None, **options: Any):
    """Decorate a TileLang kernel factory; accepts ``tilelang.jit``'s options plus tlx's.

    TileLang's: ``out_idx``, ``target`` (a dict, ``"sm_90a"``, ``"cuda"``/``"auto"`` for the
    current GPU), ``pass_configs``, ``compile_flags`` (appended to ``tl.device_compile_flags``
    as TileLang does), ``debug_root_path`` (the CUDA source of each compile is written there);
    ``execution_backend``, ``target_host`` and ``verbose`` are accepted and ignored.
    tlx options: ``verify`` ("error" | "warn" | "off"), ``assume`` (conditions on shape
    variables, e.g. ``"M % 128 == 0"``), ``numerics`` ("default" | "strict"),
    ``eliminate_guards``, ``allow_approx`` (approximate intrinsics allowed in strict mode),
    ``pin`` (a pin file re-applied at compile time).
    """
    opts = jit_options(options, compile_flags)

    def decorate(f: Callable) -> JITFunction:
        jf = JITFunction(f, opts)
        jf.debug_root_path = debug_root_path
        return jf

    return decorate if fn is None else decorate(fn)


def jit_options(options: dict, compile_flags) -> Options:
    """``Options`` from ``tilelang.jit``/``tilelang.compile`` keywords plus tlx's."""
    options = {k: v for k, v in options.items() if k not in _IGNORED_TILELANG_OPTIONS}
    pass_configs = {str(getattr(k, "value", k)): v for k, v in (options.pop("pass_configs", None) or {}).items()}
    if compile_flags:
        pass_configs = _with_compile_flags(pass_configs, compile_flags)
    return Options.make(pass_configs=pass_configs, **options)


def _with_compile_flags(pass_configs: dict, compile_flags) -> dict:
    """``compile_flags`` appended to ``tl.device_compile_flags``, as ``tilelang.jit`` does."""
    from tlx.numerics.modes import DEVICE_FLAGS_CONFIG

    current = pass_configs.get(DEVICE_FLAGS_CONFIG) or []
    current = [current] if isinstance(current, str) else list(current)
    added = [compile_flags] if isinstance(compile_flags, str) else list(compile_flags)
    return {**pass_configs, DEVICE_FLAGS_CONFIG: [*current, *added]}
