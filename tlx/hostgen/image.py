"""What the device image (cubin) tells the launch: each kernel's static shared memory, and
whether its launches fit the architecture's shared memory per block.

A launch may use at most the architecture's opt-in limit of shared memory per block, the
kernel's static ``__shared__`` data (TileLang's mbarriers, for instance) included. Past it the
driver refuses to raise the dynamic limit at the first launch; checked here, the compile fails
with the sizes instead.

The opt-in limit does not count the 1 KiB the driver reserves per block
(``cudaDevAttrReservedSharedMemoryPerBlock``). Images for sm_90 and newer lay that block out at
the start of each kernel's shared window, inside its ``.nv.shared.<kernel>`` section (the
kernel's own data starts at 0x400; cuobjdump's ``SHARED`` counts it too), and mark this with a
``.nv.shared.reserved.*`` section; older images leave it out. Counting the section whole
refused kernels the driver launches (TileLang's MLA decode: 231424 dynamic bytes behind a 2048-byte
section fill the 232448-byte sm_90 limit exactly).
"""

from __future__ import annotations

import struct

__all__ = ["RESERVED_SHARED_PER_BLOCK", "SHARED_PER_BLOCK", "SharedMemoryError", "check_shared_memory", "static_shared_bytes"]

# Opt-in shared memory per block (bytes), by SM version (CUDA programming guide, compute
# capabilities table).
SHARED_PER_BLOCK = {"70": 98304, "75": 65536, "80": 166912, "86": 101376, "87": 166912, "89": 101376, "90": 232448,
                    "100": 232448, "103": 232448, "120": 101376}

# Shared memory the driver reserves per block from sm_80 on (CUDA programming guide).
RESERVED_SHARED_PER_BLOCK = 1024

_SHT_NOBITS = 8
_PREFIX = ".nv.shared."
_RESERVED_PREFIX = _PREFIX + "reserved."


class SharedMemoryError(ValueError):
    """A launch needs more shared memory per block than the target architecture has."""


def static_shared_bytes(image: bytes) -> dict[str, int]:
    """Static shared memory of each kernel in an ELF64 cubin, as the opt-in limit counts it: its
    ``.nv.shared.<kernel>`` section, less the driver's reserved block where the image lays that
    block out inside the section (see the module's docstring)."""
    if image[:4] != b"\x7fELF" or image[4] != 2:
        raise ValueError("image: expected an ELF64 cubin")
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return image[start:image.index(b"\0", start)].decode()

    sections = {name(sh_name): sh_size for sh_name, sh_type, _, _, _, sh_size in headers if sh_type == _SHT_NOBITS}
    reserved = RESERVED_SHARED_PER_BLOCK if any(s.startswith(_RESERVED_PREFIX) for s in sections) else 0
    sizes = {}
    for section, size in sections.items():
        if section.startswith(_PREFIX) and not section.startswith(_RESERVED_PREFIX):
            if size < reserved:
                raise ValueError(f"image: section {section} holds {size} bytes, less than the {reserved} bytes the driver "
                                 "reserves at the start of every kernel's shared memory in this image")
            sizes[section[len(_PREFIX):]] = size - reserved
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
