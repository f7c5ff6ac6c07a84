"""The decode kernels (top-k, indexer, MLA decode in both split layouts, sparse decode) under
``compute-sanitizer --tool memcheck`` at tail shapes and with the inputs their guards are for: block-table entries past the
cache and negative, -1 / out-of-sequence top-k slots, empty sequences, lengths past the table.
Any bad access fails the test. Run as a script, this file is the workload (``python FILE
[INDEX]``: only operation INDEX, which is how the kernels are built beforehand, in parallel)."""

import pytest


N_OPS = 17


def workload(only: int | None = None):
    import torch

    from kernels.attention.decode_mla import mla_decode
    from kernels.attention.decode_sparse import sparse_mla_decode
    from kernels.attention.indexer import indexer_logits, indexer_logits_paged
    from kernels.attention.topk import topk_indices

    torch.manual_seed(0)
    dev = "cuda"
    e4m3 = torch.float8_e4m3fn
    ops = []
    x = torch.randn(3, 2052, device=dev)
    ops.append(lambda: topk_indices(x, 2048, ctas_per_row=1))
    ops.append(lambda: topk_indices(x, 2048, ctas_per_row=2))  # 513 quads: the clusters' halves differ
    q = torch.randn(3, 64, 128, device=dev).to(e4m3)
    k = torch.randn(130, 128, device=dev).to(e4m3)
    pos = torch.tensor([-3, 129, 500], dtype=torch.int32, device=dev)
    ops.append(lambda: indexer_logits(q, k, torch.rand(130, device=dev), torch.randn(3, 64, device=dev), pos))
    pages = 5
    table = torch.tensor([[0, 5, -1, 1 << 30], [4, 4, 4, 4], [-7, 2, 3, 1]], dtype=torch.int32, device=dev)
    sl = torch.tensor([250, 10 ** 6, 0], dtype=torch.int32, device=dev)  # the 2nd is past the table
    qd = torch.randn(3, 2, 64, 128, device=dev).to(e4m3)
    kc = torch.randn(pages, 64, 128, device=dev).to(e4m3)
    ops.append(lambda: indexer_logits_paged(qd, kc, torch.rand(pages, 64, device=dev), table, sl,
                                            torch.randn(3, 2, 64, device=dev)))
    qm = torch.randn(3, 2, 16, 576, device=dev, dtype=torch.bfloat16)
    cache = torch.randn(pages, 64, 576, device=dev, dtype=torch.bfloat16)
    cache8 = cache.to(e4m3)
    scales = torch.rand(pages, 64, 9, device=dev)
    ops.append(lambda: mla_decode(qm, cache, table, sl))
    ops.append(lambda: mla_decode(qm, cache8, table, sl, kv_scales=scales))
    ops.append(lambda: mla_decode(qm, cache, table, sl, key_major=1))
    ops.append(lambda: mla_decode(qm, cache8, table, sl, kv_scales=scales, key_major=2))
    ops.append(lambda: mla_decode(qm, cache8, table, sl, kv_scales=scales, key_major=1))  # producers dequantize
    q16 = qm[:, :1].contiguous()  # one producer takes 16 query rows
    ops.append(lambda: mla_decode(q16, cache8, table, sl, kv_scales=scales, key_major=1, num_stages=1))  # two CTAs a SM
    ops.append(lambda: mla_decode(q16, cache8, table, sl, kv_scales=scales))  # the staged split: TMA stages the next page
    qh = torch.randn(3, 2, 128, 576, device=dev, dtype=torch.bfloat16)  # 64 heads a block: the queries by TMA
    ops.append(lambda: mla_decode(qh, cache, table, sl))
    idx = torch.randint(-1, 400, (3, 2, 512), dtype=torch.int32, device=dev)
    idx[0, 0, :3] = torch.tensor([-5, 10 ** 6, 255], dtype=torch.int32)
    ops.append(lambda: sparse_mla_decode(qm, cache, table, sl, idx, sink=torch.randn(16, device=dev)))
    ops.append(lambda: sparse_mla_decode(qm, cache8, table, sl, idx, kv_scales=scales))
    idx_long = torch.randint(-1, 400, (3, 1, 2048), dtype=torch.int32, device=dev)  # one 2048-slot split, 128 heads
    ops.append(lambda: sparse_mla_decode(qh[:, :1].contiguous(), cache, table, sl, idx_long, sink=torch.randn(128, device=dev)))
    ops.append(lambda: sparse_mla_decode(qh[:, :1].contiguous(), cache8, table, sl, idx_long, kv_scales=scales,
                                         finish=False))  # the consumers' dequant, fp32 partials and the combine
    ops.append(lambda: sparse_mla_decode(qh[:, :1].contiguous(), cache8, table, sl, idx_long, kv_scales=scales,
                                         dequant_by="producer", split_slots=1024))  # two splits, the producer's dequant
    assert len(ops) == N_OPS
    for op in ops if only is None else ops[only:only + 1]:
        op()
    torch.cuda.synchronize()
    print(f"ran {len(ops) if only is None else 1} operations")


@pytest.mark.gpu
def test_compute_sanitizer_memcheck():
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        pytest.skip("compute-sanitizer not installed")
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    # the kernels are built (and run once) outside the sanitizer first, so that none compiles under
    # it: one process per operation, all at once (one after another they outlast a device call)
    warm = [subprocess.Popen([sys.executable, __file__, str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for i in range(N_OPS)]
    for i, w in enumerate(warm):
        out = w.communicate(timeout=600)[0]
        assert w.returncode == 0, f"operation {i}: {out[-8000:]}"
    # then each operation in its own sanitized process, all at once: one process running them all
    # took 405 s of a 600-s device call (2026-12-03)
    checked = [subprocess.Popen([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, __file__, str(i)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for i in range(N_OPS)]
    for i, proc in enumerate(checked):
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, f"operation {i}: {out[-8000:]}"
        assert "ERROR SUMMARY: 0 errors" in out, f"operation {i}: {out[-8000:]}"
        assert "ran 1 operations" in out, f"operation {i}: {out[-8000:]}"


if __name__ == "__main__":
    import sys

    workload(int(sys.argv[1]) if len(sys.argv) > 1 else None)
