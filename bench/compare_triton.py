#!/usr/bin/env python3
"""Two bench_attention.py results side by side: the same cells under two Tritons.

  python bench/compare_triton.py BEFORE/attention.json AFTER/attention.json
  python bench/compare_triton.py BEFORE/indexer.json AFTER/indexer.json

One line per engine cell (heads, tokens, cache, e4m3 path) and per swept launch config
(`--sweep-bf16`: path "BH:BN:warps:stages"): our time in each, AFTER / BEFORE, and both
relative errors against float64; the geometric mean of the ratios per cache last (engine cells).
Also two bench/indexer/bench_indexer.py results (indexer.json): one line per cell (kind, batch or
queries, context, next_n, path), with DeepGEMM's time in AFTER's run where it was timed.
Standard library only (runs where the benchmark ran, or here on the returned files).
"""
from __future__ import annotations

import json
import math
import sys


def load(path: str) -> tuple[str, dict]:
    data = json.load(open(path))
    rows = {}
    if path.endswith("indexer.json"):
        for r in data.get("rows", []):
            if not isinstance(r.get("ours_us"), float):
                continue  # a swept config that did not launch
            size = r.get("batch", r.get("queries"))
            e4m3 = r.get("path")
            if e4m3 is None:  # --sweep rows: the e4m3 path and the launch config
                cfg = [r.get(k) for k in ("QROWS", "BLOCK_N", "num_warps", "num_stages", "programs")]
                e4m3 = ("mma" if r["fp8_mma"] else "sw") + ":" + ":".join(
                    str(v) for v in cfg if v is not None)
            rows[(r["kind"], size, str(r["context"]), r.get("next_n", 1), e4m3)] = r
        return data.get("triton", path), rows
    for r in data.get("rows", []):
        if r.get("call") == "engine":
            rows[(r["heads"], r["tokens"], r["cache"], r.get("path") or "-")] = r
        elif r.get("call") == "sweep" and "ours_us" in r:
            tile = ":".join(str(r[k]) for k in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"))
            rows[(r["heads"], r["tokens"], r["cache"] + "*", tile)] = r
    return data.get("triton", path), rows


def compare(before: dict, after: dict) -> list[str]:
    lines = [f"{'heads':>5} {'tokens':>6} {'cache':<10} {'path':<11} {'before_us':>10} {'after_us':>10} "
             f"{'after/before':>12} {'err_before':>10} {'err_after':>10}"]
    ratios: dict[str, list[float]] = {}
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        ratio = a["ours_us"] / b["ours_us"]
        ratios.setdefault(key[2], []).append(ratio)
        lines.append(f"{key[0]:>5} {key[1]:>6} {key[2]:<10} {key[3]:<11} {b['ours_us']:>10.1f} "
                     f"{a['ours_us']:>10.1f} {ratio:>12.3f} {b.get('rel_err_vs_f64', float('nan')):>10.2e} "
                     f"{a.get('rel_err_vs_f64', float('nan')):>10.2e}")
    for cache, rs in sorted(ratios.items()):
        gm = math.exp(sum(map(math.log, rs)) / len(rs))
        lines.append(f"geomean after/before {cache}: {gm:.3f} over {len(rs)} cells")
    missing = sorted(set(before) ^ set(after))
    if missing:
        lines.append(f"cells in one file only: {missing}")
    return lines


def compare_indexer(before: dict, after: dict) -> list[str]:
    lines = [f"{'kind':<13} {'size':>5} {'context':>7} {'n':>2} {'path':<14} {'before_us':>10} "
             f"{'after_us':>10} {'after/before':>12} {'deepgemm_us':>11} {'after/dg':>8}"]
    ratios: list[float] = []
    for key in sorted(set(before) & set(after), key=str):
        b, a = before[key], after[key]
        ratio = a["ours_us"] / b["ours_us"]
        ratios.append(ratio)
        dg = a.get("deepgemm_us")
        lines.append(f"{key[0]:<13} {key[1]:>5} {key[2]:>7} {key[3]:>2} {key[4]:<14} "
                     f"{b['ours_us']:>10.1f} {a['ours_us']:>10.1f} {ratio:>12.3f} "
                     + (f"{dg:>11.1f} {a['ours_us'] / dg:>8.2f}" if dg else f"{'-':>11} {'-':>8}"))
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"geomean after/before indexer: {gm:.3f} over {len(ratios)} cells")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    (tb, before), (ta, after) = load(argv[0]), load(argv[1])
    print(f"before: triton {tb} ({argv[0]}); after: triton {ta} ({argv[1]})")
    lines = (compare_indexer if argv[0].endswith("indexer.json") else compare)(before, after)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
