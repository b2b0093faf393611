"""Load a 4-bit tiny DeepSeek-V3.2 / GLM-5 checkpoint into vLLM's own classes on the CPU.

usage: python cpu_load_check.py CKPT_DIR [--dtype bfloat16|float16]
  with vLLM 0.26.0's Python importable (a source tree on PYTHONPATH is enough), torch,
  transformers 5.x, safetensors. CKPT_DIR is make_checkpoint.py's output.

What it checks, with vLLM's code (the stand-ins of ../deepseek-v4-tiny/cpu_load_check.py:
the platform is vLLM's CudaPlatform faked as an H200 with 132 SMs, CUDA ops raise if called,
none is):
1. EngineArgs(model=CKPT_DIR, the e2e engine's settings: MTP 1 token, skip_tokenizer_init)
   -> create_engine_config(): the config parses with MLA, the quantization vLLM picks for the
   checkpoint's `quantization_config` on sm90 (auto_awq / auto_gptq: the Marlin classes), the
   MTP draft DeepSeekMTPModel.
2. The target model and DeepSeekMTP are built on the CPU by vLLM's initialize_model, as the
   engine builds them;
   every linear layer of the MLPs (dense, shared experts) gets the Marlin linear method of the
   format (AutoAWQMarlinLinearMethod / AutoGPTQLinearMethod, kernel chosen for sm90), every
   routed-expert layer the format's Marlin MoE method (AutoAWQMoEMethod / AutoGPTQMoEMethod),
   and every attention and indexer projection stays unquantized (UnquantizedLinearMethod).
3. The checkpoint loads through vLLM's DefaultModelLoader.load_weights, and every byte of
   every parameter is written (each model is loaded twice, filled with 0x00 and 0xFF bytes
   before; a byte the loader did not write differs). load_weights returns every parameter
   name (but the MoE act-order indices, made after loading: COMPUTED), and vLLM's safetensors iterator yields every checkpoint tensor.
4. Spot checks of the bytes: a dense gate_up_proj qweight (weight_packed) is the checkpoint's
   gate_proj | up_proj, the down_proj scales and (GPTQ) g_idx are the checkpoint's.
compressed-tensors checkpoints need the `compressed_tensors` package importable (the e2e
bundle's wheel); the other formats get an empty stand-in for it.
Prints one line per check and "ALL OK"; exits 1 on the first failure.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
V4_CHECK = HERE.parent / "deepseek-v4-tiny" / "cpu_load_check.py"
sys.path.insert(0, str(HERE.parent.parent))  # tests/e2e: the probe's helpers
from quant_probe import LINEAR_METHOD, MOE_METHOD, is_16bit, method_name, role  # noqa: E402

QUANTIZATION = {"awq": "auto_awq", "gptq": "auto_gptq", "compressed-tensors": "compressed-tensors",
                "modelopt": "modelopt_fp4"}
FORMAT = {"awq": "awq", "gptq": "gptq", "compressed-tensors": "ct", "modelopt": "nvfp4"}  # quant_method -> generator format
# Parameters no checkpoint without act order holds, made after loading by the MoE methods'
# process_weights_after_loading: GPTQ's sort indices (from g_idx), compressed-tensors' expert
# g_idx (CompressedTensorsWNA16MarlinMoEMethod, actorder None).
# And the attention layer's KV-cache scales a ModelOpt config attaches (ModelOptKVCacheMethod:
# 1.0 after loading when the checkpoint has none, as with kv_cache_scheme None).
COMPUTED = ("g_idx_sort_indices", "experts.w13_weight_g_idx", "experts.w2_weight_g_idx",
            "attn.k_scale", "attn.v_scale", "attn.q_scale", "attn.prob_scale")


def _v4_check_module():
    spec = importlib.util.spec_from_file_location("v4_cpu_load_check", V4_CHECK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def quant_methods(model) -> dict[str, str]:
    """Module prefix -> its quant method (the e2e probe's naming), for every module that has one."""
    return {name: method_name(mod.quant_method, mod) for name, mod in model.named_modules()
            if getattr(mod, "quant_method", None) is not None}


def _fill(model, byte: int) -> None:
    """Every parameter's bytes set to `byte` (0-dim scales too)."""
    import torch

    with torch.no_grad():
        for _, p in model.named_parameters():
            p.data.reshape(-1).view(torch.uint8).fill_(byte)


def _snapshot(model) -> dict:
    import torch

    return {n: p.data.detach().reshape(-1).contiguous().view(torch.uint8).clone()
            for n, p in model.named_parameters()}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> int:
    ckpt = Path(argv[0]).resolve()
    dtype = argv[argv.index("--dtype") + 1] if "--dtype" in argv else "bfloat16"
    v4 = _v4_check_module()
    v4._stand_ins()
    from vllm.platforms import cuda

    # Marlin's MoE workspace is sized by the SM count (an H200 has 132)
    cuda.CudaPlatform.num_compute_units = classmethod(lambda c, device_id=0: 132)
    import torch
    from safetensors import safe_open

    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    check = v4.Checker()
    ckcfg = json.loads((ckpt / "config.json").read_text())
    method = ckcfg["quantization_config"]["quant_method"]
    fmt = FORMAT[method]
    cfg = EngineArgs(
        model=str(ckpt), dtype=dtype, skip_tokenizer_init=True, max_model_len=8192,
        max_num_batched_tokens=2048, max_num_seqs=64, seed=0, kv_cache_memory_bytes=4 << 30,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
        compilation_config={"mode": 0},  # no torch.compile backend on the CPU
    ).create_engine_config()
    mc, sc = cfg.model_config, cfg.speculative_config
    check(mc.use_mla and mc.architectures == ckcfg["architectures"],
          f"config parses: {mc.architectures}, mla, dtype {mc.dtype}")
    check(mc.quantization == QUANTIZATION[method], f"quantization {mc.quantization} for {method!r}")
    check(sc.draft_model_config.architectures == ["DeepSeekMTPModel"],
          f"MTP draft {sc.draft_model_config.architectures}")

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        ck = {k: f.get_tensor(k) for k in f.keys()}

    with set_current_vllm_config(cfg), set_default_torch_dtype(mc.dtype):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        ensure_model_parallel_initialized(1, 1)
        from vllm.model_executor.model_loader.utils import initialize_model

        # as the engine builds them (initialize_model: the model class's packed_modules_mapping
        # handed to the quant config first, which GPTQ's layer matching relies on)
        target = initialize_model(vllm_config=cfg)
        draft = initialize_model(vllm_config=cfg, model_config=sc.draft_model_config)
    target_cls = type(target)
    check(type(draft).__name__ == "DeepSeekMTP", f"draft model class {type(draft).__name__}")

    for what, model in (("target", target), ("MTP", draft)):
        methods = quant_methods(model)
        by_role: dict[str, set[str]] = {}
        for prefix, m in methods.items():
            by_role.setdefault(role(prefix), set()).add(m)
        odd = sorted(p for p, m in methods.items() if (role(p) == "mlp" and not m.startswith(LINEAR_METHOD[fmt]))
                     or (role(p) == "other" and not m.startswith("Unquantized")))
        if odd:
            print(f"     {what}: MLP modules not on {LINEAR_METHOD[fmt]}, other modules quantized: {odd[:6]}")
        print(f"     {what} quant methods by role: { {k: sorted(v) for k, v in sorted(by_role.items())} }")
        check(by_role.get("mlp") and all(m.startswith(LINEAR_METHOD[fmt]) for m in by_role["mlp"]),
              f"{what}: every dense / shared-expert MLP linear on {LINEAR_METHOD[fmt]}: {sorted(by_role.get('mlp', []))}")
        check(by_role.get("experts") and all(m.startswith(MOE_METHOD[fmt]) for m in by_role["experts"]),
              f"{what}: routed experts on {MOE_METHOD[fmt]}: {sorted(by_role.get('experts', []))}")
        check(by_role.get("attention") and by_role.get("indexer")
              and all(is_16bit(m) for r in ("attention", "indexer") for m in by_role[r]),
              f"{what}: attention and indexer projections unquantized: "
              f"{sorted(by_role.get('attention', []))} / {sorted(by_role.get('indexer', []))}")

    loader = DefaultModelLoader(cfg.load_config)
    seen = v4.track_reads(DefaultModelLoader)

    def load_twice(model, model_config, what):
        returned, snaps = v4.load_filled(model, loader, model_config, cfg, _fill, _snapshot)
        names = {n for n, _ in model.named_parameters() if not n.endswith(COMPUTED)}
        returned = set(returned) - {n for n in returned if n.endswith(COMPUTED)}
        check(returned == names, f"{what}: load_weights returned all {len(names)} parameters"
              + ("" if returned == names else f"; missing {sorted(names - returned)[:8]}, "
                 f"extra {sorted(returned - names)[:8]}"))
        unwritten = [n for n in names if not torch.equal(snaps[0][n], snaps[1][n])]
        check(not unwritten, f"{what}: every byte of every parameter written by the load"
              + ("" if not unwritten else f"; not: {unwritten[:8]}"))

    load_twice(target, mc, target_cls.__name__)
    load_twice(draft, sc.draft_model_config, "DeepSeekMTP")
    check(seen == set(ck), f"vLLM's safetensors iterator yields all {len(ck)} checkpoint tensors"
          + ("" if seen == set(ck) else f"; not: {sorted(set(ck) - seen)[:8]}"))

    tp = dict(target.named_parameters())
    m = "model.layers.0.mlp."
    if fmt == "ct":  # packed along K: gate | up stack along N, dim 0
        qw, sc, cat = "weight_packed", "weight_scale", 0
    elif fmt == "nvfp4":
        qw, sc, cat = "weight", "weight_scale", 0
    else:  # AWQ [K, N/8], GPTQ [K/8, N]: gate | up along N, dim 1
        qw, sc, cat = "qweight", "scales", 1
    gu = tp[f"{m}gate_up_proj.{qw}"]
    check(torch.equal(gu, torch.cat([ck[f"{m}gate_proj.{qw}"], ck[f"{m}up_proj.{qw}"]], dim=cat)),
          f"dense gate_proj | up_proj {qw} -> gate_up_proj.{qw} {tuple(gu.shape)}")
    want = ck[f"{m}down_proj.{sc}"]
    got = tp[f"{m}down_proj.{sc}"]
    check(torch.equal(got.view(torch.uint8), want.view(torch.uint8)) if fmt == "nvfp4"
          else torch.equal(got, want.to(mc.dtype)), f"dense down_proj.{sc}")
    if fmt == "gptq":
        check(torch.equal(tp[m + "down_proj.g_idx"], ck[m + "down_proj.g_idx"]), "dense down_proj.g_idx")
    print(f"ALL OK ({check.n} checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
