"""The MoE's weight-bound GEMMs at decode sizes: the weights-on-M decode kernel against the persistent routed-row kernel.

Two parts, side by side in one run, on the GPU:

* ``gemm``: per model, T and GEMM (L1: N = 2I, K = H; L2: N = H, K = I), the contiguous layout of
  a random routing (distinct experts a token, as gating gives), random e4m3 rows and the model's
  random weights (``random_layer``): the persistent 128-wide routed-row kernel
  (``grouped_gemm_contiguous_kernel(row_mask=True)``, the layer's GEMM before) and each decode
  configuration (``grouped_gemm_decode_kernel``: block_n, K blocks a stage, stages), every output's
  routed rows compared bit for bit with the persistent kernel's first, then timed in turn
  (``interleaved_ms``, queued: the GPU's time). The rate is the active experts' weight bytes (e4m3
  and block scales) over the time, and its share of the 2 GiB copy's rate (read + write) in the
  same run.
* ``layer``: ``moe_layer`` as two CUDA graphs, with ``grouped_gemm_decode.decode_width`` taking the
  decode kernel at every T up to 64 (the default rule stops at ``DEFAULT_MAX_TOKENS``; with
  ``--layer-width W`` at every T, W rows a pass, an expert's further rows in further passes) and
  returning None (the persistent kernel), outputs compared bit for bit, replays timed in turn.

    python3 bench/decode_gemm.py [--tokens 8,64] [--layer-tokens 1,8,16,64] [--layer-width W] [--configs 128:2:3,64:2:4]
                                 [--reps 20] [--out FILE] [--precompile]
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = []
CONFIGS = "128:2:3,128:1:6,64:2:4,64:4:3"  # block_n:group:num_stages (2-3 CTAs a SM where smem allows)


def parse_configs(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in c.split(":")) for c in text.split(",") if c]


def models():
    from kernels.moe.pipeline import V4_FLASH, V4_PRO

    return {"V4-Flash": V4_FLASH, "V4-Pro": V4_PRO}


def gemm_shapes(model: dict) -> dict:
    """name -> (N, K) of the two GEMMs."""
    h, i = model["hidden"], model["inter"]
    return {"L1": (2 * i, h), "L2": (h, i)}


def kernel_specs(names: list[str], tokens: list[int], configs, layer_tokens: list[int], layer_width: int | None) -> list:
    """(module, factory, args, kwargs) of every kernel of the run (``--precompile`` builds them here,
    the device's cache serves them there)."""
    from kernels.moe.grouped_gemm_decode import one_chunk, width_for as width

    specs = []
    for name in names:
        model = models()[name]
        for n, k in gemm_shapes(model).values():
            specs.append(("kernels.moe.grouped_gemm", "grouped_gemm_contiguous_kernel", (n, k),
                          {"num_sms": 132, "block_n": 128, "row_mask": True}))
            for t in tokens if name == "V4-Flash" else tokens[:1]:
                for block_n, group, stages in configs:
                    specs.append(("kernels.moe.grouped_gemm_decode", "grouped_gemm_decode_kernel", (n, k, width(t)),
                                  {"block_n": block_n, "group": group, "num_stages": stages, "bounded": True}))
            for t in layer_tokens if name == "V4-Flash" else [8]:
                w = layer_width or width(t)
                specs.append(("kernels.moe.grouped_gemm_decode", "grouped_gemm_decode_kernel", (n, k, w),
                              {"bounded": one_chunk(t, w)}))
    return list({repr(s): s for s in specs}.values())


def routing(t: int, model: dict, seed: int):
    """(ids [T, k] int32 of distinct experts, its metadata) for a random routing."""
    import torch

    from kernels.moe.metadata import routing_metadata

    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(t, model["n_experts"], device="cuda", generator=g)
    ids = logits.topk(model["cfg"].topk, dim=1).indices.to(torch.int32)
    return ids, routing_metadata(ids, model["n_experts"], 0, 1)


def gemm_rows(name: str, model: dict, weights, t: int, configs, copy_gbs: float, reps: int) -> None:
    import torch

    from bench.timing import interleaved_ms
    from kernels.moe.grouped_gemm import grouped_gemm_contiguous_kernel, persistent_ctas
    from kernels.moe.grouped_gemm_decode import grouped_gemm_decode_kernel, width_for

    ids, meta = routing(t, model, seed=t)
    rows = meta["entry_of_row"]
    r = rows.shape[0]
    live = rows >= 0
    active = int(torch.unique(ids).numel())
    for gemm, (n, k), (w, s) in zip(("L1", "L2"), gemm_shapes(model).values(), (weights[:2], weights[2:])):
        g = torch.Generator(device="cuda").manual_seed(7 + t)
        a = (torch.randn(r, k, device="cuda", generator=g) * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
        sa = torch.rand(r, k // 128, device="cuda", generator=g) + 0.5
        args = (a, sa, w, s, meta["block_expert"], rows)
        fns, outs = {}, {}
        old = grouped_gemm_contiguous_kernel(n, k, num_sms=persistent_ctas(0), block_n=128, row_mask=True)
        outs["persistent 128"] = torch.full((r, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        fns["persistent 128"] = lambda o=outs["persistent 128"]: old.launch(*args, o)
        for block_n, group, stages in configs:
            key = f"decode {block_n}:{group}:{stages}"
            kern = grouped_gemm_decode_kernel(n, k, width_for(t), block_n=block_n, group=group, num_stages=stages,
                                              bounded=True)
            outs[key] = torch.full((r, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fns[key] = lambda o=outs[key], kern=kern: kern.launch(*args, o)
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        ref = outs["persistent 128"][live].view(torch.int16)
        for key, o in outs.items():
            if not torch.equal(o[live].view(torch.int16), ref):
                raise SystemExit(f"{name} T={t} {gemm} {key}: routed rows differ from the persistent kernel's")
            if not torch.isnan(o[~live].float()).all():
                raise SystemExit(f"{name} T={t} {gemm} {key}: a padding row was written")
        ms = interleaved_ms(fns, reps, queued=True)
        moved = active * (n * k + (n // 128) * (k // 128) * 4)
        for key, v in ms.items():
            gbs = moved / (v * 1e6)
            print(f"| {name} | {t} | {gemm} | {key} | {v * 1e3:.1f} | {gbs:.0f} | {gbs / copy_gbs:.1%} | bit for bit |",
                  flush=True)
            ROWS.append(dict(part="gemm", model=name, T=t, gemm=gemm, kernel=key, us=v * 1e3, gbs=gbs,
                             of_copy=gbs / copy_gbs, active=active))


def layer_rows(name: str, model: dict, weights, t: int, reps: int, width: int | None) -> None:
    import torch

    import kernels.moe.grouped_gemm_decode as D
    from bench.mega_moe import captured
    from bench.timing import interleaved_ms
    from kernels.moe.pipeline import moe_layer

    cfg = model["cfg"]
    g = torch.Generator(device="cuda").manual_seed(100 + t)
    x = torch.randn(t, model["hidden"], device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(t, model["n_experts"], device="cuda", generator=g)
    rule = D.decode_width
    # the decode kernel up to 64 tokens whatever the default rule, or at ``width`` rows a pass at every T
    forced = (lambda tokens: width) if width else D.width_for
    graphs, outs = {}, {}
    try:
        for key, choose in (("decode", forced), ("persistent 128", lambda tokens: None)):
            D.decode_width = choose
            moe_layer(x, logits, *weights, cfg)  # compiles and warms outside the capture
            graphs[key], outs[key] = captured(lambda: moe_layer(x, logits, *weights, cfg))
            graphs[key].replay()
    finally:
        D.decode_width = rule
    torch.cuda.synchronize()
    if not torch.equal(outs["decode"].view(torch.int16), outs["persistent 128"].view(torch.int16)):
        raise SystemExit(f"{name} T={t}: the layer's bits differ between the two GEMMs")
    ms = interleaved_ms({k: v.replay for k, v in graphs.items()}, reps)
    dec, old = ms["decode"] * 1e3, ms["persistent 128"] * 1e3
    w = forced(t)
    print(f"| {name} | {t} | layer | decode ({w} rows a pass) {dec:.1f} us, persistent {old:.1f} us | {old / dec:.3f}x | | | "
          "bit for bit |", flush=True)
    ROWS.append(dict(part="layer", model=name, T=t, width=w, decode_us=dec, persistent_us=old))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8,64", help="T of the GEMM rows (V4-Pro: the first only)")
    ap.add_argument("--layer-tokens", default="1,8,16,64", help="T of the layer rows ('' for none)")
    ap.add_argument("--layer-width", type=int, help="the layer rows' decode width at every T (default: the smallest that holds T)")
    ap.add_argument("--configs", default=CONFIGS, help="decode configurations block_n:group:num_stages, comma-separated")
    ap.add_argument("--models", default="V4-Flash,V4-Pro")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--precompile", action="store_true", help="build every kernel of the run (no GPU needed), then exit")
    args = ap.parse_args()
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    configs = parse_configs(args.configs)
    if args.precompile:
        from bench.precompile import build_spec, compile_in_processes

        compile_in_processes(build_spec, kernel_specs(args.models.split(","), ints(args.tokens), configs, ints(args.layer_tokens),
                                          args.layer_width),
                             os.cpu_count() or 1)
        return
    import torch

    from bench.timing import large_copy_ms
    from kernels.moe.reference import random_layer

    if not torch.cuda.is_available():
        sys.exit("bench/decode_gemm.py needs a CUDA GPU")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a timeout still writes --out
    copy_ms, copy_bytes = large_copy_ms(args.reps)
    copy_gbs = copy_bytes / (copy_ms * 1e6)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, copy {copy_gbs:.0f} GB/s")
    print("| model | T | GEMM | kernel | us | weight GB/s | of copy | outputs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    try:
        for name in args.models.split(","):
            model = models()[name]
            weights = random_layer(model, seed=1)
            for t in ints(args.tokens) if name == "V4-Flash" else ints(args.tokens)[:1]:
                gemm_rows(name, model, weights, t, configs, copy_gbs, args.reps)
            for t in ints(args.layer_tokens) if name == "V4-Flash" else [8]:
                layer_rows(name, model, weights, t, args.reps, args.layer_width)
            del weights
            torch.cuda.empty_cache()
    finally:
        if args.out:
            Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "copy_gbs": copy_gbs,
                                                  "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
