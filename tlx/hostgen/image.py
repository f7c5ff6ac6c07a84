"""What the device image (cubin) tells the launch: each kernel's static shared memory, and
whether its launches fit the architecture's shared memory per block.

A launch may use at most the architecture's opt-in limit of shared memory per block, the
kernel's static ``__shared__`` data (TileLang's mbarriers, for instance) included. Past it the
driver refuses to raise the dynamic limit at the first launch; checked here, the compile fails
with the sizes instead.
"""

from __future__ import annotations

import struct

__all__ = ["SHARED_PER_BLOCK", "SharedMemoryError", "check_shared_memory", "static_shared_bytes"]

# Opt-in shared memory per block (bytes), by SM version (CUDA programming guide, compute
# capabilities table).
SHARED_PER_BLOCK = {"70": 98304, "75": 65536, "80": 166912, "86": 101376, "87": 166912, "89": 101376, "90": 232448,
                    "100": 232448, "103": 232448, "120": 101376}

_SHT_NOBITS = 8
_PREFIX = ".nv.shared."


class SharedMemoryError(ValueError):
    """A launch needs more shared memory per block than the target architecture has."""


def static_shared_bytes(image: bytes) -> dict[str, int]:
    """Static shared memory of each kernel in an ELF64 cubin (its ``.nv.shared.<kernel>``
    section; ``.nv.shared.reserved.*`` is the driver's, not the kernel's)."""
    if image[:4] != b"\x7fELF" or image[4] != 2:
        raise ValueError("image: expected an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return image[start:image.index(b"\0", start)].decode()

    sizes = {}
    for sh_name, sh_type, _, _, _, sh_size in headers:
        section = name(sh_name)
        if sh_type == _SHT_NOBITS and section.startswith(_PREFIX) and not section.startswith(_PREFIX + "reserved."):
            sizes[section[len(_PREFIX):]] = sh_size
    return sizes


def check_shared_memory(name: str, launches: list[dict], image: bytes, arch: str) -> None:
    """Add ``static_shared_memory`` to each launch and raise :class:`SharedMemoryError` where a
    launch of known size exceeds ``arch``'s limit (a size that depends on the arguments, or an
    architecture not in the table, is left to the driver)."""
    static = static_shared_bytes(image)
    limit = SHARED_PER_BLOCK.get(arch.removeprefix("sm_").rstrip("af"))
    for launch in launches:
        launch["static_shared_memory"] = static.get(launch["kernel"], 0)
        try:
            dynamic = int(launch["dynamic_shared_memory"])
        except (TypeError, ValueError):
            continue
        total = dynamic + launch["static_shared_memory"]
        if limit is not None and total > limit:
            raise SharedMemoryError(
                f"{name}: kernel {launch['kernel']} needs {total} bytes of shared memory per block ({dynamic} dynamic + "
                f"{launch['static_shared_memory']} static); {arch} allows at most {limit}")
