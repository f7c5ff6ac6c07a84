"""Top-k selection over the lightning indexer's logits: for each row of ``x [R, N]`` fp32, the
indices of its ``k`` largest values, ties to the lower index: the set a stable descending sort
puts first. Indices are returned in ascending order (the order sparse attention reads KV in).

Radix select, one CTA of 1024 threads per row (or a cluster of two, below), so a row's result
never depends on the other rows (batch invariant) and no step depends on timing (deterministic:
counts are integers, the output order is the index order):

1. Each value becomes a 32-bit key ordered like the values (``ordered_key``: -0 is +0, every NaN
   is above +inf, as in torch's sort).
2. Three histogram passes over the row (11, 11 and 10 bits of the key, high bits first) find the
   threshold key ``t`` and ``need``: every key above ``t`` is taken, and the first ``need`` keys
   equal to ``t`` in index order.
3. A collection pass walks the row in index order, 16 consecutive values per thread; one block
   scan per 16384 values gives each thread the count of taken values before its own, so each
   index is written to its place in ascending order.

The row is read four times; at 64 rows x 65536 (16 MiB) it stays in L2 after the first pass.
Each histogram pass loads four coalesced quads a thread before it counts any: with one load in
flight a thread, the first pass waited on DRAM latency (64 x 65536, k 2048, one CTA a row: 2.31x
`torch.topk` before, 2.63x after; 2-CTA clusters 3.19x; H200, 2026-12-02).

With one CTA per row a 64-row batch keeps 64 of the H200's 132 SMs busy, and a row's time is
one SM streaming it. ``ctas_per_row=2`` gives each row a 2-CTA thread-block cluster (sm_90):
CTA rank ``r`` streams quads ``[r * h, min(N4, (r + 1) * h))``, ``h = ceil(N4 / 2)``. After each
histogram pass a CTA writes its histogram into the peer's shared memory (distributed shared
memory, one receive buffer per pass so that no buffer is rewritten), a cluster barrier
(release / acquire) publishes it, and both CTAs scan the same sum of integer counts, so both
derive the same threshold. Rank 1 also counts, from rank 0's histograms, rank 0's keys above
the threshold and equal to it: its collection pass starts from those counts, so its indices
land after rank 0's, exactly where the 1-CTA kernel puts them.

Bounds: ``tlx check`` proves 257 of the 259 accesses (one CTA per row; 299 of 301 clustered,
under the launcher-checked ``R <= 1073741823``) and leaves 16 to 23 items unknown (k 2048: 16,
k 512 and 1024: 17, clustered: 23), none a violation: the two ``Idx`` stores of the
collection pass and possible int32 / uint32 overflows, all in sums of counts held in shared
memory. The verifier bounds a private count by the steps its loop takes (``packed`` gains at
most 16 keys, ``greater`` and ``equal`` at most a 16-bit field per chunk: proven), but it does
not track what shared memory holds, so it cannot see that each histogram bin, and with it a
thread's ``own``, the block-scan partial sums, ``above``, ``found[1]``, and so ``g``, ``e``
and ``need``, counts keys of one row and is therefore in ``[0, N]``, ``N = 4 * N4 <= 2^17``
(the ``assume``); clustered also the sum of both CTAs' bins and rank 1's ``peer`` /
``peer_above`` (rank 0's keys, still keys of the row). The ``Idx`` indices ``g + min(e, need)``
and ``g + e`` are below ``k`` by their guards and not negative because ``g`` and ``e`` are
counts. ``packed``'s block scan (16384 keys) keeps the low field below 2^16 (no carry) and the
high one at most 2^30. ``need`` starts at ``k`` and only loses ``found[1] < need``;
``found[0]`` is a bin in ``[0, 2^11)`` (the scan crosses ``need`` in every pass when the row has
more than ``k`` keys, the only rows the wrapper launches), so ``prefix`` holds at most 11, 22,
then 32 bits and its shifts never drop a set bit.
"""

import torch
import tilelang.language as T

import tlx
from kernels.device import sm_count

TARGET = {"kind": "cuda", "arch": "sm_90a"}
THREADS = 1024
WARPS = THREADS // 32
PASS_BITS = (11, 11, 10)  # key bits each histogram pass resolves, high bits first
BINS = 1 << max(PASS_BITS)
PER_THREAD = 16  # consecutive values a thread takes in the collection pass
LOADS = PER_THREAD // 4  # quads a thread loads at once in a histogram pass
KS = (512, 1024, 2048)
MAX_N = 1 << 17
CTAS_PER_ROW = (1, 2)  # CTAs (one thread-block cluster) that share a row


def ordered_key(x):
    """uint32 key of an fp32 value: larger value, larger key; -0 maps to +0's key, every NaN to
    the largest key (torch's sort treats NaN as the largest value)."""
    u = T.reinterpret(x, T.uint32)
    mag = u & T.uint32(0x7FFFFFFF)
    key = T.if_then_else(u >> T.uint32(31) != T.uint32(0), ~u, u | T.uint32(0x80000000))
    key = T.if_then_else(mag == T.uint32(0), T.uint32(0x80000000), key)
    return T.if_then_else(mag > T.uint32(0x7F800000), T.uint32(0xFFFFFFFF), key)


@tlx.jit(target=TARGET, assume=["1 <= N4", f"N4 <= {MAX_N // 4}"])
def topk_kernel(k: int, ctas_per_row: int = 1):
    """``Idx [R, k]`` int32: the top-k indices of each row of ``X [R, N4, 4]`` (a row of
    ``4 * N4`` values, viewed in fours so that every load is one 16-byte vector), ascending.
    ``ctas_per_row``: 1, or 2 for a 2-CTA cluster per row (see the module docstring)."""
    if ctas_per_row not in CTAS_PER_ROW:
        raise ValueError(f"ctas_per_row: expected one of {CTAS_PER_ROW}, got {ctas_per_row}")
    rows = T.dynamic("R")
    n4 = T.dynamic("N4")
    clustered = ctas_per_row == 2

    def in_part(q, lo, part, n4):
        """Whether quad ``q`` of the CTA's part (quads ``lo ..``) is in the part and in the row;
        two plain bounds guards, where one compare against a min of both would tie the bound to
        the CTA's rank."""
        return q < part if not clustered else T.And(q < part, lo + q < n4)

    @T.macro
    def block_scan(value, warp_sums, lane, warp, result):
        """``result[0]``: the inclusive prefix sum of ``value`` over the CTA's threads in thread
        order; the CTA's total is left in ``warp_sums[WARPS - 1]``."""
        T.sync_threads()  # the previous scan's readers are done with warp_sums
        result[0] = value
        for d in T.unroll(5):
            up = T.shfl_up(result[0], 1 << d)
            if lane >= (1 << d):
                result[0] = result[0] + up
        if lane == 31:
            warp_sums[warp] = result[0]
        T.sync_threads()
        if warp == 0:
            total = T.alloc_var("int32")
            total = warp_sums[lane]
            for d in T.unroll(5):
                up = T.shfl_up(total, 1 << d)
                if lane >= (1 << d):
                    total = total + up
            warp_sums[lane] = total
        T.sync_threads()
        if warp > 0:
            result[0] = result[0] + warp_sums[warp - 1]

    @T.macro
    def histogram_pass(X, row, lo, part, rank, tx, lane, warp, hist, received, peer_above, warp_sums, found, xs,
                       counts, scan, prefix: T.Ref, need: T.Ref, step: int):
        """Extend ``prefix`` (the threshold key's high bits resolved by the earlier steps) by
        ``PASS_BITS[step]`` bits and lower ``need`` by the count of keys above the new prefix.
        The CTA counts the row's quads ``[lo, min(lo + part, N4))``; clustered, the counts are the sum of both
        CTAs' histograms, and rank 1 adds rank 0's count of keys above the new prefix to
        ``peer_above[0]``."""
        done = sum(PASS_BITS[:step])
        bits = PASS_BITS[step]
        bins = 1 << bits
        per = bins // THREADS
        shift = 32 - done - bits
        for j in T.unroll(BINS // THREADS):
            hist[j * THREADS + tx] = 0
        T.sync_threads()
        # LOADS quads a thread, coalesced (quad (it * LOADS + j) * THREADS + tx), all loaded
        # before any is counted: LOADS loads in flight per thread, not one load per count
        for it in T.serial(T.ceildiv(part, THREADS * LOADS)):
            for j in T.unroll(LOADS):
                q = (it * LOADS + j) * THREADS + tx  # quad of the CTA's part
                if in_part(q, lo, part, n4):
                    for v in T.vectorized(4):
                        xs[j * 4 + v] = X[row, lo + q, v]
            for j in T.unroll(LOADS):
                q = (it * LOADS + j) * THREADS + tx
                if in_part(q, lo, part, n4):
                    for v in T.unroll(4):
                        key = ordered_key(xs[j * 4 + v])
                        if done == 0:
                            T.atomic_add(hist[T.Cast("int32", key >> T.uint32(shift))], 1)
                        elif key >> T.uint32(32 - done) == prefix:
                            T.atomic_add(hist[T.Cast("int32", (key >> T.uint32(shift)) & T.uint32(bins - 1))], 1)
        T.sync_threads()
        if clustered:
            if step == 0:
                T.cluster_wait()  # the peer has started (its arrive opened the kernel): its shared memory exists
            T.copy_cluster(hist[0:bins], received[step, 0:bins], dst_block=1 - rank)
            T.cluster_sync()  # release our writes into the peer, acquire the peer's into ours
        # thread tx owns bins bins-1-per*tx .. bins-per*(tx+1), highest first, so the scan over
        # threads counts the keys at or above each thread's bins
        own = T.alloc_var("int32")
        own = 0
        for j in T.unroll(per):
            if clustered:
                counts[j] = hist[bins - 1 - (per * tx + j)] + received[step, bins - 1 - (per * tx + j)]
            else:
                counts[j] = hist[bins - 1 - (per * tx + j)]
            own = own + counts[j]
        block_scan(own, warp_sums, lane, warp, scan)
        above = T.alloc_var("int32")
        above = scan[0] - own
        for j in T.unroll(per):
            if above < need and above + counts[j] >= need:
                found[0] = bins - 1 - (per * tx + j)
                found[1] = above
            above = above + counts[j]
        T.sync_threads()
        if clustered:
            if rank == 1:
                peer = T.alloc_var("int32")
                peer = 0
                for j in T.unroll(per):
                    if bins - 1 - (per * tx + j) > found[0]:
                        peer = peer + received[step, bins - 1 - (per * tx + j)]
                peer = T.warp_reduce_sum(peer)
                if lane == 0:
                    T.atomic_add(peer_above[0], peer)
        prefix = (prefix << T.uint32(bits)) | T.Cast("uint32", found[0])
        need = need - found[1]

    @T.prim_func
    def kernel(X: T.Tensor((rows, n4, 4), "float32"), Idx: T.Tensor((rows, k), "int32")):
        with T.Kernel(rows * ctas_per_row, threads=THREADS, cluster_dims=ctas_per_row) as bx:
            if clustered:
                T.cluster_arrive_relaxed()  # paired with the cluster_wait before the first exchange
            row = bx // ctas_per_row
            rank = bx % ctas_per_row
            part = T.ceildiv(n4, ctas_per_row)  # the CTA's part of the row: quads [lo, min(lo + part, N4))
            lo = rank * part
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            hist = T.alloc_shared((BINS,), "int32")
            # clustered: the peer's histogram of each pass, written by the peer
            received = T.alloc_shared((len(PASS_BITS) if clustered else 1, BINS if clustered else 1), "int32")
            peer_above = T.alloc_shared((1,), "int32")  # clustered, rank 1: rank 0's keys above the threshold
            warp_sums = T.alloc_shared((WARPS,), "int32")
            found = T.alloc_shared((2,), "int32")  # the threshold bin, the count of keys above it
            xs = T.alloc_local((PER_THREAD,), "float32")
            keys = T.alloc_local((PER_THREAD,), "uint32")
            counts = T.alloc_local((BINS // THREADS,), "int32")
            scan = T.alloc_local((1,), "int32")
            prefix = T.alloc_var("uint32")
            need = T.alloc_var("int32")
            prefix = T.uint32(0)
            need = k
            if clustered:
                if tx == 0:
                    peer_above[0] = 0
            histogram_pass(X, row, lo, part, rank, tx, lane, warp, hist, received, peer_above, warp_sums, found, xs,
                           counts, scan, prefix, need, 0)
            histogram_pass(X, row, lo, part, rank, tx, lane, warp, hist, received, peer_above, warp_sums, found, xs,
                           counts, scan, prefix, need, 1)
            histogram_pass(X, row, lo, part, rank, tx, lane, warp, hist, received, peer_above, warp_sums, found, xs,
                           counts, scan, prefix, need, 2)
            # prefix is now the threshold key t; take every key above t and the first `need` equal
            # to t; clustered rank 1 starts from rank 0's counts of both
            greater = T.alloc_var("int32")
            equal = T.alloc_var("int32")
            greater = 0
            equal = 0
            if clustered:
                if rank == 1:
                    greater = peer_above[0]
                    # found[0] < 2^PASS_BITS[-1] whenever the row has k keys (the wrapper's case);
                    # the mask keeps the read in bounds for a direct launch with 4 * N4 < k
                    equal = received[len(PASS_BITS) - 1, found[0] & ((1 << PASS_BITS[-1]) - 1)]
            for c in T.serial(T.ceildiv(part, THREADS * PER_THREAD // 4)):
                q0 = (c * THREADS + tx) * (PER_THREAD // 4)  # quad of the CTA's part
                for j in T.unroll(PER_THREAD // 4):
                    if in_part(q0 + j, lo, part, n4):
                        for v in T.vectorized(4):
                            xs[j * 4 + v] = X[row, lo + q0 + j, v]
                packed = T.alloc_var("int32")
                packed = 0  # keys above t in the low 16 bits, keys equal to t in the high 16
                for j in T.unroll(PER_THREAD):
                    keys[j] = T.if_then_else(in_part(q0 + j // 4, lo, part, n4), ordered_key(xs[j]), T.uint32(0))
                    if in_part(q0 + j // 4, lo, part, n4):
                        if keys[j] > prefix:
                            packed = packed + 1
                        elif keys[j] == prefix:
                            packed = packed + (1 << 16)
                block_scan(packed, warp_sums, lane, warp, scan)
                g = T.alloc_var("int32")
                e = T.alloc_var("int32")
                g = greater + ((scan[0] - packed) & 0xFFFF)
                e = equal + ((scan[0] - packed) >> 16)
                for j in T.unroll(PER_THREAD):
                    if in_part(q0 + j // 4, lo, part, n4):
                        if keys[j] > prefix:
                            if g + T.min(e, need) < k:
                                Idx[row, g + T.min(e, need)] = (lo + q0) * 4 + j
                            g = g + 1
                        elif keys[j] == prefix:
                            if e < need and g + e < k:
                                Idx[row, g + e] = (lo + q0) * 4 + j
                            e = e + 1
                greater = greater + (warp_sums[WARPS - 1] & 0xFFFF)
                equal = equal + (warp_sums[WARPS - 1] >> 16)

    return kernel


def topk_indices(x: torch.Tensor, k: int, ctas_per_row: int | None = None) -> torch.Tensor:
    """int32 ``[R, k]``: the indices of the ``k`` largest values of each row of ``x [R, N]``
    (fp32, contiguous, CUDA, ``N % 4 == 0``, ``4 <= N <= 131072``), ties to the lower index,
    in ascending order. A row shorter than k (N <= k) gives all its indices, then -1 (the
    masked slot of sparse decode); no kernel runs then. ``ctas_per_row`` (1 or 2) picks the
    kernel variant; both give the same bits. None: 2 when every row's pair of CTAs fits on the
    GPU at once (2 R <= its SM count; faster at every measured shape), else 1."""
    if k not in KS:
        raise ValueError(f"k: expected one of {KS}, got {k}")
    if ctas_per_row is not None and ctas_per_row not in CTAS_PER_ROW:
        raise ValueError(f"ctas_per_row: expected one of {CTAS_PER_ROW}, got {ctas_per_row}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 2:
        raise TypeError(f"x: expected a 2-d float32 tensor, got {getattr(x, 'dtype', type(x))} "
                        f"with {getattr(x, 'dim', lambda: '?')()} dims")
    r, n = x.shape
    if n % 4 or not 4 <= n <= MAX_N:
        raise ValueError(f"x: expected N a multiple of 4 with 4 <= N <= {MAX_N}, got N = {n}")
    if not x.is_cuda or not x.is_contiguous():
        raise ValueError(f"x: expected a contiguous CUDA tensor, got device {x.device}, "
                         f"contiguous {x.is_contiguous()}")
    if n <= k:
        row = torch.arange(k, dtype=torch.int32, device=x.device)
        return torch.where(row < n, row, -1).expand(r, k).contiguous()
    if ctas_per_row is None:
        ctas_per_row = 2 if 2 * r <= sm_count(x.device.index) else 1
    out = torch.empty((r, k), dtype=torch.int32, device=x.device)
    if r:
        topk_kernel(k, ctas_per_row)(x.view(r, n // 4, 4), out)
    return out
