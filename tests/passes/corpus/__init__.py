"""The verifier's corpus: correct kernels (``correct.CORRECT``) and planted bugs (``bugs.BUGS``)."""

import functools


def lower_jit(fn, **params):
    """The lowered kernel of ``@tlx.jit`` function ``fn`` built with ``params``, under its own
    target and pass configs."""
    from tlx.lowering import lower

    return lower(fn.get_tir(**params), fn.options.target_dict(), fn.options.pass_config_dict())


@functools.cache
def lowered(name):
    """The lowered kernel of corpus entry ``name``, built once per test session."""
    _, fn, params = entry(name)[:3]
    return lower_jit(fn, **params)


def entry(name):
    from tests.passes.corpus.bugs import BUGS
    from tests.passes.corpus.correct import CORRECT

    return next(e for e in CORRECT + BUGS if e[0] == name)
