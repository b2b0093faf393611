#!/usr/bin/env python3
"""Benchmark: the Triton sparse-MLA kernel on an fp8_ds_mla cache vs a bf16 cache.

Same kernel (sparse_mla_fwd of the tree in SMLA_TREE, heuristic launch
config), same query, same top-k slots, same latent rows, in the same run:
  bf16      the 16-bit cache, [blocks, 64, 576] bf16 (1152 B per row)
  fp8       the fp8_ds_mla cache, [blocks, 64, 656] uint8, default decode
            (hardware e4m3 conversion on sm89+)
  fp8-sw    the same cache, software decode forced (fp8_hw=False): the code
            path sm80/86 run
  copy      floor measured in the same run: a 1 GiB device-to-device copy,
            bandwidth = (bytes read + bytes written) / time
Bytes actually read, per cell: every gathered row once per token (656 B fp8,
1152 B bf16; all slots valid, uniform random over the cache) + q (H x 576 x
2 B) + out (H x 512 x 2 B).  "% copy" = (bytes / time) / copy bandwidth.
Targets (issue 14, H200): at <= 16 heads and >= 1024 tokens fp8 >= 85% of
copy bandwidth (about 1.7x bf16); at 64/128 heads fp8 no slower than bf16.
Timing: triton.testing.do_bench (CUDA events, L2 flushed, median).  Cache:
4096 blocks x 64 slots (262144 rows: 302 MB bf16, 172 MB fp8; both above the
H200's L2), latent rows with per-tile magnitudes 2**-3..2**3, written by the
reference writer (tests/fp8_ds_mla_reference.py; byte-identical layout to
vLLM's concat_and_cache_mla, checked by tests/gpu/test_fp8_kv_gpu.py).  Each
cell's three outputs are checked against the float64 reference on up to 8
tokens (bf16 bound 5e-3 as the GPU tests).

  python bench/bench_fp8_kv.py [--quick] [--out DIR] [--prewarm N] [--sweep]
  --prewarm N: first run every launch configuration of the bench and of
  tests/gpu/test_fp8_kv_gpu.py once in N processes (fills Triton's cache)
  --prewarm-only: stop after that.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

R, P, ROW, BS = 512, 64, 656, 64
SCALE = 192 ** -0.5
NUM_BLOCKS = 4096
BOUND = 5e-3
HEADS = [8, 16, 64, 128]
TOKENS = [1, 64, 1024, 4096]
TOPK = 2048
VARIANTS = ("bf16", "fp8", "fp8-sw")
# --sweep: other launch configs of the fp8 path on a few cells (tuning data;
# BLOCK_H and the split count stay the heuristic's).
SWEEP_CELLS = [(16, 4096), (64, 4096), (128, 1024)]
SWEEP_CFGS = [dict(BLOCK_N=n, num_warps=w, num_stages=st)
              for n, w, st in ((16, 4, 2), (32, 4, 2), (32, 4, 3), (32, 8, 2), (64, 4, 2),
                               (64, 8, 2), (64, 8, 3))]


def _line_tree(repo: Path) -> Path:
    """The work tree of the line under test, as tests/conftest.py: $SMLA_LINE, else the newest line."""
    lines = sorted((p.parent.name for p in (repo / "lines").glob("*/vllm-pin.txt")),
                   key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))
    return repo / "work" / (os.environ.get("SMLA_LINE") or lines[-1]) / "vllm"


def tree_path() -> Path:
    return Path(os.environ.get("SMLA_TREE") or _line_tree(REPO))  # as tests/conftest.py


def load_ours():
    from sparse_mla_reference import load_sparse_mla_module

    return load_sparse_mla_module(tree_path(), interpret=False)


def call(ours, variant, q, kv, slots, config=None):
    if variant == "bf16":
        return ours.sparse_mla_fwd(q, kv, slots, SCALE, config=config)
    return ours.sparse_mla_fwd(q, kv, slots, SCALE, kv_cache_dtype="fp8_ds_mla",
                               fp8_hw=None if variant == "fp8" else False, config=config)


def cells(args):
    return [(h, t) for h in args.heads for t in args.tokens]


def prewarm_calls(args):
    """(variant, dtype, H, T, K) of every launch the bench and the GPU test make."""
    import torch

    out = [(v, torch.bfloat16, h, t, TOPK, None) for h, t in cells(args) for v in VARIANTS]
    if args.sweep:
        out += [("fp8", torch.bfloat16, h, t, TOPK, json.dumps(c, sort_keys=True))
                for h, t in SWEEP_CELLS for c in SWEEP_CFGS]
    try:
        import test_fp8_kv_gpu as G

        for dt, h, k, t in G.KERNEL_CASES:
            out += [("fp8", dt, h, t, k, None), ("fp8-sw", dt, h, t, k, None)]
        out += [("fp8", torch.bfloat16, 64, 4, 2048, None),
                ("fp8", torch.bfloat16, 64, 16, 2048, None),
                ("bf16", torch.bfloat16, 64, 16, 2048, None)]
    except ImportError as e:  # pytest missing: bench cells only
        print("prewarm: GPU test cases not loaded:", e, flush=True)
    return sorted(set(out), key=str)


def worker(args, i, n):
    import torch

    ours = load_ours()
    todo = prewarm_calls(args)[i::n]
    for variant, dt, h, t, k, cfg in todo:
        nb = 8
        if variant == "bf16":
            kv = torch.zeros((nb, BS, R + P), dtype=dt, device="cuda")
        else:
            kv = torch.zeros((nb, BS, ROW), dtype=torch.uint8, device="cuda")
        q = torch.zeros((t, h, R + P), dtype=dt, device="cuda")
        slots = torch.zeros((t, k), dtype=torch.int32, device="cuda")
        try:
            call(ours, variant, q, kv, slots, json.loads(cfg) if cfg else None)
        except Exception as e:  # a sweep config that does not fit this kernel
            if type(e).__name__ != "OutOfResources":
                raise
    torch.cuda.synchronize()


def prewarm(args):
    t0 = time.time()
    base = [sys.executable, __file__, *[a for a in sys.argv[1:] if a != "--prewarm-only"]]
    procs = [subprocess.Popen(base + ["--worker", f"{i}/{args.prewarm}"])
             for i in range(args.prewarm)]
    rcs = [p.wait() for p in procs]
    print(f"prewarm: {args.prewarm} workers, {len(prewarm_calls(args))} launches, rc {rcs}, "
          f"{time.time() - t0:.1f} s", flush=True)


def copy_bandwidth():
    import torch
    from triton.testing import do_bench

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    del a, b
    return 2 * n / (ms * 1e-3)


def env_stamp():
    import torch
    import triton

    p = torch.cuda.get_device_properties(0)
    return dict(gpu=torch.cuda.get_device_name(0), sms=p.multi_processor_count,
                capability=f"{p.major}.{p.minor}", torch=torch.__version__,
                cuda=torch.version.cuda, triton=triton.__version__,
                command="python bench/bench_fp8_kv.py " + " ".join(sys.argv[1:]),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def main_run(args):
    import torch
    from triton.testing import do_bench

    from fp8_ds_mla_reference import dequant_ds_mla, latent_like_values, quantize_ds_mla
    from sparse_mla_reference import reference_sparse_mla, rel_err

    ours = load_ours()
    res = {"env": env_stamp()}
    copy_bw = copy_bandwidth()
    res["copy_bw"] = copy_bw
    print(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s", flush=True)
    g = torch.Generator(device="cuda").manual_seed(1234)
    n = NUM_BLOCKS * BS
    kv_c = latent_like_values(n, R, torch.bfloat16, g, device="cuda")
    k_pe = torch.randn(n, P, device="cuda", generator=g).to(torch.bfloat16)
    kv16 = torch.cat([kv_c, k_pe], dim=-1).view(NUM_BLOCKS, BS, R + P)
    kv8 = quantize_ds_mla(kv_c, k_pe).view(NUM_BLOCKS, BS, ROW)
    del kv_c, k_pe
    deq = None
    rows = []
    for h, t in cells(args):
        q = (torch.randn(t, h, R + P, device="cuda", generator=g) * 0.25).to(torch.bfloat16)
        # uniform random slots (a row repeats ~8 of its 2048 by chance; the
        # kernel reads repeats again, so the byte count below stays exact)
        slots = torch.randint(0, n, (t, TOPK), device="cuda", generator=g, dtype=torch.int32)
        n_rows = t * TOPK
        row = dict(heads=h, tokens=t, topk=TOPK,
                   splits=ours._plan(torch.bfloat16, q.device, t, h, TOPK, R, None, None)[1])
        kvs = {"bf16": kv16, "fp8": kv8, "fp8-sw": kv8}
        row_bytes = {"bf16": (R + P) * 2, "fp8": ROW, "fp8-sw": ROW}
        for v in VARIANTS:
            ms = do_bench(lambda: call(ours, v, q, kvs[v], slots), warmup=10, rep=args.rep_ms,
                          return_mode="median")
            nbytes = n_rows * row_bytes[v] + t * h * (R + P) * 2 + t * h * R * 2
            row[v] = dict(us=ms * 1e3, bytes=nbytes, bw=nbytes / (ms * 1e-3),
                          pct_copy=100 * nbytes / (ms * 1e-3) / copy_bw)
        # correctness on up to 8 tokens
        tc = min(t, 8)
        if deq is None:
            deq = dequant_ds_mla(kv8.view(-1, ROW), torch.bfloat16)
        ref8 = reference_sparse_mla(q[:tc], deq, slots[:tc], SCALE, token_chunk=4)
        ref16 = reference_sparse_mla(q[:tc], kv16.view(-1, R + P), slots[:tc], SCALE,
                                     token_chunk=4)
        for v in VARIANTS:
            o = call(ours, v, q[:tc], kvs[v], slots[:tc])
            err = rel_err(o, ref16 if v == "bf16" else ref8)
            row[v]["rel_err"] = err
            row[v]["ok"] = err < BOUND
        row["speedup_fp8"] = row["bf16"]["us"] / row["fp8"]["us"]
        row["speedup_fp8_sw"] = row["bf16"]["us"] / row["fp8-sw"]["us"]
        rows.append(row)
        print(f"H{h:4d} T{t:5d} bf16 {row['bf16']['us']:9.1f} us ({row['bf16']['pct_copy']:5.1f}%)"
              f"  fp8 {row['fp8']['us']:9.1f} us ({row['fp8']['pct_copy']:5.1f}%)"
              f"  fp8-sw {row['fp8-sw']['us']:9.1f} us  x{row['speedup_fp8']:.2f}"
              f"  ok {all(row[v]['ok'] for v in VARIANTS)}", flush=True)
    res["cells"] = rows
    if args.sweep:
        res["sweep"] = []
        for h, t in SWEEP_CELLS:
            q = (torch.randn(t, h, R + P, device="cuda", generator=g) * 0.25).to(torch.bfloat16)
            slots = torch.randint(0, n, (t, TOPK), device="cuda", generator=g, dtype=torch.int32)
            for c in SWEEP_CFGS:
                try:
                    ms = do_bench(lambda: call(ours, "fp8", q, kv8, slots, c), warmup=10,
                                  rep=args.rep_ms / 2, return_mode="median")
                except Exception as e:
                    if type(e).__name__ != "OutOfResources":
                        raise
                    res["sweep"].append(dict(heads=h, tokens=t, **c, error=str(e)[:200]))
                    print(f"sweep H{h} T{t} {c}: does not fit ({str(e)[:80]})", flush=True)
                    continue
                nbytes = t * TOPK * ROW + t * h * (R + P) * 2 + t * h * R * 2
                res["sweep"].append(dict(heads=h, tokens=t, **c, us=ms * 1e3,
                                         pct_copy=100 * nbytes / (ms * 1e-3) / copy_bw))
                print(f"sweep H{h} T{t} {c}: {ms * 1e3:.1f} us", flush=True)
    return res


def write(res, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    e = res["env"]
    lines = [f"# fp8_ds_mla vs bf16 cache: {e['gpu']} ({e['sms']} SMs), torch {e['torch']}, "
             f"Triton {e['triton']}, {e['date']}", "",
             f"`{e['command']}`; copy bandwidth (read + write) "
             f"{res['copy_bw'] / 1e12:.3f} TB/s; top-k {TOPK}; times in us (median).", "",
             "| heads | tokens | splits | bf16 us | bf16 % copy | fp8 us | fp8 % copy | "
             "fp8-sw us | fp8 speed-up | fp8-sw speed-up | errors ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["cells"]:
        ok = all(r[v]["ok"] for v in VARIANTS)
        lines.append(
            f"| {r['heads']} | {r['tokens']} | {r['splits']} | {r['bf16']['us']:.1f} | "
            f"{r['bf16']['pct_copy']:.1f} | {r['fp8']['us']:.1f} | {r['fp8']['pct_copy']:.1f} | "
            f"{r['fp8-sw']['us']:.1f} | {r['speedup_fp8']:.2f} | {r['speedup_fp8_sw']:.2f} | "
            f"{'yes' if ok else 'NO'} |")
    lines += ["", "Targets (issue 14): <=16 heads and >=1024 tokens: fp8 >= 85% of copy "
              "bandwidth; 64/128 heads: fp8 speed-up >= 1.0.", ""]
    for r in res["cells"]:
        if r["heads"] <= 16 and r["tokens"] >= 1024:
            met = r["fp8"]["pct_copy"] >= 85
            lines.append(f"- H{r['heads']} T{r['tokens']}: fp8 {r['fp8']['pct_copy']:.1f}% of copy "
                         f"-> {'met' if met else 'NOT met'}")
        if r["heads"] >= 64:
            met = r["speedup_fp8"] >= 1.0
            lines.append(f"- H{r['heads']} T{r['tokens']}: fp8 x{r['speedup_fp8']:.2f} vs bf16 "
                         f"-> {'met' if met else 'NOT met'}")
    if res.get("sweep"):
        lines += ["", "Sweep of fp8 launch configs (hardware decode; BLOCK_H and splits from the "
                  "heuristic):", "", "| heads | tokens | BLOCK_N | warps | stages | us | % copy |",
                  "|---|---|---|---|---|---|---|"]
        for r in res["sweep"]:
            t_us = f"{r['us']:.1f} | {r['pct_copy']:.1f}" if "us" in r else "does not fit | -"
            lines.append(f"| {r['heads']} | {r['tokens']} | {r['BLOCK_N']} | {r['num_warps']} | "
                         f"{r['num_stages']} | {t_us} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "fp8"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--prewarm", type=int, default=0)
    ap.add_argument("--prewarm-only", action="store_true")
    ap.add_argument("--rep-ms", type=float, default=50.0)
    ap.add_argument("--sweep", action="store_true", help="also time SWEEP_CFGS on SWEEP_CELLS")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.heads, args.tokens = HEADS, TOKENS
    if args.quick:
        args.heads, args.tokens, args.rep_ms = [16, 64], [1, 1024], 10.0
    if args.worker:
        i, n = map(int, args.worker.split("/"))
        return worker(args, i, n)
    if args.prewarm:
        prewarm(args)
        if args.prewarm_only:
            return 0
    t0 = time.time()
    res = main_run(args)
    res["seconds"] = time.time() - t0
    write(res, Path(args.out))
    print(f"wrote {args.out} in {res['seconds']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
