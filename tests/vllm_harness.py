"""Run vLLM's own attention-backend selection for DSA sparse-MLA geometries.

Public API (no pytest dependency; reused by the `explain` command):

    PRESETS                      model geometries ("glm-5", "deepseek-v3.2")
    CAPABILITIES, DTYPES         the support matrix this project targets
    Cell(...)                    one query: preset, capability, dtype, ...
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
  `hf_config` / `hf_text_config` (a transformers PretrainedConfig with the
  preset's MLA fields) and `dtype`; that is all the selection path reads
  (FLASHINFER_MLA checks hf_text_config.qk_nope_head_dim).  A real
  ModelConfig would need the checkpoint's config from the Hub.

Run as a script:

    python tests/vllm_harness.py --tree work/vllm --table
    python tests/vllm_harness.py --tree work/vllm --capability 12.0 \\
        --dtype float16 --preset glm-5 --backend TRITON_MLA_SPARSE --json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
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

CAPABILITIES: list[str] = ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1"]
DTYPES: list[str] = ["float16", "bfloat16"]
BLOCK_SIZE = 64


@dataclasses.dataclass(frozen=True)
class Cell:
    preset: str
    capability: str  # "12.0"
    dtype: str  # "float16" | "bfloat16"
    kv_cache_dtype: str = "auto"
    block_size: int = BLOCK_SIZE
    backend: str | None = None  # explicit --attention-backend, or None = auto

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

    Each result dict has: the cell's fields, "priority" (list of
    {"backend", "valid", "reasons"} in CUDA priority order), "selected"
    (backend name or None), "error" (vLLM's exact error text or None),
    "stand_ins" (what was stubbed in that interpreter).
    """
    tree = Path(tree).resolve()
    if not (tree / "vllm" / "__init__.py").is_file():
        raise FileNotFoundError(f"no vLLM source tree at {tree}")
    payload = json.dumps({"tree": str(tree),
                          "cells": [dataclasses.asdict(c) for c in cells]})
    env = dict(os.environ)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env["VLLM_TARGET_DEVICE"] = env.get("VLLM_TARGET_DEVICE", "cuda")
    proc = subprocess.run(
        [python or sys.executable, str(Path(__file__).resolve()), "--_worker"],
        input=payload, capture_output=True, text=True, timeout=timeout,
        cwd=str(tree.parent), env=env,
    )
    marker = "@@SMLA-JSON@@"
    out = proc.stdout
    if proc.returncode != 0 or marker not in out:
        raise RuntimeError(
            f"selection worker failed (rc={proc.returncode}):\n"
            f"{proc.stderr[-4000:]}\n{out[-2000:]}")
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

    tree = payload["tree"]
    sys.path.insert(0, tree)
    stand_ins = _install_stand_ins()

    import vllm
    if not str(Path(vllm.__file__).resolve()).startswith(str(Path(tree))):
        raise RuntimeError(f"imported vllm from {vllm.__file__}, not {tree}")

    import vllm.platforms as platforms

    platforms.resolve_current_platform_cls_qualname = (
        lambda: "vllm.platforms.cuda.CudaPlatform")

    import torch
    from transformers import PretrainedConfig

    import vllm.platforms.cuda as cuda_mod
    from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    current = platforms.current_platform
    platform_cls = type(current)
    assert issubclass(platform_cls, cuda_mod.CudaPlatformBase), platform_cls

    results = []
    for c in payload["cells"]:
        major, minor = (int(x) for x in c["capability"].split("."))
        cap = DeviceCapability(major, minor)
        platform_cls.get_device_capability = classmethod(
            lambda cls, device_id=0, _cap=cap: _cap)
        dtype = getattr(torch, c["dtype"])
        geom = PRESETS[c["preset"]]
        hf = PretrainedConfig(**geom, model_type="smla-harness")
        model_config = types.SimpleNamespace(
            hf_config=hf, hf_text_config=hf, dtype=dtype, use_mla=True)
        backend_enum = (AttentionBackendEnum[c["backend"]]
                        if c["backend"] else None)
        vllm_config = VllmConfig(
            attention_config=AttentionConfig(backend=backend_enum))
        object.__setattr__(vllm_config, "model_config", model_config)

        head_size = geom["kv_lora_rank"] + geom["qk_rope_head_dim"]
        selector._cached_get_attn_backend.cache_clear()
        res: dict[str, Any] = dict(c)
        res["stand_ins"] = stand_ins
        log = io.StringIO()
        with set_current_vllm_config(vllm_config), \
                contextlib.redirect_stdout(log):
            # Same config the selector builds (block_size cleared, as in
            # CudaPlatformBase.get_attn_backend_cls).
            sel_cfg = selector.AttentionSelectorConfig(
                head_size=head_size, dtype=dtype,
                kv_cache_dtype=c["kv_cache_dtype"], block_size=None,
                use_mla=True, use_sparse=True)
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
                    use_mla=True, use_sparse=True)
                res["selected"] = cls.get_name()
                res["error"] = None
            except ValueError as e:
                res["selected"] = None
                res["error"] = str(e)
        results.append(res)
    return results


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
    ap.add_argument("--tree", default=os.environ.get("SMLA_VLLM_TREE",
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
