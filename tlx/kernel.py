"""The compiled kernel object a user calls with torch tensors."""

from __future__ import annotations


class Kernel:
    def __init__(self, impl, options):
        self._impl = impl
        self.options = options

    def __call__(self, *args):
        return self._impl(*args)

    @property
    def device_source(self) -> str:
        return self._impl.get_kernel_source()

    @property
    def host_source(self) -> str:
        return self._impl.get_host_source()
