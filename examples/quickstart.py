"""Quickstart: compile a shipped tlx kernel, show its generated launcher, run it when a GPU is present.

The kernel is the per-token-group FP8 cast of ``kernels/quant`` (bf16 ``[T, H]`` -> e4m3 plus
one fp32 scale per 1x128 group), compiled for Hopper (sm_90a). Without a GPU the compile,
the bounds proof and the launcher build still run; the launch is skipped.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels.quant import group_cast  # noqa: E402
from kernels.quant.reference import per_token_group_cast as reference  # noqa: E402
from tlx.numerics.parity import assert_bitwise  # noqa: E402

H = 7168
kernel = group_cast.group_cast_kernel(H, 128, "plain", "bfloat16")  # compiles once, then loads from the disk cache
print("=== generated host launcher (C++, TVM-FFI C ABI) ===")
print(kernel.host_source)
print("=== launch metadata ===")
for launch in kernel.metadata["launches"]:
    print(f"{launch['kernel']}: grid {launch['grid']}, block {launch['block']}, shared memory {launch['dynamic_shared_memory']} "
          f"dynamic + {launch['static_shared_memory']} static bytes")
print("shape preconditions checked on every call:", [p["text"] for p in kernel.metadata.get("preconditions", [])] or "none")
bounds = kernel.metadata.get("reports", {}).get("bounds")
if bounds:
    print(f"bounds: {bounds.get('proven')}/{bounds.get('accesses')} accesses proven in bounds")

if not torch.cuda.is_available():
    print("no GPU visible: compiled and built, not run")
    sys.exit(0)

x = torch.randn(4001, H, device="cuda", dtype=torch.bfloat16)
q, s = group_cast.per_token_group_cast(x, 128)
q_ref, s_ref = reference(x.cpu(), 128)
assert_bitwise(q.cpu().view(torch.uint8), q_ref.view(torch.uint8), name="e4m3 values")
assert_bitwise(s.cpu(), s_ref, name="scales")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
x = torch.randn(16384, H, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    group_cast.per_token_group_cast(x, 128)
start.record()
for _ in range(20):
    group_cast.per_token_group_cast(x, 128)
end.record()
end.synchronize()
ms = start.elapsed_time(end) / 20
gbytes = (x.numel() * 2 + x.numel() + x.numel() // 128 * 4) / 1e9
print(f"ran on {torch.cuda.get_device_name()}: bitwise equal to the torch reference; "
      f"T=16384 H={H}: {ms * 1000:.1f} µs, {gbytes / ms * 1000:.0f} GB/s")
