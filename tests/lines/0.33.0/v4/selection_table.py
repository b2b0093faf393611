"""Print (JSON) the DeepSeek-V4 attention class that a vLLM tree's CUDA model builds, per
compute capability 8.0-12.1 (mocked), FlashInfer's sm120 kernel present or absent, and (where
the tree has it) KernelConfig.deepseek_v4_kernels; no attention backend given, and with
--attention-backend TRITON_MLA_SPARSE_DSV4 / FLASHMLA_SPARSE_DSV4. FlashMLA's sparse kernels
are taken as built for sm90/sm100 (vLLM's CUDA wheel). Run with PYTHONPATH=<tree>."""
import json
import sys
from types import SimpleNamespace

import port_v4_interp  # noqa: F401  (vllm.triton_utils sees Triton)
from vllm.models.deepseek_v4.nvidia import model
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backends.registry import AttentionBackendEnum

CAPS = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (12, 1)]
platform_cls = type(model.current_platform)
patched = hasattr(model, "_dsv4_attn_cls_and_reason")
options = ["auto", "upstream", "portable"] if patched else [None]
backends = [None, "TRITON_MLA_SPARSE_DSV4", "FLASHMLA_SPARSE_DSV4"]
rows = []
for cap in CAPS:
    for fi in (True, False):
        platform_cls.get_device_capability = classmethod(
            lambda cls, device_id=0, _c=DeviceCapability(*cap): _c
        )
        if patched:
            model.has_flashinfer_sparse_mla_sm120 = lambda _fi=fi: _fi
            model.is_flashmla_sparse_supported = lambda _c=cap: (_c[0] in (9, 10), None)
        for opt in options:
            for b in backends:
                if b is not None and not hasattr(AttentionBackendEnum, b):
                    continue
                kernel_config = SimpleNamespace(deepseek_v4_kernels=opt)
                if patched:
                    from vllm.config.kernel import KernelConfig

                    kernel_config = KernelConfig(deepseek_v4_kernels=opt)
                cfg = SimpleNamespace(
                    attention_config=SimpleNamespace(
                        backend=None if b is None else AttentionBackendEnum[b]
                    ),
                    kernel_config=kernel_config,
                )
                try:
                    got = model._select_dsv4_attn_cls(cfg).__name__
                except Exception as e:  # noqa: BLE001
                    got = f"error: {type(e).__name__}"
                rows.append(dict(cap=f"{cap[0]}.{cap[1]}", flashinfer_sm120=fi,
                                 option=opt, backend=b, cls=got))
print(json.dumps(rows))
sys.stdout.flush()
