"""Load the tiny GLM-5.3-Flash checkpoint into vLLM's own model classes on the CPU (no GPU).

usage: python cpu_load_check.py CKPT_DIR [--capability 8.6] [--assume-deep-gemm]
  with vLLM 0.33.0's Python importable (its source tree on PYTHONPATH), torch, transformers
  >= 5.16.1 (Glm5NextTextConfig), safetensors. CKPT_DIR is make_checkpoint.py's output.

1. EngineArgs(model=CKPT_DIR, MTP 1 token, skip_tokenizer_init) -> create_engine_config(): the
   config parses (Glm5NextForCausalLM, MLA head 512), MTP draft = Glm5NextMTPModel.
2. Builds Glm5NextForCausalLM and Glm5NextMTP on the CPU with vLLM's CUDA platform faked as a GPU
   of --capability (default 8.6, an RTX 3090) and loads CKPT_DIR through DefaultModelLoader
   (safetensors iterator, the models' load_weights).
3. Every parameter is written by the load (each model loaded twice, its parameters filled with
   0x00 then 0xFF bytes before; a byte not written differs), load_weights returns every
   parameter name, and every checkpoint tensor is consumed by one of the two models.
--assume-deep-gemm: DeepGEMM counts as installed (as in vLLM's official wheel, which vendors
   it; this CPU harness has none): the upstream kpool indexer op checks has_deep_gemm() when it
   is built. With --capability 9.0 this builds and loads the upstream path, which checks the
   checkpoint's names and shapes independently of the series' sm8x patches.
4. Prints which kernels the layers were built with (attention backend, indexer logits path, mHC
   ops, KDA prefill backend).

STAND-INS (names, shapes and bytes are checked, not kernels): those of the DeepSeek-V4 check
(../deepseek-v4-tiny/cpu_load_check.py: CudaPlatform faked with device_type "cpu", inert CUDA
streams/events, compiled-op namespaces that raise if called, gloo), the capability set to
--capability, and transformers' torchvision-backed image/video processors as empty stubs where
torchvision is not installed (GLM-5.3-Flash's module imports the multimodal model).
Prints one line per check and "ALL OK (N checks)"; exits 1 on the first failure.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent
LINE_TESTS = MODELS.parent.parent / "lines" / "0.33.0" / "glm53"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str]) -> int:
    ckpt = Path(argv[0]).resolve()
    cap = argv[argv.index("--capability") + 1] if "--capability" in argv else "8.6"
    if (LINE_TESTS / "torchvision_standin.py").is_file():
        _load(LINE_TESTS / "torchvision_standin.py", "torchvision_standin")
    v4 = _load(MODELS / "deepseek-v4-tiny" / "cpu_load_check.py", "v4_cpu_load_check")
    v4._stand_ins()
    import torch
    from safetensors import safe_open

    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    major, minor = (int(x) for x in cap.split("."))
    cuda.CudaPlatform.get_device_capability = classmethod(
        lambda c, device_id=0: DeviceCapability(major, minor))
    cuda.CudaPlatform.get_device_name = classmethod(lambda c, device_id=0: f"stand-in sm{major}{minor}")
    if "--assume-deep-gemm" in argv:
        import vllm.models.glm5next.nvidia.sparse_indexer as kpool_op

        kpool_op.has_deep_gemm = lambda: True
    import vllm.model_executor.models.registry as registry

    registry._run_in_subprocess = lambda fn: fn()  # inspect in this process (stand-ins apply)
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    check = v4.Checker()
    cfg = EngineArgs(
        model=str(ckpt), skip_tokenizer_init=True, max_model_len=8192, max_num_batched_tokens=2048,
        max_num_seqs=16, seed=0, kv_cache_memory_bytes=4 << 30,
        # KDA prefill on the Triton kernels (what sm8x picks; FlashKDA is a compiled module)
        additional_config={"kda_prefill_backend": "triton"},
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
    ).create_engine_config()
    mc, sc = cfg.model_config, cfg.speculative_config
    check(mc.architectures == ["Glm5NextForCausalLM"] and mc.use_mla and mc.get_head_size() == 512,
          f"config parses: {mc.architectures}, mla, head {mc.get_head_size()}")
    check(sc.draft_model_config.architectures == ["Glm5NextMTPModel"],
          f"MTP draft {sc.draft_model_config.architectures}")
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        ck_names = set(f.keys())

    with set_current_vllm_config(cfg), set_default_torch_dtype(torch.bfloat16):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:29541")
        ensure_model_parallel_initialized(1, 1)
        from vllm.models.glm5next import Glm5NextForCausalLM
        from vllm.models.glm5next.common.mtp import Glm5NextMTP

        target = Glm5NextForCausalLM(vllm_config=cfg)
        check(True, "Glm5NextForCausalLM built")
        draft = Glm5NextMTP(vllm_config=cfg)
        check(True, "Glm5NextMTP built")
    loader = DefaultModelLoader(cfg.load_config)
    seen = v4.track_reads(DefaultModelLoader)
    for model, model_config, what in ((target, mc, "target"),
                                      (draft, sc.draft_model_config, "MTP")):
        returned, snaps = v4.load_filled(model, loader, model_config, cfg)
        names = {n for n, _ in model.named_parameters()}
        check(returned == names, f"{what}: load_weights returned all {len(names)} parameters"
              + ("" if returned == names else f"; missing {sorted(names - returned)[:6]}"))
        unwritten = [n for n in names if not torch.equal(snaps[0][n], snaps[1][n])]
        check(not unwritten, f"{what}: every parameter byte written" +
              (f"; not: {unwritten[:6]}" if unwritten else ""))
    check(seen == ck_names, f"every checkpoint tensor read ({len(ck_names)})")
    attn = [m for m in target.modules() if type(m).__name__ == "MLAAttention"]
    kpool = [m for m in target.modules() if type(m).__name__ == "SparseAttnIndexerKpool"]
    kernels = {"attention": sorted({type(m.impl).__name__ for m in attn}),
               "indexer_logits": sorted({str(getattr(m, "logits_backend", "deepgemm"))
                                         for m in kpool}),
               "mhc_pre": sorted({getattr(m.mhc_pre_op, "__name__", type(m.mhc_pre_op).__name__)
                                  for m in target.modules() if hasattr(m, "mhc_pre_op")})}
    print("kernels: " + json.dumps(kernels), flush=True)
    print(f"ALL OK ({check.n} checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
