"""pytest plugin for the GPU machine (torch 2.11, no vLLM installed there): the 0.33.0 line's own
tests of its own Triton kernels, run as they would in vLLM, with the kernel files loaded from the
tree in SMLA_TREE (tests/gpu/kpool-bundle.sh copies them):
  tests/kernels/test_fused_deepseek_v32_fp8_encode.py  patch 0006: DeepSeek-V3.2 / GLM-5's fused
      cache writers and index query (vllm/models/deepseek_v32/common/kernels.py)
  tests/kernels/test_glm5next_kpool_fp8_encode.py      patch 0014: GLM-5.3-Flash's kpool writers
Stand-ins, all here, for the vLLM modules those files import and no kernel runs:
  vllm.platforms.current_platform  tests/gpu/platform_stand_in.py: is_cuda / fp8_dtype /
      has_device_capability / is_arch_support_pdl ..., answered as CudaPlatform answers them
      (torch's device capability)
  vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl  fused_q asks it on CUDA (the module needs
      CuTe DSL, not on the machine): is_fused_q_cutedsl_supported False below sm100, as vLLM's
  vllm.utils.deep_gemm.mqa_logits_use_mx_scales  False (MX scales are sm100's)
  vllm.v1.attention.ops.common.pack_ue8m0_x4  only traced with MX scales, never here
  vllm.v1.kv_cache_interface.is_quantized_kv_cache  True for the fp8 cache dtypes
vllm.triton_utils is Triton itself (sparse_mla_reference.provide_triton_utils).
usage: PYTHONPATH=tests:tests/gpu python3 -m pytest -p line_ops_stub <tree>/tests/kernels/test_X.py
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

from platform_stand_in import provide_platforms
from sparse_mla_reference import provide_ops_package

TREE = Path(os.environ["SMLA_TREE"])
PACKAGES = ("vllm.models", "vllm.models.deepseek_v32", "vllm.models.deepseek_v32.common",
            "vllm.models.deepseek_v32.nvidia", "vllm.models.deepseek_v32.nvidia.ops",
            "vllm.models.glm5next", "vllm.models.glm5next.nvidia", "vllm.models.glm5next.nvidia.ops")


CUTEDSL = "vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl"


def _fused_q_cutedsl_supported(*args, **kwargs) -> bool:
    """vLLM's answer below sm100 whatever the tensors (the H200 is sm90): the Triton fused_q runs."""
    from vllm.platforms import current_platform

    if current_platform.has_device_capability(100):
        raise RuntimeError("the CuTe DSL fused_q is not bundled: its sm100+ check needs it")
    return False


def _fused_q_cutedsl_missing(*args, **kwargs):
    raise RuntimeError("the CuTe DSL fused_q is not bundled (tests/gpu/line_ops_stub.py)")


def _module(name: str, **attrs) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__smla_stub__ = True
    sys.modules[name] = mod


def install() -> None:
    provide_ops_package(TREE)  # vllm ... vllm.v1.attention.ops from the tree, vllm.triton_utils
    import triton
    import triton.language as tl

    for name in PACKAGES:  # the tree's files, without its package __init__ files
        _module(name, __path__=[str(TREE.joinpath(*name.split(".")))])
    provide_platforms()
    _module("vllm.utils", __path__=[])
    _module("vllm.utils.deep_gemm", mqa_logits_use_mx_scales=lambda: False)

    @triton.jit
    def pack_ue8m0_x4(x):  # MX scales only (sm100): never traced here
        return x.to(tl.int32, bitcast=True)

    _module("vllm.v1.attention.ops.common", pack_ue8m0_x4=pack_ue8m0_x4)
    _module(CUTEDSL, is_fused_q_cutedsl_supported=_fused_q_cutedsl_supported,
            fused_q_cutedsl=_fused_q_cutedsl_missing)
    _module("vllm.v1.kv_cache_interface",
            is_quantized_kv_cache=lambda dtype: isinstance(dtype, str) and dtype.startswith("fp8"))


install()
