"""`explain`'s output for DeepSeek-V4, whose CUDA model picks its attention class, mHC, o_proj and
compressor kernels itself (smla.selection's DeepSeek-V4 query): one case (`dsv4_text`) and the
matrix (`dsv4_matrix_text`), and the short labels the README's generated table uses.
"""
from __future__ import annotations

from typing import Any

from smla.explain_text import _indexer_line, _short_stand_ins

# --------------------------------------------------------------------------
# A DeepSeek-V4 result holds one case per combination of the inputs the tree's own functions
# were asked with (VLLM_DSV4_PORTABLE; FlashInfer's sm120 kernel; vLLM's FlashMLA build). The
# output groups them by VLLM_DSV4_PORTABLE and names the other two only where an answer
# depends on them.

DSV4_ENV = "VLLM_DSV4_PORTABLE"
_DSV4_LABELS = {"flashinfer_sm120": ("with FlashInfer's sm120 kernel", "without FlashInfer's sm120 kernel"),
                "flashmla": ("vLLM built with FlashMLA", "vLLM built without FlashMLA")}
_DSV4_ROUTE = "the series' nvidia/portable.py (select_dsv4_mhc_kernels, select_dsv4_o_proj) and nvidia/ops (cutedsl_supported)"
_DSV4_NO_ROUTE = "no choice in this tree: the series' route (nvidia/portable.py, ops.cutedsl_supported) is absent"
_DSV4_UPSTREAM = ("upstream's CUDA model calls its TileLang/DeepGEMM mHC kernels, DeepGEMM o_proj and CuTe DSL "
                  "compressor on every GPU")


def dsv4_switch(result: dict[str, Any]) -> str:
    """The key of the series' switch in each case: VLLM_DSV4_PORTABLE (0.26.0 line),
    KernelConfig's deepseek_v4_kernels (0.33.0 line), "switch" where the tree has none."""
    d = result["dsv4"]
    return d["switch"] or "switch" if "switch" in d else DSV4_ENV


def dsv4_switch_label(result: dict[str, Any]) -> str:
    """How a user sets the switch: the env var, or the --kernel-config field."""
    d = result["dsv4"]
    if "switch" in d and d["switch"] is None:
        return "the series' DeepSeek-V4 switch"
    name = dsv4_switch(result)
    return name if name == DSV4_ENV else f"--kernel-config {name}"


def dsv4_groups(result: dict[str, Any]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """[(the switch's value or None, its cases)], in the order asked."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    key = dsv4_switch(result)
    for case in result["dsv4"]["cases"]:
        groups.setdefault(case[key], []).append(case)
    return list(groups.items())


def dsv4_variants(cases: list[dict[str, Any]], show) -> list[tuple[list[str], str]]:
    """[(labels of the inputs it depends on, show(case))] for one VLLM_DSV4_PORTABLE value: one
    entry with no labels where no other input changes the answer, else one per value of the inputs
    that do (an input changes it where two cases differing in it alone differ)."""
    inputs = [k for k in _DSV4_LABELS if any(c[k] is not None for c in cases)]

    def differ(key: str) -> bool:
        for a in cases:
            for b in cases:
                if (a[key] != b[key] and all(a[k] == b[k] for k in inputs if k != key)
                        and show(a) != show(b)):
                    return True
        return False

    matter = [k for k in inputs if differ(k)]
    out: dict[tuple, tuple[list[str], str]] = {}
    for c in cases:
        key = tuple(c[k] for k in matter)
        if key not in out:
            out[key] = ([_DSV4_LABELS[k][0 if c[k] else 1] for k in matter], show(c))
    return list(out.values())


def _dsv4_attention(case: dict[str, Any], capability: str) -> str:
    a = case["attention"]
    if a is None:
        return f"none; vLLM error: {case['error']}"
    notes = [f"backend {a['backend']}"] if a.get("backend") else []
    if a.get("fp8_ds_mla_layout"):
        notes.append("fp8_ds_mla cache")
    about = ", ".join(notes)
    if a.get("backend_supports_capability") is False:
        about += f"; that backend does not support compute capability {capability}"
    return a["class"] + (f" ({about})" if about else "") + (f": {a['reason']}" if a.get("reason") else "")


def _dsv4_cutedsl(case: dict[str, Any]) -> str | None:
    if case["cutedsl"] is None:
        return None
    kind = "CuTe DSL" if case["cutedsl"] else "Triton"
    return f"{'yes' if case['cutedsl'] else 'no'}: the compressor, gathers and indexer query run their {kind} kernels"


def _dsv4_shows(capability: str) -> dict[str, Any]:
    return {"attention": lambda c: _dsv4_attention(c, capability),
            "mHC": lambda c: c["mhc"]["reason"] if c["mhc"] else None,
            "o_proj": lambda c: c["o_proj"]["reason"] if c["o_proj"] else None,
            "CuTe DSL": _dsv4_cutedsl}


def dsv4_text(result: dict[str, Any], tree_desc: str) -> str:
    r, m, d = result, result["model"], result["dsv4"]
    module, _, func = d["selector"].rpartition(".")
    topk = f"  index_topk={m['index_topk']}" if m.get("index_topk") is not None else ""
    lines = [
        f"tree:  {tree_desc}",
        f"model: {r['preset']}  model_type={m['model_type']}  DeepSeek-V4  head_size={m['head_size']}{topk}",
        f"case:  compute capability {r['capability']}"
        + (f", --backend {r['backend']}" if r.get("backend") else "")
        + " (model dtype, KV-cache dtype and heads do not enter this choice)",
        "",
        "DeepSeek-V4's CUDA model picks its kernels itself, not through vLLM's backend selector:",
        f"  attention class: {module.replace('.', '/')}.py::{func}",
        "  mHC, o_proj, CuTe DSL: " + (_DSV4_ROUTE if d["series_route"] else _DSV4_NO_ROUTE),
        "",
    ]
    shows = _dsv4_shows(r["capability"])
    label = dsv4_switch_label(r)
    for env, cases in dsv4_groups(r):
        lines.append(f"{label}={env}" + (" (the default):" if env == "auto" else ":") if env is not None else
                     f"{label}: not in this tree:")
        for name, show in shows.items():
            variants = dsv4_variants(cases, show)
            if all(v is None for _, v in variants):
                continue
            for labels, value in variants:
                lines.append(f"  {', '.join([name, *labels])}: {value}")
        if not d["series_route"]:
            lines.append(f"  mHC, o_proj, CuTe DSL: {_DSV4_UPSTREAM}")
    lines.append("")
    lines.append("indexer: " + _indexer_line(r.get("indexer")))
    lines.append("stand-ins: " + ", ".join(_short_stand_ins(r["stand_ins"]) + _short_dsv4_stand_ins(d))
                 + " (details: tools/smla/_selection_standins.py)")
    return "\n".join(lines) + "\n"


def _short_dsv4_stand_ins(d: dict[str, Any]) -> list[str]:
    out = []
    for item in d.get("stand_ins", []):
        if item.startswith("vllm._custom_ops.cutlass"):
            out.append("cutlass_scaled_mm_supports_* answer False at import")
        elif item.startswith("DeepSeek-V4 kernel packages"):
            out.append("tilelang, cutlass DSL and DeepGEMM installed")
    return out


def dsv4_short_class(name: str) -> str:
    """DeepseekV4TritonAttention -> Triton."""
    return name.removeprefix("DeepseekV4").removesuffix("Attention")


def dsv4_short_route(case: dict[str, Any]) -> str:
    """The mHC, o_proj and CuTe DSL routes in a few words (the head of the tree's own reasons)."""
    parts = []
    if case["mhc"]:
        parts.append("mHC " + case["mhc"]["reason"].split(":")[0].split(", forced")[0].split(" (")[0])
    if case["o_proj"]:
        parts.append("o_proj " + {"deep_gemm": "DeepGEMM"}.get(case["o_proj"]["path"], case["o_proj"]["path"]))
    if case["cutedsl"] is not None:
        parts.append("compressor " + ("CuTe DSL" if case["cutedsl"] else "Triton"))
    return ", ".join(parts)


def dsv4_short_pick(case: dict[str, Any], capability: str) -> str:
    """The attention layers' class, in a word; "(its backend: not X)" where that backend does not support
    the capability; "error" where the tree refuses."""
    a = case["attention"]
    if a is None:
        return "error"
    return dsv4_short_class(a["class"]) + (f" (its backend: not {capability})"
                                           if a.get("backend_supports_capability") is False else "")


def dsv4_matrix_text(results: list[dict[str, Any]], tree_desc: str) -> str:
    """The DeepSeek-V4 matrix: a row per capability and VLLM_DSV4_PORTABLE value; the attention
    layers' class, in a word (each input it depends on named), and the mHC / o_proj / compressor route."""
    first = results[0]
    lines = [f"tree:  {tree_desc}",
             f"model: {first.get('preset', '?')}; DeepSeek-V4's own choice"
             + (f"; requested backend {first['backend']}" if first.get("backend") else ""),
             "",
             f"| cc | {dsv4_switch_label(first)} | attention | mHC, o_proj, compressor |",
             "|---|---|---|---|"]
    for r in results:
        for env, cases in dsv4_groups(r):
            att = " / ".join(f"{v} ({', '.join(labels)})" if labels else v
                             for labels, v in dsv4_variants(cases, lambda c: dsv4_short_pick(c, r["capability"])))
            route = " / ".join(f"{v} ({', '.join(labels)})" if labels else v
                               for labels, v in dsv4_variants(cases, dsv4_short_route))
            lines.append(f"| {r['capability']} | {env if env is not None else 'not in this tree'} | {att} | "
                         f"{route or 'not chosen by this tree'} |")
    return "\n".join(lines) + "\n"
