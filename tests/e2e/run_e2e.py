"""End-to-end comparison through `vllm.LLM`: our sparse-MLA backend + indexer vs the pristine reference.

Each engine (model x dtype x side x TP) runs in its own spawned process, so its
GPU memory and its environment (backend, indexer switch) never leak into the
next; several run at once on the lent GPUs. Every engine gets the same
deterministic workload and the same weights (tests/e2e/e2e_plugin.py):

  pass 1, teacher-forced: prompt_logprobs=1 over every prompt position (these
          requests skip *reading* the prefix cache, so every prompt is prefilled
          in chunks of max_num_batched_tokens; they fill the cache for pass 2);
  pass 2, greedy: 48 new tokens per prompt, logprobs=2, MTP speculative decoding,
          prompts served from the prefix cache, CUDA graphs in vLLM's default mode.

Sides: `ref` = what vLLM's own selection picks on sm90 (FLASH_ATTN_MLA_SPARSE for
bf16 and fp16; --ref-backend auto leaves the choice to vLLM) with the DeepGEMM indexer; `ref2` = FLASHMLA_SPARSE forced (bf16 only),
the other upstream kernel, used to calibrate how far two correct kernels drift
apart; `ours` = TRITON_MLA_SPARSE forced plus the Triton indexer forced
(VLLM_SPARSE_INDEXER_BACKEND=triton, docs/indexer.md; --ours-env overrides). The parent compares each side against `ref` (tests/e2e/compare.py)
against tests/e2e/bounds.json and exits 1 when a bound is broken, 3 when an
engine failed.

KV cache (--kv-dtypes): `auto` = the model dtype (the engines above, names
tpN-model-dtype-side); `fp8` = kv_cache_dtype="fp8" (vLLM makes it fp8_ds_mla for
sparse MLA), names tpN-model-dtype-fp8kv-side, sides: `ours` (bf16, fp16) and `ref`
(bf16 only, vLLM's own selection: FLASHMLA_SPARSE on sm90; FLASH_ATTN_MLA_SPARSE has
no fp8 and upstream has no fp16 + fp8 sparse backend on sm90); no `ref2`. For bf16 each
fp8 `ref` / `ours` also runs as an all-MQA variant, tpN-model-bfloat16-fp8kv-mqa-side
(attention_config.sparse_mla_force_mqa on that engine: every prefill through the sparse
kernel, reading every key from the fp8 cache, as our backend does for fp16 + fp8; the
calibration of the fp16 fp8 `ours`, README "fp8 KV cache"). Every engine records the KV
cache dtype it used and the capacity vLLM logged.

DeepSeek-V4 (--models deepseek-v4-tiny; README "DeepSeek-V4"): a real tiny checkpoint that
make_checkpoint.py generates on the machine once (kept in /tmp/smla-e2e/models while the
machine stays warm; the generation is timed), load_format "auto", bf16, kv_cache_dtype "fp8"
(V4's fp8_ds_mla cache; V4 has no 16-bit cache on these classes), engines named
tpN-deepseek-v4-tiny-bfloat16-fp8kv-side. Sides: `ref` = the upstream kernels the wheel picks
on the GPU (FlashMLA attention, DeepGEMM indexer and o_proj; mHC on TileLang and the
compressor on CuTe DSL where those packages are installed, --v4-ref-kernels); `ref2` = `ref`
with another prefill chunk size (the calibration: upstream vs upstream); `ref-o16` = `ref`
with the bf16 output projection of the portable path (SMLA_E2E_DSV4_O_PROJ=bf16, e2e_plugin);
`ours` = VLLM_DSV4_PORTABLE=1 + the Triton indexer (the whole portable path).

Runs on the GPU machine (tests/e2e/device-run.sh); needs no network.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare import V4_MODELS, engine_name  # noqa: E402  (one naming rule for both modules)
import prompt_lp_guard  # noqa: E402
import quant_probe  # noqa: E402
import sm80_paths  # noqa: E402

MODELS = {"deepseek-v32-tiny": HERE / "models" / "deepseek-v32-tiny",
          "glm5-tiny": HERE / "models" / "glm5-tiny",
          "deepseek-v4-tiny": HERE / "models" / "deepseek-v4-tiny",
          # GLM-5.2's IndexCache (index_topk_freq / index_skip_topk_offset), e2e_dummy weights
          "glm52-tiny": HERE / "models" / "glm52-tiny",
          # GLM-5.3-Flash (vLLM 0.33.0 only): KDA + DSA layers, head-512 NoPE, pooled indexer,
          # mHC; a checkpoint generated on the machine (models/glm53-flash-tiny)
          "glm53-flash-tiny": HERE / "models" / "glm53-flash-tiny"}
# vLLM 0.33.0 models: the indexer kernels are chosen by KernelConfig.sparse_indexer_logits_backend
# (an engine argument) there, not by VLLM_SPARSE_INDEXER_BACKEND (0.26.0's series)
LINE_033_MODELS = {"glm53-flash-tiny"}
# 4-bit checkpoints (AWQ, GPTQ) of the tiny DeepSeek-V3.2 / GLM-5, generated on the machine by
# models/dsa-4bit/make_checkpoint.py like DeepSeek-V4's (README "4-bit checkpoints")
MODELS.update({name: HERE / "models" / "dsa-4bit" for name in quant_probe.FOURBIT})
# --models default: the DSA models of the first runs (their commands in README keep meaning
# what they meant); DeepSeek-V4 is asked for by name.
DEFAULT_MODELS = ["deepseek-v32-tiny", "glm5-tiny"]
# DeepSeek-V4: a generated checkpoint (models/deepseek-v4-tiny/make_checkpoint.py), not e2e_dummy
# weights (vLLM's dummy loader skips the model's load_weights, which builds layer 0's mHC
# broadcast weights). V4_MODELS (compare.py) lists them.
V4_CHECKPOINTS = Path("/tmp/smla-e2e/models")  # the device store: kept while the machine is warm
V4_DTYPE = "bfloat16"  # mHC asserts bf16
V4_KV = "fp8"  # _resolve_dsv4_kv_cache_dtype asserts an fp8 cache for the fp8_ds_mla classes
V4_SIDES = ("ref", "ref2", "ref-o16", "ours")
V4_PORTABLE_SWITCH = "VLLM_DSV4_PORTABLE"  # patch 0020: the one switch of the portable path
V4_O_PROJ_SWITCH = "SMLA_E2E_DSV4_O_PROJ"  # e2e_plugin: the `ref-o16` engine
# `ref2`: the upstream engine with another prefill chunk size. No second upstream DeepSeek-V4
# attention kernel runs on sm90 (FlashInfer's DSV4 classes are sm100 / sm12x), so the
# calibration swaps the batch shapes (GEMM tilings, chunk boundaries) instead of a kernel.
V4_REF2_BATCHED_TOKENS = 1024
V4_REF_KERNELS = ("available", "complete")
# What pristine 0.26.0 selects on sm90 for these models, bf16 and fp16 (seen in the
# validation run with auto selection, tests/e2e/results/); forced so that the patched
# wheel's priority list cannot change the reference.
REF_BACKEND = "FLASH_ATTN_MLA_SPARSE"
REF2_BACKEND = "FLASHMLA_SPARSE"
OURS_BACKEND = "TRITON_MLA_SPARSE"
INDEXER_SWITCH = "VLLM_SPARSE_INDEXER_BACKEND"  # docs/indexer.md
KV_DTYPES = ("auto", "fp8")
GEN_TOKENS = 48
ENGINE = dict(
    load_format="e2e_dummy",
    skip_tokenizer_init=True,
    max_model_len=8192,
    # Prompts reach 7000 tokens: every prompt over 2048 is prefilled in chunks.
    max_num_batched_tokens=2048,
    enable_chunked_prefill=True,
    enable_prefix_caching=True,
    max_num_seqs=64,
    seed=0,
    gpu_memory_utilization=0.12,
    disable_log_stats=False,
    speculative_config={"method": "mtp", "num_speculative_tokens": 1},
    # Default compilation and CUDA-graph *mode*; fewer capture sizes only to
    # keep start-up short (the workload never runs more than 128 tokens a step in decode).
    compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]},
)


def workload(vocab: int, seed: int = 0) -> tuple[list[list[int]], list[str]]:
    """40 prompts: 20 independent lengths 8..7000 and 20 sharing one of 4 prefixes.

    Token ids are drawn from [3, vocab) (0..2 are bos/eos/pad in the configs).
    """
    import random

    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    prompts, labels = [], []
    for n in (8, 17, 33, 64, 100, 127, 128, 129, 255, 256, 511, 1024, 2047, 2048, 2049, 2100,
              3000, 4097, 5500, 7000):
        prompts.append(toks(n))
        labels.append(f"solo-{n}")
    shared = {"A": (3000, (10, 64, 150, 700, 1500, 2000)), "B": (2500, (5, 300, 900, 1800, 2400)),
              "C": (1200, (1, 50, 400, 800, 1000)), "D": (200, (20, 100, 1800, 1900))}
    for key, (plen, suffixes) in shared.items():
        prefix = toks(plen)
        for s in suffixes:
            prompts.append(prefix + toks(s))
            labels.append(f"prefix{key}{plen}+{s}")
    return prompts, labels


def _metrics(llm) -> dict:
    out = {}
    try:
        for m in llm.get_metrics():
            if any(k in m.name for k in ("spec_decode", "prefix_cache")):
                val = getattr(m, "value", None)
                if isinstance(val, (int, float)):
                    out[m.name] = out.get(m.name, 0) + val
    except Exception as exc:  # metrics are informative only
        out["error"] = repr(exc)
    return out


# vLLM 0.26.0, vllm/v1/core/kv_cache_utils.py (get_kv_cache_configs), logged once by the
# engine core, whose stdout/stderr is this engine's engine.log:
#   logger.info_once("GPU KV cache size: %s tokens", f"{num_tokens:,}")
#   logger.info_once("Maximum concurrency for %s tokens per request: %.2fx", f"{max_model_len:,}", c)
KV_SIZE_RE = re.compile(r"GPU KV cache size: ([0-9][0-9,]*) tokens")
KV_CONC_RE = re.compile(r"Maximum concurrency for ([0-9][0-9,]*) tokens per request: ([0-9.]+)x")


def parse_kv_capacity(text: str) -> dict:
    """The KV capacity vLLM logged: tokens (int), max_concurrency (float), the raw lines.

    None for what is not there; the last occurrence wins."""
    out = {"tokens": None, "max_concurrency": None, "line": None, "concurrency_line": None}
    for line in text.splitlines():
        m = KV_SIZE_RE.search(line)
        if m:
            out["tokens"], out["line"] = int(m.group(1).replace(",", "")), line.strip()
        m = KV_CONC_RE.search(line)
        if m:
            try:
                out["max_concurrency"] = float(m.group(2))
            except ValueError:
                out["max_concurrency"] = None
            out["concurrency_line"] = line.strip()
    return out


def kv_cache_record(vllm_config, log_path: Path) -> dict:
    """meta["kv_cache"]: the cache dtype in the front end's config and the capacity from the log.

    Never raises (informative; the dtype check is compare.py's). The front end's
    cache_config is what the engine was built with; the layers' own dtype (after
    vLLM's sparse-MLA canonicalisation, e.g. fp8 -> fp8_ds_mla, done in the workers)
    is in model_probe[*]["kv_cache_dtypes"]."""
    rec: dict = {"dtype_used": None, "tokens": None, "max_concurrency": None, "line": None}
    try:
        rec["dtype_used"] = str(vllm_config.cache_config.cache_dtype)
    except Exception as exc:
        rec["error"] = f"cache_dtype: {exc!r}"
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        rec.update(parse_kv_capacity(Path(log_path).read_text(errors="replace")))
    except Exception as exc:
        rec["error"] = f"log: {exc!r}"
    return rec


# vLLM 0.26.0's CUDAGraphMode names an engine can be given (NONE is left out: compare.py
# requires CUDA graphs).
CUDAGRAPH_MODES = ("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def is_v4(model: str) -> bool:
    return model in V4_MODELS


def is_generated(model: str) -> bool:
    """A model whose engines load a checkpoint generated on the machine (load_format auto)."""
    return is_v4(model) or model in quant_probe.FOURBIT or model in LINE_033_MODELS


def v4_engine_kwargs(spec: dict) -> dict:
    """vllm.LLM(...) arguments of a DeepSeek-V4 engine: the generated checkpoint (load_format
    "auto"), bf16, the fp8 cache, the same workload settings as the other models (chunked
    prefill, prefix caching, MTP 1 token, CUDA graphs in vLLM's default mode: V4 turns on
    the breakable CUDA graph itself); no attention backend anywhere (V4 picks its attention
    class in `_select_dsv4_attn_cls`; VLLM_DSV4_PORTABLE in the engine's environment is the
    switch), so the MTP drafter selects as the target does."""
    return dict(ENGINE, model=spec["model_dir"], dtype=spec["dtype"], tensor_parallel_size=spec["tp"],
                kv_cache_memory_bytes=spec["kv_bytes"], load_format="auto", kv_cache_dtype=spec["kv_cache_dtype"],
                max_num_batched_tokens=spec.get("max_num_batched_tokens") or ENGINE["max_num_batched_tokens"],
                speculative_config=dict(ENGINE["speculative_config"]),
                compilation_config=dict(ENGINE["compilation_config"]))


def engine_kwargs(spec: dict) -> dict:
    """The vllm.LLM(...) arguments of one engine (--cudagraph-mode: that CUDA-graph mode in
    its compilation_config, else vLLM's default)."""
    kwargs = v4_engine_kwargs(spec) if is_v4(spec["model"]) else _dsa_engine_kwargs(spec)
    if spec.get("cudagraph_mode"):
        kwargs["compilation_config"] = dict(kwargs["compilation_config"],
                                            cudagraph_mode=spec["cudagraph_mode"])
    return kwargs


def _dsa_engine_kwargs(spec: dict) -> dict:
    kwargs = dict(ENGINE, model=spec["model_dir"], dtype=spec["dtype"],
                  tensor_parallel_size=spec["tp"], kv_cache_memory_bytes=spec["kv_bytes"])
    att = {}
    if spec["backend"]:
        att["backend"] = spec["backend"]
    if spec.get("force_mqa"):
        # vLLM 0.26 sends prefill batches whose longest sequence is <= index_topk to a
        # shared dense MHA prefill kernel (FlashAttention) on every sparse backend;
        # this sends them through the sparse backend's MQA path too.
        att["sparse_mla_force_mqa"] = True
    if att:
        kwargs["attention_config"] = att
    if spec.get("kv_cache_dtype", "auto") != "auto":
        kwargs["kv_cache_dtype"] = spec["kv_cache_dtype"]
    if spec.get("load_format"):  # a generated checkpoint (4-bit models, GLM-5.3-Flash)
        kwargs["load_format"] = spec["load_format"]
    if spec["model"] in LINE_033_MODELS:
        kwargs["sparse_indexer_logits_backend"] = "triton" if spec["side"] == "ours" else "deepgemm"
    if spec["backend"]:
        # the MTP drafter selects its own backend (SpeculativeConfig.attention_backend,
        # auto = FLASH_ATTN_MLA_SPARSE on sm90) unless told: same kernel as the target.
        # Not forced (backend None: the fp8 `ref`, --ref-backend auto), it selects like the target.
        kwargs["speculative_config"] = dict(ENGINE["speculative_config"], attention_backend=spec["backend"])
    return kwargs


def engine_main(spec: dict, result_dir: str) -> None:
    """Child process: build one engine, run both passes, save arrays + meta."""
    rdir = Path(result_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    log = open(rdir / "engine.log", "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.environ.update(spec["env"])
    meta: dict = {"spec": spec}
    llm = None
    try:
        import numpy as np
        import torch
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        from e2e_plugin import describe_model, worker_cudagraphs, worker_drafter

        t0 = time.perf_counter()
        llm = LLM(**engine_kwargs(spec))
        meta["init_s"] = time.perf_counter() - t0
        cfg = llm.llm_engine.vllm_config
        meta["kv_cache"] = kv_cache_record(cfg, rdir / "engine.log")
        meta["cudagraph_mode"] = str(cfg.compilation_config.cudagraph_mode)
        meta["compilation_mode"] = str(cfg.compilation_config.mode)
        # the front end's value (our backend may still turn it on in the workers, fp16 + fp8)
        meta["sparse_mla_force_mqa"] = getattr(getattr(cfg, "attention_config", None),
                                               "sparse_mla_force_mqa", None)
        meta["model_probe"] = llm.apply_model(describe_model)
        meta["worker_cudagraphs"] = llm.collective_rpc(worker_cudagraphs)
        meta["drafter_probe"] = llm.collective_rpc(worker_drafter)
        meta["versions"] = {"vllm": vllm.__version__, "torch": torch.__version__,
                            "gpu": torch.cuda.get_device_name(0), "python": sys.version.split()[0]}
        try:
            import triton
            meta["versions"]["triton"] = triton.__version__
        except ImportError:
            pass
        vocab = cfg.model_config.hf_text_config.vocab_size
        prompts, labels = workload(vocab)
        meta["labels"] = labels
        meta["prompt_lens"] = [len(p) for p in prompts]
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]

        # Pass 1: teacher-forced logprobs of every prompt token.
        t = time.perf_counter()
        outs = llm.generate(inputs, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1,
                                                   ignore_eos=True), use_tqdm=False)
        meta["pass1_s"] = time.perf_counter() - t
        lp, top1 = [], []
        for p, o in zip(prompts, outs):
            plp = o.prompt_logprobs
            assert plp is not None and len(plp) == len(p), "prompt_logprobs missing or short"
            for i in range(1, len(p)):
                d = plp[i]
                lp.append(d[p[i]].logprob)
                top1.append(next(tok for tok, v in d.items() if v.rank == 1))
        # Pass 2: greedy generation (prefix cache, MTP, CUDA graphs).
        t = time.perf_counter()
        outs = llm.generate(inputs, SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0, logprobs=2,
                                                   ignore_eos=True), use_tqdm=False)
        meta["pass2_s"] = time.perf_counter() - t
        meta["indexer_calls"] = llm.collective_rpc(quant_probe.worker_indexer_calls)
        gen_ids = np.zeros((len(prompts), GEN_TOKENS), np.int32)
        gen_top = np.zeros((len(prompts), GEN_TOKENS, 2), np.int32)
        gen_lp = np.full((len(prompts), GEN_TOKENS, 2), np.nan, np.float32)
        for r, o in enumerate(outs):
            c = o.outputs[0]
            assert len(c.token_ids) == GEN_TOKENS, f"got {len(c.token_ids)} tokens"
            gen_ids[r] = c.token_ids
            for s, d in enumerate(c.logprobs):
                ranked = sorted(((v.rank, tok, v.logprob) for tok, v in d.items() if v.rank <= 2))
                for k, (_, tok, val) in enumerate(ranked[:2]):
                    gen_top[r, s, k] = tok
                    gen_lp[r, s, k] = val
        meta["prompt_tokens"] = sum(meta["prompt_lens"])
        meta["generated_tokens"] = int(gen_ids.size)
        meta["pass1_prompt_tok_per_s"] = meta["prompt_tokens"] / meta["pass1_s"]
        meta["pass2_gen_tok_per_s"] = meta["generated_tokens"] / meta["pass2_s"]
        meta["metrics"] = _metrics(llm)
        np.savez_compressed(rdir / "arrays.npz", prompt_lp=np.asarray(lp, np.float32),
                            prompt_top1=np.asarray(top1, np.int32), gen_ids=gen_ids, gen_top=gen_top,
                            gen_lp=gen_lp, prompt_lens=np.asarray(meta["prompt_lens"], np.int32))
        meta["ok"] = True
    except BaseException as exc:  # reported by the parent, never swallowed
        meta["ok"] = False
        meta["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    (rdir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    try:  # stop the engine-core (and TP worker) processes before this one ends
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        traceback.print_exc()
    log.flush()
    os._exit(0)


def sides_for(dtype: str, kv: str, sides: list[str]) -> list[str]:
    """The requested sides that exist for one model dtype and KV cache dtype.

    kv auto: ref, ours, and ref2 for bf16 only (FLASHMLA_SPARSE is bf16-only).
    kv fp8:  ours for bf16 and fp16; ref for bf16 only (upstream has no fp16 + fp8
             sparse backend on sm90); no ref2 (FLASH_ATTN_MLA_SPARSE has no fp8, so
             there is no second upstream fp8 kernel)."""
    if kv == "auto":
        exists = {"ref", "ours"} | ({"ref2"} if dtype == "bfloat16" else set())
    else:
        exists = ({"ours"} if dtype in ("bfloat16", "float16") else set()) | (
            {"ref"} if dtype == "bfloat16" else set())
    return [s for s in sides if s in exists]


def mqa_variants(dtype: str, kv: str, side: str) -> tuple[bool, ...]:
    """(False,) plus True for the all-MQA variant (tpN-model-bfloat16-fp8kv-mqa-side) of a bf16
    fp8 `ref` / `ours`: attention_config.sparse_mla_force_mqa on that engine, so that every
    prefill runs the sparse kernel from the fp8 cache (no shared dense MHA prefill on 16-bit
    K/V). The `mqa-ref` is the fp8-cost calibration of the fp16 fp8 `ours` (which our backend
    puts on that path by itself); the `mqa-ours` is compared with it. No fp16 variant: the
    fp16 fp8 `ours` is all-MQA already."""
    return (False, True) if kv == "fp8" and dtype == "bfloat16" and side in ("ref", "ours") else (False,)


def side_backend(side: str, kv: str, ref_backend: str) -> str | None:
    """The attention backend forced on a side (None: vLLM's own selection)."""
    if side == "ours":
        return OURS_BACKEND
    if side == "ref2":
        return REF2_BACKEND
    if kv != "auto":
        return None  # fp8 `ref`: what vLLM picks for the fp8 cache (FLASHMLA_SPARSE on sm90)
    return None if ref_backend == "auto" else ref_backend


def v4_side_env(side: str, ref_kernels: str, ours_env: dict) -> dict:
    """The environment that makes a DeepSeek-V4 side.

    ours:    VLLM_DSV4_PORTABLE=1 (patch 0020: DeepseekV4TritonAttention, torch/Triton mHC,
             bf16 o_proj, Triton compressor / gathers / indexer q) + the Triton indexer
             logits; --ours-env on top.
    ref:     the upstream kernels: VLLM_DSV4_PORTABLE=auto (--v4-ref-kernels available: what the
             wheel picks on the GPU with the packages there) or 0 (complete: TileLang mHC and
             DeepGEMM o_proj forced; the probe then also requires the CuTe DSL compressor), the
             DeepGEMM indexer.
    ref2:    as ref (its prefill chunk size differs: job field max_num_batched_tokens).
    ref-o16: as ref, plus SMLA_E2E_DSV4_O_PROJ=bf16 (e2e_plugin: the bf16 output projection)."""
    if side == "ours":
        return {V4_PORTABLE_SWITCH: "1", **ours_env}
    env = {V4_PORTABLE_SWITCH: "0" if ref_kernels == "complete" else "auto", INDEXER_SWITCH: "deepgemm"}
    if side == "ref-o16":
        env[V4_O_PROJ_SWITCH] = "bf16"
    return env


def v4_jobs(args, tp: int, model: str, base_env: dict, ours_env: dict) -> list[dict]:
    """The DeepSeek-V4 engines of one TP: bf16 only, fp8 cache whatever --kv-dtypes says,
    sides in V4_SIDES order among --sides."""
    if V4_DTYPE not in args.dtypes:
        return []
    ref_kernels = getattr(args, "v4_ref_kernels", "available")
    if getattr(args, "ours_sm80_paths", False):
        ours_env = dict(ours_env, **{sm80_paths.SM80_ENV: "1"})
    root = Path(getattr(args, "v4_checkpoints", V4_CHECKPOINTS))
    jobs = []
    for side in (s for s in V4_SIDES if s in args.sides):
        jobs.append({"name": engine_name(tp, model, V4_DTYPE, side, V4_KV), "model": model,
                     "model_dir": str(root / model), "dtype": V4_DTYPE, "side": side, "tp": tp,
                     "kv_cache_dtype": V4_KV, "mqa": False, "backend": None,
                     "env": dict(base_env, **v4_side_env(side, ref_kernels, ours_env)),
                     "force_mqa": False, "kv_bytes": args.kv_gib << 30, "load_format": "auto",
                     "max_num_batched_tokens": V4_REF2_BATCHED_TOKENS if side == "ref2" else None,
                     "v4_ref_kernels": ref_kernels})
    return jobs


def build_jobs(args) -> list[dict]:
    ours_env = dict(kv.split("=", 1) for kv in args.ours_env)
    base_env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
                "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1", "PYTHONUNBUFFERED": "1"}
    if getattr(args, "prompt_lp_guard", True):
        base_env[prompt_lp_guard.GUARD_ENV] = "1"
    base_env.update(kv.split("=", 1) for kv in getattr(args, "engine_env", None) or [])
    jobs = []
    for tp in args.tp:
        for model in args.models:
            if is_v4(model):
                jobs += v4_jobs(args, tp, model, base_env, ours_env)
                continue
            for kv in getattr(args, "kv_dtypes", ["auto"]):
                for dtype in args.dtypes:
                    for side in sides_for(dtype, kv, args.sides):
                        side_env = ours_env if side == "ours" else {INDEXER_SWITCH: "deepgemm"}
                        for mqa in mqa_variants(dtype, kv, side):
                            model_dir = (Path(getattr(args, "v4_checkpoints", V4_CHECKPOINTS)) / model
                                         if is_generated(model) else MODELS[model])
                            jobs.append({"name": engine_name(tp, model, dtype, side, kv, mqa), "model": model,
                                         "model_dir": str(model_dir), "dtype": dtype, "side": side,
                                         "load_format": "auto" if is_generated(model) else None,
                                         "tp": tp, "kv_cache_dtype": kv, "mqa": mqa,
                                         "backend": side_backend(side, kv, args.ref_backend),
                                         "env": dict(base_env, **side_env),
                                         "force_mqa": bool(args.force_mqa or mqa),
                                         "kv_bytes": args.kv_gib << 30})
    mode = getattr(args, "cudagraph_mode", None)
    for job in jobs:
        job["cudagraph_mode"] = mode
        # the weights are the same at every TP size (e2e_dummy draws each parameter whole and
        # shards it, V4 loads one checkpoint): a TP=k engine is compared with its TP=1 twin too
        job["tp1_ref"] = re.sub(r"^tp\d+-", "tp1-", job["name"]) if job["tp"] > 1 else None
    return jobs


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _generator_inputs(model: str) -> list[Path]:
    """The files a generated checkpoint depends on: the generator and the config it reads."""
    d = MODELS[model]
    if model in quant_probe.FOURBIT:
        return [d / "make_checkpoint.py", HERE / "models" / quant_probe.FOURBIT[model][0] / "config.json"]
    return [d / "make_checkpoint.py", d / "config.json"]


def generator_command(model: str, out: Path, python: str = sys.executable) -> list[str]:
    """The command that writes the model's checkpoint into out."""
    cmd = [python, str(MODELS[model] / "make_checkpoint.py"), str(out)]
    if model in quant_probe.FOURBIT:
        base, fmt = quant_probe.FOURBIT[model]
        cmd += ["--base", base, "--format", fmt]
    return cmd


def checkpoint_key(model: str) -> str:
    """What the generated checkpoint depends on: the model name, the generator and the config
    (the seed and, for V4, the expert format are the generator's defaults)."""
    import hashlib

    h = hashlib.sha256(model.encode() + b"\0")
    for f in _generator_inputs(model):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def ensure_checkpoint(model: str, root: Path, python: str = sys.executable) -> dict:
    """The model's generated checkpoint in root/model: reused when a previous call of this
    machine made it from the same generator and config (stamp file), else generated now
    (make_checkpoint.py, timed). Returns what the summary records."""
    out = Path(root) / model
    stamp = out / ".e2e-stamp.json"
    key = checkpoint_key(model)
    rec = {"model": model, "dir": str(out), "key": key}
    st = out / "model.safetensors"
    if stamp.is_file() and st.is_file() and (out / "config.json").is_file():
        old = json.loads(stamp.read_text())
        if old.get("key") == key and old.get("bytes") == st.stat().st_size:
            t = time.perf_counter()
            digest = _sha256(st)
            if digest == old.get("sha256"):
                rec.update(old, cached=True, hash_s=round(time.perf_counter() - t, 2))
                return rec
    if out.exists():
        shutil.rmtree(out)
    t = time.perf_counter()
    import subprocess

    proc = subprocess.run(generator_command(model, out, python), capture_output=True, text=True)
    gen_s = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"make_checkpoint.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
    t = time.perf_counter()
    digest = _sha256(st)
    made = {"key": key, "generate_s": round(gen_s, 1), "bytes": st.stat().st_size, "sha256": digest,
            "generator_output": proc.stdout.strip()[-500:]}
    stamp.write_text(json.dumps(made, indent=1) + "\n")
    rec.update(made, cached=False, hash_s=round(time.perf_counter() - t, 2))
    return rec


def prepare_checkpoints(jobs: list[dict], root: Path) -> tuple[dict, list[str]]:
    """ensure_checkpoint for every generated-checkpoint model among the jobs, all at once (one
    generator process each); a model whose checkpoint cannot be made fails its engines (named
    in the returned errors), not the run."""
    from concurrent.futures import ThreadPoolExecutor

    done, errors = {}, []
    models = list(dict.fromkeys(j["model"] for j in jobs if is_generated(j["model"])))
    with ThreadPoolExecutor(max_workers=max(1, len(models))) as pool:  # one generator process each
        futures = {m: pool.submit(ensure_checkpoint, m, root) for m in models}
    for model, fut in futures.items():
        try:
            done[model] = fut.result()
            print(f"checkpoint {model}: {done[model]['dir']} "
                  + ("reused" if done[model]["cached"] else f"generated in {done[model]['generate_s']} s"),
                  flush=True)
        except Exception as exc:
            done[model] = {"model": model, "error": f"{type(exc).__name__}: {exc}"}
            errors.append(model)
            print(f"checkpoint {model}: FAILED {exc}", flush=True)
    return done, errors


# Device-time estimate of one `run` call (run_e2e.py --plan). Assumptions, in seconds:
# install: unpack + pip of the reduced wheel + deps (the series run's last call took 201 s
# around 175 s of engines); per engine wave: start-up + the two passes. DSA models: start-up seen 109-175 s with 7-16 engines at once (torch.compile,
# CUDA-graph capture, DeepGEMM JIT), passes 4-10 s. DeepSeek-V4 (three runs on the H200,
# 2026-12-01, 4 engines at once): start-up 298-406 s per engine (no torch.compile, but
# DeepGEMM JIT, Triton JIT of the portable kernels, Marlin MXFP4 repacking, breakable CUDA
# graph capture), both passes 39-55 s, the checkpoint generated in 6.9-10.5 s.
ESTIMATE = {"install_s": 40, "compare_s": 15, "dsa_start_s": 175, "dsa_passes_s": 15,
            "v4_start_s": 410, "v4_passes_s": 55, "checkpoint_s": 15}


def estimate(jobs: list[dict], parallel: int, checkpoint_cached: bool = False) -> dict:
    """Wall seconds of the `run` call that runs these jobs (after the staging calls), by the
    assumptions in ESTIMATE: all engines of a wave start together and a wave lasts as long
    as its slowest engine."""
    waves = [jobs[i:i + parallel] for i in range(0, len(jobs), parallel)] if jobs else []
    per = [max((ESTIMATE["v4_start_s"] + ESTIMATE["v4_passes_s"]) if is_v4(j["model"])
               else (ESTIMATE["dsa_start_s"] + ESTIMATE["dsa_passes_s"]) for j in w) for w in waves]
    # generated in parallel (prepare_checkpoints): one generation's time
    ckpt = 0 if checkpoint_cached or not any(is_generated(j["model"]) for j in jobs) else ESTIMATE["checkpoint_s"]
    total = ESTIMATE["install_s"] + ckpt + sum(per) + ESTIMATE["compare_s"]
    slowest = max(per, default=0)
    return {"engines": len(jobs), "waves": len(waves), "wave_s": per, "checkpoint_s": ckpt,
            "install_s": ESTIMATE["install_s"], "compare_s": ESTIMATE["compare_s"], "total_s": total,
            "engine_timeout_needed_s": slowest}


def select_jobs(args) -> list[dict]:
    """build_jobs, then --only."""
    jobs = build_jobs(args)
    if args.only:
        jobs = [j for j in jobs if re.search(args.only, j["name"])]
    return jobs


def run_jobs(jobs: list[dict], args, res: Path) -> None:
    """Run jobs, at most args.parallel at once, TP ranks placed on the least-used GPUs."""
    ctx = mp.get_context("spawn")
    pending = list(jobs)
    running: list[tuple[dict, mp.Process, float, list[int]]] = []
    load = [0] * args.gpus
    t_start = time.perf_counter()
    while pending or running:
        for item in list(running):
            job, p, t0, gpus = item
            timed_out = time.perf_counter() - t0 > args.engine_timeout
            if not p.is_alive() or timed_out:
                if timed_out and p.is_alive():
                    p.kill()
                    (res / job["name"]).mkdir(parents=True, exist_ok=True)
                    (res / job["name"] / "timeout").write_text(f"killed after {args.engine_timeout} s\n")
                p.join()
                for g in gpus:
                    load[g] -= 1
                running.remove(item)
                print(f"[{time.perf_counter() - t_start:6.0f}s] done {job['name']} ({time.perf_counter() - t0:.0f}s)",
                      flush=True)
        while pending and len(running) < args.parallel:
            job = pending.pop(0)
            gpus = sorted(range(args.gpus), key=lambda g: (load[g], g))[:job["tp"]]
            for g in gpus:
                load[g] += 1
            job["env"]["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            p = ctx.Process(target=engine_main, args=(job, str(res / job["name"])), daemon=False)
            p.start()
            running.append((job, p, time.perf_counter(), gpus))
            print(f"[{time.perf_counter() - t_start:6.0f}s] start {job['name']} on GPU {job['env']['CUDA_VISIBLE_DEVICES']}",
                  flush=True)
        time.sleep(1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/smla-e2e-out")))
    ap.add_argument("--results", type=Path, default=Path("/tmp/smla-e2e/results"),
                    help="raw per-engine arrays and logs (large; stays on the machine)")
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS),
                    help="default: the DSA models (DeepSeek-V3.2, GLM-5); deepseek-v4-tiny, the 4-bit "
                         "checkpoints (*-awq, *-gptq) and glm52-tiny (IndexCache) on request")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    ap.add_argument("--sides", nargs="+", default=["ref", "ours"], choices=["ref", "ref2", "ref-o16", "ours"],
                    help="ref-o16: DeepSeek-V4 only (the upstream engine with the bf16 output projection)")
    ap.add_argument("--tp", nargs="+", type=int, default=[1])
    ap.add_argument("--kv-dtypes", nargs="+", default=["auto"], choices=list(KV_DTYPES),
                    help="KV cache dtypes: auto (the model dtype) and/or fp8 (fp8_ds_mla for sparse MLA); "
                         "fp8 engines are named tpN-model-dtype-fp8kv-side")
    ap.add_argument("--ours-env", action="append", default=None, metavar="NAME=VALUE",
                    help=f"environment of the `ours` engines (default {INDEXER_SWITCH}=triton)")
    ap.add_argument("--engine-env", action="append", default=None, metavar="NAME=VALUE",
                    help="environment of every engine, all sides (e.g. VLLM_DISABLED_KERNELS="
                         "MacheteLinearKernel: 4-bit linear layers on Marlin on sm90, as on sm80-sm89 "
                         "and sm120, README \"4-bit checkpoints\")")
    ap.add_argument("--ref-backend", default=REF_BACKEND,
                    help="attention backend of the kv-auto `ref`; 'auto' = vLLM's own selection "
                         "(the fp8 `ref` always uses vLLM's own selection)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of the machine (device-run.sh: all of them); "
                    "an engine of TP=k takes k of them")
    ap.add_argument("--kind", default=None, help="the lent machine kind (e.g. nvidia-h200-x8), recorded in "
                    "summary.json and the report")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--kv-gib", type=int, default=4)
    ap.add_argument("--engine-timeout", type=float, default=420.0)
    ap.add_argument("--cudagraph-mode", choices=CUDAGRAPH_MODES, default=None,
                    help="compilation_config.cudagraph_mode of every engine (default: vLLM's own, "
                         "FULL_AND_PIECEWISE); e.g. FULL_DECODE_ONLY keeps every prefill step out of "
                         "the graphs (README \"DeepSeek-V4\": the upstream defect's bisect)")
    ap.add_argument("--force-mqa", action="store_true",
                    help="attention_config.sparse_mla_force_mqa on every side: short prefills through the "
                         "sparse kernels too (default: vLLM's shared dense prefill for them; the "
                         "fp8kv-mqa-* engines set it on their own whatever this says)")
    ap.add_argument("--only", default=None, metavar="REGEX",
                    help="run only the engines whose name (tpN-model-dtype-side, "
                         "tpN-model-dtype-fp8kv-side, tpN-model-bfloat16-fp8kv-mqa-side) matches (re.search)")
    ap.add_argument("--bounds", type=Path, default=HERE / "bounds.json")
    ap.add_argument("--v4-ref-kernels", choices=V4_REF_KERNELS, default="available",
                    help="DeepSeek-V4 `ref`/`ref2`/`ref-o16`: 'available' = FlashMLA + DeepGEMM indexer + "
                         "DeepGEMM o_proj required, mHC and compressor as the installed packages allow "
                         "(recorded); 'complete' = also TileLang mHC and the CuTe DSL compressor required "
                         "(pristine 0.26.0's whole path; needs tilelang and nvidia-cutlass-dsl installed)")
    ap.add_argument("--v4-checkpoints", type=Path, default=V4_CHECKPOINTS,
                    help="where the generated checkpoints (DeepSeek-V4, the 4-bit models) are made and reused")
    ap.add_argument("--ours-sm80-paths", action="store_true",
                    help="DeepSeek-V4 `ours`: the series' kernels take their sm80/86 code paths "
                         "(software e4m3, indexer without fp8 tensor cores) on this GPU "
                         "(SMLA_E2E_SM80_PATHS=1, tests/e2e/sm80_paths.py)")
    ap.add_argument("--no-prompt-lp-guard", dest="prompt_lp_guard", action="store_false",
                    help="compute the teacher-forced logprobs as vLLM 0.26.0 does, from hidden states "
                         "the MTP drafter can overwrite on a graph-replayed step (default: from a copy "
                         "taken before the drafter runs; tests/e2e/prompt_lp_guard.py)")
    ap.add_argument("--plan", action="store_true",
                    help="print the engines (name, environment, LLM arguments) and the device-time "
                         "estimate as JSON, run nothing")
    args = ap.parse_args(argv)
    if args.ours_sm80_paths and not any(is_v4(m) for m in args.models):
        ap.error("--ours-sm80-paths applies to DeepSeek-V4 only: add --models deepseek-v4-tiny")
    if args.ours_env is None:
        args.ours_env = [f"{INDEXER_SWITCH}=triton"]
    return args


def plan(args, jobs: list[dict]) -> dict:
    """What --plan prints: every engine's name, environment and LLM(...) arguments, and the
    estimate (checkpoint counted as not yet made)."""
    return {"engines": [{"name": j["name"], "env": j["env"], "llm_kwargs": engine_kwargs(j)} for j in jobs],
            "estimate": estimate(jobs, args.parallel), "parallel": args.parallel,
            "engine_timeout": args.engine_timeout}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = select_jobs(args)
    if args.plan:
        print(json.dumps(plan(args, jobs), indent=1, default=str))
        return 0
    if max(args.tp) > args.gpus:
        print(f"--tp {max(args.tp)} needs {max(args.tp)} GPUs, --gpus says {args.gpus}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.results.exists():
        shutil.rmtree(args.results)  # never compare against a previous call's engines
    args.results.mkdir(parents=True)
    (args.results / "jobs.json").write_text(json.dumps(jobs, indent=1))
    t0 = time.perf_counter()
    checkpoints, failed = prepare_checkpoints(jobs, args.v4_checkpoints)
    for job in [j for j in jobs if j["model"] in failed]:
        d = args.results / job["name"]
        d.mkdir(parents=True, exist_ok=True)
        (d / "meta.json").write_text(json.dumps({"ok": False, "spec": job, "error": "checkpoint: "
                                                 + checkpoints[job["model"]]["error"]}))
    run_jobs([j for j in jobs if j["model"] not in failed], args, args.results)
    from compare import compare_all, write_report

    summary = compare_all(jobs, args.results, json.loads(args.bounds.read_text()))
    if checkpoints:
        summary["checkpoints"] = checkpoints
    summary["command"] = " ".join(sys.argv)
    summary["kind"] = args.kind
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True, default=str) + "\n")
    (args.out / "report.md").write_text(write_report(summary))
    print(write_report(summary))
    return summary["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
