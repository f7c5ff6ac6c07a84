"""The identity of a kernel factory's program, for the disk-cache key, without building its TIR.

A factory's generated code depends on more than its own file: the helpers and ``@T.macro``
functions its nested ``@T.prim_func`` calls, closures, and constants imported from other
modules. :func:`program_fingerprint` walks the factory's code object recursively (nested code
objects included), and every global, closure cell, default and module attribute any of them
names, hashing bytecode, constants and plain values. It reads no file, so it works the same for
a factory defined in a module, ``python -c``, stdin, ``exec`` or a notebook cell.

Code from installed packages (TileLang, torch, tlx itself) is named, not walked: the cache key
already holds their versions.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
import types

__all__ = ["program_fingerprint"]

_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_INSTALLED = tuple({p for p in (sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"), sysconfig.get_paths().get("stdlib")) if p})
_TLX_ROOT = __file__.rsplit("/", 1)[0] + "/"


def program_fingerprint(fn) -> str:
    """A hex digest of everything ``fn``'s generated code can depend on (see the module doc)."""
    walker = _Walker()
    walker.function(fn)
    return walker.digest.hexdigest()


def _installed(filename: str) -> bool:
    return filename.startswith(_INSTALLED) or filename.startswith(_TLX_ROOT) or "site-packages" in filename or "dist-packages" in filename


class _Walker:
    def __init__(self):
        self.digest = hashlib.sha256(sys.version.split()[0].encode())  # bytecode differs across Pythons
        self.seen: set = set()

    def put(self, *parts) -> None:
        for part in parts:
            self.digest.update(repr(part).encode())
            self.digest.update(b"\x00")

    def function(self, fn) -> None:
        fn = _unwrap(fn)
        if id(fn) in self.seen:
            self.put("seen", getattr(fn, "__qualname__", ""))
            return
        self.seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is None or _installed(code.co_filename):
            self.put("named", getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(type(fn))))
            return
        self.put("fn", fn.__qualname__)
        self.value(fn.__defaults__)
        self.value(fn.__kwdefaults__)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell (a name not bound yet)
                contents = None
            self.put("free", name)
            self.value(contents)
        self.code(code, fn.__globals__)

    def code(self, code: types.CodeType, globals_: dict) -> None:
        self.put("code", code.co_code, code.co_names, code.co_varnames, code.co_freevars)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const, globals_)  # nested functions: the @T.prim_func, helpers, lambdas
            else:
                self.value(const)
        for name in code.co_names:
            if name in globals_:
                self.put("global", name)
                self.value(globals_[name], attrs=code.co_names)

    def value(self, v, attrs: tuple[str, ...] = ()) -> None:
        if isinstance(v, _PLAIN):
            self.put(v)
        elif isinstance(v, (tuple, list, frozenset, set)):
            self.put(type(v).__name__, len(v))
            for x in sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v:
                self.value(x)
        elif isinstance(v, dict):
            self.put("dict", len(v))
            for k in sorted(v, key=repr):
                self.put(k)
                self.value(v[k])
        elif isinstance(v, types.ModuleType):
            self.module(v, attrs)
        elif isinstance(v, type):
            self.put("type", v.__module__, v.__qualname__)
            if id(v) not in self.seen and not _installed(getattr(sys.modules.get(v.__module__), "__file__", None) or ""):
                self.seen.add(id(v))
                for k, x in sorted(vars(v).items()):
                    if isinstance(x, (types.FunctionType, staticmethod, classmethod, property, *_PLAIN)):
                        self.put(k)
                        self.value(getattr(x, "__func__", getattr(x, "fget", x)))
        elif _unwrap(v) is not v or hasattr(v, "__code__"):
            self.function(v)
        elif isinstance(v, types.BuiltinFunctionType):
            self.put("builtin", v.__module__, v.__qualname__)
        elif _user_instance(v):
            # An instance of a class of the user's (a config object, say): its attributes.
            self.put("instance")
            self.value(type(v))
            if id(v) not in self.seen:
                self.seen.add(id(v))
                self.value(vars(v))
        else:
            # Other objects (dtypes, tensors, enums, TVM nodes): their type and printed form.
            self.put("object", type(v).__module__, type(v).__qualname__, _printed(v))

    def module(self, mod: types.ModuleType, attrs: tuple[str, ...]) -> None:
        """A module is reached through attributes (``helpers.scale``): hash the ones the code
        names; an installed module is named only."""
        self.put("module", mod.__name__)
        if _installed(getattr(mod, "__file__", None) or ""):
            return
        for name in attrs:
            if name in vars(mod) and (id(mod), name) not in self.seen:
                self.seen.add((id(mod), name))
                self.put("attr", name)
                self.value(vars(mod)[name])


def _user_instance(v) -> bool:
    """An object with attributes whose class is the user's (defined in ``__main__``, a cell or a
    file outside the installed packages), not a builtin or library type."""
    name = type(v).__module__
    if name == "builtins" or not hasattr(v, "__dict__"):
        return False
    return not _installed(getattr(sys.modules.get(name), "__file__", None) or "")


def _unwrap(fn):
    """The Python function behind a tlx ``JITFunction``, a TileLang ``JITImpl``/``JITFunc``,
    ``T.macro`` or module-level ``@T.prim_func`` (each keeps it as an attribute)."""
    for _ in range(4):
        inner = getattr(fn, "factory", None) or getattr(fn, "orig_func", None) or getattr(getattr(fn, "func", None), "orig_func", None)
        if inner is None or inner is fn:
            break
        fn = inner
    return fn


def _printed(v) -> str:
    """repr without memory addresses (which differ across processes)."""
    import re

    return re.sub(r" at 0x[0-9a-f]+", "", repr(v))
