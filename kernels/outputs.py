"""Caller-given output buffers (``out=``) of the kernels' Python wrappers, checked before a launch."""


def check_out(out, what: str, expected, device) -> tuple:
    """``out`` as a tuple after checking that it is a pair (or n-tuple) named ``what`` (e.g. "an (ids,
    weights) pair") of contiguous tensors of ``expected`` [(dtype, shape), ...] on ``device``; every
    error names ``out[i]`` with the expected and the actual value."""
    if not isinstance(out, (tuple, list)) or len(out) != len(expected):
        raise ValueError(f"out: expected {what} of tensors, got {type(out).__name__}")
    for i, (v, (dtype, shape)) in enumerate(zip(out, expected)):
        if v.dtype != dtype or tuple(v.shape) != tuple(shape) or not v.is_contiguous() or v.device != device:
            raise ValueError(f"out[{i}]: expected a contiguous {dtype} tensor of shape {tuple(shape)} on {device}, got "
                             f"{v.dtype} of shape {tuple(v.shape)} on {v.device}")
    return tuple(out)
