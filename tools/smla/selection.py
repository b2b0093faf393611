"""Run vLLM's own attention-backend selection for DSA sparse-MLA geometries.

Library module (moved here from tests/vllm_harness.py); used by
`smla explain` (tools/smla/explain.py) and by the selection tests.

Public API:

    PRESETS                      model geometries ("glm-5", "deepseek-v3.2")
    CAPABILITIES, DTYPES         the support matrix this project targets
    Cell(...)                    one query: preset (or HF config), capability,
                                 dtype, ...
    preset_config(name)          a preset as an HF config dict
    run_selection(tree, cells)   -> list[dict], one result per cell
    run_selections([(tree, cells), ...])  the same for several trees, concurrently
    matrix_cells(...)            the full capability x dtype x preset matrix
    format_table(results)        plain-text table of picks
    import_vllm_tree(tree)       the same stand-ins + import, in this process

Each call of run_selection() starts ONE fresh interpreter (vLLM caches the
platform, backend priorities and selections with functools.cache, and the
tree is imported from `tree` itself), which answers every cell and prints
JSON.  Inside that interpreter the real vLLM code path is used:
`vllm.v1.attention.selector.get_attn_backend` for the pick (or the exact
ValueError text), and `CudaPlatform.get_valid_backends` /
`AttentionBackend.validate_configuration` for the per-backend reasons, over
the CUDA priority list from `vllm.platforms.cuda._get_backend_priorities`.

What is mocked or stood in for (all in the child process only):

- Platform: `vllm.platforms.current_platform` resolves to
  `vllm.platforms.cuda.CudaPlatform` (patched resolver), and
  `CudaPlatform.get_device_capability` returns the cell's DeviceCapability.
- `vllm._C` (compiled ops): an empty module, if it cannot be imported.
- `vllm.vllm_flash_attn` (compiled FlashAttention): a module whose
  `flash_attn_varlen_func` / `get_scheduler_metadata` raise if called, if it
  cannot be imported.  It has no `flash_attn_interface`, so
  `flash_attn_supports_mla()` is False and FLASH_ATTN_MLA additionally reports
  "FlashAttention MLA not supported on this device" (also on 9.0, where a
  real vLLM wheel would not say that; its "sparse not supported" stands).
- `flashinfer` / `flashinfer.decode` (only if flashinfer is not installed):
  modules whose functions raise if called, so FLASHINFER_MLA's module imports
  and reports its real validate_configuration reasons instead of
  "ImportError".
- Without a CUDA device: tensor factories called with a CUDA device at
  backend-module import time (CUTLASS_MLA / FLASHINFER_MLA allocate global
  workspaces) create "meta" tensors instead, and
  `torch.cuda.get_device_properties` returns a stand-in with
  multi_processor_count=132.  Nothing is ever computed on them.
- Not stood in: other compiled extensions (e.g. vllm._flashmla_C), so
  FLASHMLA additionally reports "vllm._flashmla_C is not available ..." as
  on a build without it.  These extra reasons never change the pick here:
  every such backend is already invalid for sparse MLA ("sparse not supported").
- Model config: `VllmConfig.model_config` is a SimpleNamespace carrying
  `hf_config` / `hf_text_config` (a plain transformers PretrainedConfig built
  from the preset's MLA fields, or from a config.json's fields, instead of
  the model's own config class) and `dtype`; that is all the selection path
  reads (FLASHINFER_MLA checks hf_text_config.qk_nope_head_dim).  A real
  ModelConfig would need the checkpoint's config from the Hub.  use_mla,
  use_sparse and head_size are derived from that config by the tree's own
  code (ModelArchConfigConvertorBase.is_deepseek_mla / get_head_size,
  VLLM_MLA_DISABLE, and `hasattr(hf_config, "index_topk")` as in
  CudaPlatform.check_and_update_config); dtype "auto" goes through the
  tree's `_resolve_auto_dtype` (platform device name stood in for its
  fallback warning).

Run as a script (users: prefer `smla explain`):

    python -m smla.selection --tree work/vllm --table
    python -m smla.selection --tree work/vllm --capability 12.0 \\
        --dtype float16 --preset glm-5 --backend TRITON_MLA_SPARSE --json

This module imports nothing from `smla` at module level: the selection
child process loads this file on its own (by path), with the vLLM tree and
not the toolkit on its sys.path.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # GLM-5 (DSA): wider nope / v heads than DeepSeek.
    "glm-5": dict(
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=192,
        v_head_dim=256,
        index_topk=2048,
    ),
    "deepseek-v3.2": dict(
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        index_topk=2048,
    ),
}

# model_type / architectures of each preset, as in the checkpoints' config.json
# (vLLM 0.16.0: GlmMoeDsaForCausalLM and DeepseekV32ForCausalLM in
# vllm/model_executor/models/registry.py; both model types are in
# is_deepseek_mla's list).
PRESET_MODELS: dict[str, dict[str, Any]] = {
    "glm-5": dict(model_type="glm_moe_dsa",
                  architectures=["GlmMoeDsaForCausalLM"], torch_dtype="bfloat16"),
    "deepseek-v3.2": dict(model_type="deepseek_v32",
                          architectures=["DeepseekV32ForCausalLM"],
                          torch_dtype="bfloat16"),
}


def preset_config(name: str) -> dict[str, Any]:
    """The preset `name` as an HF config dict (MLA geometry + model type)."""
    return {**PRESET_MODELS[name], **PRESETS[name]}


CAPABILITIES: list[str] = ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1"]
DTYPES: list[str] = ["float16", "bfloat16"]
BLOCK_SIZE = 64


@dataclasses.dataclass(frozen=True)
class Cell:
    preset: str  # a PRESETS name, or only a label when `config` is given
    capability: str  # "12.0"
    dtype: str  # "float16" | "bfloat16" | "auto" (the config's, as vLLM does)
    kv_cache_dtype: str = "auto"
    block_size: int = BLOCK_SIZE
    backend: str | None = None  # explicit --attention-backend, or None = auto
    config: str | None = None  # JSON text of an HF config.json, else the preset

    def key(self) -> tuple:
        return (self.preset, self.capability, self.dtype, self.kv_cache_dtype,
                self.block_size, self.backend)


def matrix_cells(presets=None, capabilities=None, dtypes=None,
                 backend: str | None = None, kv_cache_dtype: str = "auto"
                 ) -> list[Cell]:
    return [
        Cell(p, c, d, kv_cache_dtype=kv_cache_dtype, backend=backend)
        for p in (presets or list(PRESETS))
        for c in (capabilities or CAPABILITIES)
        for d in (dtypes or DTYPES)
    ]


def run_selection(tree: str | os.PathLike, cells: list[Cell],
                  timeout: float = 300.0, python: str | None = None
                  ) -> list[dict[str, Any]]:
    """Answer every cell in one fresh interpreter importing vLLM from `tree`.

    Each result dict has: the cell's fields, "model" (what the tree derives
    from the config: model_type, use_mla, use_sparse, head_size, dtype),
    "priority" (list of {"backend", "valid", "reasons"} in CUDA priority
    order), "selected" (backend name or None), "error" (vLLM's exact error
    text or None), "stand_ins" (what was stubbed in that interpreter).
    Instead of a selection, a result may carry "input_error" (the config or
    backend name was refused: no "priority") or "not_mla" (the tree does not
    use MLA for this config: no selection was run).

    Raises TreeStateError when `tree` is no vLLM source tree, CommandError
    when the child process fails.
    """
    from smla import proc as proc_mod
    from smla.errors import CommandError, TreeStateError

    tree = Path(tree).resolve()
    if not (tree / "vllm" / "__init__.py").is_file():
        raise TreeStateError(f"no vLLM source tree at {tree} (no vllm/__init__.py)",
                             hint="run `make patch`, or give the root of a vLLM checkout")
    payload = json.dumps({"tree": str(tree),
                          "cells": [dataclasses.asdict(c) for c in cells]})
    env = {
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cuda"),
    }
    # The child loads this very file by path (not the `smla` package) and
    # runs its worker; it imports vLLM from `tree` only.
    child = ("import importlib.util as u, sys; "
             "s = u.spec_from_file_location('smla_selection_worker', sys.argv[1]); "
             "m = u.module_from_spec(s); sys.modules[s.name] = m; "
             "s.loader.exec_module(m); "
             "sys.exit(m.main(['--_worker']))")
    result = proc_mod.run(
        [python or sys.executable, "-c", child, str(Path(__file__).resolve())],
        input=payload, timeout=timeout, cwd=str(tree.parent), env=env,
        check=False,
    )
    marker = "@@SMLA-JSON@@"
    out = result.stdout
    if result.returncode != 0 or marker not in out:
        raise CommandError(
            f"vLLM selection subprocess failed (exit {result.returncode}) "
            f"for tree {tree}:\n{result.stderr[-4000:]}\n{out[-2000:]}",
            hint="the tree must import with this interpreter's torch/transformers")
    return json.loads(out.split(marker, 1)[1])


def run_selections(jobs: list[tuple[str | os.PathLike, list[Cell]]],
                   timeout: float = 300.0) -> list[list[dict[str, Any]]]:
    """run_selection for several trees at once (one interpreter each, run
    concurrently); results in the order of `jobs`."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        futures = [pool.submit(run_selection, tree, cells, timeout)
                   for tree, cells in jobs]
        return [f.result() for f in futures]


# --------------------------------------------------------------------------
# child-process side
# --------------------------------------------------------------------------

def _install_stand_ins() -> list[str]:
    import importlib.machinery
    import importlib.util
    import types

    stand_ins: list[str] = []

    def _raiser(name):
        def f(*args, **kwargs):
            raise RuntimeError(f"{name} is a selection-harness stand-in")
        f.__name__ = name.rsplit(".", 1)[-1]
        return f

    def _module(name, attrs=()):
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        for a in attrs:
            setattr(m, a, _raiser(f"{name}.{a}"))
        sys.modules[name] = m
        return m

    try:
        import vllm._C  # noqa: F401
    except ImportError:
        _module("vllm._C")
        stand_ins.append("vllm._C (empty module)")
    try:
        import vllm.vllm_flash_attn as _fa  # noqa: F401
        _fa.flash_attn_varlen_func  # noqa: B018
    except (ImportError, AttributeError):
        sys.modules.pop("vllm.vllm_flash_attn", None)
        _module("vllm.vllm_flash_attn",
                ["flash_attn_varlen_func", "get_scheduler_metadata"])
        stand_ins.append("vllm.vllm_flash_attn (functions raise if called)")
    if importlib.util.find_spec("flashinfer") is None:
        fi = _module("flashinfer")
        fi.__path__ = []  # package, so flashinfer.decode resolves
        dec = _module("flashinfer.decode",
                      ["trtllm_batch_decode_with_kv_cache_mla"])
        fi.decode = dec
        stand_ins.append("flashinfer, flashinfer.decode (functions raise)")

    import torch

    if not torch.cuda.is_available():
        from torch.overrides import TorchFunctionMode

        class _CudaToMeta(TorchFunctionMode):
            def __torch_function__(self, func, types_, args=(), kwargs=None):
                kwargs = dict(kwargs or {})
                dev = kwargs.get("device")
                if dev is not None and torch.device(dev).type == "cuda":
                    kwargs["device"] = "meta"
                return func(*args, **kwargs)

        mode = _CudaToMeta()
        mode.__enter__()  # for the whole (short-lived) child process

        class _Props:
            multi_processor_count = 132
            name = "selection-harness stand-in"
            total_memory = 80 << 30

        torch.cuda.get_device_properties = lambda *a, **k: _Props()
        stand_ins.append("no CUDA: cuda tensor factories -> meta tensors, "
                         "torch.cuda.get_device_properties stand-in")
    return stand_ins


def import_vllm_tree(tree: str | os.PathLike) -> list[str]:
    """Put `tree` first on sys.path in THIS process, install the stand-ins
    that are needed (see module docstring) and import vllm from the tree.
    Returns the list of stand-ins installed.  For in-process users such as
    the GPU backend test; selection queries should use run_selection()."""
    tree = str(Path(tree).resolve())
    if tree not in sys.path:
        sys.path.insert(0, tree)
    stand_ins = _install_stand_ins()
    import vllm
    if not str(Path(vllm.__file__).resolve()).startswith(tree):
        raise RuntimeError(f"imported vllm from {vllm.__file__}, not {tree}")
    return stand_ins


def _worker(payload: dict[str, Any]) -> list[dict[str, Any]]:
    import contextlib
    import io
    import types

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    tree = payload["tree"]
    sys.path.insert(0, tree)
    stand_ins = _install_stand_ins()

    import vllm
    if not str(Path(vllm.__file__).resolve()).startswith(str(Path(tree))):
        raise RuntimeError(f"imported vllm from {vllm.__file__}, not {tree}")

    import vllm.platforms as platforms

    platforms.resolve_current_platform_cls_qualname = (
        lambda: "vllm.platforms.cuda.CudaPlatform")

    import vllm.platforms.cuda as cuda_mod
    from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    current = platforms.current_platform
    platform_cls = type(current)
    assert issubclass(platform_cls, cuda_mod.CudaPlatformBase), platform_cls

    # Only reached by _resolve_auto_dtype's fallback warning (e.g. a bf16
    # config on a pre-8.0 capability); the real one asks NVML.
    platform_cls.get_device_name = classmethod(
        lambda cls, device_id=0: "selection-harness stand-in GPU")

    results = []
    for c in payload["cells"]:
        major, minor = (int(x) for x in c["capability"].split("."))
        cap = DeviceCapability(major, minor)
        platform_cls.get_device_capability = classmethod(
            lambda cls, device_id=0, _cap=cap: _cap)
        res: dict[str, Any] = dict(c)
        res["stand_ins"] = stand_ins
        results.append(res)
        cfg = (json.loads(c["config"]) if c.get("config")
               else preset_config(c["preset"]))
        try:
            model = _derive_model(cfg, c["dtype"])
        except Exception as e:  # noqa: BLE001 - reported to the caller
            res["input_error"] = (f"vLLM cannot use this model config: "
                                  f"{type(e).__name__}: {e}")
            continue
        hf, text = model.pop("hf_config"), model.pop("hf_text_config")
        dtype = model.pop("torch_dtype")
        res["model"] = model
        if not model["use_mla"]:
            res["not_mla"] = True
            continue
        try:
            backend_enum = (AttentionBackendEnum[c["backend"]]
                            if c["backend"] else None)
        except (KeyError, ValueError) as e:  # 0.16.0 raises ValueError
            res["input_error"] = (str(e) if isinstance(e, ValueError) else
                                  f"Unknown attention backend: {c['backend']!r}")
            continue
        use_sparse = model["use_sparse"]
        model_config = types.SimpleNamespace(
            hf_config=hf, hf_text_config=text,
            dtype=dtype, use_mla=True)
        vllm_config = VllmConfig(
            attention_config=AttentionConfig(backend=backend_enum))
        object.__setattr__(vllm_config, "model_config", model_config)

        head_size = model["head_size"]
        selector._cached_get_attn_backend.cache_clear()
        log = io.StringIO()
        with set_current_vllm_config(vllm_config), \
                contextlib.redirect_stdout(log):
            # Same config the selector builds (block_size cleared, as in
            # CudaPlatformBase.get_attn_backend_cls).
            sel_cfg = selector.AttentionSelectorConfig(
                head_size=head_size, dtype=dtype,
                kv_cache_dtype=c["kv_cache_dtype"], block_size=None,
                use_mla=True, use_sparse=use_sparse)
            valid, invalid = platform_cls.get_valid_backends(
                device_capability=cap, attn_selector_config=sel_cfg)
            valid_names = {b.name for b, _ in valid}
            res["priority"] = [
                {"backend": b.name, "valid": b.name in valid_names,
                 "reasons": list(invalid.get(b, []))}
                for b in cuda_mod._get_backend_priorities(True, cap)
            ]
            if backend_enum is not None:
                # Validation of the explicit backend, listed or not.
                try:
                    reasons = backend_enum.get_class().validate_configuration(
                        device_capability=cap, **sel_cfg._asdict())
                except ImportError:
                    reasons = ["ImportError"]
                res["requested"] = {"backend": backend_enum.name,
                                    "valid": not reasons, "reasons": reasons}
            try:
                cls = selector.get_attn_backend(
                    head_size, dtype, c["kv_cache_dtype"], c["block_size"],
                    use_mla=True, use_sparse=use_sparse)
                res["selected"] = cls.get_name()
                res["error"] = None
            except ValueError as e:
                res["selected"] = None
                res["error"] = str(e)
    return results


def _derive_model(cfg: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """What the imported vLLM tree derives from an HF config dict: use_mla,
    use_sparse, head size and the model dtype (with "auto" resolved by the
    tree's own _resolve_auto_dtype for the mocked capability)."""
    import torch
    from transformers import PretrainedConfig

    from vllm import envs
    from vllm.transformers_utils.config import get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )

    hf = PretrainedConfig(**cfg)
    text = get_hf_text_config(hf)
    conv = ModelArchConfigConvertorBase(hf, text)
    is_mla = bool(conv.is_deepseek_mla())
    use_mla = is_mla and not envs.VLLM_MLA_DISABLE
    model_type = getattr(hf, "model_type", None)

    config_dtype = getattr(hf, "dtype", None)
    if config_dtype is None:
        config_dtype = getattr(text, "dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype)
    if dtype_name == "auto":
        if config_dtype is None:
            raise ValueError("the config has no torch_dtype (vLLM would read "
                             "the checkpoint's safetensors); give a dtype")
        from vllm.config.model import _resolve_auto_dtype
        dtype = _resolve_auto_dtype(model_type, config_dtype,
                                    is_pooling_model=False)
    else:
        dtype = getattr(torch, dtype_name)
    from vllm.config import model as model_mod
    if hasattr(model_mod, "_check_valid_dtype"):
        model_mod._check_valid_dtype(model_type, dtype)

    return {
        "model_type": model_type,
        "architectures": list(getattr(hf, "architectures", None) or []),
        "is_deepseek_mla": is_mla,
        "use_mla": use_mla,
        "use_sparse": hasattr(hf, "index_topk"),
        "head_size": conv.get_head_size() if use_mla else None,
        "dtype": str(dtype).removeprefix("torch."),
        "config_dtype": (str(config_dtype).removeprefix("torch.")
                         if config_dtype is not None else None),
        "hf_config": hf,
        "hf_text_config": text,
        "torch_dtype": dtype,
    }


# --------------------------------------------------------------------------
# presentation
# --------------------------------------------------------------------------

def format_table(results: list[dict[str, Any]]) -> str:
    """One line per cell: preset, capability, dtype, pick or error."""
    rows = [("preset", "cc", "dtype", "kv_cache", "requested", "selected")]
    for r in results:
        pick = r["selected"]
        if pick is None:
            err = r["error"] or ""
            pick = "ERROR: " + (err.split(" with ")[0] if err else "?")
        rows.append((r["preset"], r["capability"], r["dtype"],
                     r["kv_cache_dtype"], r["backend"] or "auto", pick))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_reasons(result: dict[str, Any]) -> str:
    lines = [f"{result['preset']} cc {result['capability']} {result['dtype']}"
             f" kv_cache={result['kv_cache_dtype']}:"]
    for p in result["priority"]:
        state = "valid" if p["valid"] else "; ".join(p["reasons"])
        lines.append(f"  {p['backend']:<18} {state}")
    lines.append(f"  -> {result['selected'] or result['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=os.environ.get("SMLA_TREE",
                    str(Path(__file__).resolve().parents[1] / "work" / "vllm")))
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS))
    ap.add_argument("--capability", action="append")
    ap.add_argument("--dtype", action="append", choices=DTYPES)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--backend", default=None,
                    help="explicit backend, like --attention-backend")
    ap.add_argument("--table", action="store_true", help="print the pick table")
    ap.add_argument("--reasons", action="store_true",
                    help="print per-backend reasons for every cell")
    ap.add_argument("--json", action="store_true", help="print raw JSON")
    args = ap.parse_args(argv)

    if args._worker:
        payload = json.loads(sys.stdin.read())
        results = _worker(payload)
        sys.stdout.write("@@SMLA-JSON@@" + json.dumps(results))
        return 0

    cells = matrix_cells(args.preset, args.capability, args.dtype,
                         backend=args.backend, kv_cache_dtype=args.kv_cache_dtype)
    results = run_selection(args.tree, cells)
    if args.json:
        print(json.dumps(results, indent=2))
    if args.reasons:
        for r in results:
            print(format_reasons(r))
    if args.table or not (args.json or args.reasons):
        print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
