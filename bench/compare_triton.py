#!/usr/bin/env python3
"""Two bench_attention.py results side by side: the same cells under two Tritons.

  python bench/compare_triton.py BEFORE/attention.json AFTER/attention.json

One line per engine cell (heads, tokens, cache, e4m3 path): our time in each, AFTER / BEFORE,
and both relative errors against float64; the geometric mean of the ratios per cache last.
Standard library only (runs where the benchmark ran, or here on the returned files).
"""
from __future__ import annotations

import json
import math
import sys


def load(path: str) -> tuple[str, dict]:
    data = json.load(open(path))
    rows = {}
    for r in data.get("rows", []):
        if r.get("call") != "engine":
            continue
        rows[(r["heads"], r["tokens"], r["cache"], r.get("path") or "-")] = r
    return data.get("triton", path), rows


def compare(before: dict, after: dict) -> list[str]:
    lines = [f"{'heads':>5} {'tokens':>6} {'cache':<10} {'path':<8} {'before_us':>10} {'after_us':>10} "
             f"{'after/before':>12} {'err_before':>10} {'err_after':>10}"]
    ratios: dict[str, list[float]] = {}
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        ratio = a["ours_us"] / b["ours_us"]
        ratios.setdefault(key[2], []).append(ratio)
        lines.append(f"{key[0]:>5} {key[1]:>6} {key[2]:<10} {key[3]:<8} {b['ours_us']:>10.1f} "
                     f"{a['ours_us']:>10.1f} {ratio:>12.3f} {b.get('rel_err_vs_f64', float('nan')):>10.2e} "
                     f"{a.get('rel_err_vs_f64', float('nan')):>10.2e}")
    for cache, rs in sorted(ratios.items()):
        gm = math.exp(sum(map(math.log, rs)) / len(rs))
        lines.append(f"geomean after/before {cache}: {gm:.3f} over {len(rs)} cells")
    missing = sorted(set(before) ^ set(after))
    if missing:
        lines.append(f"cells in one file only: {missing}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    (tb, before), (ta, after) = load(argv[0]), load(argv[1])
    print(f"before: triton {tb} ({argv[0]}); after: triton {ta} ({argv[1]})")
    print("\n".join(compare(before, after)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
