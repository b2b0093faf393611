#!/usr/bin/env python3
"""Print the attention, host-time, DeepSeek-V4 decode, indexer and GLM-5.3-Flash benchmark
results (attention.json, host.json, dsv4.json, indexer.json, glm53.json in DIR) as short tables.
usage: python bench/summarize.py DIR
       python bench/summarize.py --readme DIR   (the README's Speed tables, Markdown)
       python bench/summarize.py --engine DIR   (bench/README.md's engine-form table, Markdown:
                                                 attention.json, Triton 3.6, beside
                                                 attention-3.8.json where DIR has it)"""
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

    g = d / "glm53.json"
    if g.is_file():
        res = json.loads(g.read_text())
        print(f"GLM-5.3-Flash (copy {res['copy_tbps']:.2f} TB/s): NoPE attention, top-k width 2176")
        table([r for r in res["rows"] if r["call"] == "attention"],
              ["cache", "heads", "tokens", "graph", "ours_us", "flashmla_us", "ours_vs_flashmla",
               "pct_copy_bw", "rel_err_vs_f64", "flashmla_rel_err_vs_f64", "error",
               "flashmla_error"])
        print("pooled indexer decode logits, 16 heads (DeepGEMM: 32 padded); eager and graph")
        table([r for r in res["rows"] if r["call"] == "indexer-decode"],
              ["page_pools", "batch", "context", "ours_us", "deepgemm_us", "ours_vs_deepgemm",
               "ours_graph_us", "deepgemm_graph_us", "software_us", "pct_copy_bw",
               "ours_rel_err_vs_f64", "deepgemm_rel_err_vs_f64", "deepgemm_error"])
        table([r for r in res["rows"] if r["call"] == "indexer-prefill"],
              ["queries", "context", "pools", "ours_us", "deepgemm_us", "ours_vs_deepgemm",
               "software_us", "ours_rel_err_vs_f64", "deepgemm_rel_err_vs_f64"])


# the README's Speed section: these cells of attention.json (host.json: bench/README.md)
README_CELLS = [(8, 1), (8, 64), (8, 4096), (16, 1024), (32, 64), (32, 1024), (32, 4096),
                (64, 1024), (128, 1024)]


def us(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if v < 100 else f"{v:,.0f}")


def readme(d: Path) -> None:
    """The README's attention table, from DIR's attention.json."""
    rows = json.loads((d / "attention.json").read_text())["rows"]
    cell = {(r["heads"], r["tokens"], r["cache"], r.get("path")): r
            for r in rows if r["call"] == "engine"}
    print("| heads x tokens | bf16: ours | FlashMLA | fp8, hw e4m3: ours | fp8, software e4m3: ours "
          "| FlashMLA fp8 |")
    print("|---|---|---|---|---|---|")
    for H, T in README_CELLS:
        b, hw, sw = (cell.get((H, T, "bfloat16", None)), cell.get((H, T, "fp8_ds_mla", "hw")),
                     cell.get((H, T, "fp8_ds_mla", "software")))
        print(f"| {H} x {T} | {us(b['ours_us'])} | {us(b.get('flashmla_us'))} | "
              f"{us(hw['ours_us'])} | {us(sw['ours_us'])} | {us(hw.get('flashmla_us'))} |")


def ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def engine(d: Path) -> None:
    """bench/README.md's table of every engine-form cell: Triton 3.6 (attention.json) and,
    where DIR has attention-3.8.json, the same cells under 3.8."""
    def cells(name):
        f = d / name
        if not f.is_file():
            return {}
        return {(r["heads"], r["tokens"], r["cache"], r.get("path")): r
                for r in json.loads(f.read_text())["rows"] if r["call"] == "engine"}

    a, b = cells("attention.json"), cells("attention-3.8.json")
    print("| cache | e4m3 path | heads | tokens | graph | 3.6: ours µs | FlashMLA µs | ours / FM "
          "| 3.8: ours µs | FlashMLA µs | ours / FM | fp8 kernel picked | 3.6: codes µs "
          "| dequant µs | % copy BW | rel. err vs f64 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, r in a.items():
        o = b.get(key, {})
        print(f"| {r['cache']} | {r.get('path') or '-'} | {r['heads']} | {r['tokens']} | "
              f"{'yes' if r['graph'] else 'no'} | {us(r['ours_us'])} | {us(r.get('flashmla_us'))} | "
              f"{ratio(r.get('ours_vs_flashmla'))} | {us(o.get('ours_us'))} | "
              f"{us(o.get('flashmla_us'))} | {ratio(o.get('ours_vs_flashmla'))} | "
              f"{r.get('fp8_kernel', '-')} | {us(r.get('codes_us'))} | {us(r.get('dequant_us'))} | "
              f"{r['pct_copy_bw']:.0f} | {r['rel_err_vs_f64']:.1e} |")


if __name__ == "__main__":
    if sys.argv[1] == "--readme":
        readme(Path(sys.argv[2]))
    elif sys.argv[1] == "--engine":
        engine(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
