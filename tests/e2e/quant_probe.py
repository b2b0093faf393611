"""The 4-bit checkpoints and GLM-5.2's IndexCache layers in the e2e runs: which models they are,
what the model probe records about them (in the engine's workers), what makes an engine fail,
and the report's lines (tests/e2e/README.md, "4-bit checkpoints" and "IndexCache").

Linear and MoE kernels: every module holding a `quant_method` is grouped by role (attention,
indexer, mlp = dense MLP and shared experts, experts = the routed FusedMoE layer, other) and
named by its quant method class, with the compressed-tensors scheme where the module has one,
and the linear kernel vLLM chose (`quant_method.kernel` or `scheme.kernel`:
MarlinLinearKernel, MacheteLinearKernel, ...) or the MoE backend and experts class
(`wna16_moe_backend` / `unquantized_backend`, `experts_cls`: MARLIN, TRITON, ...).

IndexCache (vLLM 0.26.0, models/deepseek_v2.py, DeepseekV2MLAAttention): a target layer
builds an indexer unless max(layer - index_skip_topk_offset + 1, 0) % index_topk_freq != 0;
the layers without one keep `skip_topk` and reuse the top-k buffer the last indexer wrote;
the MTP layer always has its own. The probe records each MLA layer's indexer and skip_topk,
and counts, per layer, the calls of vLLM's sparse-indexer op (its eager calls: the op names
its layer through `_resolve_layer_name`, which the counter wraps; replayed CUDA graphs run
no Python and are not counted).
"""
from __future__ import annotations

import os
import re
import sys

# run_e2e model name -> (base model directory under models/, format)
FOURBIT = {"deepseek-v32-tiny-awq": ("deepseek-v32-tiny", "awq"),
           "deepseek-v32-tiny-gptq": ("deepseek-v32-tiny", "gptq"),
           "glm5-tiny-awq": ("glm5-tiny", "awq"),
           "glm5-tiny-gptq": ("glm5-tiny", "gptq"),
           "deepseek-v32-tiny-ct": ("deepseek-v32-tiny", "ct"),
           "glm5-tiny-ct": ("glm5-tiny", "ct"),
           "deepseek-v32-tiny-nvfp4": ("deepseek-v32-tiny", "nvfp4"),
           "glm5-tiny-nvfp4": ("glm5-tiny", "nvfp4")}
INDEXCACHE_MODELS = ("glm52-tiny",)
# ct = compressed-tensors W4A16 (pack-quantized): the linear method names its scheme
LINEAR_METHOD = {"awq": "AutoAWQMarlinLinearMethod", "gptq": "AutoGPTQLinearMethod",
                 "ct": "CompressedTensorsLinearMethod/CompressedTensorsWNA16",
                 "nvfp4": "ModelOptNvFp4LinearMethod"}
MOE_METHOD = {"awq": "AutoAWQMoEMethod", "gptq": "AutoGPTQMoEMethod",
              "ct": "CompressedTensorsWNA16MarlinMoEMethod",
              "nvfp4": "ModelOptNvFp4FusedMoE"}
INDEXER_MODULE = "vllm.model_executor.layers.sparse_attn_indexer"
_CALLS: dict[str, int] = {}


def siblings(model: str) -> list[str]:
    """The same base model in the other checkpoint formats (the 4-bit ones, then the 16-bit
    base): their attention and indexer are the same, only the MLP weights differ."""
    base = FOURBIT[model][0] if model in FOURBIT else model
    return [m for m in FOURBIT if FOURBIT[m][0] == base and m != model] + ([base] if base != model else [])


def role(prefix: str) -> str:
    """What a module is: attention, indexer, mlp (dense / shared experts), experts, other."""
    if ".indexer." in prefix or prefix.endswith(".indexer"):
        return "indexer"
    if ".self_attn." in prefix or prefix.endswith(".self_attn"):
        return "attention"
    if prefix.endswith(".mlp.experts") or ".mlp.experts." in prefix:
        return "experts"
    if ".mlp." in prefix and not prefix.endswith(".mlp.gate"):
        return "mlp"
    return "other"


def _name(obj) -> str | None:
    if obj is None:
        return None
    if isinstance(obj, (list, tuple)):
        return "+".join(filter(None, map(_name, obj))) or None
    for attr in ("name", "__name__"):
        v = getattr(obj, attr, None)
        if isinstance(v, str):
            return v
    return type(obj).__name__


def method_name(qm, module=None) -> str:
    """A quant method's class, plus the compressed-tensors scheme (held by the module), the
    linear kernel, or the MoE backend / experts class."""
    parts = [type(qm).__name__]
    scheme = getattr(module, "scheme", None)
    if scheme is not None:
        parts.append(type(scheme).__name__)
    kernel = getattr(qm, "kernel", None) or getattr(scheme, "kernel", None)
    if kernel is not None:
        parts.append(type(kernel).__name__)
    for attr in ("wna16_moe_backend", "unquantized_backend", "experts_cls"):
        n = _name(getattr(qm, attr, None))
        if n:
            parts.append(n)
    return "/".join(parts)


def describe_quant(model) -> dict[str, list[str]]:
    """Role -> the sorted quant methods (with kernels) of the modules of that role."""
    by_role: dict[str, set[str]] = {}
    for prefix, mod in model.named_modules():
        qm = getattr(mod, "quant_method", None)
        if qm is not None:
            by_role.setdefault(role(prefix), set()).add(method_name(qm, mod))
    return {k: sorted(v) for k, v in sorted(by_role.items())}


def describe_indexer_layers(model) -> list[dict]:
    """Each sparse MLA layer: whether it has its own indexer and whether it skips the top-k."""
    out = []
    for prefix, mod in model.named_modules():
        if hasattr(mod, "skip_topk") and hasattr(mod, "indexer") and getattr(mod, "is_sparse", False):
            m = re.search(r"layers\.(\d+)\.", prefix + ".")
            out.append({"layer": int(m.group(1)) if m else None, "module": prefix,
                        "indexer": mod.indexer is not None, "skip_topk": bool(mod.skip_topk)})
    return sorted(out, key=lambda r: (r["layer"] is None, r["layer"]))


def _patch_indexer_module(module) -> None:
    orig = module._resolve_layer_name
    if getattr(orig, "_smla_counted", False):
        return

    def counted(name, *a, **k):
        layer = orig(name, *a, **k)
        key = str(layer if isinstance(layer, str) else name)
        _CALLS[key] = _CALLS.get(key, 0) + 1
        return layer

    counted._smla_counted = True
    module._resolve_layer_name = counted


def install_indexer_counter(patch_now_or_after_import) -> str:
    """Count the sparse-indexer op's calls per layer in this process (every engine)."""
    return patch_now_or_after_import(INDEXER_MODULE, _patch_indexer_module)


def worker_indexer_calls(worker) -> dict[str, int]:
    """The counter of this worker process (collective_rpc)."""
    return dict(sorted(_CALLS.items()))


def is_16bit(method: str) -> bool:
    """An attention / indexer module left 16-bit: an unquantized linear, or the KV-cache method a
    quant config attaches to the attention layer (ModelOpt's, with no KV-cache scheme)."""
    return method.startswith("UnquantizedLinearMethod") or method.endswith("KVCacheMethod")


def expected_skip(layer: int, cfg: dict) -> bool:
    """vLLM 0.26.0's rule (deepseek_v2.py) for a target layer without its own indexer."""
    freq, offset = cfg.get("index_topk_freq", 1), cfg.get("index_skip_topk_offset", 2)
    return max(layer - offset + 1, 0) % freq != 0


def _layer_of(key: str) -> int | None:
    m = re.search(r"layers\.(\d+)\.", key)
    return int(m.group(1)) if m else None


def engine_failures(job: dict, meta: dict, model_cfg: dict | None) -> list[str]:
    """A 4-bit engine whose MLPs or experts are not on the format's Marlin methods, or whose
    attention / indexer got quantized; an IndexCache engine whose layers do not follow the
    config's rule, or whose indexer op ran in a layer without an indexer."""
    name, out = job["name"], []
    if job["model"] in FOURBIT:
        fmt = FOURBIT[job["model"]][1]
        for where, key in (("target", "model_probe"), ("MTP drafter", "drafter_probe")):
            for probe in meta.get(key) or []:
                q = (probe or {}).get("quant") or {}
                mlp, exp = q.get("mlp", []), q.get("experts", [])
                if not mlp or not all(m.startswith(LINEAR_METHOD[fmt]) for m in mlp):
                    out.append(f"{name}: {where}: MLP linears {mlp}, expected {LINEAR_METHOD[fmt]}")
                if not exp or not all(m.startswith(MOE_METHOD[fmt]) for m in exp):
                    out.append(f"{name}: {where}: routed experts {exp}, expected {MOE_METHOD[fmt]}")
                for r in ("attention", "indexer"):
                    if any(not is_16bit(m) for m in q.get(r, [])):
                        out.append(f"{name}: {where}: {r} {q[r]}, expected 16-bit (UnquantizedLinearMethod)")
    if job["model"] in INDEXCACHE_MODELS and model_cfg is not None:
        n = model_cfg["num_hidden_layers"]
        for probe in meta.get("model_probe") or []:
            layers = [r for r in (probe or {}).get("indexer_layers", []) if r["layer"] is not None
                      and r["layer"] < n]
            if len(layers) != n:
                out.append(f"{name}: {len(layers)} sparse MLA layers in the probe, expected {n}")
            for r in layers:
                skip = expected_skip(r["layer"], model_cfg)
                if r["skip_topk"] != skip or r["indexer"] == skip:
                    out.append(f"{name}: layer {r['layer']}: indexer {r['indexer']}, skip_topk "
                               f"{r['skip_topk']}; the config's rule says skip={skip}")
        calls = [c for c in meta.get("indexer_calls") or [] if c]
        skipped = {i for i in range(n) if expected_skip(i, model_cfg)}
        for c in calls:
            bad = sorted(k for k in c if _layer_of(k) in skipped)
            if bad:
                out.append(f"{name}: the indexer op ran for layers without an indexer: {bad}")
        if not calls:
            out.append(f"{name}: no indexer op call recorded")
    return out


def report_lines(s: dict) -> list[str]:
    """The report's tables: linear / MoE kernels per engine (4-bit models), indexer layers and
    indexer op calls per engine (IndexCache models)."""
    out = []
    rows = [(n, e) for n, e in s["engines"].items() if e.get("model") in FOURBIT]
    if rows:
        out += ["", "| engine (4-bit) | dense / shared-expert MLP | routed experts | attention | indexer |",
                "|---|---|---|---|---|"]
        for n, e in rows:
            q = ((e.get("model_probe") or [{}])[0] or {}).get("quant") or {}
            out.append(f"| {n} | {', '.join(q.get('mlp', ['-']))} | {', '.join(q.get('experts', ['-']))} | "
                       f"{', '.join(q.get('attention', ['-']))} | {', '.join(q.get('indexer', ['-']))} |")
    rows = [(n, e) for n, e in s["engines"].items() if e.get("model") in INDEXCACHE_MODELS]
    if rows:
        out += ["", "| engine (IndexCache) | layers with an indexer | layers reusing the top-k (skip_topk) | "
                "indexer op calls per layer (eager) |", "|---|---|---|---|"]
        for n, e in rows:
            layers = ((e.get("model_probe") or [{}])[0] or {}).get("indexer_layers") or []
            own = [str(r["layer"]) for r in layers if r["indexer"]]
            skip = [str(r["layer"]) for r in layers if r["skip_topk"]]
            calls = ((e.get("indexer_calls") or [{}])[0]) or {}
            per = ", ".join(f"{_layer_of(k)}: {v}" for k, v in sorted(calls.items(), key=lambda kv: (
                _layer_of(kv[0]) is None, _layer_of(kv[0]) or 0)))
            out.append(f"| {n} | {' '.join(own) or '-'} | {' '.join(skip) or '-'} | {per or '-'} |")
    return out


def model_config(model_dir: str) -> dict | None:
    """The model's config.json (None if unreadable)."""
    import json

    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit("a module of tests/e2e, not a command")
