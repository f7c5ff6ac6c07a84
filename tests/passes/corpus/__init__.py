"""The verifier's corpus: correct kernels (``correct.CORRECT``) and planted bugs (``bugs.BUGS``)."""

import functools


@functools.cache
def lowered(name):
    """The lowered kernel of corpus entry ``name``, built once per test session."""
    from tests.passes.corpus.bugs import BUGS
    from tests.passes.corpus.correct import CORRECT
    from tlx.lowering import lower

    entry = next(e for e in CORRECT + BUGS if e[0] == name)
    fn, params = entry[1], entry[2]
    return lower(fn.get_tir(**params), fn.options.target_dict(), fn.options.pass_config_dict())


def entry(name):
    from tests.passes.corpus.bugs import BUGS
    from tests.passes.corpus.correct import CORRECT

    return next(e for e in CORRECT + BUGS if e[0] == name)
