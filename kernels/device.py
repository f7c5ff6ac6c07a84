"""Facts of a CUDA device that kernel wrappers read on every call, looked up once per device."""

import functools


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """The SM count of CUDA device ``device_index`` (torch's property lookup each call costs
    microseconds on a wrapper's host path)."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count
