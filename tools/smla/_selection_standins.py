"""Stand-ins for what a CPU checkout of vLLM lacks, and the import machinery that installs them.

Used by smla._selection_worker (in the child interpreter, loaded by path beside it, and in-process
for import_vllm_tree). Imports nothing from `smla` and nothing but the standard library at module
level: in the child the vLLM tree, not the toolkit, is on sys.path.

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
  and torch.cuda.get_device_properties returns a stand-in (132 SMs);
  torch.accelerator.empty_cache does nothing (torch's CPU build raises
  without an accelerator, where a CUDA build returns; vLLM 0.33.0's
  workspace manager calls it when it grows).
- Platform: vllm.platforms.current_platform resolves to CudaPlatform and
  get_device_capability returns the cell's capability; get_device_name (only
  reached by _resolve_auto_dtype's fallback warning) returns a stand-in name.
- Model config: VllmConfig.model_config is a SimpleNamespace with hf_config /
  hf_text_config (a plain transformers PretrainedConfig with the config's
  fields), dtype and use_mla: what the selection path reads.  use_mla,
  use_sparse, head size and dtype "auto" are derived by the tree's own code.
- DeepSeek-V4 (its CUDA model picks its kernels itself): the section at the
  end of this file (import_dsv4, dsv4_inputs).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path


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


class _MLAPagedWrapper:
    """flashinfer.mla.BatchMLAPagedAttentionWrapper as vLLM 0.33.0's pin (flashinfer-python 0.7.2.post1)
    has it: vLLM probes run()'s keyword-only `ckv_scale_arr` (FlashInfer >= 0.6.18, has_flashinfer_sm90_nope_mla)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("flashinfer.mla.BatchMLAPagedAttentionWrapper is a selection-harness stand-in")

    def run(self, *args, ckv_scale_arr=None, **kwargs):
        raise RuntimeError("flashinfer.mla.BatchMLAPagedAttentionWrapper.run is a selection-harness stand-in")


# FlashInfer APIs whose signature vLLM inspects (not only that they exist): served as written above.
_FLASHINFER_APIS = {"flashinfer.mla.BatchMLAPagedAttentionWrapper": _MLAPagedWrapper}


class _AnyAttrModule(types.ModuleType):
    """Stand-in package: any public attribute is a function that raises (or, for the few APIs vLLM
    inspects, the stand-in class in _FLASHINFER_APIS)."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        fn = _FLASHINFER_APIS.get(f"{self.__name__}.{attr}") or _raiser(f"{self.__name__}.{attr}")
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
              "torch.cuda.get_device_properties stand-in, torch.accelerator.empty_cache no-op")


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
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and accelerator.current_accelerator() is None:
            accelerator.empty_cache = lambda: None
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
# DeepSeek-V4: its CUDA model picks its own kernels (not vLLM's backend selector)
# --------------------------------------------------------------------------
#
# The DeepSeek-V4 query (smla explain --model deepseek-v4) imports the tree's CUDA model module,
# whose _select_dsv4_attn_cls picks the attention class, and with the series (nvidia/portable.py,
# ops.cutedsl_supported) the mHC, output-projection and CuTe DSL routes. What it needs beyond the
# stand-ins above, each undone once its step is over (the model imported; a case answered):
#
# - vllm._custom_ops.cutlass_scaled_mm_supports_* call compiled _C ops while the quantization
#   utilities import (module-level constants): they answer False during the import. They choose
#   linear-layer kernels; none of the selectors explain runs reads them.
# - The kernel packages of the official wheel with vLLM's CUDA requirements count as installed:
#   tilelang and cutlass (nvidia-cutlass-dsl), both in requirements/cuda.txt, and DeepGEMM
#   (vendored into the wheel): has_tilelang / has_cutedsl / has_deep_gemm answer True where the
#   selectors ask. Their arch checks (has_device_capability, support_deep_gemm) are the tree's own.
# - Two inputs, asked both ways: FlashInfer's sm120 sparse-MLA kernel (has_flashinfer_sparse_mla_sm120
#   in the model module, where the tree asks for it) and vLLM's FlashMLA build (the flags
#   vllm.v1.attention.ops.flashmla sets from importing vllm._flashmla_C / _flashmla_extension_C;
#   its is_flashmla_sparse_supported then adds its own capability check). VLLM_DSV4_PORTABLE
#   is set in the environment for each value the tree's vllm.envs knows.
DSV4_MODEL = "vllm.models.deepseek_v4.nvidia.model"
DSV4_PORTABLE = "vllm.models.deepseek_v4.nvidia.portable"
DSV4_OPS = "vllm.models.deepseek_v4.nvidia.ops"
DSV4_ENV = "VLLM_DSV4_PORTABLE"
# 0.33.0+: the series' switch is KernelConfig.deepseek_v4_kernels (--kernel-config), not an env var
DSV4_CONFIG_FIELD = "deepseek_v4_kernels"
_FLASHMLA_OPS = "vllm.v1.attention.ops.flashmla"
_DEEP_GEMM_UTILS = "vllm.utils.deep_gemm"
_CUTLASS_NOTE = ("vllm._custom_ops.cutlass_scaled_mm_supports_* (compiled _C queries run at import: "
                 "answer False; no selector explain runs reads them)")
_DSV4_PACKAGES_NOTE = ("DeepSeek-V4 kernel packages (official wheel + CUDA requirements: tilelang, cutlass "
                       "DSL and vendored DeepGEMM count as installed; FlashMLA's build and FlashInfer's "
                       "sm120 kernel asked both ways)")


def import_dsv4() -> types.SimpleNamespace:
    """Import the tree's DeepSeek-V4 CUDA model (after import_vllm_tree with a capability).

    Returns the modules the query calls: model (its _select_dsv4_attn_cls), portable (the series'
    nvidia/portable.py, None where the tree has none), ops (nvidia/ops, with the series'
    cutedsl_supported), flashmla (the FlashMLA flags) and deep_gemm (vllm.utils.deep_gemm); and
    stand_ins, the DeepSeek-V4 stand-ins (named in DeepSeek-V4 results only).
    Raises ImportError where the tree has no DeepSeek-V4 model code."""
    import vllm._custom_ops as custom_ops

    saved = {name: getattr(custom_ops, name) for name in dir(custom_ops)
             if name.startswith("cutlass_") and "_supports_" in name}
    for name in saved:
        setattr(custom_ops, name, lambda *args, **kwargs: False)
    try:
        model = importlib.import_module(DSV4_MODEL)
    finally:
        for name, fn in saved.items():
            setattr(custom_ops, name, fn)
    try:
        portable = importlib.import_module(DSV4_PORTABLE)
    except ModuleNotFoundError as exc:
        if exc.name != DSV4_PORTABLE:
            raise
        portable = None
    return types.SimpleNamespace(model=model, portable=portable, ops=importlib.import_module(DSV4_OPS),
                                 flashmla=importlib.import_module(_FLASHMLA_OPS),
                                 deep_gemm=importlib.import_module(_DEEP_GEMM_UTILS),
                                 stand_ins=([_CUTLASS_NOTE] if saved else []) + [_DSV4_PACKAGES_NOTE])


def dsv4_switch() -> tuple[str | None, list[str | None]]:
    """The series' DeepSeek-V4 kernel switch in this tree and the values to ask it with:
    (VLLM_DSV4_PORTABLE, its values) where the tree's vllm.envs knows it (0.26.0 line),
    (deepseek_v4_kernels, its values) where KernelConfig has that field (0.33.0 line), else
    (None, [None]) (no series)."""
    import typing

    import vllm.envs as envs
    from vllm.config import KernelConfig

    if DSV4_ENV in getattr(envs, "environment_variables", {}):
        return DSV4_ENV, ["auto", "1", "0"]
    field = getattr(KernelConfig, "__dataclass_fields__", {}).get(DSV4_CONFIG_FIELD)
    if field is not None:
        hint = typing.get_type_hints(KernelConfig).get(DSV4_CONFIG_FIELD, field.type)
        values = list(typing.get_args(hint)) or ["auto"]
        return DSV4_CONFIG_FIELD, ["auto", *[v for v in values if v != "auto"]]
    return None, [None]


def dsv4_has_flashinfer_input(mods: types.SimpleNamespace) -> bool:
    """Whether the tree's attention choice asks FlashInfer for its sm120 sparse-MLA kernel."""
    return hasattr(mods.model, "has_flashinfer_sparse_mla_sm120")


def _put_env(name: str, value: str | None) -> None:
    """Set `name` to `value`, or unset it for None."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _dsv4_caches(mods: types.SimpleNamespace) -> list:
    """The functools caches of the selectors the query calls (cleared around each case)."""
    fns = [getattr(mods.deep_gemm, "is_deep_gemm_supported", None), getattr(mods.ops, "cutedsl_supported", None)]
    if mods.portable is not None:
        fns += [getattr(mods.portable, "select_dsv4_mhc_kernels", None),
                getattr(mods.portable, "select_dsv4_o_proj", None)]
    return [fn for fn in fns if hasattr(fn, "cache_clear")]


@contextlib.contextmanager
def dsv4_inputs(mods: types.SimpleNamespace, portable_env: str | None, flashinfer_sm120: bool | None,
                flashmla: bool):
    """One DeepSeek-V4 case: VLLM_DSV4_PORTABLE (None: unset; a KernelConfig switch is not set
    here but passed to the selectors), FlashInfer's sm120 kernel (None: not asked by the tree) and
    vLLM's FlashMLA build, plus the installed packages; all undone after."""
    patches = [(mods.flashmla, "_flashmla_C_AVAILABLE", flashmla),
               (mods.flashmla, "_flashmla_extension_C_AVAILABLE", flashmla),
               (mods.deep_gemm, "has_deep_gemm", lambda: True)]
    if flashinfer_sm120 is not None:
        patches.append((mods.model, "has_flashinfer_sparse_mla_sm120", lambda: flashinfer_sm120))
    if mods.portable is not None and hasattr(mods.portable, "has_tilelang"):
        patches.append((mods.portable, "has_tilelang", lambda: True))
    if hasattr(mods.ops, "has_cutedsl"):
        patches.append((mods.ops, "has_cutedsl", lambda: True))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    saved_env = os.environ.get(DSV4_ENV)
    for obj, name, value in patches:
        setattr(obj, name, value)
    _put_env(DSV4_ENV, portable_env)
    caches = _dsv4_caches(mods)
    for fn in caches:
        fn.cache_clear()
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        _put_env(DSV4_ENV, saved_env)
        for fn in caches:
            fn.cache_clear()
