"""Run vLLM's own attention-backend selection for DSA sparse-MLA geometries.

Library (what `smla explain`, the selection tests and the GPU backend test
import).  The work happens in a child interpreter that runs
tools/smla/_selection_worker.py by path (the query); the stand-ins it
installs (compiled modules, FlashInfer, CUDA device, platform) are listed in
tools/smla/_selection_standins.py, the model config's in the worker.

Public API:

    PRESETS, preset_config(name)   model geometries ("glm-5", "deepseek-v3.2")
    NOPE_PRESETS                   GLM-5.3-Flash ("glm-5.3-flash"): head 512, NoPE, kpool 4
    DSV4_PRESETS, is_dsv4(config)  DeepSeek-V4 ("deepseek-v4"): its own query
    MODEL_PRESETS                  every preset name
    CAPABILITIES, DTYPES, KV_CACHE_DTYPES, HEADS   the selection matrix axes
    Cell(...)                      one question: model, capability, dtype, KV
                                   cache dtype, heads per GPU, backend (what
                                   smla.explain.cell builds from user input)
    matrix_cells(...)              the product of those axes
    run_selection(tree, cells)     -> list[dict], one result per cell
    run_selections([(tree, cells), ...])  several trees, concurrently
    import_vllm_tree(tree)         the same stand-ins + import, in this process

One call of run_selection() starts ONE fresh interpreter (vLLM caches the
platform, backend priorities and selections, and the tree is imported from
`tree` itself) that answers every cell.  In it the real vLLM code path runs:
`vllm.v1.attention.selector.get_attn_backend` (with the cell's KV-cache dtype
and heads per GPU, as MLAAttention calls it) for the pick or vLLM's exact
error; the AttentionSelectorConfig the selector built is then handed to
`CudaPlatform.get_valid_backends` for every backend's reasons, over the
priority list `vllm.platforms.cuda._get_backend_priorities` gave for it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from smla import _selection_worker as _worker
from smla import proc
from smla.errors import CommandError, TreeStateError

PRESETS: dict[str, dict[str, Any]] = {
    # GLM-5 (DSA): wider nope / v heads than DeepSeek; 64 attention heads.
    "glm-5": dict(
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=192,
        v_head_dim=256,
        index_topk=2048,
        num_attention_heads=64,
    ),
    "deepseek-v3.2": dict(
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        index_topk=2048,
        num_attention_heads=128,
    ),
}

# model_type / architectures of each preset, as in the checkpoints'
# config.json (both model types are in vLLM's is_deepseek_mla list).
PRESET_MODELS: dict[str, dict[str, Any]] = {
    "glm-5": dict(model_type="glm_moe_dsa",
                  architectures=["GlmMoeDsaForCausalLM"], torch_dtype="bfloat16"),
    "deepseek-v3.2": dict(model_type="deepseek_v32",
                          architectures=["DeepseekV32ForCausalLM"],
                          torch_dtype="bfloat16"),
}


# DeepSeek-V4: what its checkpoints' config.json say that selection reads (model type, the
# head_dim + compress_ratios that make vLLM treat it as MLA, dtype), and its attention geometry
# (head 512 = 448 NoPE + 64 RoPE, 64 heads, index top-k 512; compress_ratios: one per layer in a
# checkpoint, here one of each layer kind: sliding window only, C4, C128). Its CUDA model picks
# its attention class itself, so it is not a preset of the sparse-MLA matrix above.
DSV4_PRESETS: dict[str, dict[str, Any]] = {
    "deepseek-v4": dict(
        model_type=_worker.DSV4_MODEL_TYPE,
        architectures=["DeepseekV4ForCausalLM"],
        torch_dtype="bfloat16",
        head_dim=512,
        qk_rope_head_dim=64,
        num_attention_heads=64,
        index_topk=512,
        compress_ratios=[0, 4, 128],
    ),
}
# GLM-5.3-Flash (Glm5Next): MLA without RoPE (NoPE: qk_rope_head_dim 0), so the selector gets head
# size kv_lora_rank + 0 = 512; 64 heads, top-k 2048 over keys pooled 4:1 (index_kpool; its buffer is
# 2176 wide). model_type is the text config's (Glm5NextTextConfig, in vLLM's is_deepseek_mla list).
# Not a preset of the head-576 matrix above (PRESETS): `--model glm-5.3-flash` asks it by name.
NOPE_PRESETS: dict[str, dict[str, Any]] = {
    "glm-5.3-flash": dict(
        model_type="glm5_next_text",
        architectures=["Glm5NextForCausalLM"],
        torch_dtype="bfloat16",
        kv_lora_rank=512,
        qk_rope_head_dim=0,
        qk_nope_head_dim=256,
        v_head_dim=256,
        mla_use_nope=True,
        index_topk=2048,
        index_kpool=4,
        index_n_heads=16,
        index_head_dim=128,
        num_attention_heads=64,
    ),
}
# Every model `smla explain --model` takes by name.
MODEL_PRESETS: list[str] = [*PRESETS, *NOPE_PRESETS, *DSV4_PRESETS]


def preset_config(name: str) -> dict[str, Any]:
    """The preset `name` as an HF config dict (MLA geometry + model type)."""
    if name in DSV4_PRESETS:
        return dict(DSV4_PRESETS[name])
    if name in NOPE_PRESETS:
        return dict(NOPE_PRESETS[name])
    return {**PRESET_MODELS[name], **PRESETS[name]}


def is_dsv4(config: dict[str, Any]) -> bool:
    """Whether an HF config dict is DeepSeek-V4's (answered by its own query, not vLLM's selector)."""
    return config.get("model_type") == _worker.DSV4_MODEL_TYPE


CAPABILITIES: list[str] = ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1"]
DTYPES: list[str] = ["float16", "bfloat16"]
# vLLM's --kv-cache-dtype values that matter for MLA: the model dtype, an
# explicit 16-bit cache, and the fp8 variants (fp8_ds_mla: DeepSeek's packed
# 656-byte sparse-MLA format).
KV_CACHE_DTYPES: list[str] = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_ds_mla"]
# Attention heads per GPU (num_attention_heads / tensor-parallel size):
# 0.17+ order sm10x's sparse backends by it.
HEADS: list[int] = [8, 16, 64, 128]


@dataclasses.dataclass(frozen=True)
class Cell:
    preset: str  # a PRESETS name, or only a label when `config` is given
    capability: str  # "12.0"
    dtype: str  # "float16" | "bfloat16" | "auto" (the config's, as vLLM does)
    kv_cache_dtype: str = "auto"
    heads: int | None = None  # heads per GPU; None: num_attention_heads / tp
    tp: int = 1  # tensor-parallel size, only used when heads is None
    backend: str | None = None  # explicit --attention-backend, or None = auto
    block_size: int | None = None  # explicit --block-size, or None
    config: str | None = None  # JSON text of an HF config.json, else the preset

    def key(self) -> tuple:
        return (self.preset, self.capability, self.dtype, self.kv_cache_dtype,
                self.heads, self.tp, self.backend, self.block_size)

    @classmethod
    def of(cls, result: dict[str, Any]) -> Cell:
        """The cell a result answers."""
        return cls(**{f.name: result.get(f.name) for f in dataclasses.fields(cls)
                      if f.name != "config"})


def matrix_cells(presets=None, capabilities=None, dtypes=None, kv_cache_dtypes=None,
                 heads=None, backend: str | None = None) -> list[Cell]:
    """Every combination of the axes (defaults: the full matrix)."""
    return [
        Cell(p, c, d, kv_cache_dtype=kv, heads=h, backend=backend)
        for p in (presets or list(PRESETS))
        for c in (capabilities or CAPABILITIES)
        for d in (dtypes or DTYPES)
        for kv in (kv_cache_dtypes or KV_CACHE_DTYPES)
        for h in (heads or HEADS)
    ]


def _payload_cell(cell: Cell) -> dict[str, Any]:
    d = dataclasses.asdict(cell)
    config = d.pop("config")
    d["config_dict"] = json.loads(config) if config else preset_config(cell.preset)
    return d


def run_selection(tree: str | os.PathLike, cells: list[Cell],
                  timeout: float = 600.0, python: str | None = None
                  ) -> list[dict[str, Any]]:
    """Answer every cell in one fresh interpreter importing vLLM from `tree`.

    Each result dict has the cell's fields and: "model" (what the tree derives
    from the config: model_type, use_mla, use_sparse, head_size, dtype,
    index_topk, num_attention_heads), "heads_per_gpu", "priority" (list of
    {"backend", "valid", "reasons"} in the CUDA priority order vLLM used),
    "selected" (backend name or None), "error" (vLLM's exact error text or
    None), "requested" (with `backend`: its own validation),
    "kv_cache_dtype_used" (the cache format after selection: 0.24+ turn some
    dtypes into fp8_ds_mla for the chosen backend), "selector_config",
    "indexer" ({"deep_gemm_arch", "path", "reason"}: the DSA indexer's kernels
    as the tree decides them) and "stand_ins".  Instead of a
    selection, a result may carry "input_error" (the config or backend name
    was refused) or "not_mla" (the tree does not use MLA for this config).

    A DeepSeek-V4 cell (is_dsv4) has "model", "indexer" and "stand_ins", and
    instead of the selection fields "dsv4": {"selector", "series_route" (the
    tree has the series' nvidia/portable.py), "inputs" (the values asked:
    VLLM_DSV4_PORTABLE, None where the tree has no such switch;
    "flashinfer_sm120", None where the tree does not ask; "flashmla"), "cases"
    (one per combination: those inputs, "attention" ({"class", "reason",
    "backend", "backend_supports_capability", "fp8_ds_mla_layout"}) or None
    with vLLM's "error", "mhc" ({"kernels": {op: module kind}, "reason"}),
    "o_proj" ({"path", "reason"}) and "cutedsl" (bool), each None where the
    tree has no such selector), "stand_ins" (those of the DeepSeek-V4 query)}.

    Raises TreeStateError when `tree` is no vLLM source tree, CommandError
    when the child process fails.
    """
    tree = Path(tree).resolve()
    if not (tree / "vllm" / "__init__.py").is_file():
        raise TreeStateError(f"no vLLM source tree at {tree} (no vllm/__init__.py)",
                             hint="run `make patch`, or give the root of a vLLM checkout")
    payload = json.dumps({"tree": str(tree), "cells": [_payload_cell(c) for c in cells]})
    env = {
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cuda"),
    }
    result = proc.run([python or sys.executable, str(Path(_worker.__file__).resolve())],
                      input=payload, timeout=timeout, cwd=str(tree.parent), env=env,
                      check=False)
    out = result.stdout
    if result.returncode != 0 or _worker.MARKER not in out:
        raise CommandError(
            f"vLLM selection subprocess failed (exit {result.returncode}) "
            f"for tree {tree}:\n{result.stderr[-4000:]}\n{out[-2000:]}",
            hint="the tree must import with this interpreter's torch/transformers "
                 "(requirements/vllm-import.txt)")
    return json.loads(out.split(_worker.MARKER, 1)[1])


def run_selections(jobs: list[tuple[str | os.PathLike, list[Cell]]],
                   timeout: float = 600.0, python: str | None = None) -> list[list[dict[str, Any]]]:
    """run_selection for several trees at once (one interpreter each, run
    concurrently); results in the order of `jobs`."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        futures = [pool.submit(run_selection, tree, cells, timeout, python) for tree, cells in jobs]
        return [f.result() for f in futures]


def import_vllm_tree(tree: str | os.PathLike, capability: str | None = None) -> list[str]:
    """Put `tree` first on sys.path in THIS process, install the stand-ins
    that are needed (see smla._selection_standins) and import vllm from the
    tree.  With `capability` ("9.0"), vLLM's current_platform is CudaPlatform
    reporting that compute capability; without, vLLM detects the platform
    (the real one on a GPU machine).  Returns the stand-ins used so far.
    For in-process users such as the GPU backend test; selection queries
    should use run_selection()."""
    return _worker.import_vllm_tree(tree, capability=capability)
