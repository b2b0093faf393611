#!/usr/bin/env python3
"""Print the attention, host-time, DeepSeek-V4 decode and indexer benchmark results
(attention.json, host.json, dsv4.json, indexer.json in DIR) as short tables.
usage: python bench/summarize.py DIR"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.0f}"
    return str(v)


def table(rows, cols):
    print(" ".join(c[:14].rjust(14) for c in cols))
    for r in rows:
        print(" ".join(fmt(r.get(c)).rjust(14) for c in cols))


def main(d: Path) -> None:
    a = d / "attention.json"
    if a.is_file():
        res = json.loads(a.read_text())
        print(f"attention (copy {res['copy_tbps']:.2f} TB/s)")
        table([r for r in res["rows"] if r["call"] == "engine"],
              ["cache", "path", "heads", "tokens", "graph", "ours_us", "flashmla_us",
               "ours_vs_flashmla", "fp8_kernel", "codes_us", "dequant_us", "pct_copy_bw",
               "rel_err_vs_f64"])
        table([r for r in res["rows"] if r["call"] == "sweep"],
              ["cache", "path", "tokens", "FP8_DEQUANT", "BLOCK_H", "BLOCK_N", "num_warps",
               "num_stages", "ours_us", "rel_err_vs_f64", "error"])
    h = d / "host.json"
    if h.is_file():
        res = json.loads(h.read_text())
        print("host time of one eager call")
        table(res["rows"], ["call", "cache", "path", "heads", "host_us"])
    v = d / "dsv4.json"
    if v.is_file():
        res = json.loads(v.read_text())
        print(f"dsv4 decode (copy {res['copy_tbps']:.2f} TB/s)")
        table(res["rows"], ["layer", "heads", "batch", "context", "ours_us", "flashmla_us",
                            "ours_vs_flashmla", "pct_copy_bw", "flashmla_pct_copy_bw",
                            "rel_err_vs_flashmla", "rel_err_vs_f64", "flashmla_error"])
    i = d / "indexer.json"
    if i.is_file():
        res = json.loads(i.read_text())
        print(f"indexer (copy {res['copy_tbps']:.2f} TB/s)")
        table([r for r in res["rows"] if r["kind"] == "prefill"],
              ["queries", "context", "path", "ours_us", "deepgemm_us", "ours_vs_deepgemm",
               "before_us", "tflops"])
        table([r for r in res["rows"] if r["kind"] == "decode"],
              ["batch", "context", "next_n", "path", "ours_us", "deepgemm_us", "ours_vs_deepgemm",
               "pct_copy_bw", "before_us", "step_ours_topk_us", "step_deepgemm_persistent_topk_us",
               "host_us"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
