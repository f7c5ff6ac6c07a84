"""``@tlx.jit``: the decorator kernel authors use in place of ``@tilelang.jit``.

The decorated function is a kernel factory: called with its parameters it returns a
``@T.prim_func``. ``@tlx.jit`` compiles each distinct parameter set once (in memory,
then on disk) and returns a callable :class:`tlx.kernel.Kernel`.
"""

from __future__ import annotations

import functools
import os
import inspect
from collections.abc import Callable
from typing import Any

from tlx.options import Options

__all__ = ["JITFunction", "jit"]

class JITFunction:
    """A kernel factory plus tlx options; calling it returns a compiled kernel."""

    def __init__(self, factory: Callable, options: Options):
        self.factory = factory
        self.options = options
        self._signature = inspect.signature(factory)
        self._kernels: dict[tuple, Any] = {}
        self._by_call: dict[tuple, Any] = {}  # raw (args, kwargs) -> kernel, for repeat calls
        self._source_hash: str | None = None
        functools.update_wrapper(self, factory)

    def _key(self, args, kwargs) -> tuple:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple((k, _param_key(v)) for k, v in bound.arguments.items())

    def _fingerprint(self) -> str:
        """The factory's source files, and those of user code it refers to, hashed (cached per process).

        Installed packages (TileLang, torch, tlx itself) are covered by the versions in the
        cache key, so only files outside site-packages are read.
        """
        if self._source_hash is None:
            import hashlib
            import sys
            import types

            files = {inspect.getsourcefile(self.factory)}
            for name in self.factory.__code__.co_names:
                obj = self.factory.__globals__.get(name)
                if isinstance(obj, (types.FunctionType, type, types.ModuleType, JITFunction)):
                    try:
                        files.add(inspect.getsourcefile(getattr(obj, "factory", obj)))
                    except TypeError:
                        pass
            prefixes = tuple(p for p in sys.path if "site-packages" in p or "dist-packages" in p)
            h = hashlib.sha256()
            for f in sorted(f for f in files if f and not f.startswith(prefixes)):
                h.update(os.path.basename(f).encode())  # not the directory: a checkout elsewhere hits the same entry
                with open(f, "rb") as fh:
                    h.update(fh.read())
            self._source_hash = f"{self.factory.__module__}.{self.factory.__qualname__}:{h.hexdigest()}"
        return self._source_hash

    def get_tir(self, *args, **kwargs):
        """The ``@T.prim_func`` the factory builds for these parameters."""
        return self.factory(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        # Hot path: a repeat call with plain values (ints, strings, ...) is one dict lookup, no
        # signature binding; other arguments (symbolic dims, lists) take the general path.
        call = (args, tuple(sorted(kwargs.items()))) if kwargs else (args, ())
        plain = all(type(v) in _PLAIN for v in args) and all(type(v) in _PLAIN for v in kwargs.values())
        kernel = self._by_call.get(call) if plain else None
        if kernel is not None:
            return kernel
        key = self._key(args, kwargs)
        kernel = self._kernels.get(key)
        if kernel is None:
            from tlx.compiler import compile_kernel

            kernel = compile_kernel(
                lambda: self.get_tir(*args, **kwargs),
                self.options,
                name=self.factory.__name__,
                program_key=self._fingerprint() + repr(key),
            )
            self._kernels[key] = kernel
        if plain:
            self._by_call[call] = kernel
        return kernel


_PLAIN = (int, float, str, bool, type(None))


def _param_key(v):
    """A hashable, printable stand-in for one factory argument (symbolic dims by name)."""
    try:
        from tilelang import tvm

        if isinstance(v, tvm.tirx.Var):
            return ("var", v.name, str(v.dtype))
    except Exception:
        pass
    if isinstance(v, (list, tuple)):
        return tuple(_param_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _param_key(x)) for k, x in v.items()))
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


def jit(fn: Callable | None = None, **options: Any):
    """Decorate a TileLang kernel factory; accepts ``tilelang.jit``'s options plus tlx's.

    tlx options: ``verify`` ("error" | "warn" | "off"), ``assume`` (conditions on shape
    variables, e.g. ``"M % 128 == 0"``), ``numerics`` ("default" | "strict"),
    ``eliminate_guards``, ``allow_approx`` (approximate intrinsics allowed in strict mode),
    ``pin`` (a pin file re-applied at compile time).
    """
    opts = Options.make(**options)
    if fn is None:
        return lambda f: JITFunction(f, opts)
    return JITFunction(fn, opts)
