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

This module: the inputs, the trees, running the selection and checking its answers; the output
lives in smla.explain_text (MLA presets) and smla.explain_dsv4 (DeepSeek-V4). The work tree, and so
the pin and the pristine base, are those of the release line (`smla --line`, `make explain VLLM=`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from smla import cache, proc, selection
from smla.errors import TreeStateError, UsageError
from smla.explain_dsv4 import (  # noqa: F401  (the DeepSeek-V4 output, as the docs' table tests use it)
    DSV4_ENV, dsv4_groups, dsv4_matrix_text, dsv4_short_class, dsv4_short_pick, dsv4_short_route, dsv4_text,
    dsv4_variants,
)
from smla.explain_text import matrix_text as mla_matrix_text
from smla.explain_text import text as mla_text
from smla.explain_text import to_dict
from smla.project import Project
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
        as_json: bool = False, python: str | None = None, **options) -> str:
    """`smla explain`: one case (or the whole matrix) on one tree, rendered as text or JSON.
    `python`: the interpreter the tree's selection runs in (`line_python`; None: this one).
    `options`: those of `plan` (capability, dtype, kv_cache_dtype, heads, tp, backend)."""
    cells = plan(model, matrix=matrix, **options)  # inputs first: before a tree is exported
    tree, desc = resolve_tree(tree_spec, work_tree)
    return render(explain_many([(tree, cells)], python=python)[0], desc, matrix=matrix, as_json=as_json)


def line_python(project: Project) -> str | None:
    """The interpreter a line's vLLM imports with (Project.line_python): None where it is this
    one or the toolkit's own serves; a line whose Python is missing is an error naming the make
    target that builds it (vLLM 0.33.0 imports packages, and pins a Triton, the toolkit's .venv
    does not have)."""
    py = project.line_python
    if py is None or Path(sys.prefix).resolve() == py.parent.parent.resolve():
        return None
    if not py.is_file():
        raise UsageError(f"line {project.line}'s vLLM imports with its own Python, {project.rel(py)}, "
                         "which is not there",
                         hint=f"run `make venv VLLM={project.line}` (it installs "
                              f"requirements/line-{project.line}.txt into .venv-{project.line})")
    return str(py)


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

def explain_many(jobs: list[tuple[Path, list[selection.Cell]]],
                 python: str | None = None) -> list[list[dict[str, Any]]]:
    """Every cell of every tree (one interpreter per tree, run concurrently).

    A result the tree refuses (bad config, unknown backend, a non-MLA model)
    raises UsageError."""
    if len(jobs) == 1:
        out = [selection.run_selection(*jobs[0], python=python)]
    else:
        out = selection.run_selections(jobs, python=python)
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
# output: smla.explain_text (MLA presets), smla.explain_dsv4 (DeepSeek-V4)
# --------------------------------------------------------------------------

def text(result: dict[str, Any], tree_desc: str) -> str:
    """One case, as `smla explain` prints it."""
    return dsv4_text(result, tree_desc) if "dsv4" in result else mla_text(result, tree_desc)


def matrix_text(results: list[dict[str, Any]], tree_desc: str) -> str:
    """The matrix, as `smla explain --matrix` prints it."""
    if results and "dsv4" in results[0]:
        return dsv4_matrix_text(results, tree_desc)
    return mla_matrix_text(results, tree_desc)
