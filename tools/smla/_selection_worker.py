"""Child-process side of smla.selection: run vLLM's own attention-backend
selection inside ONE fresh interpreter that imports vLLM from a source tree.

Run by path (never imported from the `smla` package in the child), as

    python .../smla/_selection_worker.py  < payload.json

with payload {"tree": PATH, "cells": [cell dicts, each with its HF config as
"config_dict"]}.  It prints `@@SMLA-JSON@@` and a JSON list with one result
per cell (fields: see smla.selection.run_selection).  smla.selection also
imports this module in-process for import_vllm_tree().

The file imports nothing from `smla` (the stand-ins are loaded by path) and only the standard
library at module level: in the child the vLLM tree, not the toolkit, is on sys.path.

The stand-ins (compiled modules, FlashInfer, no CUDA device, the mocked platform) are installed
by _selection_standins.py; this module is the query, what vLLM's selection answers per cell. The
model config stand-in is here (_derive_model): VllmConfig.model_config is a SimpleNamespace with
hf_config / hf_text_config (a plain PretrainedConfig with the config's fields), dtype and use_mla;
use_mla, use_sparse, head size and dtype "auto" are derived by the tree's own code.

DeepSeek-V4 (model_type deepseek_v4) is asked differently: its CUDA model picks
its attention class itself (nvidia/model.py::_select_dsv4_attn_cls), not through
vLLM's backend selector, and with the series its mHC, output projection and
CuTe DSL routes too (nvidia/portable.py, nvidia/ops); answer_dsv4 calls those
functions of the tree for each value of their inputs (the stand-ins for them:
_selection_standins.import_dsv4 / dsv4_inputs).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

if __name__ == "__main__" and sys.path and sys.path[0] and \
        Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    # Run by path: Python put smla's own directory first on sys.path, where
    # module names like `wheel` or `cache` would shadow real packages.
    del sys.path[0]

MARKER = "@@SMLA-JSON@@"
# DeepSeek-V4's model_type: its CUDA model picks its attention class itself
# (nvidia/model.py::_select_dsv4_attn_cls), outside vLLM's backend selector.
DSV4_MODEL_TYPE = "deepseek_v4"

if __package__:  # imported from smla (in-process: import_vllm_tree)
    from smla import _selection_standins as standins
else:  # run by path, the child: load the stand-ins beside this file (smla's directory is off sys.path)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_smla_selection_standins", Path(__file__).resolve().with_name("_selection_standins.py"))
    standins = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = standins
    _spec.loader.exec_module(standins)
COMPILED, FLASHINFER = standins.COMPILED, standins.FLASHINFER
DSV4_ENV = standins.DSV4_ENV
import_vllm_tree, install_stand_ins, set_capability = (
    standins.import_vllm_tree, standins.install_stand_ins, standins.set_capability)


# --------------------------------------------------------------------------
# answering cells
# --------------------------------------------------------------------------

def _call(fn, **kwargs):
    """fn(**kwargs) with only the keyword arguments fn's signature takes
    (the selection API gained arguments between vLLM releases)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _derive_model(cfg: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """What the imported tree derives from an HF config dict: use_mla,
    use_sparse, head size and the model dtype ("auto" resolved by the tree's
    _resolve_auto_dtype for the mocked capability)."""
    import torch
    from transformers import PretrainedConfig

    from vllm import envs
    from vllm.transformers_utils.config import get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )

    # RoPE scaling goes in after construction: transformers 5's PretrainedConfig standardises it in
    # __init__, before the other fields (max_position_embeddings) are set, and fails there. Nothing
    # on the selection path reads it.
    rope = {k: cfg[k] for k in ("rope_scaling", "rope_parameters") if k in cfg}
    hf = PretrainedConfig(**{k: v for k, v in cfg.items() if k not in rope})
    for key, value in rope.items():
        setattr(hf, key, value)
    text = get_hf_text_config(hf)
    conv = ModelArchConfigConvertorBase(hf, text)
    is_mla = bool(conv.is_deepseek_mla())
    use_mla = is_mla and not envs.VLLM_MLA_DISABLE
    model_type = getattr(hf, "model_type", None)

    config_dtype = getattr(hf, "dtype", None)
    if config_dtype is None:
        config_dtype = getattr(text, "dtype", None)
    if config_dtype is None:
        config_dtype = cfg.get("torch_dtype")
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype)
    if dtype_name == "auto":
        if config_dtype is None:
            raise ValueError("the config has no torch_dtype (vLLM would read "
                             "the checkpoint's safetensors); give a dtype")
        from vllm.config.model import _resolve_auto_dtype
        dtype = _resolve_auto_dtype(model_type, config_dtype, is_pooling_model=False)
    else:
        dtype = getattr(torch, dtype_name)
    from vllm.config import model as model_mod
    if hasattr(model_mod, "_check_valid_dtype"):
        model_mod._check_valid_dtype(model_type, dtype)

    heads = getattr(text, "num_attention_heads", None)
    return {
        "model_type": model_type,
        "architectures": list(getattr(hf, "architectures", None) or []),
        "is_deepseek_mla": is_mla,
        "use_mla": use_mla,
        # as the DeepSeek-V2 family's layers decide (is_v32 / use_sparse)
        "use_sparse": hasattr(hf, "index_topk"),
        "index_topk": getattr(text, "index_topk", None),
        "num_attention_heads": heads if isinstance(heads, int) else None,
        "head_size": conv.get_head_size() if use_mla else None,
        "dtype": str(dtype).removeprefix("torch."),
        "config_dtype": (str(config_dtype).removeprefix("torch.")
                         if config_dtype is not None else None),
        "hf_config": hf,
        "hf_text_config": text,
        "torch_dtype": dtype,
    }


class _Selection:
    """The imported tree's selection machinery, with capability mocked."""

    def __init__(self, tree: str):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        self.stand_ins = import_vllm_tree(tree, capability="9.0")  # set per cell

        import vllm.platforms as platforms
        import vllm.platforms.cuda as cuda_mod
        from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config
        from vllm.platforms.interface import DeviceCapability
        from vllm.v1.attention import selector
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        self.cuda_mod, self.selector = cuda_mod, selector
        self.AttentionConfig, self.VllmConfig = AttentionConfig, VllmConfig
        self.set_current_vllm_config = set_current_vllm_config
        self.DeviceCapability, self.Enum = DeviceCapability, AttentionBackendEnum

        platform_cls = type(platforms.current_platform)
        assert issubclass(platform_cls, cuda_mod.CudaPlatformBase), platform_cls
        self.platform_cls = platform_cls

        # Record what vLLM's selector hands the platform (the exact
        # AttentionSelectorConfig and num_heads), and the priority list the
        # platform computes from them.
        self.seen: dict[str, Any] = {}
        orig_cls = platform_cls.get_attn_backend_cls.__func__

        def get_attn_backend_cls(cls, *args, **kwargs):
            bound = inspect.signature(orig_cls).bind(cls, *args, **kwargs)
            self.seen["call"] = dict(bound.arguments)
            return orig_cls(cls, *args, **kwargs)

        platform_cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)
        orig_prio = cuda_mod._get_backend_priorities

        def _get_backend_priorities(*args, **kwargs):
            out = orig_prio(*args, **kwargs)
            self.seen["priority"] = list(out)
            return out

        cuda_mod._get_backend_priorities = _get_backend_priorities

        try:  # 0.24+: the cache format a sparse backend turns the KV dtype into
            from vllm.model_executor.layers.attention import mla_attention
            self.canonicalize = getattr(
                mla_attention, "_canonicalize_sparse_mla_kv_cache_dtype", None)
        except ImportError:
            self.canonicalize = None

    def answer(self, c: dict[str, Any]) -> dict[str, Any]:
        res: dict[str, Any] = {k: v for k, v in c.items() if k != "config_dict"}
        res["stand_ins"] = self.stand_ins
        cap = set_capability(c["capability"])
        try:
            model = _derive_model(c["config_dict"], c["dtype"])
        except Exception as e:  # noqa: BLE001 - reported to the caller
            res["input_error"] = f"vLLM cannot use this model config: {type(e).__name__}: {e}"
            return res
        hf, text = model.pop("hf_config"), model.pop("hf_text_config")
        dtype = model.pop("torch_dtype")
        res["model"] = model
        if model["model_type"] == DSV4_MODEL_TYPE:
            return self.answer_dsv4(res, c, cap)
        if not model["use_mla"]:
            res["not_mla"] = True
            return res
        try:
            backend_enum = self.Enum[c["backend"]] if c["backend"] else None
        except (KeyError, ValueError) as e:  # 0.16.0 raises ValueError
            res["input_error"] = (str(e) if isinstance(e, ValueError) else
                                  f"Unknown attention backend: {c['backend']!r}")
            return res

        heads = c.get("heads")
        if heads is None and model["num_attention_heads"]:
            tp = int(c.get("tp") or 1)
            if model["num_attention_heads"] % tp:
                res["input_error"] = (f"num_attention_heads {model['num_attention_heads']} "
                                      f"is not divisible by tensor parallel size {tp}")
                return res
            heads = model["num_attention_heads"] // tp
        res["heads_per_gpu"] = heads

        # rswa_window (0.33+: a reverse sliding window; none in these models) and is_mm_prefix_lm
        # are read by the selection path of newer trees; older trees ignore them.
        model_config = types.SimpleNamespace(hf_config=hf, hf_text_config=text,
                                             dtype=dtype, use_mla=True, rswa_window=None,
                                             is_mm_prefix_lm=False)
        vllm_config = self.VllmConfig(
            attention_config=self.AttentionConfig(backend=backend_enum))
        object.__setattr__(vllm_config, "model_config", model_config)
        if c.get("block_size") is not None and vllm_config.cache_config is not None:
            cc = vllm_config.cache_config
            cc.block_size = c["block_size"]
            if hasattr(cc, "user_specified_block_size"):
                cc.user_specified_block_size = True

        sel = self.selector
        sel._cached_get_attn_backend.cache_clear()
        self.seen.clear()
        kv = c["kv_cache_dtype"]
        with self.set_current_vllm_config(vllm_config), \
                contextlib.redirect_stdout(io.StringIO()):
            try:
                cls = _call(sel.get_attn_backend, head_size=model["head_size"],
                            dtype=dtype, kv_cache_dtype=kv,
                            block_size=c.get("block_size"), use_mla=True,
                            use_sparse=model["use_sparse"], num_heads=heads)
                res["selected"], res["error"] = cls.get_name(), None
            except AssertionError as e:  # vLLM's check of the kv_cache_dtype value
                res["input_error"] = str(e)
                return res
            except ValueError as e:
                res["selected"], res["error"] = None, str(e)
                cls = None
            call = self.seen.get("call")
            if call is None:  # refused before reaching the platform
                res["priority"] = []
                return res
            sel_cfg = call["attn_selector_config"]
            res["selector_config"] = {k: str(v) for k, v in sel_cfg._asdict().items()}
            valid, invalid = _call(self.platform_cls.get_valid_backends,
                                   device_capability=cap, attn_selector_config=sel_cfg,
                                   num_heads=call.get("num_heads"))
            valid_names = {getattr(v, "backend", None) or v[0] for v in valid}
            valid_names = {b.name for b in valid_names}
            res["priority"] = []
            for b in self.seen.get("priority", []):
                why = invalid.get(b, [])
                if isinstance(why, tuple):  # 0.26: (priority, reasons)
                    why = why[1]
                res["priority"].append({"backend": b.name, "valid": b.name in valid_names,
                                        "reasons": list(why)})
            if backend_enum is not None:
                try:
                    reasons = backend_enum.get_class().validate_configuration(
                        device_capability=cap, **sel_cfg._asdict())
                except ImportError:
                    reasons = ["ImportError"]
                res["requested"] = {"backend": backend_enum.name,
                                    "valid": not reasons, "reasons": list(reasons)}
            if cls is not None and self.canonicalize is not None:
                res["kv_cache_dtype_used"] = self.canonicalize(cls, kv)
            elif cls is not None:
                res["kv_cache_dtype_used"] = kv
            res["indexer"] = self._indexer_facts(model["model_type"])
        return res

    # ----------------------------------------------------------------------
    # DeepSeek-V4
    # ----------------------------------------------------------------------

    def answer_dsv4(self, res: dict[str, Any], c: dict[str, Any], cap) -> dict[str, Any]:
        """DeepSeek-V4 at the mocked capability: for every value of VLLM_DSV4_PORTABLE the tree
        knows, with and without FlashInfer's sm120 kernel (where the tree asks for it) and vLLM's
        FlashMLA build, the attention class the tree's _select_dsv4_attn_cls picks (and the
        reason, where the tree gives one), or its error; and the mHC / o_proj / CuTe DSL routes
        of the tree's own selectors (None where the tree has none: no series)."""
        if not hasattr(self, "dsv4"):
            try:
                self.dsv4 = standins.import_dsv4()
                self.dsv4_error = None
            except ImportError as e:
                self.dsv4, self.dsv4_error = None, f"{type(e).__name__}: {e}"
        if self.dsv4 is None:
            res["input_error"] = ("this tree's DeepSeek-V4 CUDA model does not import here "
                                  f"({standins.DSV4_MODEL}): {self.dsv4_error}")
            return res
        try:
            backend_enum = self.Enum[c["backend"]] if c["backend"] else None
        except (KeyError, ValueError) as e:
            res["input_error"] = (str(e) if isinstance(e, ValueError) else
                                  f"Unknown attention backend: {c['backend']!r}")
            return res
        mods = self.dsv4
        switch, values = standins.dsv4_switch()
        flashinfer = [True, False] if standins.dsv4_has_flashinfer_input(mods) else [None]
        cases = []
        for value in values:
            env = value if switch == DSV4_ENV else None
            choice = value if switch == standins.DSV4_CONFIG_FIELD else None
            for fi in flashinfer:
                for flashmla in (True, False):
                    with standins.dsv4_inputs(mods, env, fi, flashmla), \
                            contextlib.redirect_stdout(io.StringIO()):
                        case = {switch or "switch": value, "flashinfer_sm120": fi, "flashmla": flashmla}
                        case.update(self._dsv4_case(mods, cap, backend_enum, choice))
                    cases.append(case)
        res["dsv4"] = {
            "selector": f"{standins.DSV4_MODEL}._select_dsv4_attn_cls",
            "series_route": mods.portable is not None,
            "switch": switch,
            "inputs": {switch or "switch": values, "flashinfer_sm120": flashinfer, "flashmla": [True, False]},
            "cases": cases,
            "stand_ins": list(mods.stand_ins),
        }
        res["indexer"] = self._indexer_facts()
        return res

    def _dsv4_case(self, mods, cap, backend_enum, choice: str | None) -> dict[str, Any]:
        """One case; `choice`: the KernelConfig switch's value (0.33.0), None (0.26.0: the env var)."""
        kwargs = {"attention_config": self.AttentionConfig(backend=backend_enum)}
        if choice is not None:
            kwargs["kernel_config"] = importlib.import_module("vllm.config").KernelConfig(
                **{standins.DSV4_CONFIG_FIELD: choice})
        vllm_config = self.VllmConfig(**kwargs)
        select_args = () if choice is None else (choice,)
        out: dict[str, Any] = {"attention": None, "error": None}
        try:
            cls = mods.model._select_dsv4_attn_cls(vllm_config)
        except ValueError as e:
            out["error"] = str(e)
        else:
            why = getattr(mods.model, "_dsv4_attn_cls_and_reason", None)
            backend_cls = getattr(cls, "backend_cls", None)
            out["attention"] = {
                "class": cls.__name__,
                "reason": why(vllm_config)[1] if why is not None else None,
                "backend": backend_cls.get_name() if backend_cls is not None else None,
                "backend_supports_capability": (bool(backend_cls.supports_compute_capability(cap))
                                                if backend_cls is not None else None),
                "fp8_ds_mla_layout": bool(getattr(cls, "use_fp8_ds_mla_layout", False)),
            }
        out["mhc"] = out["o_proj"] = None
        if mods.portable is not None:
            kernels, why = mods.portable.select_dsv4_mhc_kernels(*select_args)
            out["mhc"] = {"reason": why, "kernels": {f: getattr(kernels, f).__module__.rsplit(".", 1)[-1]
                                                     for f in kernels._fields if callable(getattr(kernels, f))}}
            path, why = mods.portable.select_dsv4_o_proj(*select_args)
            out["o_proj"] = {"path": path, "reason": why}
        supported = getattr(mods.ops, "cutedsl_supported", None)
        out["cutedsl"] = bool(supported(*select_args)) if supported is not None else None
        return out

    def _indexer_facts(self, model_type: str | None = None) -> dict[str, Any]:
        """Which kernels the tree's DSA indexer would run at the mocked
        capability, decided by the tree's own code.

        A patched tree has `select_sparse_indexer_logits()` (indexer patch):
        its answer is taken with DeepGEMM assumed importable, as in an
        installed wheel, which vendors it (this CPU harness has no DeepGEMM;
        asking `has_deep_gemm()` here would describe this machine, not the
        GPU's).  VLLM_SPARSE_INDEXER_BACKEND in the environment is honoured.
        A pristine tree has no such choice: DeepGEMM or an error at startup.
        """
        support = getattr(self.platform_cls, "support_deep_gemm", None)
        arch = bool(support()) if support else None
        facts: dict[str, Any] = {"deep_gemm_arch": arch, "path": None, "reason": None}
        try:
            mod = importlib.import_module("vllm.v1.attention.backends.mla.indexer")
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            facts["reason"] = f"indexer module does not import here: {type(e).__name__}"
            return facts
        select = getattr(mod, "select_sparse_indexer_logits", None)
        kpool_own = model_type in GLM5NEXT_MODEL_TYPES and not _kpool_asks_select()
        if select is None or kpool_own:
            facts["path"] = "deepgemm" if arch else "none"
            facts["reason"] = (("GLM-5.3-Flash's pooled indexer op of this tree" if kpool_own else
                                "the only indexer this tree has") if arch else
                               "DeepGEMM only, which has no kernels for this capability: "
                               "the indexer fails at startup")
            return facts
        saved = getattr(mod, "has_deep_gemm", None)
        mod.has_deep_gemm = lambda: True
        try:
            select.cache_clear() if hasattr(select, "cache_clear") else None
            facts["path"], facts["reason"] = select()
        finally:
            if saved is not None:
                mod.has_deep_gemm = saved
            select.cache_clear() if hasattr(select, "cache_clear") else None
        return facts


# GLM-5.3-Flash's pooled (kpool) indexer op (vllm/models/glm5next/nvidia/sparse_indexer.py) takes
# the series' logits choice where it calls select_sparse_indexer_logits; upstream's: DeepGEMM only.
GLM5NEXT_MODEL_TYPES = ("glm5_next", "glm5_next_text")


def _kpool_asks_select() -> bool:
    spec = importlib.util.find_spec("vllm.models")
    path = Path(spec.submodule_search_locations[0]) / "glm5next" / "nvidia" / "sparse_indexer.py"
    return path.is_file() and "select_sparse_indexer_logits" in path.read_text()


def run(payload: dict[str, Any]) -> list[dict[str, Any]]:
    s = _Selection(payload["tree"])
    return [s.answer(c) for c in payload["cells"]]


def main() -> int:
    payload = json.loads(sys.stdin.read())
    results = run(payload)
    sys.stdout.write(MARKER + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
