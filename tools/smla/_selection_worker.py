"""Child-process side of smla.selection: run vLLM's own attention-backend
selection inside ONE fresh interpreter that imports vLLM from a source tree.

Run by path (never imported from the `smla` package in the child), as

    python .../smla/_selection_worker.py  < payload.json

with payload {"tree": PATH, "cells": [cell dicts, each with its HF config as
"config_dict"]}.  It prints `@@SMLA-JSON@@` and a JSON list with one result
per cell (fields: see smla.selection.run_selection).  smla.selection also
imports this module in-process for import_vllm_tree().

The file imports nothing from `smla` and nothing but the standard library at
module level: in the child the vLLM tree, not the toolkit, is on sys.path.

Stand-ins (installed by install_stand_ins; every one used is named in each
result's "stand_ins" list).  The model is "the official CUDA wheel of this
vLLM release, installed with its CUDA requirements, on a GPU of the cell's
compute capability":

- Compiled modules of the official wheel (COMPILED): an empty module, only
  when the selection path imports one and no real one is found (a meta-path
  finder placed after the real ones).  0.24+ `vllm._C_stable_libtorch`
  (imported unguarded by platforms/cuda.py), 0.16 `vllm._C`, and
  FlashAttention's `vllm.vllm_flash_attn._vllm_fa2_C` / `_vllm_fa3_C`: with
  those two present, the tree's own flash_attn_interface decides FA2/FA3
  support from the capability (FA3 on 9.x only; FLASH_ATTN_MLA_SPARSE needs
  it), as on a real install.  Nothing in them is called on this path.
  Not stood in: FlashMLA's `vllm._flashmla_C` (the wheel pairs it with a
  Python interface the sdist lacks; FLASHMLA_SPARSE's validation does not
  ask for it, dense FLASHMLA reports it missing), optional packages such as
  tokenspeed_mla, and DeepGEMM (vendored into the wheel only).  Their
  "not available/installed" reasons appear only next to "sparse not
  supported" for the sparse geometries.
- `vllm.vllm_flash_attn` as a whole, only for trees whose source has no such
  package (0.16.0's sdist): a module whose functions raise if called and
  which has no flash_attn_interface, so FLASH_ATTN_MLA adds "not supported
  on this device" (it already says "sparse not supported").
- FlashInfer (`flashinfer`, its submodules, and `flashinfer_cubin`), only if
  flashinfer is not installed: vLLM's CUDA requirements pin flashinfer-python
  (and list flashinfer-cubin), so a real install has the FlashInfer APIs
  vLLM probes for (e.g. has_flashinfer_sparse_mla_sm120).  The stand-in
  package makes any submodule importable and any public attribute a
  function that raises if called; dunder lookups fail as usual.
- No CUDA device: CUDA tensor factories at import time give "meta" tensors,
  and torch.cuda.get_device_properties returns a stand-in (132 SMs).
- Platform: vllm.platforms.current_platform resolves to CudaPlatform and
  get_device_capability returns the cell's capability; get_device_name (only
  reached by _resolve_auto_dtype's fallback warning) returns a stand-in name.
- Model config: VllmConfig.model_config is a SimpleNamespace with hf_config /
  hf_text_config (a plain transformers PretrainedConfig with the config's
  fields), dtype and use_mla: what the selection path reads.  use_mla,
  use_sparse, head size and dtype "auto" are derived by the tree's own code.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
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

# Compiled extension modules of the official CUDA wheels (0.16.0 and 0.26.0)
# that the selection path may import.
COMPILED = (
    "vllm._C",
    "vllm._C_stable_libtorch",
    "vllm.vllm_flash_attn._vllm_fa2_C",
    "vllm.vllm_flash_attn._vllm_fa3_C",
)
FLASHINFER = ("flashinfer", "flashinfer_cubin")


def _raiser(name: str):
    def f(*args, **kwargs):
        raise RuntimeError(f"{name} is a selection-harness stand-in")
    f.__name__ = name.rsplit(".", 1)[-1]
    f.__qualname__ = f.__name__
    return f


class _AnyAttrModule(types.ModuleType):
    """Stand-in package: any public attribute is a function that raises."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        fn = _raiser(f"{self.__name__}.{attr}")
        setattr(self, attr, fn)
        return fn


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves stand-in modules for names nothing else on sys.meta_path finds.

    Appended to sys.meta_path, so a real module (a built tree, an installed
    flashinfer) always wins.  Records every stand-in it hands out."""

    def __init__(self, has_fa_package: bool, flashinfer: bool):
        self.used: list[str] = []
        self.has_fa_package = has_fa_package
        self.flashinfer = flashinfer

    def _kind(self, name: str) -> str | None:
        if name in COMPILED:
            return "compiled"
        if name == "vllm.vllm_flash_attn" and not self.has_fa_package:
            return "fa_package"
        if self.flashinfer and (name in FLASHINFER or name.startswith("flashinfer.")):
            return "flashinfer"
        return None

    def find_spec(self, name, path=None, target=None):
        kind = self._kind(name)
        if kind is None:
            return None
        self._note_kind(name, kind)
        return importlib.machinery.ModuleSpec(
            name, self, is_package=(kind == "flashinfer" and name == "flashinfer"))

    def create_module(self, spec):
        kind = self._kind(spec.name)
        if kind == "flashinfer":
            mod = _AnyAttrModule(spec.name)
            if spec.name == "flashinfer":
                mod.__path__ = []
        else:
            mod = types.ModuleType(spec.name)
            if kind == "fa_package":
                for attr in ("flash_attn_varlen_func", "get_scheduler_metadata"):
                    setattr(mod, attr, _raiser(f"{spec.name}.{attr}"))
        return mod

    def exec_module(self, module):
        pass

    def _note_kind(self, name: str, kind: str) -> None:
        if kind == "compiled":
            self._note(f"{name} (compiled module of the official wheel: empty)")
        elif kind == "fa_package":
            self._note("vllm.vllm_flash_attn (not in this source tree: functions raise if called)")
        else:
            top = name.split(".")[0]
            self._note(f"{top} (as vLLM's CUDA requirements install it: any function, raises if called)")

    def _note(self, text: str) -> None:
        if text not in self.used:
            self.used.append(text)


class _PlatformHook(importlib.abc.MetaPathFinder):
    """Makes `vllm.platforms` resolve current_platform to CudaPlatform.

    vLLM resolves its platform lazily, on first use, which may already
    happen inside `import vllm`; so the resolver is replaced right after
    vllm/platforms/__init__.py has run, before anything can use it."""

    QUALNAME = "vllm.platforms.cuda.CudaPlatform"

    def find_spec(self, name, path=None, target=None):
        if name != "vllm.platforms":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            module.resolve_current_platform_cls_qualname = lambda: self.QUALNAME

        spec.loader.exec_module = exec_and_patch
        return spec


_FINDER: _StandInFinder | None = None
_CUDA_NOTE = ("no CUDA device: cuda tensor factories -> meta tensors, "
              "torch.cuda.get_device_properties stand-in")


def install_stand_ins(tree: str | os.PathLike, cuda_platform: bool = False) -> _StandInFinder:
    """Install the stand-ins (module docstring) for importing vLLM from
    `tree` in this process; returns the finder (its .used names them).
    With cuda_platform, vLLM's platform resolves to CudaPlatform (its
    capability is then set with set_capability)."""
    global _FINDER
    if cuda_platform and not any(isinstance(f, _PlatformHook) for f in sys.meta_path):
        if "vllm.platforms" in sys.modules:
            raise RuntimeError("vllm.platforms was imported before the CUDA platform stand-in")
        sys.meta_path.insert(0, _PlatformHook())
    if _FINDER is not None:
        return _FINDER
    import importlib.util

    tree = Path(tree)
    has_fa = (tree / "vllm" / "vllm_flash_attn" / "__init__.py").is_file()
    finder = _StandInFinder(has_fa_package=has_fa,
                            flashinfer=importlib.util.find_spec("flashinfer") is None)
    sys.meta_path.append(finder)
    _FINDER = finder

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

        _CudaToMeta().__enter__()  # for the whole (short-lived) process

        class _Props:
            multi_processor_count = 132
            name = "selection-harness stand-in"
            total_memory = 80 << 30
            major, minor = 9, 0
            is_integrated = False

        torch.cuda.get_device_properties = lambda *a, **k: _Props()
        finder._note(_CUDA_NOTE)
    return finder


def import_vllm_tree(tree: str | os.PathLike, capability: str | None = None) -> list[str]:
    """Put `tree` first on sys.path, install the stand-ins and import vllm
    from it, in THIS process.  With `capability` ("12.0"), vLLM's platform is
    CudaPlatform with that compute capability (as in the selection worker);
    without, vLLM detects its platform itself.  Returns the stand-ins used
    so far."""
    tree = str(Path(tree).resolve())
    if tree not in sys.path:
        sys.path.insert(0, tree)
    finder = install_stand_ins(tree, cuda_platform=capability is not None)
    import vllm
    if not str(Path(vllm.__file__).resolve()).startswith(tree):
        raise RuntimeError(f"imported vllm from {vllm.__file__}, not {tree}")
    if capability is not None:
        set_capability(capability)
        finder._note("CUDA platform: current_platform is CudaPlatform, compute capability mocked")
    return finder.used


def set_capability(text: str):
    """Make vLLM's CUDA platform report compute capability `text` ("12.0")."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability

    major, minor = (int(x) for x in text.split("."))
    cap = DeviceCapability(major, minor)
    platform_cls = type(platforms.current_platform)
    platform_cls.get_device_capability = classmethod(lambda cls, device_id=0, _cap=cap: _cap)
    # Only reached by _resolve_auto_dtype's fallback warning; the real one asks NVML.
    platform_cls.get_device_name = classmethod(
        lambda cls, device_id=0: "selection-harness stand-in GPU")
    return cap


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

    hf = PretrainedConfig(**cfg)
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

        model_config = types.SimpleNamespace(hf_config=hf, hf_text_config=text,
                                             dtype=dtype, use_mla=True)
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
            res["indexer"] = self._indexer_facts()
        return res

    def _indexer_facts(self) -> dict[str, Any]:
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
        if select is None:
            facts["path"] = "deepgemm" if arch else "none"
            facts["reason"] = ("DeepGEMM only (no portable indexer in this tree)" if arch else
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
