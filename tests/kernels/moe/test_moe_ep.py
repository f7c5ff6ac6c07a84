"""The unfused expert-parallel layer over a process group (kernels/moe/pipeline.py): CPU tests of
its exchange with three gloo processes (``ep_plan``'s order, the all-to-all of packed e4m3 rows,
scales and expert ids, the results' way back, ``row_of``), with a torch stand-in for the experts
(its argument checks: test_moe_pipeline.py). The CUDA path (NCCL, the project's kernels, bitwise
against ``moe_layer``) runs under ``torchrun`` in ``bench/mega_moe_ep.py``."""

import torch

from kernels.moe.pipeline import ep_expert_rows, ep_plan

H, K, EXPERTS, RANKS = 256, 3, 6, 3  # two experts a rank


def test_plan_groups_entries_by_destination_in_token_and_slot_order():
    ids = torch.tensor([[5, 0, 2], [1, 4, 3]], dtype=torch.int32)  # ranks: [2, 0, 1], [0, 2, 1]
    order, counts = ep_plan(ids, 2, RANKS)
    assert order.tolist() == [1, 3, 2, 5, 0, 4]  # rank 0: (0,1) (1,0); rank 1: (0,2) (1,2); rank 2: (0,0) (1,1)
    assert counts.tolist() == [2, 2, 2]
    empty, none = ep_plan(torch.zeros(0, K, dtype=torch.int32), 2, RANKS)
    assert empty.numel() == 0 and none.tolist() == [0, 0, 0]


def _inputs(rank: int):
    """Rank r's tokens: r + 2 of them (rank 0: 2, rank 2: 4), routed only to ranks 0 and 1 (experts
    0-3): rank 2 receives nothing."""
    g = torch.Generator().manual_seed(rank)
    t = rank + 2
    xq = torch.randint(0, 256, (t, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    xs = torch.rand(t, H // 128, generator=g)
    ids = torch.stack([torch.randperm(4, generator=g)[:K] for _ in range(t)]).to(torch.int32)
    return xq, xs, ids


def _stand_in(xq_rows, xs_rows, expert_ids):
    """What an expert 'computes' here: the row's bytes, its scales' bits and the expert id, side
    by side, so each returned row says where it came from."""
    return torch.cat([xq_rows.view(torch.uint8).to(torch.int32), xs_rows.view(torch.int32), expert_ids[:, None]], dim=1)


def _worker(rank: int, store: str, received: dict):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    try:
        xq, xs, ids = _inputs(rank)
        seen = []
        y, row_of = ep_expert_rows(xq, xs, ids, dist.group.WORLD, EXPERTS // RANKS,
                                   lambda q, s, e: seen.append(e.numel()) or _stand_in(q, s, e))
        assert row_of.shape == ids.shape and sorted(row_of.flatten().tolist()) == list(range(ids.numel()))
        for t in range(ids.shape[0]):
            for j in range(K):
                want = torch.cat([xq[t].view(torch.uint8).to(torch.int32), xs[t].view(torch.int32), ids[t, j:j + 1]])
                assert torch.equal(y[row_of[t, j]], want), (rank, t, j)
        received[rank] = seen[0]
    finally:
        dist.destroy_process_group()


def test_exchange_brings_every_entry_back_to_its_slot(tmp_path):
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        received = manager.dict()
        mp.spawn(_worker, args=(str(tmp_path / "store"), received), nprocs=RANKS)
        got = dict(received)
    # every entry went to the rank of its expert: rank 2 owns experts 4-5, which nobody chose
    assert got[2] == 0 and got[0] + got[1] == sum((r + 2) * K for r in range(RANKS))
