"""MegaMoE: the expert-parallel routed-expert layer, wave-pipelined, pulling over buffers every
rank can address, bitwise equal to ``moe_layer(..., n_ranks=n)``.

What this version is (and is not)
---------------------------------
The target design is one persistent kernel per rank that dispatches, runs L1, SwiGLU + FP8
requant and L2, and writes results back, wave by wave. This version implements the *protocol*
and the *wave schedule* of that design; of the compute steps, L1 and the SwiGLU cast are fused
(and, opt-in, L2 with them):

* **New kernels** (``protocol.py``, ``@tlx.jit``): ``announce`` (epoch, READY publish),
  ``exchange`` (acquire of every rank's READY), ``gather_ids`` (every rank's routing),
  ``dispatch`` (a persistent pull of each row's e4m3 token and scales from its source rank, wave
  by wave, a release-add per wave: the permute of the unfused layer, done over the peers),
  ``step`` (between waves: release the finished wave's DONE, acquire the next wave's dispatch
  count), ``gate`` (acquire every rank's DONE of every wave) and ``combine`` (pull each token's k
  rows from their owners, the same fma chain as ``permute.combine``). System-scope release /
  acquire is ``sysflags.py``.
* **Fused: L1 + SwiGLU + e4m3 requant** (``fusion="l1_swiglu"``, the default where it measured
  faster, ``default_fusion``: one rank at decode sizes, every batch of 9-512 tokens over all ranks,
  8 ranks from 512 tokens a rank):
  ``grouped_gemm_swiglu_kernel`` is the L1 grouped GEMM with ``swiglu_cast`` as its epilogue, so
  the bf16 hidden state [R, 2I] (4I bytes a row, written and read again in the unfused path)
  never reaches memory, and each wave is two launches (L1 + SwiGLU, L2) instead of
  three. Why this step first: it is the one whose intermediate is largest (2I bf16 per row, 4x
  the e4m3 L2 input) and whose fusion costs no synchronisation (a tile's epilogue needs only its own
  rows and its own gate and up columns), and it computes only the wave's row blocks.
* **Fused, opt-in: the whole wave** (``fusion="wave"``, ``kernels.moe.mega.wave``): one persistent
  kernel runs the wave's L1 + SwiGLU tiles and then its L2 tiles; an L2 tile waits (bounded, with
  the rank's timeout, status WAIT_L1) for a per-row-block count of finished L1 tiles. It saves the
  second launch and the tail between L1 and L2 (L2 tiles of finished row blocks start while other
  L1 tiles still run), at the price of a co-residency requirement (all its CTAs resident: its grid
  is ``MegaPlan.wave_sms``, a little smaller than the GEMMs' share, see ``make_plan``), 3 pipeline
  stages instead of 4 (shared memory holds both output tiles) and 128-wide L2 tiles. Not the
  default until the GPU has checked it (bits and time).
* **Not fused**: the dispatch and combine run as their own kernels on the rank's streams (they
  overlap the GEMMs through the waves); gating, the cast of x and the metadata are separate kernels
  ahead of the protocol, as in the published design (they need all of the rank's tokens, before
  any wave).
* **Reused, unchanged**: ``gating``, the per-token FP8 cast (``kernels.quant``), ``routing_metadata``,
  the contiguous grouped GEMM for L2 (run per wave on the wave's row blocks only, with the rank's
  SM share as its persistent grid). ``fusion="none"`` keeps the unfused wave for comparison: L1 by
  the contiguous grouped GEMM into bf16, ``swiglu_cast`` over the wave's rows (``rows`` masks the
  others: it neither reads nor writes them), then L2. The plain GEMMs store the wave's routed
  rows only where their tiles are 128 wide (``grouped_gemm.streaming_block_n``); up to 512 tokens in
  all (every rank's; ``grouped_gemm_decode.decode_width``), the plain GEMMs are
  ``grouped_gemm_decode_kernel`` (the weights on the MMA's M side, the wave's routed rows stored;
  one chunk of rows a block up to 8 tokens, else 32 rows a chunk), as in ``moe_layer``.

Ranks and buffers
-----------------
Rank r owns experts ``[r * El, (r + 1) * El)`` (El = E / n) and sends ``Tr`` tokens (x rows).
Every rank holds, in buffers every rank can address ("symmetric"): ``flags`` [F] int32 (layout in
``protocol.py``), its send buffers ``xq`` [Tr, H] e4m3, ``xs`` [Tr, H/128] fp32 and ``ids`` [Tr, k]
(-1 for unused token slots), its L2 output ``y`` [R, H] bf16 and its ``row_of`` [n * Tr, k] (the row
of each global token's entries in ``y``). Global token ``g = s * Tr + t`` is token t of rank s.

* ``n_virtual_ranks=n`` (one GPU): x [T, H] is split into n slices of ``Tr = ceil(T / n)`` tokens
  (the last ones may be short or empty). Each virtual rank has its own buffers (plain device
  tensors, addressable by all), its own compute and communication streams, and a share of the SMs
  for its persistent GEMMs (``gemm_sms``): the ranks run concurrently and talk only through the
  flags below, never through stream order.
* ``group=`` (one GPU per rank): the same kernels and the same launch sequence; the buffers come
  from ``torch.distributed._symmetric_memory`` (``empty`` + ``rendezvous``; a peer's tensor is
  ``get_buffer(p, shape, dtype)``), x is the rank's own [Tr, H] (every rank passes the same Tr).
  The flags use ``.sys`` scope for this case. Not yet run on several GPUs (separate issue).

Protocol of one call (epoch e = the rank's call counter, kept in device memory so that a CUDA
graph replays it; flags are compared for equality with e, so nobody resets them)
------------------------------------------------------------------------------------------------
1. compute stream: gating and the FP8 cast of the rank's tokens, written straight into ``ids / xq / xs``;
   ``announce``: e += 1, status cleared, READY = e (st.release.sys).
2. ``exchange``: acquire READY == e of every rank (ld.acquire.sys).
3. ``gather_ids`` -> ``routing_metadata`` over all ranks' tokens for the rank's experts (its
   ``row_of`` written straight into the symmetric buffer); per-wave block and row masks (torch ops,
   several waves only).
4. communication stream (after an event): ``dispatch`` pulls the rows of wave 0, 1, ... from the
   source ranks' ``xq / xs`` and, after each wave, every CTA does red.release.sys on COUNT + w.
5. compute stream, per wave w: ``step`` (release DONE + w-1 = e; acquire COUNT + w == CTAs, reset
   it), L1 GEMM + SwiGLU cast (one kernel; two with ``fusion="none"``), L2 GEMM into ``y`` (wave
   w's rows; ``fusion="wave"``: one kernel for all three, after its row-block counts are zeroed
   once per call in step 3). While wave w computes, the dispatch pulls wave w+1 (it never waits),
   and peers may already read wave w-1's results.
   A last ``step`` releases the last wave's DONE.
6. ``gate`` acquires DONE == e of every wave of every rank;
   ``combine`` pulls each token's k rows from their owners' ``y`` (row from the owner's
   ``row_of``) and sums them in k order.

One rank (``MegaPlan.solo``, EP1): there is no peer to publish to or wait for, so steps 1-6 run
without the flag kernels: no ``announce``, ``exchange``, ``step`` or ``gate``, the metadata reads the
rank's own ``ids`` (no ``gather_ids``), and the dispatch runs on the compute stream, whose order
does what READY / COUNT / DONE do across ranks (``protocol_segments`` models it so; the race check
covers n = 1). The dispatch is ``moe_layer``'s permute (the same rows; a token pushed to its k
rows is read once, where the pull reads it once a row: 131 against 88 µs at V4-Flash T = 8192,
H100 2026-12-07), its CTAs letting the decode GEMMs launch early as the pull's do. Nothing
waits, so nothing can time out; the layer is the same kernels in the same order otherwise, and
gives the same bits.

Why buffers are not overwritten while a peer still reads them: a rank reaches step 1 of call e+1
only after its combine of call e, which follows every rank's DONE of call e, which follows each
rank's dispatch of call e (all pulls from the send buffers); and a rank writes ``y`` / ``row_of``
of call e+1 only after its exchange of e+1, which needs every peer's READY of e+1, published only
after that peer's combine of call e (all pulls from ``y``). So READY / DONE of a peer are either
e-1 or e while a rank waits for e, and equality is exact. The reads of peer data happen in
kernels that follow the acquiring kernel in stream order (never in the kernel that waited), so
no stale line of a non-coherent cache can be read.

Race freedom of that traffic is checked, not only argued: ``protocol_segments`` writes two calls
of the protocol on every rank as segments for ``tlx.passes.protocol`` (what each kernel reads and
writes of which rank's buffer, per wave where the wave owns the rows; the flags per call; the
stream joins), whose happens-before check finds no unordered conflicting pair, and finds the race
each synchronisation of ``SYNC`` prevents when it is left out (tests/kernels/moe/mega).

Launch order (``launch_order``): the host enqueues each phase for every rank before the next
phase (1 for all ranks, then 2-4, then 5 wave by wave, then 6), so every flag a kernel waits for
is set by a kernel enqueued before it (``flags_set`` / ``flags_awaited``; a CPU test checks it for
every rank count and wave count). That matters on one GPU: streams share a few hardware queues
(CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), where a kernel can sit behind any earlier kernel
of another stream; when ``exchange`` also published READY, rank 0's waiting exchange held rank
1's publish behind it (H200, 2026-12-01: every 8-rank test and some 2- and 4-rank ones timed out
after 5 s). Publishing in a separate ``announce`` restores the order; it has not run on the GPU
yet. On several GPUs each rank has its own queues.

Co-residency: apart from the fused wave kernel (``fusion="wave"``, whose CTAs wait for each
other: ``make_plan`` sizes its grid for that), only ``exchange``, ``step`` and ``gate`` wait, each
one warp of one CTA on the rank's compute stream, so n ranks hold at most n waiting warps. Everything they wait for
(peers' announces, dispatches, GEMMs) waits on nothing that a waiting warp holds: persistent
GEMM CTAs that find no free SM start when another CTA of any kernel finishes. So no rank waits
on one that cannot be scheduled, whatever the ranks' relative speed.

Timeouts: every wait gives up after ``timeout_s`` (``%globaltimer``), records (code, rank, wave,
peer) in the rank's status words, and every later wait of that rank gives up at once, so a
missing rank costs about one timeout. ``mega_moe`` (``check=True``) reads the status words after
the call and raises ``MegaMoETimeout`` naming the rank, the peer and the wave; under CUDA-graph
capture call ``MegaMoE.check()`` after a replay. A layer whose call failed is not reused.

Bitwise equality with ``moe_layer(..., n_ranks=n)``: gating, the cast, the SwiGLU cast and the
combine compute each token / row from its own data in a fixed order; the grouped GEMM computes a
row of a row block from that row and the expert's weights only, whichever CTA takes the tile and
whatever rows share the block; dispatch copies bytes. The fused L1 + SwiGLU kernel computes each
row's e4m3 bytes and scale to the bit as L1 followed by ``swiglu_cast`` (its docstring says how);
padding rows are read by no later step (the combine reads routed rows only). So only the row
placement differs (the metadata here counts the padding token slots of short ranks, ids -1, which
take no rows), which no output bit depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.device import sm_count
from kernels.moe.mega import protocol as K
from kernels.moe.grouped_gemm import BLOCK_N, narrow_everywhere, streaming_block_n
from kernels.moe.grouped_gemm_decode import CHUNKED_WIDTH, decode_width, one_chunk
from kernels.moe.metadata import max_rows, metadata_buffers, routing_metadata
from kernels.moe.permute import permute_fp8_kernel
from kernels.moe.pipeline import MoEConfig

GROUP = K.GROUP


class MegaMoETimeout(RuntimeError):
    """A rank gave up waiting for a peer (the message names the rank, the peer and the wave)."""


_WHAT = {K.WAIT_TOKENS: "the tokens and routing of rank {peer} (wave {wave}, exchange)",
         K.WAIT_DISPATCH: "its own dispatch of wave {wave} (pulling from the source ranks)",
         K.WAIT_L1: "its own L1 tiles of wave {wave} (an L2 tile of the fused wave kernel)",
         K.WAIT_RESULTS: "the L2 results of rank {peer}, wave {wave} (combine)"}


def failure_message(code: int, rank: int, wave: int, peer: int, timeout_s: float) -> str:
    what = _WHAT.get(code, "an unknown step (status code {code})").format(peer=peer, wave=wave, code=code)
    return f"MegaMoE: rank {rank} timed out after {timeout_s:g} s waiting for {what}"


@dataclass(frozen=True)
class MegaPlan:
    """Static sizes of one rank's part of a layer call (the same on every rank)."""

    n_ranks: int
    tokens_per_rank: int  # Tr: send-buffer rows of every rank
    hidden: int
    inter: int
    n_experts: int
    topk: int
    n_waves: int
    wave_experts: int
    gemm_sms: int  # persistent CTAs of each GEMM launch (the rank's SM share)
    dispatch_ctas: int
    wave_sms: int  # persistent CTAs of the fused wave kernel (all co-resident: see make_plan)
    narrow_tiles: bool = False  # the device takes 128-wide GEMM tiles at every size (grouped_gemm.narrow_everywhere)

    @property
    def solo(self) -> bool:
        """One rank: no peer to publish to or wait for, so the flag kernels (``announce``, ``exchange``,
        ``step``, ``gate``) and ``gather_ids`` are not launched and the dispatch runs on the compute
        stream, stream order doing what the flags do across ranks (module docstring)."""
        return self.n_ranks == 1

    @property
    def n_local(self) -> int:
        return self.n_experts // self.n_ranks

    @property
    def global_tokens(self) -> int:
        return self.n_ranks * self.tokens_per_rank

    @property
    def rows(self) -> int:
        """R: the rank's padded expert-major rows (``routing_metadata``'s static bound)."""
        return max_rows(self.global_tokens, self.topk, self.n_local)

    def waves(self) -> list[range]:
        """Local experts of each wave, in order."""
        w = self.wave_experts
        return [range(i * w, min((i + 1) * w, self.n_local)) for i in range(self.n_waves)]

    def symmetric_bytes(self) -> int:
        """Bytes of one rank's buffers that peers read."""
        tr, h, k = self.tokens_per_rank, self.hidden, self.topk
        return (4 * K.FLAG_WORDS + tr * h + tr * (h // GROUP) * 4 + tr * k * 4 + self.rows * h * 2
                + self.global_tokens * k * 4)


def make_plan(n_ranks: int, tokens_per_rank: int, hidden: int, inter: int, n_experts: int, topk: int, sms: int,
              waves: int | None = None, virtual: bool = True, narrow_tiles: bool = False) -> MegaPlan:
    """The plan of a layer call; every argument error names the argument. ``sms``: the device's
    SM count; virtual ranks share it (each rank's GEMMs get ``sms // n`` rounded down to even).

    ``wave_sms``: the fused wave kernel's CTAs wait for each other (``kernels.moe.mega.wave``), so
    all of them must be resident at once. A CTA fills an SM, and its 2-CTA cluster takes a pair of
    SMs (a TPC: ``sms / 2`` pairs); on one GPU the n ranks' wave kernels may run together with up to
    n - 1 waiting one-warp CTAs of the other ranks (``exchange``, ``step``, ``gate``: one at a time
    per compute stream), each of which can spoil a pair at worst, so
    ``n * wave_sms / 2 + n - 1 <= sms / 2``. On one GPU per rank only the rank's own kernels run there.
    ``narrow_tiles``: the unfused GEMMs take 128-wide tiles at every size (the device is one of
    ``grouped_gemm.NARROW_EVERYWHERE``: see ``streaming_block_n``)."""
    if not 1 <= n_ranks <= K.PEERS:
        raise ValueError(f"n_ranks: expected 1 to {K.PEERS} ranks, got {n_ranks}")
    if n_experts % n_ranks:
        raise ValueError(f"n_ranks: expected a divisor of the {n_experts} experts, got {n_ranks}")
    if tokens_per_rank < 1:
        raise ValueError(f"tokens_per_rank: expected at least 1, got {tokens_per_rank}")
    if hidden % 1024:
        raise ValueError(f"hidden: expected a multiple of 1024 (dispatch and combine move 16-byte words "
                         f"per lane), got {hidden}")
    if inter % GROUP:
        raise ValueError(f"inter: expected a multiple of {GROUP}, got {inter}")
    if not 1 <= topk <= n_experts:
        raise ValueError(f"topk: expected 1 to {n_experts}, got {topk}")
    el = n_experts // n_ranks
    if waves is None:
        waves = 1 if n_ranks == 1 else 2
    if not 1 <= waves <= min(K.MAX_WAVES, el):
        raise ValueError(f"waves: expected 1 to {min(K.MAX_WAVES, el)} (local experts {el}), got {waves}")
    per_wave = -(-el // waves)
    share = sms // n_ranks if virtual else sms
    gemm_sms = share // 2 * 2
    if gemm_sms < 2:
        raise ValueError(f"n_ranks: {n_ranks} virtual ranks leave {share} SMs each of {sms}; a GEMM needs 2")
    wave_sms = max(1, (sms // 2 - n_ranks + 1) // n_ranks) * 2 if virtual else gemm_sms
    return MegaPlan(n_ranks, tokens_per_rank, hidden, inter, n_experts, topk, -(-el // per_wave), per_wave,
                    gemm_sms, gemm_sms, wave_sms, narrow_tiles)


FUSIONS = ("l1_swiglu", "none", "wave")  # what a wave's compute fuses (module docstring)


def rank_tokens(n_tokens: int, n_ranks: int, virtual: bool) -> int:
    """Tokens a rank's plan is sized for: ``x``'s tokens shared out over the virtual ranks, or in
    group mode ``x``'s (this rank's; every rank passes the same count)."""
    return max(1, -(-n_tokens // n_ranks) if virtual else n_tokens)


def default_fusion(n_ranks: int, tokens_per_rank: int) -> str:
    """``fusion`` when none is given: the L1 + SwiGLU kernel where it measured faster than the three
    launches a wave (``"none"``), else those. V4-Flash graph replays, ``bench/mega_moe.py``, one H100,
    fused against three launches, µs:

    * one rank up to ``DEFAULT_MAX_TOKENS`` = 8 tokens (the decode kernel's SwiGLU form, one chunk):
      390-401 against 395-405 in three runs at T = 8, 94 against 97 at T = 1 (2026-12-07 09:16-09:26);
    * the decode kernel in 32-row chunks (more than 8 and at most ``CHUNKED_MAX_TOKENS`` tokens over
      all ranks; 2026-12-07 19:04-19:51, d2fd426, two runs where repeated): one rank T = 64 1605 / 1605,
      T = 512 2202 / 2216 (and 2186 / 2200 at 16:53); 2 / 4 / 8 ranks at 64 tokens a rank 2162 / 2163,
      2287 / 2347, 2406 / 2524, again 2128 / 2151, 2285 / 2343, 2388 / 2513; 4 / 8 ranks at 4 tokens
      833 / 866, 1279 / 1297;
    * 8 ranks from 512 tokens a rank (the persistent kernels): 2822 / 3034 (19:05), 2917 / 3144 (09:26).

    The three launches elsewhere: several ranks whose tokens all fit one 8-row chunk (2 ranks at 1 / 4
    tokens 196 / 183, 455 / 428; 4 ranks at 1 token 284 / 263; 8 ranks at 1 token 458 / 461, equal), one rank
    at T = 4001 / 8192 (2706 / 2625, 4522 / 4050), 2 and 4 ranks at 512 tokens (2563 / 2444, 2641 /
    2561). (On an H200 on 2026-12-02, before the routed-row GEMMs and the skipping SwiGLU cast sped
    the three launches up, the fused kernel led from 4 ranks on.)"""
    width = decode_width(n_ranks * tokens_per_rank)  # the GEMMs' decode width, None: the persistent kernels
    if width is not None and (n_ranks == 1 or width == CHUNKED_WIDTH):
        return "l1_swiglu"
    return "l1_swiglu" if n_ranks >= 8 and tokens_per_rank >= 512 else "none"


def compute_kernel_specs(plan: MegaPlan, clamp: float, fusion: str) -> dict:
    """name -> (module, factory, args, kwargs) of the GEMM kernels a wave launches: ``l1`` (the fused
    L1 + SwiGLU cast, or with ``fusion="none"`` the bf16 L1) and ``l2``, on the rank's SM share;
    with ``fusion="wave"`` the one ``wave`` kernel on ``plan.wave_sms``. ``bench/mega_moe.py
    --precompile`` builds the same list."""
    if fusion not in FUSIONS:
        raise ValueError(f"fusion: expected one of {FUSIONS}, got {fusion!r}")
    gemm, sms = "kernels.moe.grouped_gemm", {"num_sms": plan.gemm_sms}
    i2, h = 2 * plan.inter, plan.hidden
    if fusion == "wave":
        return {"wave": ("kernels.moe.mega.wave", "wave_kernel", (i2, h, float(clamp)), {"num_sms": plan.wave_sms})}
    # the unfused GEMMs as moe_layer's (``grouped_gemm_contiguous``): the weights-on-M decode kernel where
    # ``decode_width`` takes the tokens of all ranks, else its tile width (``streaming_block_n``); 128 wide,
    # the wave's routed rows stored
    width = decode_width(plan.global_tokens)
    if width is not None:  # the fused L1 too: the decode kernel with the SwiGLU cast, one K block a stage
        # programmatic dependents: their first stages of weights load while the kernel before them
        # (the dispatch or the wave's step, the L1, the SwiGLU cast: none writes weights) finishes
        decode = ("kernels.moe.grouped_gemm_decode", "grouped_gemm_decode_kernel")
        pdl = {"pdl": True, "bounded": one_chunk(plan.global_tokens, width)}
        l1_plain, l2 = (*decode, (i2, h, width), pdl), (*decode, (h, plan.inter, width), pdl)
        l1_fused = (*decode, (i2, h, width), {"swiglu_clamp": float(clamp), "group": 1} | pdl)
    else:
        block_n = streaming_block_n(plan.rows, plan.n_local, plan.narrow_tiles)
        plain = sms | {"block_n": block_n, "row_mask": block_n == BLOCK_N}
        l1_plain = (gemm, "grouped_gemm_contiguous_kernel", (i2, h), plain)
        l2 = (gemm, "grouped_gemm_contiguous_kernel", (h, plan.inter), plain)
        l1_fused = (gemm, "grouped_gemm_swiglu_kernel", (i2, h, float(clamp)), sms)
    return {"l1": l1_fused if fusion == "l1_swiglu" else l1_plain, "l2": l2}


def takes_rows(spec: tuple) -> bool:
    """Whether a plain GEMM of ``compute_kernel_specs`` takes the wave's ``rows`` (and stores those rows only)."""
    _, factory, _, kwargs = spec
    return factory == "grouped_gemm_decode_kernel" or kwargs.get("row_mask", False)


def launch_order(plan: MegaPlan, ranks) -> list[tuple[str, int, int]]:
    """``(step, rank, wave)`` in the order the host enqueues them, a phase for every rank before the
    next phase (module docstring, launch order): ``publish`` (gating, casts, ``announce``),
    ``route`` (``exchange``, ids, metadata, ``dispatch``), ``wave`` (``step``, L1 + SwiGLU cast, L2;
    wave-major so the ranks' waves interleave; wave ``n_waves`` is the ``step`` that releases the
    last DONE), ``finish`` (``gate``, ``combine``)."""
    order = [("publish", r, -1) for r in ranks] + [("route", r, -1) for r in ranks]
    order += [("wave", r, w) for w in range(plan.n_waves + 1) for r in ranks]  # wave n_waves: the last DONE
    return order + [("finish", r, -1) for r in ranks]


def flags_set(plan: MegaPlan, step: str, r: int, w: int) -> list[tuple]:
    """The flags (``("READY", rank)``, ``("COUNT", rank, wave)``, ``("DONE", rank, wave)``) that a
    step's kernels set (none on one rank: ``MegaPlan.solo``)."""
    if plan.solo:
        return []
    if step == "publish":
        return [("READY", r)]
    if step == "route":
        return [("COUNT", r, v) for v in range(plan.n_waves)]
    if step == "wave":
        return [("DONE", r, w - 1)] if w > 0 else []
    return []


def flags_awaited(plan: MegaPlan, step: str, r: int, w: int) -> list[tuple]:
    """The flags that a step's kernels wait for (with a timeout; none on one rank)."""
    if plan.solo:
        return []
    if step == "route":
        return [("READY", s) for s in range(plan.n_ranks)]
    if step == "wave":
        return [("COUNT", r, w)] if w < plan.n_waves else []
    if step == "finish":
        return [("DONE", s, v) for s in range(plan.n_ranks) for v in range(plan.n_waves)]
    return []


# the synchronisation that orders the layer's global-memory traffic; ``protocol_segments(leave_out=)``
# drops one, to show the race it prevents. Also modelled, but not needed for that order while every
# wait arrives: the caller-stream joins of ``__call__`` and ``_finish``'s wait for the dispatch's
# stream (there for a wait that timed out: the call then ends with every kernel finished).
SYNC = ("exchange", "dispatch_after_route", "step_count", "gate")


def protocol_segments(plan: MegaPlan, calls: int = 2, fusion: str = "l1_swiglu", leave_out=()) -> list:
    """The global-memory traffic of ``calls`` consecutive layer calls on every rank, as
    ``tlx.passes.protocol`` segments in host enqueue order (``launch_order``): what each kernel
    reads and writes of which rank's buffer (per wave where a wave owns the rows), the flags it
    releases and acquires (keyed by call: the epoch), and the stream joins of ``__call__`` /
    ``_route`` / ``_finish``. Each rank's caller stream is its own, as in group mode (on one GPU
    the ranks share it, which only adds order). ``leave_out``: synchronisation of ``SYNC`` to
    drop, to show that the check finds the race it prevents."""
    from tlx.passes.protocol import Access, Segment

    unknown = set(leave_out) - set(SYNC)
    if unknown:
        raise ValueError(f"leave_out: expected names from {SYNC}, got {sorted(unknown)}")
    if fusion not in FUSIONS:
        raise ValueError(f"fusion: expected one of {FUSIONS}, got {fusion!r}")
    n, waves, solo = plan.n_ranks, range(plan.n_waves), plan.solo
    # decode sizes: the GEMMs are programmatic dependents (``compute_kernel_specs``) that read the
    # metadata's block experts and rows before their grid-dependency wait
    dependent = fusion != "wave" and decode_width(plan.global_tokens) is not None

    def rd(r, name, part=None):
        return Access((name, r), part)

    def flags(*flag):
        """The flag a step releases: none on one rank."""
        return [] if solo else [flag]

    def wr(r, name, part=None):
        return Access((name, r), part, True)

    segs = []
    for c in range(calls):
        def seg(name, r, stream, accesses=(), awaits=(), sets=(), joins=()):
            segs.append(Segment(f"{name} (rank {r}, call {c})", (r, stream), tuple(accesses), tuple(awaits), tuple(sets),
                                tuple(joins)))

        def gemm(name, r, accesses):
            """A wave's GEMM on the compute stream; at decode sizes a dependent, its early part first."""
            if dependent:
                segs.append(Segment(f"{name} early (rank {r}, call {c})", (r, "compute"), (rd(r, "meta"),), programmatic=True))
            seg(name, r, "compute", accesses)

        for r in range(n):
            for stream in ("compute", "comm"):  # the rank's streams wait for the caller's stream
                seg("start", r, stream, joins=[(r, "caller")])
        for step, r, w in launch_order(plan, range(n)):
            if step == "publish":  # gating and the cast into the send buffers, then announce
                seg("publish", r, "compute", [wr(r, "xq"), wr(r, "xs"), wr(r, "ids")], sets=flags("READY", r, c))
            elif step == "route":
                if not solo:  # one rank: the metadata reads its own ids (``gids`` is that buffer)
                    seg("exchange", r, "compute", awaits=[] if "exchange" in leave_out else [("READY", s, c) for s in range(n)])
                    seg("gather_ids", r, "compute", [rd(s, "ids") for s in range(n)] + [wr(r, "gids")])
                seg("routing_metadata", r, "compute", [rd(r, "ids" if solo else "gids"), wr(r, "meta"), wr(r, "row_of")])
                if solo:  # one rank: the permute writes every wave's rows
                    seg("dispatch (push)", r, "compute", [rd(r, "xq"), rd(r, "xs"), rd(r, "meta"), rd(r, "row_of")]
                        + [wr(r, buf, v) for v in waves for buf in ("xp", "sp")])
                else:
                    for v in waves:  # the dispatch's CTAs release COUNT + v after pulling wave v's rows
                        seg(f"dispatch wave {v}", r, "comm",
                            [rd(s, name) for s in range(n) for name in ("xq", "xs")] + [rd(r, "meta"), wr(r, "xp", v), wr(r, "sp", v)],
                            sets=flags("COUNT", r, v, c),
                            joins=[(r, "compute")] if v == 0 and "dispatch_after_route" not in leave_out else [])
            elif step == "wave" and w < plan.n_waves:
                if not solo:
                    done = [("DONE", r, w - 1, c)] if w > 0 else []
                    seg(f"step {w}", r, "compute", awaits=[] if "step_count" in leave_out else [("COUNT", r, w, c)], sets=done)
                l1_in = [rd(r, "xp", w), rd(r, "sp", w), rd(r, "meta")]
                if fusion == "wave":
                    seg(f"wave kernel {w}", r, "compute", l1_in + [wr(r, "y", w)])
                    continue
                if fusion == "none":
                    gemm(f"l1 {w}", r, l1_in + [wr(r, "hid", w)])
                    seg(f"swiglu_cast {w}", r, "compute", [rd(r, "hid", w), wr(r, "hq", w), wr(r, "hs", w)])
                else:
                    gemm(f"l1_swiglu {w}", r, l1_in + [wr(r, "hq", w), wr(r, "hs", w)])
                gemm(f"l2 {w}", r, [rd(r, "hq", w), rd(r, "hs", w), rd(r, "meta"), wr(r, "y", w)])
            elif step == "wave":
                if not solo:
                    seg("step (last DONE)", r, "compute", sets=[("DONE", r, w - 1, c)])
            elif solo:
                seg("finish", r, "compute", joins=[(r, "comm")])
            else:
                seg("gate", r, "compute", awaits=[] if "gate" in leave_out else [("DONE", s, v, c) for s in range(n) for v in waves],
                    joins=[(r, "comm")])
                seg("combine", r, "compute", [rd(s, name) for s in range(n) for name in ("y", "row_of")] + [wr(r, "out")])
        for r in range(n):
            seg("end", r, "caller", joins=[(r, "compute"), (r, "comm")])
    return segs


def check_layer_args(x, logits, w1, s1, w2, s2, cfg: MoEConfig, n_ranks: int, local: bool):
    """moe_layer's argument rules, with the names of mega_moe's arguments. ``local``: x and logits
    are one rank's tokens (group mode), else the whole batch."""
    for name, t in (("x", x), ("logits", logits), ("w1", w1), ("s1", s1), ("w2", w2), ("s2", s2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if w1.dim() != 3 or w1.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w1: expected e4m3 [E, 2I, H], got {w1.dtype} of shape {tuple(w1.shape)}")
    e, two_i, h = w1.shape
    if e != cfg.n_experts:
        raise ValueError(f"w1: expected {cfg.n_experts} experts (cfg.n_experts), got {e}")
    expect = {"s1": ((e, two_i // 128, h // 128), torch.float32, s1), "w2": ((e, h, two_i // 2), torch.float8_e4m3fn, w2),
              "s2": ((e, h // 128, two_i // 2 // 128), torch.float32, s2)}
    for name, (shape, dtype, t) in expect.items():
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype} of shape {shape}, got {t.dtype} of shape {tuple(t.shape)}")
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != h:
        raise ValueError(f"x: expected bf16 [T, {h}], got {x.dtype} of shape {tuple(x.shape)}")
    if logits.dtype != torch.float32 or tuple(logits.shape) != (x.shape[0], e):
        raise ValueError(f"logits: expected float32 [{x.shape[0]}, {e}], got {logits.dtype} of shape {tuple(logits.shape)}")
    if x.shape[0] == 0 and not local:
        raise ValueError("x: expected at least one token, got 0")
    if not 1 <= n_ranks <= K.PEERS or e % n_ranks:
        raise ValueError(f"n_ranks: expected 1 to {K.PEERS} ranks dividing {e} experts, got {n_ranks}")
    for name, t in (("x", x), ("logits", logits), ("w1", w1), ("s1", s1), ("w2", w2), ("s2", s2)):
        if t.device != w1.device or t.device.type != "cuda":
            raise ValueError(f"{name}: expected a tensor on w1's CUDA device, got one on {t.device} (w1 on {w1.device})")


class _Rank:
    """One rank's buffers: ``sym`` (peers read them: flags, xq, xs, ids, y, row_of) and local ones."""

    SYM = ("flags", "xq", "xs", "ids", "y", "row_of")

    def __init__(self, plan: MegaPlan, device, alloc):
        tr, h, k, rows = plan.tokens_per_rank, plan.hidden, plan.topk, plan.rows
        shapes = {"flags": ((K.FLAG_WORDS,), torch.int32), "xq": ((tr, h), torch.float8_e4m3fn),
                  "xs": ((tr, h // GROUP), torch.float32), "ids": ((tr, k), torch.int32),
                  "y": ((rows, h), torch.bfloat16), "row_of": ((plan.global_tokens, k), torch.int32)}
        self.sym = {name: alloc(name, shape, dtype) for name, (shape, dtype) in shapes.items()}
        # every rank's ids (``gather_ids``); one rank's own send buffer, which is all of them
        self.gids = self.sym["ids"] if plan.solo else torch.full((plan.global_tokens, k), -1, dtype=torch.int32, device=device)
        self.meta = metadata_buffers(self.gids, plan.n_experts, plan.n_ranks)
        self.meta["row_of"] = self.sym["row_of"]  # the metadata kernel writes the peers' row map in place
        self.xp = torch.empty(rows, h, dtype=torch.float8_e4m3fn, device=device)
        self.sp = torch.empty(rows, h // GROUP, dtype=torch.float32, device=device)
        self.waves = torch.arange(plan.n_waves, dtype=torch.int32, device=device)[:, None]
        self.l1_done = torch.zeros(rows // 128, dtype=torch.int32, device=device)  # fusion="wave": L1 tiles per row block


class MegaMoE:
    """A layer's state for one token count: plans, buffers, streams, compiled kernels.

    ``n_virtual_ranks=n`` runs all n ranks on this GPU; ``group=`` runs this process's rank of a
    process group (one GPU each). ``__call__`` has ``moe_layer``'s arguments.

    ``timeline``: set to ``{}`` before an eager call to get, per rank, CUDA events (timing
    enabled) at the dispatch's start and end (communication stream) and where wave 0 is ready
    (compute stream); ``bench/mega_moe.py`` reads the overlap of communication and compute from it."""

    timeline = None

    def __init__(self, w1, s1, w2, s2, cfg: MoEConfig, n_tokens: int, *, group=None, n_virtual_ranks: int | None = None,
                 waves: int | None = None, timeout_s: float = 5.0, fusion: str | None = None):
        if (group is None) == (n_virtual_ranks is None):
            raise ValueError("group / n_virtual_ranks: expected exactly one of them, got "
                             f"{'both' if group is not None else 'neither'}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s}")
        self.virtual = group is None
        n = n_virtual_ranks if self.virtual else group.size()
        if not isinstance(n, int) or not 1 <= n <= K.PEERS:
            raise ValueError(f"{'n_virtual_ranks' if self.virtual else 'group'}: expected 1 to {K.PEERS} ranks, got {n}")
        tr = rank_tokens(n_tokens, n, self.virtual)
        if fusion is None:
            fusion = default_fusion(n, tr)
        if fusion not in FUSIONS:
            raise ValueError(f"fusion: expected one of {FUSIONS}, got {fusion!r}")
        self.fusion = fusion
        e, two_i, h = w1.shape
        if e % n:
            raise ValueError(f"{'n_virtual_ranks' if self.virtual else 'group'}: expected a divisor of {e} experts, got {n}")
        device = w1.device
        sms = sm_count(device.index)
        self.plan = make_plan(n, tr, h, two_i // 2, e, cfg.topk, sms, waves, self.virtual,
                              narrow_everywhere(device.index))
        self.cfg, self.weights, self.n_tokens = cfg, (w1, s1, w2, s2), n_tokens
        self.timeout_ns = int(timeout_s * 1e9)
        self.timeout_s = timeout_s
        self.group = group
        self.failed = None
        if self.virtual:
            self.my_ranks = list(range(n))
            self.ranks = [_Rank(self.plan, device, self._local_alloc(device)) for _ in range(n)]
            self.peers = [{name: [rk.sym[name] for rk in self.ranks] for name in _Rank.SYM}] * n
        else:
            me = group.rank()
            self.my_ranks = [me]
            handles = {}
            rank = _Rank(self.plan, device, self._symmetric_alloc(device, group, handles))
            self.ranks = {me: rank}
            self.peers = {me: {name: [handles[name].get_buffer(p, tuple(t.shape), t.dtype) if p != me else t
                                      for p in range(n)] for name, t in rank.sym.items()}}
        for r in self.my_ranks:
            self.ranks[r].sym["flags"].zero_()
            self.ranks[r].sym["ids"].fill_(-1)
        self.streams = {r: (torch.cuda.Stream(device), torch.cuda.Stream(device)) for r in self.my_ranks}
        if not self.virtual:
            torch.cuda.synchronize(device)
            torch.distributed.barrier(group)  # every rank's flags are zero before anyone publishes
        self._kernels = self._build_kernels()

    @staticmethod
    def _local_alloc(device):
        return lambda name, shape, dtype: torch.empty(shape, dtype=dtype, device=device)

    @staticmethod
    def _symmetric_alloc(device, group, handles):
        from torch.distributed import _symmetric_memory as symm_mem

        def alloc(name, shape, dtype):
            t = symm_mem.empty(*shape, dtype=dtype, device=device)
            handles[name] = symm_mem.rendezvous(t, group)
            return t

        return alloc

    def _build_kernels(self) -> dict:
        """Every kernel the call launches, compiled before the first launch: a wait must never
        include a peer's compile time."""
        import importlib

        p = self.plan
        h = p.hidden
        kernels = {
            "announce": K.announce_kernel(), "exchange": K.exchange_kernel(p.n_ranks), "step": K.step_kernel(),
            "gate": K.gate_kernel(p.n_ranks, p.n_waves),
            "gather": K.gather_ids_kernel(p.n_ranks, p.topk),
            "dispatch": (permute_fp8_kernel(h, p.topk, zero_padding=False, trigger=True) if p.solo else
                         K.dispatch_kernel(p.n_ranks, h, p.topk, p.n_waves, p.wave_experts, p.n_local, p.dispatch_ctas)),
            "combine": K.combine_kernel(p.n_ranks, h, p.topk, p.n_local),
        }
        specs = compute_kernel_specs(p, self.cfg.clamp, self.fusion)
        for name, (module, factory, args, kwargs) in specs.items():
            kernels[name] = getattr(importlib.import_module(module), factory)(*args, **kwargs)
        # the wave GEMMs that take the wave's rows (and store those rows only)
        self._takes_rows = {name for name, spec in specs.items() if takes_rows(spec)}
        return kernels

    def _warm(self, x, logits):
        """Compile the reused kernels (gating, casts, metadata) on the caller's stream, outside the protocol."""
        from kernels.moe.gating import gating
        from kernels.quant.group_cast import per_token_group_cast, swiglu_cast

        cfg, p = self.cfg, self.plan
        gating(logits[:1], None, cfg.topk, cfg.score_func, cfg.n_groups, cfg.topk_groups, cfg.renormalize, cfg.routed_scaling)
        per_token_group_cast(x[:1], group=GROUP)
        if self.fusion == "none":
            swiglu_cast(torch.zeros(1, 2 * p.inter, dtype=torch.bfloat16, device=x.device), clamp=cfg.clamp, group=GROUP,
                        rows=torch.zeros(1, dtype=torch.int32, device=x.device))
        rk = self.ranks[self.my_ranks[0]]
        routing_metadata(rk.gids, p.n_experts, self.my_ranks[0], p.n_ranks, out=rk.meta)

    def _slots(self, r, name):
        """The PEERS tensor arguments of buffer ``name`` for rank r (unused slots: its own)."""
        bufs = self.peers[r][name]
        return bufs + [bufs[r]] * (K.PEERS - len(bufs))

    def token_range(self, r) -> range:
        tr = self.plan.tokens_per_rank
        return range(min(r * tr, self.n_tokens), min((r + 1) * tr, self.n_tokens)) if self.virtual else range(self.n_tokens)

    def __call__(self, x, logits, bias=None, *, out=None, check: bool = True, launch_only=None):
        """``out``: bf16 [T, H] to write (else allocated). ``launch_only``: fault injection for
        tests: launch only these ranks' kernels (virtual ranks); the others never arrive, and the
        launched ones must time out naming them."""
        if self.failed:
            raise RuntimeError(f"MegaMoE: this layer failed earlier ({self.failed}); build a new one")
        w1, s1, w2, s2 = self.weights
        check_layer_args(x, logits, w1, s1, w2, s2, self.cfg, self.plan.n_ranks, not self.virtual)
        if x.shape[0] != self.n_tokens:
            raise ValueError(f"x: expected {self.n_tokens} tokens (this layer's plan), got {x.shape[0]}")
        capturing = torch.cuda.is_current_stream_capturing()
        if not getattr(self, "_warmed", False):
            if capturing:
                raise RuntimeError("MegaMoE: call the layer once before capturing it (kernels compile on the first call)")
            self._warm(x, logits)
            self._warmed = True
        if out is None:
            out = torch.empty_like(x)
        elif out.dtype != torch.bfloat16 or out.shape != x.shape or not out.is_contiguous() or out.device != x.device:
            raise ValueError(f"out: expected a contiguous bf16 tensor of shape {tuple(x.shape)} on {x.device}, got "
                             f"{out.dtype} of shape {tuple(out.shape)} on {out.device}")
        caller = torch.cuda.current_stream()
        for r in self.my_ranks:
            for s in self.streams[r]:
                s.wait_stream(caller)
        ranks = self.my_ranks if launch_only is None else [r for r in self.my_ranks if r in launch_only]
        state = {r: {} for r in ranks}
        for step, r, w in launch_order(self.plan, ranks):
            if step == "publish":
                self._publish(r, x, logits, bias, state[r])
            elif step == "route":
                self._route(r, state[r])
            elif step == "wave":
                self._wave(r, w, state[r])
            else:
                self._finish(r, out, state[r])
        for r in ranks:
            for s in self.streams[r]:
                caller.wait_stream(s)
        if check and not capturing:
            self.check()
        return out

    def _publish(self, r, x, logits, bias, st):
        from kernels.moe.gating import gating
        from kernels.quant.group_cast import per_token_group_cast

        cfg, rk = self.cfg, self.ranks[r]
        toks = self.token_range(r)
        with torch.cuda.stream(self.streams[r][0]):
            if len(toks):
                sl = slice(toks.start, toks.stop)
                n = len(toks)
                # straight into the send buffers' first n rows (the rest keep ids -1)
                ids, weights = gating(logits[sl], bias, cfg.topk, cfg.score_func, cfg.n_groups, cfg.topk_groups,
                                      cfg.renormalize, cfg.routed_scaling,
                                      out=(rk.sym["ids"][:n], torch.empty(n, cfg.topk, device=x.device)))
                per_token_group_cast(x[sl], group=GROUP, out=(rk.sym["xq"][:n], rk.sym["xs"][:n]))
                st["ids"], st["weights"] = ids, weights
            if not self.plan.solo:
                self._kernels["announce"].launch(rk.sym["flags"])

    def _route(self, r, st):
        p, rk, k = self.plan, self.ranks[r], self._kernels
        compute, comm = self.streams[r]
        with torch.cuda.stream(compute):
            dev = rk.xp.device
            if self.fusion == "none":
                st["hid"] = torch.empty(p.rows, 2 * p.inter, dtype=torch.bfloat16, device=dev)
            else:  # the L2 input that the fused L1 writes wave by wave
                if self.fusion == "wave":
                    rk.l1_done.zero_()  # each row block belongs to one wave: counted once per call
                st["hq"] = torch.empty(p.rows, p.inter, dtype=torch.float8_e4m3fn, device=dev)
                st["hs"] = torch.empty(p.rows, p.inter // GROUP, dtype=torch.float32, device=dev)
            if not p.solo:
                k["exchange"].launch(*self._slots(r, "flags"), rk.sym["flags"], r, self.timeout_ns)
                k["gather"].launch(*self._slots(r, "ids"), rk.gids)
            meta = routing_metadata(rk.gids, p.n_experts, r, p.n_ranks, out=rk.meta)  # row_of: into sym["row_of"]
            be = meta["block_expert"]
            # per wave: its blocks' experts (-1 elsewhere) and, for the unfused SwiGLU cast and the
            # row-masked GEMMs, its rows
            if p.n_waves == 1:
                rk.block_waves, rk.row_waves = be[None], meta["entry_of_row"][None]
            else:
                wave_of_block = torch.div(be, p.wave_experts, rounding_mode="floor")  # -1 stays -1
                mine = wave_of_block[None] == rk.waves
                rk.block_waves = torch.where(mine, be[None], -1)
                if self.fusion == "none" or self._takes_rows:
                    rk.row_waves = torch.where(mine.repeat_interleave(128, dim=1), meta["entry_of_row"][None], -1)
        comm.wait_stream(compute)
        with torch.cuda.stream(compute if p.solo else comm):
            self._mark(r, "dispatch_start")
            if p.solo:  # every wave's rows at once, from the rank's own send buffers
                k["dispatch"].launch(rk.sym["xq"], rk.sym["xs"], meta["row_of"], meta["entry_of_row"], meta["offsets"],
                                     rk.xp, rk.sp)
            else:
                k["dispatch"].launch(*self._slots(r, "xq"), *self._slots(r, "xs"), rk.sym["flags"], meta["entry_of_row"],
                                     meta["offsets"], rk.xp, rk.sp)
            self._mark(r, "dispatch_end")

    def _wave(self, r, w, st):
        from kernels.quant.group_cast import swiglu_cast

        p, rk, k = self.plan, self.ranks[r], self._kernels
        w1, s1, w2, s2 = self.weights
        mine = slice(r * p.n_local, (r + 1) * p.n_local)
        with torch.cuda.stream(self.streams[r][0]):
            if w == p.n_waves:  # the last wave's L2 rows are written: release its DONE
                if not p.solo:
                    k["step"].launch(rk.sym["flags"], w - 1, -1, p.dispatch_ctas, r, self.timeout_ns)
                return
            if not p.solo:
                k["step"].launch(rk.sym["flags"], w - 1, w, p.dispatch_ctas, r, self.timeout_ns)
            if w == 0:
                self._mark(r, "wave0_ready")
            if self.fusion == "wave":
                hq, hs = st["hq"], st["hs"]
                k["wave"].launch(rk.xp, rk.sp, w1[mine], s1[mine], rk.block_waves[w], hq, hs, hq, w2[mine], s2[mine],
                                 rk.sym["y"], rk.l1_done, rk.sym["flags"], r, w, self.timeout_ns)
                return
            if self.fusion == "none":
                k["l1"].launch(rk.xp, rk.sp, w1[mine], s1[mine], rk.block_waves[w], *self._rows(rk, w, "l1"), st["hid"])
                hq, hs = swiglu_cast(st["hid"], clamp=self.cfg.clamp, group=GROUP, rows=rk.row_waves[w])
            else:
                hq, hs = st["hq"], st["hs"]
                k["l1"].launch(rk.xp, rk.sp, w1[mine], s1[mine], rk.block_waves[w], *self._rows(rk, w, "l1"), hq, hs)
            k["l2"].launch(hq, hs, w2[mine], s2[mine], rk.block_waves[w], *self._rows(rk, w, "l2"), rk.sym["y"])

    def _rows(self, rk, w, gemm: str) -> tuple:
        """The wave's row mask as ``gemm``'s ``rows`` argument, where it takes one (the 128-wide
        tiles, the decode kernel)."""
        return (rk.row_waves[w],) if gemm in self._takes_rows else ()

    def _finish(self, r, out, st):
        p, rk, k = self.plan, self.ranks[r], self._kernels
        compute = self.streams[r][0]
        compute.wait_stream(self.streams[r][1])  # the dispatch has finished (it did, or DONE could not be set)
        toks = self.token_range(r)
        with torch.cuda.stream(compute):
            if not p.solo:
                k["gate"].launch(*self._slots(r, "flags"), rk.sym["flags"], r, self.timeout_ns)
            if len(toks):
                dst = out[toks.start:toks.stop] if self.virtual else out
                k["combine"].launch(*self._slots(r, "y"), *self._slots(r, "row_of"), st["ids"], st["weights"], dst,
                                    r * p.tokens_per_rank)

    def _mark(self, r, name):
        """Record event ``name`` of rank r on the current stream when a timeline is requested."""
        if self.timeline is not None and not torch.cuda.is_current_stream_capturing():
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.timeline.setdefault(r, {})[name] = ev

    def status(self) -> dict:
        """rank -> (code, rank, wave, peer) of its first failed wait in the last call (code 0: none); syncs."""
        words = torch.stack([self.ranks[r].sym["flags"][K.STATUS:K.STATUS + 4] for r in self.my_ranks]).cpu().tolist()
        return dict(zip(self.my_ranks, map(tuple, words)))

    def check(self):
        """Raise ``MegaMoETimeout`` if a wait of the last call gave up (the first failing rank's record)."""
        for r, (code, rank, wave, peer) in self.status().items():
            if code:
                self.failed = failure_message(code, rank, wave, peer, self.timeout_s)
                raise MegaMoETimeout(self.failed)


_LAYERS: dict = {}


def mega_moe(x, logits, w1, s1, w2, s2, cfg: MoEConfig, bias=None, *, group=None, n_virtual_ranks: int | None = None,
             waves: int | None = None, timeout_s: float = 5.0, out=None, check: bool = True,
             fusion: str | None = None):
    """``moe_layer``'s routed experts, expert-parallel over ``n_virtual_ranks`` ranks on this GPU or
    over ``group`` (one GPU per rank; x, logits and the result are this rank's tokens); bitwise equal
    to ``moe_layer(x, logits, w1, s1, w2, s2, cfg, bias, n_ranks=n)`` on the same (gathered) tokens.

    ``fusion``: ``"l1_swiglu"`` (L1 and the SwiGLU cast in one kernel per wave), ``"wave"`` (L1,
    SwiGLU cast and L2 in one kernel per wave) or ``"none"`` (the unfused wave: L1, SwiGLU cast, L2
    as three launches); None: ``default_fusion(n, tokens)``; the same bits every way (module docstring).
    The layer state (buffers, streams, kernels) is kept per weights, token count, ranks, waves and
    fusion; ``check`` reads the ranks' status words after the call (one host sync) and raises
    ``MegaMoETimeout`` if a rank timed out; it is skipped under CUDA-graph capture (call
    ``layer_for(...).check()`` after a replay)."""
    if (group is None) == (n_virtual_ranks is None):
        raise ValueError("group / n_virtual_ranks: expected exactly one of them, got "
                         f"{'both' if group is not None else 'neither'}")
    n = n_virtual_ranks if group is None else group.size()
    if not isinstance(n, int) or isinstance(n, bool):
        raise ValueError(f"n_virtual_ranks: expected an int, got {type(n).__name__}")
    if fusion is not None and fusion not in FUSIONS:  # None: layer_for takes default_fusion
        raise ValueError(f"fusion: expected one of {FUSIONS}, got {fusion!r}")
    check_layer_args(x, logits, w1, s1, w2, s2, cfg, n, group is not None)
    layer = layer_for(x, w1, s1, w2, s2, cfg, group=group, n_virtual_ranks=n_virtual_ranks, waves=waves,
                      timeout_s=timeout_s, fusion=fusion)
    return layer(x, logits, bias, out=out, check=check)


def layer_for(x, w1, s1, w2, s2, cfg: MoEConfig, *, group=None, n_virtual_ranks=None, waves=None, timeout_s=5.0,
              fusion=None):
    """The cached ``MegaMoE`` that ``mega_moe`` uses for these arguments (``fusion`` None: the rank
    and token counts' ``default_fusion``, as ``mega_moe`` resolves it)."""
    n = n_virtual_ranks if group is None else group.size()
    if fusion is None and (group is None) != (n_virtual_ranks is None) and isinstance(n, int) and n >= 1:
        tokens = x.shape[0] if isinstance(x, torch.Tensor) else 0  # else MegaMoE names the bad argument
        fusion = default_fusion(n, rank_tokens(tokens, n, group is None))
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D bf16 tensor, got {getattr(x, 'shape', type(x))}")
    if not isinstance(w1, torch.Tensor) or w1.dim() != 3:
        raise ValueError(f"w1: expected e4m3 [E, 2I, H], got {getattr(w1, 'shape', type(w1))}")
    key = (tuple(t.data_ptr() for t in (w1, s1, w2, s2)), tuple(w1.shape), x.shape[0], cfg, id(group), n_virtual_ranks,
           waves, timeout_s, fusion)
    layer = _LAYERS.get(key)
    if layer is None or layer.failed:
        if len(_LAYERS) >= 8:
            _LAYERS.pop(next(iter(_LAYERS)))
        layer = _LAYERS[key] = MegaMoE(w1, s1, w2, s2, cfg, x.shape[0], group=group, n_virtual_ranks=n_virtual_ranks,
                                       waves=waves, timeout_s=timeout_s, fusion=fusion)
    return layer
