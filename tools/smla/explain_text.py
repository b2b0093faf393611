"""`explain`'s output for the MLA presets: one case (`text`), the matrix (`matrix_text`), JSON
(`to_dict`). DeepSeek-V4 results have their own output (smla.explain_dsv4); smla.explain.text and
matrix_text pick between them. Pure functions of a result of smla.selection.run_selection.
"""
from __future__ import annotations

from typing import Any

# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------

def to_dict(result: dict[str, Any], tree_desc: str) -> dict[str, Any]:
    d = {k: v for k, v in result.items() if k != "config"}
    d["tree"] = tree_desc
    return d


def text(result: dict[str, Any], tree_desc: str) -> str:
    """One MLA case (DeepSeek-V4 results: smla.explain_dsv4; smla.explain.text picks)."""
    r, m = result, result["model"]
    kind = "sparse MLA (DSA)" if m["use_sparse"] else "dense MLA (not DSA: the series does not change it)"
    topk = f"  index_topk={m['index_topk']}" if m.get("index_topk") is not None else ""
    heads = r.get("heads_per_gpu")
    if r.get("heads") is not None:
        heads_desc = f"{heads} heads per GPU"
    elif heads is not None:
        heads_desc = f"{heads} heads per GPU ({m['num_attention_heads']} / tp {r.get('tp') or 1})"
    else:
        heads_desc = "heads per GPU unknown (no num_attention_heads in the config)"
    lines = [
        f"tree:  {tree_desc}",
        f"model: {r['preset']}  model_type={m['model_type']}  {kind}  head_size={m['head_size']}{topk}",
        f"case:  compute capability {r['capability']}, dtype {m['dtype']}"
        + (f" (config: {m['config_dtype']})" if r["dtype"] == "auto" else "")
        + f", kv_cache_dtype {r['kv_cache_dtype']}, {heads_desc}"
        + (f", block_size {r['block_size']}" if r.get("block_size") else ""),
        "",
        "CUDA MLA backends in vLLM's priority order for this case:",
    ]
    rows = [("#", "backend", "valid", "reasons (vLLM's own)")]
    for i, p in enumerate(r["priority"], 1):
        rows.append((str(i), p["backend"], "yes" if p["valid"] else "no", "; ".join(p["reasons"])))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append(("  " + "  ".join(v.ljust(w) for v, w in zip(row[:3], widths)) + "  " + row[3]).rstrip())
    lines.append("")
    req = r.get("requested")
    if req:
        state = "valid" if req["valid"] else "invalid: " + "; ".join(req["reasons"])
        lines.append(f"requested backend {req['backend']}: {state}")
    label = "selection (--backend)" if req else "auto-selection"
    if r["selected"]:
        lines.append(f"{label}: {r['selected']}")
        used = r.get("kv_cache_dtype_used")
        if used and used != r["kv_cache_dtype"]:
            lines.append(f"kv cache: {r['kv_cache_dtype']} -> {used} "
                         "(vLLM's _canonicalize_sparse_mla_kv_cache_dtype for this backend)")
    else:
        lines.append(f"{label}: none; vLLM error: {r['error']}")
    lines.append("")
    lines.append("indexer: " + _indexer_line(r.get("indexer")))
    lines.append("stand-ins: " + ", ".join(_short_stand_ins(r["stand_ins"]))
                 + " (details: tools/smla/_selection_standins.py)")
    return "\n".join(lines) + "\n"


def _indexer_line(ix: dict[str, Any] | None) -> str:
    """The DSA indexer's logits path as the tree's own code decides it
    (see _selection_worker._Selection._indexer_facts)."""
    if not ix:
        return "not reported by this tree"
    path = ix.get("path") or "not determined"
    names = {"deepgemm": "DeepGEMM", "triton": "portable Triton kernels (TRITON_MLA_SPARSE series)",
             "none": "none"}
    reason = ix.get("reason") or ""
    return f"{names.get(path, path)}" + (f" ({reason})" if reason else "")


def _short_stand_ins(stand_ins: list[str]) -> list[str]:
    out = ["config as a plain PretrainedConfig"]
    for item in stand_ins:
        if item.startswith("no CUDA device"):
            out.append("no GPU: cuda tensors -> meta")
        elif item.startswith("CUDA platform"):
            out.insert(0, "mocked CUDA platform + capability")
        else:
            out.append("stub " + item.split(" (")[0])
    return out


# --------------------------------------------------------------------------
# the matrix
# --------------------------------------------------------------------------

def _cell_pick(r: dict[str, Any]) -> str:
    if r.get("input_error"):
        return "input error"
    sel = r.get("selected")
    if not sel:
        return "none"
    used = r.get("kv_cache_dtype_used")
    return sel + (f" (-> {used})" if used and used != r["kv_cache_dtype"] else "")


def matrix_text(results: list[dict[str, Any]], tree_desc: str) -> str:
    """Compact table of the matrix for one model and tree: a row per
    capability x model dtype, a column per KV-cache dtype.  Where the pick
    depends on the heads per GPU, the cell lists each pick with its heads;
    "(-> X)" is the cache format vLLM switches to after selection; "none" is
    vLLM's "No valid attention backend" refusal."""
    kvs = list(dict.fromkeys(r["kv_cache_dtype"] for r in results))
    groups: dict[tuple[str, str], dict[str, dict[str, list[int]]]] = {}
    for r in results:
        cell = groups.setdefault((r["capability"], r["model"]["dtype"] if r.get("model") else r["dtype"]), {})
        cell.setdefault(r["kv_cache_dtype"], {}).setdefault(_cell_pick(r), []).append(r.get("heads_per_gpu"))
    header = ["cc", "dtype"] + [f"kv {kv}" for kv in kvs]
    rows = []
    for (cc, dtype), by_kv in groups.items():
        row = [cc, dtype]
        for kv in kvs:
            picks = by_kv.get(kv, {})
            if len(picks) == 1:
                row.append(next(iter(picks)))
            else:
                row.append(" / ".join(f"{p} (heads {','.join(str(h) for h in hs)})"
                                      for p, hs in picks.items()))
        rows.append(row)
    first = results[0] if results else {}
    heads = sorted({r.get("heads_per_gpu") for r in results}, key=lambda h: (h is None, h))
    lines = [f"tree:  {tree_desc}",
             f"model: {first.get('preset', '?')}; heads per GPU {', '.join(str(h) for h in heads)}"
             + (f"; requested backend {first['backend']}" if first.get("backend") else "; auto-selection"),
             "",
             "| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# DeepSeek-V4
