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
shape, dtype and, for TP-split parameters, the TP rank, never on the attention
backend, so the reference and our side load the same weights. vLLM's own post-load processing
(MLA's absorbed W_UK/W_UV, MoE layouts) runs after this, as for a checkpoint.
"""
from __future__ import annotations

import math
import zlib

SEED = 20261130
_registered = False


def _tp_sharded(model) -> dict[str, int]:
    """Parameter name -> TP rank, for the parameters that TP splits across GPUs.

    Their shards get the rank in their seed (otherwise both halves of e.g. the LM
    head would be equal and every logit would have an exact twin). Replicated
    parameters (ReplicatedLinear, disable_tp layers, norms, the indexer, the
    router) keep a rank-free seed, so every rank holds the same copy. With TP=1
    nothing changes.
    """
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    out = {}
    for mname, mod in model.named_modules():
        size = rank = None
        if isinstance(mod, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)):
            size, rank = mod.tp_size, getattr(mod, "tp_rank", None)
        elif "FusedMoE" in type(mod).__name__:
            cfg = getattr(mod, "moe_parallel_config", None) or getattr(
                getattr(mod, "moe_config", None), "moe_parallel_config", None)
            if cfg is not None:
                size, rank = cfg.tp_size, cfg.tp_rank
        if size and size > 1:
            rank = get_tensor_model_parallel_rank() if rank is None else rank
            for pname, _ in mod.named_parameters(recurse=False):
                out[f"{mname}.{pname}" if mname else pname] = rank
    return out


def _fill(name: str, param, tp_rank: int | None = None) -> None:
    import torch

    if not torch.is_floating_point(param):
        return
    gen = torch.Generator(device=param.device)
    seed = SEED ^ zlib.crc32(name.encode())
    if tp_rank is not None:
        seed ^= zlib.crc32(f"tp-rank-{tp_rank}".encode())
    gen.manual_seed(seed)
    data = param.data
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


def register() -> None:
    """Entry point: register the `e2e_dummy` load format (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader("e2e_dummy")
    class E2EDummyModelLoader(DummyModelLoader):
        """Stock dummy weights, then O(1)-scaled seeded values per parameter name."""

        def load_weights(self, model, model_config) -> None:
            import torch

            super().load_weights(model, model_config)
            sharded = _tp_sharded(model)
            with torch.no_grad():
                for name, param in model.named_parameters():
                    _fill(name, param, sharded.get(name))

    _registered = True


def describe_model(model) -> dict:
    """Which attention / indexer implementations and KV cache dtype the loaded model really
    uses (run in workers)."""
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
    return {"attention_impls": sorted(impls), "attention_backends": sorted(backends),
            "indexer_modules": sorted(indexers), "indexer_logits": logits, "parameters": n_params,
            "kv_cache_dtypes": sorted(kv_dtypes)}


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

