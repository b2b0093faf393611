"""`explain`: which attention backend a vLLM tree picks for a sparse-MLA model, and why.

The answer comes from the tree's own code, run by smla.selection in a fresh
interpreter (mocked CUDA platform and capability, stand-ins for compiled
modules): for every backend of the CUDA MLA priority list, valid or not with
vLLM's reasons, then what auto-selection (or --backend) gives, or vLLM's
own error.

Trees: "patched" is the work tree; "pristine" is the base commit (tag
smla-base) of the same repository, exported once into the cache
(<cache>/trees/<base commit>/vllm); anything else is a path to a vLLM
source tree.

Models: a preset of smla.selection.MODEL_PRESETS, or a HuggingFace config.json
(use_mla / use_sparse / head size / dtype "auto" are derived by the tree's
own code from it). Configs that vLLM does not run with MLA are refused: the
toolkit covers the MLA (and above all the sparse, DSA) backends only.
DeepSeek-V4 (selection.is_dsv4) is answered by its own query: its CUDA model
picks its attention kernels itself, from the GPU, VLLM_DSV4_PORTABLE and
the kernels installed, so the model dtype, KV-cache dtype and heads are no input.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from smla import cache, proc, selection
from smla.errors import TreeStateError, UsageError
from smla.treeinfo import BASE_TAG, base_commit

log = logging.getLogger("smla.explain")

DTYPE_CHOICES = ("auto", "float16", "bfloat16")
TREE_PATCHED, TREE_PRISTINE = "patched", "pristine"
_CAP_RE = re.compile(r"^(\d{1,2})\.(\d)$")


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------

def parse_capability(text: str) -> str:
    """"12.0" -> "12.0"; "auto" -> this machine's GPU (UsageError without one)."""
    text = text.strip()
    if text == "auto":
        return _gpu_capability()
    m = _CAP_RE.match(text)
    if not m:
        raise UsageError(f"compute capability {text!r} is not MAJOR.MINOR",
                         hint="e.g. --capability 12.0 (RTX 50xx / RTX PRO 6000), 9.0 (H100), "
                              "8.6 (RTX 30xx / A10), or auto")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def _gpu_capability() -> str:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        raise UsageError("--capability auto needs torch to read the GPU") from exc
    if not torch.cuda.is_available():
        raise UsageError("--capability auto: no CUDA GPU is visible here",
                         hint="give the capability explicitly, e.g. --capability 12.0")
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def load_model(spec: str) -> tuple[str, str | None]:
    """(label, config JSON text or None) for a preset name or a config.json path."""
    if spec in selection.MODEL_PRESETS:
        return spec, None
    path = Path(spec)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if not path.is_file():
        raise UsageError(f"--model {spec!r}: neither a preset nor a config.json file",
                         hint="presets: " + ", ".join(selection.MODEL_PRESETS)
                              + "; or the path to a HuggingFace config.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON file: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a config.json holds a JSON object, not {type(data).__name__}")
    if "model_type" not in data:
        raise UsageError(f"{path}: no model_type (not a HuggingFace config.json?)")
    return str(path), json.dumps(data)


def cell(model: str, capability: str, dtype: str = "auto", *, kv_cache_dtype: str = "auto",
         backend: str | None = None, heads: int | None = None, tp: int = 1) -> selection.Cell:
    """One question (this model, on this capability, with this dtype, KV-cache dtype and attention
    heads per GPU) as the selection.Cell the tree answers: inputs checked (UsageError), the model's
    config.json read, capability `auto` resolved. `heads` None: the config's heads / `tp`."""
    if dtype not in DTYPE_CHOICES:
        raise UsageError(f"dtype {dtype!r}: use one of {', '.join(DTYPE_CHOICES)}")
    if heads is not None and heads < 1:
        raise UsageError(f"--heads {heads}: give the attention heads per GPU, >= 1")
    if tp < 1:
        raise UsageError(f"--tp {tp}: the tensor-parallel size is >= 1")
    if heads is not None and tp != 1:
        raise UsageError("give --heads (per GPU) or --tp, not both")
    label, config = load_model(model)
    if _is_dsv4(label, config):
        given = [name for name, on in (("--dtype", dtype != "auto"), ("--kv-cache-dtype", kv_cache_dtype != "auto"),
                                       ("--heads", heads is not None), ("--tp", tp != 1)) if on]
        if given:
            raise UsageError(f"{label}: {', '.join(given)} do not enter DeepSeek-V4's choice of kernels (its CUDA "
                             "model picks them from the GPU, VLLM_DSV4_PORTABLE and the kernels installed); "
                             f"drop {', '.join(given)}")
    # dtype "auto": the config's torch_dtype (presets: bfloat16), resolved
    # by the tree's _resolve_auto_dtype.  The KV-cache dtype is checked by
    # vLLM itself (its CacheDType list), so every release's values work.
    return selection.Cell(label, parse_capability(capability), dtype, kv_cache_dtype=kv_cache_dtype,
                          heads=heads, tp=tp, backend=backend, config=config)


def matrix_cells(model: str, backend: str | None = None) -> list[selection.Cell]:
    """The selection matrix for one model: every capability of selection.CAPABILITIES x model
    dtype x KV-cache dtype x heads per GPU."""
    label, config = load_model(model)
    if _is_dsv4(label, config):  # one question per capability: nothing else enters its choice
        return [selection.Cell(label, cc, "auto", backend=backend, config=config) for cc in selection.CAPABILITIES]
    return [dataclasses.replace(c, preset=label, config=config)
            for c in selection.matrix_cells(presets=["-"], backend=backend)]


def _is_dsv4(label: str, config: str | None) -> bool:
    return selection.is_dsv4(json.loads(config) if config else selection.preset_config(label))


def plan(model: str, *, capability: str | None = None, dtype: str = "auto", kv_cache_dtype: str = "auto",
         heads: int | None = None, tp: int = 1, backend: str | None = None,
         matrix: bool = False) -> list[selection.Cell]:
    """The cells `smla explain` asks with these options (inputs checked, nothing run yet)."""
    if matrix:
        fixed = [name for name, given in (("--capability", capability is not None), ("--dtype", dtype != "auto"),
                                          ("--kv-cache-dtype", kv_cache_dtype != "auto"),
                                          ("--heads", heads is not None), ("--tp", tp != 1)) if given]
        if fixed:
            raise UsageError(f"--matrix covers every capability, dtype, KV-cache dtype and head count; "
                             f"drop {', '.join(fixed)}")
        return matrix_cells(model, backend=backend)
    if capability is None:
        raise UsageError("--capability is required (or --matrix)", hint="e.g. --capability 12.0")
    return [cell(model, capability, dtype, kv_cache_dtype=kv_cache_dtype, backend=backend, heads=heads, tp=tp)]


def render(results: list[dict[str, Any]], tree_desc: str, *, matrix: bool = False, as_json: bool = False) -> str:
    """What `smla explain` prints for `results` (those of `plan`'s cells on one tree)."""
    from smla import report

    if as_json:
        data = [to_dict(r, tree_desc) for r in results]
        return report.to_json(data if matrix else data[0])
    return matrix_text(results, tree_desc) if matrix else text(results[0], tree_desc)


def run(work_tree: Path, model: str, *, tree_spec: str = TREE_PATCHED, matrix: bool = False,
        as_json: bool = False, **options) -> str:
    """`smla explain`: one case (or the whole matrix) on one tree, rendered as text or JSON.
    `options`: those of `plan` (capability, dtype, kv_cache_dtype, heads, tp, backend)."""
    cells = plan(model, matrix=matrix, **options)  # inputs first: before a tree is exported
    tree, desc = resolve_tree(tree_spec, work_tree)
    return render(explain_many([(tree, cells)])[0], desc, matrix=matrix, as_json=as_json)


# --------------------------------------------------------------------------
# trees
# --------------------------------------------------------------------------

def resolve_tree(spec: str, work_tree: Path) -> tuple[Path, str]:
    """(source tree, description) for "patched", "pristine" or a path."""
    if spec == TREE_PATCHED:
        return work_tree, f"patched work tree {work_tree}"
    if spec == TREE_PRISTINE:
        tree = pristine_tree(work_tree)
        return tree, f"pristine base ({BASE_TAG}) of {work_tree}, exported to {tree}"
    path = Path(spec).expanduser().absolute()
    if not (path / "vllm" / "__init__.py").is_file():
        raise UsageError(f"--tree {spec!r}: not {TREE_PATCHED}, {TREE_PRISTINE} or a vLLM source tree "
                         "(no vllm/__init__.py there)")
    return path, f"vLLM source tree {path}"


def pristine_tree(work_tree: Path) -> Path:
    """The work tree's base commit (tag smla-base) exported under the cache.

    One export per base commit id, made in a temporary directory beside its
    final place and renamed into place when complete."""
    work_tree = Path(work_tree)
    if not (work_tree / ".git").exists():
        raise TreeStateError(f"no work tree at {work_tree}", hint="run `make patch` first")
    base = base_commit(work_tree)
    if base is None:
        raise TreeStateError(f"{work_tree} has no {BASE_TAG} tag, so no pristine base to export",
                             hint="run `make patch` (or `smla fetch`) to make an smla work tree")
    dest = cache.cache_dir() / "trees" / base
    if (dest / "vllm" / "__init__.py").is_file():
        log.info("cached pristine tree: %s", dest)
        return dest
    cache.writable_dir(dest.parent)
    try:
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{base[:12]}.", suffix=".part"))
    except OSError as exc:
        raise cache.unwritable(dest.parent, exc) from exc
    try:
        archive = tmp / "base.tar"
        proc.git(work_tree, "archive", "--format=tar", f"--output={archive}", base, "vllm")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        archive.unlink()
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / "vllm" / "__init__.py").is_file():
                raise  # not a concurrent export that won the race
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


# --------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------

def explain_many(jobs: list[tuple[Path, list[selection.Cell]]]) -> list[list[dict[str, Any]]]:
    """Every cell of every tree (one interpreter per tree, run concurrently).

    A result the tree refuses (bad config, unknown backend, a non-MLA model)
    raises UsageError."""
    if len(jobs) == 1:
        out = [selection.run_selection(*jobs[0])]
    else:
        out = selection.run_selections(jobs)
    for results in out:
        for r in results:
            _check(r)
            _below_series_floor(r)
    return out


# The series' Triton kernels (attention and indexer) are built and tested for sm80+ (bf16/fp16 tensor
# cores); below it no backend is valid, and the indexer's "triton" answer would describe nothing that runs.
SERIES_MIN_CAPABILITY = (8, 0)


def _below_series_floor(r: dict[str, Any]) -> None:
    ix = r.get("indexer")
    if not ix or ix.get("path") != "triton" or not _CAP_RE.match(str(r.get("capability", ""))):
        return
    major, minor = (int(x) for x in r["capability"].split("."))
    if (major, minor) >= SERIES_MIN_CAPABILITY:
        return
    r["indexer"] = {**ix, "path": "none",
                    "reason": f"no indexer kernel runs at compute capability {r['capability']}: the series' "
                              "portable Triton kernels need 8.0+, DeepGEMM 9.0+"}


def _check(r: dict[str, Any]) -> None:
    if r.get("input_error"):
        raise UsageError(f"{r['preset']}: {r['input_error']}",
                         hint="check --tp (it must divide the model's attention heads), --heads, --dtype and "
                              "--kv-cache-dtype; `smla explain --help` lists them")
    if r.get("not_mla"):
        m = r["model"]
        raise UsageError(
            f"{r['preset']}: vLLM does not use MLA for model_type {m['model_type']!r} "
            f"(is_deepseek_mla={m['is_deepseek_mla']}), so it picks among the dense attention "
            "backends, which this toolkit does not cover",
            hint="smla explain covers MLA models, above all DSA sparse MLA (index_topk in the "
                 "config: GLM-5, DeepSeek-V3.2)")


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------

def to_dict(result: dict[str, Any], tree_desc: str) -> dict[str, Any]:
    d = {k: v for k, v in result.items() if k != "config"}
    d["tree"] = tree_desc
    return d


def text(result: dict[str, Any], tree_desc: str) -> str:
    if "dsv4" in result:
        return dsv4_text(result, tree_desc)
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
    if results and "dsv4" in results[0]:
        return dsv4_matrix_text(results, tree_desc)
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


def dsv4_groups(result: dict[str, Any]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """[(VLLM_DSV4_PORTABLE value or None, its cases)], in the order asked."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for case in result["dsv4"]["cases"]:
        groups.setdefault(case[DSV4_ENV], []).append(case)
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
    for env, cases in dsv4_groups(r):
        lines.append(f"{DSV4_ENV}={env}" + (" (the default):" if env == "auto" else ":") if env is not None else
                     f"{DSV4_ENV}: not in this tree (the series' switch is absent):")
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
        parts.append("mHC " + case["mhc"]["reason"].split(":")[0].split(", forced")[0])
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
             f"| cc | {DSV4_ENV} | attention | mHC, o_proj, compressor |",
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
