"""vLLM general plugin for the end-to-end runs: the `e2e_dummy` load format and a model probe.

Loaded in every vLLM process (front end, engine core, TP workers) through the
`vllm.general_plugins` entry point that tests/e2e/device-run.sh declares.

Why not plain `load_format="dummy"`: vLLM's dummy loader fills every floating
parameter with uniform(-1e-3, 1e-3) from the same seed (1234), norms included.
Each layer then scales its input by ~1e-3 and every layer's output is ~1e-6 of
the residual stream, so the logits depend on the current token's embedding
alone: attention and the indexer could return anything and the teacher-forced
logprobs would still agree. `e2e_dummy` runs the stock dummy loader first (same
code path), then overwrites each parameter with a seeded draw whose scale keeps
activations O(1) (a linear's weight has variance 1/fan_in, norms ~1, embeddings
~1, logits of std ~1, MoE router zero), so attention and the sparse top-k
selection decide the output. The values depend only on the parameter's name,
dtype and each element's position in the TP=1 tensor, never on the attention backend nor
on the TP size or rank: a parameter that TP splits is drawn whole (its TP=1 shape) and
this rank's shard is cut from it by the layer's own weight loader, as from a checkpoint.
So the reference and our side load the same weights, every rank holds a different shard,
and the TP=1 engine is the reference for TP=2/4/8. vLLM's own post-load processing
(MLA's absorbed W_UK/W_UV, MoE layouts) runs after this, as for a checkpoint.

DeepSeek-V4 (tests/e2e/models/deepseek-v4-tiny) loads a generated safetensors checkpoint
with load_format "auto" instead; describe_model() reports its attention class, mHC, output
projection and compressor kernels per layer (`dsv4`). Harness interventions, each only
where the engine's environment asks for it:
- SMLA_E2E_DSV4_O_PROJ=bf16 makes DeepSeek-V4's attention output projection the bf16 one
  (`o_proj.bf16_o_proj`, no fp8 quantisation of the attention output) on an otherwise
  unchanged engine: the `ref-o16` engine of the V4 runs (README "DeepSeek-V4"), which
  measures what that choice of the portable path costs.
- SMLA_E2E_PROMPT_LP_GUARD=1 (every engine, unless run_e2e --no-prompt-lp-guard) computes
  the teacher-forced logprobs from a copy of the target's hidden states, which upstream's MTP
  drafter can overwrite in the CUDA-graph pool before they are read (prompt_lp_guard.py).
- SMLA_E2E_SM80_PATHS=1 (DeepSeek-V4 `ours`, run_e2e --ours-sm80-paths) makes the series'
  kernels take their sm80/86 code paths on the GPU at hand (sm80_paths.py).
"""
from __future__ import annotations

import importlib.abc
import math
import os
import sys
import zlib

SEED = 20261130
_registered = False

# DeepSeek-V4: force the bf16 attention output projection in this engine (the `ref-o16` side).
DSV4_O_PROJ_ENV = "SMLA_E2E_DSV4_O_PROJ"
DSV4_O_PROJ_MODULE = "vllm.models.deepseek_v4.nvidia.ops.o_proj"
DSV4_PORTABLE_MODULE = "vllm.models.deepseek_v4.nvidia.portable"
DSV4_O_PROJ_REASON = f"bf16, forced by the e2e harness ({DSV4_O_PROJ_ENV}=bf16)"


def _tp_split(layer) -> tuple[str, int] | None:
    """(kind, TP size) when TP splits `layer`'s weights across GPUs, else None (replicated:
    ReplicatedLinear, disable_tp layers, norms, the indexer, the router, any layer at TP=1)."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if isinstance(layer, ColumnParallelLinear):
        kind, size = "column", layer.tp_size
    elif isinstance(layer, RowParallelLinear):
        kind, size = "row", layer.tp_size
    elif isinstance(layer, VocabParallelEmbedding):  # ParallelLMHead too
        kind, size = "vocab", layer.tp_size
    elif any(c.__name__ == "RoutedExperts" for c in type(layer).__mro__):  # FusedMoE's weights
        cfg = layer.moe_config.moe_parallel_config
        if cfg.use_ep:
            raise NotImplementedError(f"e2e_dummy: expert parallelism ({layer.layer_name})")
        kind, size = "experts", cfg.tp_size
    else:
        return None
    return (kind, size) if size > 1 else None


def _full_shape(kind: str, layer, pname: str, param, tp_size: int) -> tuple[int, ...] | None:
    """The shape the parameter has at TP=1 (what `_draw` fills), or None where this
    parameter is not split although its layer is (RowParallelLinear's bias)."""
    shape = list(param.shape)
    if kind == "column" or kind == "row":
        dim = getattr(param, "output_dim" if kind == "column" else "input_dim", None)
        if dim is None:
            return None
        if getattr(layer, "num_kv_head_replicas", 1) != 1:
            raise NotImplementedError(f"e2e_dummy: replicated KV heads ({layer.prefix})")
        shape[dim] *= tp_size
    elif kind == "vocab":
        if getattr(param, "output_dim", None) != 0:
            return None
        shape[0] = layer.num_embeddings_padded  # TP-independent (padded to padding_size)
    elif pname in ("w13_weight", "w2_weight"):
        if not layer.moe_config.is_act_and_mul:
            raise NotImplementedError(f"e2e_dummy: ungated experts ({layer.layer_name})")
        shape[1 if pname == "w13_weight" else 2] *= tp_size
        if shape[-1 if pname == "w13_weight" else 1] != layer.moe_config.hidden_dim_unpadded or (
                layer.intermediate_size_per_partition * tp_size != layer.moe_config.intermediate_size):
            raise NotImplementedError(f"e2e_dummy: padded expert sizes ({layer.layer_name})")
    else:
        raise NotImplementedError(f"e2e_dummy: TP-split expert parameter {pname} ({layer.layer_name})")
    return tuple(shape)


def _load_shard(kind: str, layer, pname: str, param, full) -> None:
    """This rank's shard of the TP=1 tensor `full`, cut by the layer's own weight loader,
    as it would cut a checkpoint tensor of that shape (merged column layers: each output
    segment separately; vocabulary: the real rows, padding zero; experts: gate and up
    halves of w13 each, w2 along its input)."""
    loader = param.weight_loader
    if kind == "vocab":
        loader(param, full[: layer.org_vocab_size])
    elif kind == "experts":
        if pname == "w13_weight":
            inter = full.shape[1] // 2
            loader(param, full[:, :inter], pname, shard_id="w1", expert_id=0)
            loader(param, full[:, inter:], pname, shard_id="w3", expert_id=0)
        else:
            loader(param, full, pname, shard_id="w2", expert_id=0)
    else:
        loader(param, full)


def _draw(name: str, data) -> None:
    """Fill `data` (the parameter as it is at TP=1) from the seed of `name`."""
    import torch

    gen = torch.Generator(device=data.device)
    gen.manual_seed(SEED ^ zlib.crc32(name.encode()))
    if data.dim() == 1:
        if name.endswith("e_score_correction_bias"):
            data.uniform_(0.0, 0.05, generator=gen)
        elif name.endswith("bias"):
            data.uniform_(-0.02, 0.02, generator=gen)
        else:  # RMSNorm / LayerNorm scales
            data.uniform_(0.9, 1.1, generator=gen)
        return
    if name.endswith("mlp.gate.weight"):
        # MoE router: zero, so every token goes to the same experts, picked by the
        # per-layer e_score_correction_bias. A random router flips experts on
        # near-ties; in the first device run those flips, not attention, made
        # most of the spread between two upstream kernels (see README).
        data.zero_()
        return
    fan_in = data.shape[-1]
    bound = math.sqrt(3.0 / fan_in)
    if "embed_tokens" in name:
        bound = math.sqrt(3.0)
    data.uniform_(-bound, bound, generator=gen)


def _fill(name: str, param, layer=None) -> None:
    """Seeded values for one parameter of `layer` (its owner module).

    The values depend on the name and the element's position in the TP=1 tensor, never on
    the TP size or rank, so a TP=k model is the TP=1 model: a parameter that TP splits is
    drawn whole, at its TP=1 shape on this device, and the layer's own weight loader takes
    this rank's shard, as from a checkpoint. Every rank thus holds different values and the
    shards gathered are the TP=1 tensor. Replicated parameters (and every parameter at
    TP=1) are drawn in place, as before.
    """
    import torch

    if not torch.is_floating_point(param):
        return
    split = _tp_split(layer) if layer is not None else None
    pname = name.rpartition(".")[2]
    full_shape = _full_shape(split[0], layer, pname, param, split[1]) if split else None
    if full_shape is None:
        _draw(name, param.data)
        return
    full = torch.empty(full_shape, dtype=param.dtype, device=param.device)
    _draw(name, full)
    _load_shard(split[0], layer, pname, param, full)


def fill_model(model) -> None:
    """`_fill` every parameter of `model`, with the module that owns it."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            owner = name.rpartition(".")[0]
            _fill(name, param, model.get_submodule(owner) if owner else model)


def _forced_o_proj() -> tuple[str, str]:
    return "bf16", DSV4_O_PROJ_REASON


def _patch_o_proj_module(module) -> None:
    """Make `use_bf16_o_proj` (which every DeepSeek-V4 attention layer calls in __init__,
    before its weights load) see "bf16"; the portable module's selector too, so that what
    the probe reads agrees."""
    module.select_dsv4_o_proj = _forced_o_proj
    portable = sys.modules.get(DSV4_PORTABLE_MODULE)
    if portable is not None:
        portable.select_dsv4_o_proj = _forced_o_proj


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs `patch(module)` right after `name` is imported (the model is imported late, in
    the worker, after the plugins are loaded)."""

    def __init__(self, name: str, patch):
        self.name, self.patch, self._spec = name, patch, None

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._spec is not None:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._spec = spec
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        # the module keeps its own loader (source lookups, reloads)
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self.patch(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _patch_now_or_after_import(name: str, patch) -> str:
    """patch(module) now if `name` is imported, else right after it is."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return "patched"
    if not any(isinstance(f, _PatchAfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(name, patch))
    return "hooked"


def install_dsv4_o_proj_override(environ=os.environ) -> str | None:
    """With SMLA_E2E_DSV4_O_PROJ=bf16: force the bf16 DeepSeek-V4 output projection in this
    process, now if the module is already imported, else right after it is. Returns what was
    done (None: the variable is not set). Any other value is an error (a typo must not run
    an unforced reference)."""
    want = environ.get(DSV4_O_PROJ_ENV)
    if not want:
        return None
    if want != "bf16":
        raise ValueError(f"{DSV4_O_PROJ_ENV}={want!r}: only 'bf16' is known")
    return _patch_now_or_after_import(DSV4_O_PROJ_MODULE, _patch_o_proj_module)


def install_nan_probe(environ=os.environ) -> str | None:
    """With SMLA_E2E_NAN_CHECK=1: the DeepSeek-V4 NaN probe (nan_probe.py, a diagnostic)."""
    import nan_probe

    if environ.get(nan_probe.NAN_CHECK_ENV) != "1":
        return None
    for name in nan_probe.MODULES:
        _patch_now_or_after_import(name, nan_probe.patch_module)
    return "installed"


def install_prompt_lp_guard(environ=os.environ) -> str | None:
    """With SMLA_E2E_PROMPT_LP_GUARD=1 (run_e2e sets it unless --no-prompt-lp-guard): prompt
    logprobs from the target's own hidden states, not from the graph pool the MTP drafter may
    have overwritten (prompt_lp_guard.py)."""
    import prompt_lp_guard

    if environ.get(prompt_lp_guard.GUARD_ENV) != "1":
        return None
    return _patch_now_or_after_import(prompt_lp_guard.MODULE, prompt_lp_guard.patch_module)


def install_sm80_paths(environ=os.environ) -> str | None:
    """With SMLA_E2E_SM80_PATHS=1 (run_e2e --ours-sm80-paths, DeepSeek-V4 `ours`): the series'
    kernels take their sm80/86 code paths on this GPU (sm80_paths.py)."""
    import sm80_paths

    if environ.get(sm80_paths.SM80_ENV) != "1":
        return None
    for name in sm80_paths.MODULES:
        _patch_now_or_after_import(name, sm80_paths.patch_module)
    return "installed"


def register() -> None:
    """Entry point: register the `e2e_dummy` load format (idempotent); the sparse-indexer op's
    per-layer call counter (quant_probe.py); with
    SMLA_E2E_DSV4_O_PROJ=bf16, the DeepSeek-V4 output-projection override; with
    SMLA_E2E_NAN_CHECK=1, the DeepSeek-V4 NaN probe; with SMLA_E2E_PROMPT_LP_GUARD=1, the
    prompt-logprob guard; with SMLA_E2E_SM80_PATHS=1, the kernels' sm80/86 paths."""
    global _registered
    if _registered:
        return
    install_dsv4_o_proj_override()
    install_nan_probe()
    install_prompt_lp_guard()
    install_sm80_paths()
    import quant_probe

    quant_probe.install_indexer_counter(_patch_now_or_after_import)
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader("e2e_dummy")
    class E2EDummyModelLoader(DummyModelLoader):
        """Stock dummy weights, then O(1)-scaled seeded values per parameter name."""

        def load_weights(self, model, model_config) -> None:
            super().load_weights(model, model_config)
            fill_model(model)

    _registered = True


def describe_model(model) -> dict:
    """Which attention / indexer implementations and KV cache dtype the loaded model really
    uses, its linear and MoE kernels, and its layers' indexers (run in workers)."""
    impls, backends, indexers, kv_dtypes = set(), set(), set(), set()
    for _, mod in model.named_modules():
        impl = getattr(mod, "impl", None)
        if impl is not None and hasattr(mod, "attn_backend"):
            impls.add(f"{type(impl).__module__}.{type(impl).__name__}")
            backend = mod.attn_backend
            backends.add(backend.get_name() if hasattr(backend, "get_name") else str(backend))
            # the layer's cache dtype after vLLM's sparse-MLA canonicalisation (fp8 -> fp8_ds_mla)
            kv_dtypes.add(str(getattr(mod, "kv_cache_dtype", "?")))
        if type(mod).__name__ in ("SparseAttnIndexer", "Indexer"):
            indexers.add(f"{type(mod).__module__}.{type(mod).__name__}")
    n_params = sum(p.numel() for p in model.parameters())
    try:  # the series' indexer dispatch (docs/indexer.md); absent in pristine vLLM
        from vllm.v1.attention.backends.mla.indexer import select_sparse_indexer_logits

        logits = list(select_sparse_indexer_logits())
    except ImportError:
        logits = ["deepgemm", "pristine vLLM: DeepGEMM is the only CUDA indexer"]
    import quant_probe
    import sm80_paths

    out = {"attention_impls": sorted(impls), "attention_backends": sorted(backends),
           "indexer_modules": sorted(indexers), "indexer_logits": logits, "parameters": n_params,
           "kv_cache_dtypes": sorted(kv_dtypes), "kernel_capability": sm80_paths.worker_view(),
           # linear / MoE kernels by role, each MLA layer's indexer and skip_topk (quant_probe.py)
           "quant": quant_probe.describe_quant(model),
           "indexer_layers": quant_probe.describe_indexer_layers(model)}
    dsv4 = describe_dsv4(model)
    if dsv4 is not None:
        # DeepSeek-V4 builds its attention outside vLLM's Attention layers: report its
        # classes' backends and caches in the generic fields too (report table, fp8 check)
        out["dsv4"] = dsv4
        out["attention_impls"] = sorted(set(out["attention_impls"]) | set(dsv4["attention_classes"]))
        out["attention_backends"] = sorted(set(out["attention_backends"]) | set(dsv4["attention_backends"]))
        out["kv_cache_dtypes"] = sorted(set(out["kv_cache_dtypes"]) | set(dsv4["kv_cache_dtypes"]))
    return out


def _has_base(obj, name: str) -> bool:
    return any(c.__name__ == name for c in type(obj).__mro__)


def _kernel_name(fn) -> str:
    fn = getattr(fn, "__wrapped__", fn)
    return getattr(fn, "__name__", None) or type(fn).__name__


def describe_dsv4(model) -> dict | None:
    """DeepSeek-V4's kernels as the loaded model really holds them (None: not a V4 model).

    Per attention layer (subclasses of DeepseekV4Attention): class, backend name, compress
    ratio, KV cache dtype after `_resolve_dsv4_kv_cache_dtype`, the sliding-window cache's
    backend, and the output projection the layer fixed at construction (`_bf16_o_proj`:
    "bf16" or "deep_gemm"). The mHC kernels of every module holding an `mhc` kernel set
    (decoder layers, the model's head, the MTP block). The compressor / gather / indexer-q
    path (`cutedsl_supported()`: CuTe DSL or Triton) and the selectors' reasons, where the
    series' `portable` module exists (pristine vLLM has neither switch: TileLang + DeepGEMM
    mHC, DeepGEMM o_proj, CuTe DSL compressor)."""
    layers, mhc = [], set()
    for name, mod in model.named_modules():
        if _has_base(mod, "DeepseekV4Attention"):
            backend = getattr(mod, "backend_cls", None)
            swa_layer = getattr(mod, "swa_cache_layer", None)
            swa = swa_layer.get_attn_backend() if hasattr(swa_layer, "get_attn_backend") else None
            bf16 = getattr(mod, "_bf16_o_proj", None)
            layers.append({
                "layer": name, "class": type(mod).__name__,
                "backend": backend.get_name() if hasattr(backend, "get_name") else str(backend),
                "compress_ratio": getattr(mod, "compress_ratio", None),
                "kv_cache_dtype": str(getattr(mod, "kv_cache_dtype", "?")),
                "swa_backend": swa.get_name() if hasattr(swa, "get_name") else (
                    None if swa is None else str(swa)),
                "o_proj": None if bf16 is None else ("bf16" if bf16 else "deep_gemm"),
                "indexer": type(getattr(mod, "indexer", None)).__name__ if getattr(mod, "indexer", None) is not None
                else None,
            })
        kernels = getattr(mod, "mhc", None)
        if kernels is not None and hasattr(kernels, "_fields"):
            mhc.update(f"{f}={_kernel_name(getattr(kernels, f))}" for f in kernels._fields)
    if not layers:
        return None
    out = {"layers": layers, "mhc_kernels": sorted(mhc),
           "attention_classes": sorted({x["class"] for x in layers}),
           "attention_backends": sorted({x["backend"] for x in layers}),
           "kv_cache_dtypes": sorted({x["kv_cache_dtype"] for x in layers}),
           "o_proj": sorted({x["o_proj"] for x in layers if x["o_proj"] is not None}),
           "compress_ratios": sorted({x["compress_ratio"] for x in layers if x["compress_ratio"] is not None}),
           "breakable_cudagraph": os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH"),
           "portable_env": os.environ.get("VLLM_DSV4_PORTABLE")}
    try:
        from vllm.models.deepseek_v4.nvidia.ops import cutedsl_supported

        out["compressor"] = "cutedsl" if cutedsl_supported() else "triton"
    except ImportError:  # pristine 0.26.0: CuTe DSL whenever it runs at all
        out["compressor"] = "cutedsl (pristine vLLM)"
    try:
        from vllm.models.deepseek_v4.nvidia import portable

        out["mhc_reason"] = portable.select_dsv4_mhc_kernels()[1]
        out["o_proj_reason"] = portable.select_dsv4_o_proj()[1]
    except (ImportError, AttributeError):
        out["mhc_reason"] = out["o_proj_reason"] = "pristine vLLM"
    return out


def worker_cudagraphs(worker) -> dict:
    """The CUDA-graph mode a worker resolved (after the backends' support was applied)
    and how many graphs of each kind its dispatcher holds (run in workers)."""
    runner = worker.model_runner
    out = {"cudagraph_mode": str(runner.compilation_config.cudagraph_mode)}
    disp = getattr(runner, "cudagraph_dispatcher", None)
    keys = getattr(disp, "cudagraph_keys", None) or {}
    out["graphs"] = {str(mode): len(v) for mode, v in keys.items()}
    return out


def worker_drafter(worker) -> dict | None:
    """describe_model() of the speculative drafter (the MTP layer), which selects
    its attention backend separately from the target model (run in workers)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    model = getattr(drafter, "model", None)
    return None if model is None else describe_model(model)

