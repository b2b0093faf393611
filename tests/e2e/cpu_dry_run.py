"""CPU dry run of the e2e engine configuration (no GPU): what vLLM makes of the tiny models.

Builds vLLM's engine config for one model / dtype / backend / TP exactly as
run_e2e.py would (except load_format "dummy": registering `e2e_dummy` imports
the model executor, which calls CUDA ops at import time), then asks vLLM's
attention selector which backend it would use.

STAND-INS (this is a dry run, not a test of the kernels):
- the platform is vLLM's CudaPlatform with the capability faked as 9.0, the
  name as "NVIDIA H200", 143771 MiB of memory and GPUS devices (default: the
  larger of 2 and TP, as on the nvidia-h200-x2/-x4/-x8 kinds);
- `vllm._C_stable_libtorch`, `vllm._moe_C_stable_libtorch`, `vllm._flashmla_C`
  and FA3's `_vllm_fa3_C` are empty modules; `vllm._custom_ops.cutlass_*supports*`
  return False.

usage: python cpu_dry_run.py MODEL DTYPE BACKEND|auto TP [GPUS]
  with vLLM 0.26.0's Python (official wheel, or an overlay of the patched
  files) importable, plus transformers 5.x. Prints the resolved config lines
  and `SELECTED <backend>`.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path


def _fake_h200(gpus: int = 2) -> None:
    for name in ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C",
                 "vllm._moe_C_stable_libtorch", "vllm._flashmla_C"):
        sys.modules[name] = types.ModuleType(name)
    import vllm.platforms as platforms
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    cls = cuda.CudaPlatform
    cls.get_device_capability = classmethod(lambda c, device_id=0: DeviceCapability(9, 0))
    cls.get_device_name = classmethod(lambda c, device_id=0: "NVIDIA H200")
    cls.get_device_total_memory = classmethod(lambda c, device_id=0: 143771 << 20)
    cls.is_fully_connected = classmethod(lambda c, ids: True)
    if hasattr(cls, "device_count"):
        cls.device_count = classmethod(lambda c: gpus)
    platforms._current_platform = cls()
    import vllm._custom_ops as ops

    for name in dir(ops):
        if name.startswith("cutlass_") and "supports" in name:
            setattr(ops, name, lambda *a, **k: False)


def main(argv: list[str]) -> int:
    model, dtype, backend, tp = argv[0], argv[1], argv[2], int(argv[3])
    gpus = int(argv[4]) if len(argv) > 4 else max(2, tp)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    _fake_h200(gpus)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import run_e2e
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.selector import get_attn_backend

    # a model of the e2e harness, or one the serving benchmark adds (models/<name>: the deep variants)
    path = run_e2e.MODELS.get(model) or Path(__file__).resolve().parent / "models" / model
    kw = dict(run_e2e.ENGINE, model=str(path), dtype=dtype, tensor_parallel_size=tp,
              kv_cache_memory_bytes=4 << 30, load_format="dummy")
    if backend != "auto":
        kw["attention_config"] = {"backend": backend}
    cfg = EngineArgs(**kw).create_engine_config()
    mc, sc, cc = cfg.model_config, cfg.speculative_config, cfg.compilation_config
    heads = mc.get_num_attention_heads(cfg.parallel_config)
    print("model", mc.hf_config.model_type, mc.architectures, mc.dtype, "mla", mc.use_mla, "heads/GPU", heads,
          "layers", mc.get_num_layers(cfg.parallel_config))
    print("mtp", sc.method, sc.num_speculative_tokens, sc.draft_model_config.architectures)
    print("compile", cc.mode, "cudagraph", cc.cudagraph_mode, "chunked", cfg.scheduler_config.enable_chunked_prefill,
          "prefix", cfg.cache_config.enable_prefix_caching)
    with set_current_vllm_config(cfg):
        chosen = get_attn_backend(576, mc.dtype, "auto", use_mla=True, use_sparse=True, num_heads=heads)
    print("SELECTED", chosen.get_name())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
