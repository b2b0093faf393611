"""Run in a child process with the patched vLLM tree first on the path (test_tp_shards.py).

Builds, on the CPU, the vLLM 0.26.0 layers of each tiny model's geometry (config.json of
tests/e2e/models/) under the parameter names the real model gives them, once per rank of
TP 1, 2, 4 and 8 (the TP group is a stand-in that answers "rank r of N"), fills each with
e2e_plugin.fill_model (what the `e2e_dummy` loader runs), gathers the ranks' shards by the
layers' documented layouts (written out here, not taken from the loaders) and prints one
JSON line, {model: report}. A report lists, per TP size: `mismatch`, the parameters whose
gathered tensor is not the TP=1 tensor; `equal_shards`, the TP-split parameters whose
shards on ranks 0 and 1 are equal; `replicas_differ`, replicated parameters that differ
between ranks; `split`, the TP-split parameters. And `tp1_legacy_mismatch`: the TP=1
weight matrices that are not the per-name draws of before.

Layers (model file deepseek_v2.py, DeepseekV2ForCausalLM; the MTP layer has the same kinds):
embed_tokens VocabParallelEmbedding; MLA fused_qkv_a_proj (DeepSeekV2FusedQkvAProjLinear,
disable_tp), q_b_proj / kv_b_proj ColumnParallelLinear, o_proj RowParallelLinear; the
indexer's wq_b ReplicatedLinear, wk_weights_proj MergedColumnParallelLinear(disable_tp),
k_norm LayerNorm; layer 0's dense DeepseekV2MLP (MergedColumnParallelLinear gate_up_proj,
RowParallelLinear down_proj); layer 1's DeepseekV2MoE (GateLinear router + correction
bias, shared DeepseekV2MLP, FusedMoE's RoutedExperts w13 / w2); norms; ParallelLMHead.

Stand-ins: the TP / EP / DP / PCP groups (_Group), vLLM's CPU platform as the current
platform, and DeepseekV2MLP's SiluAndMul (it binds a compiled op; it holds no weights).

usage: python tp_shards_cpu.py DTYPE MODEL... (MODEL: a folder of tests/e2e/models/)
"""
from __future__ import annotations

import json
import math
import sys
import types
import zlib
from pathlib import Path

import torch
from torch import nn

TP_SIZES = (1, 2, 4, 8)


class _Group:
    """Stands in for a GroupCoordinator: what the layers' constructors read."""

    def __init__(self, size: int, rank: int):
        self.world_size, self.rank_in_group, self.rank = size, rank, rank
        self.device_group = types.SimpleNamespace(size=lambda: size)


def _set_groups(tp: int, rank: int) -> None:
    from vllm.distributed import parallel_state as ps

    ps._TP = _Group(tp, rank)
    ps._EP = _Group(tp, rank)  # vLLM's EP group spans the TP ranks (EP itself stays off)
    ps._DP = _Group(1, 0)
    ps._PCP = _Group(1, 0)


def _build(cfg, dtype) -> nn.Module:
    from vllm.config import ParallelConfig
    from vllm.model_executor.layers.layernorm import LayerNorm, RMSNorm
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                                   ReplicatedLinear, RowParallelLinear)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from vllm.model_executor.models import deepseek_v2
    from vllm.model_executor.models.deepseek_v2 import (DeepSeekV2FusedQkvAProjLinear, DeepseekV2MLP,
                                                        DeepseekV2MoE)

    # the activation binds a compiled op at construction; it holds no weights
    deepseek_v2.SiluAndMul = nn.Identity

    h, heads = cfg.hidden_size, cfg.num_attention_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim

    def attn(prefix: str) -> nn.Module:
        a = nn.Module()
        a.fused_qkv_a_proj = DeepSeekV2FusedQkvAProjLinear(
            h, [cfg.q_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_head_dim], prefix=f"{prefix}.fused_qkv_a_proj")
        a.q_a_layernorm = RMSNorm(cfg.q_lora_rank)
        a.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank)
        a.q_b_proj = ColumnParallelLinear(cfg.q_lora_rank, heads * qk, bias=False, prefix=f"{prefix}.q_b_proj")
        a.kv_b_proj = ColumnParallelLinear(cfg.kv_lora_rank, heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                                           bias=False, prefix=f"{prefix}.kv_b_proj")
        a.o_proj = RowParallelLinear(heads * cfg.v_head_dim, h, bias=False, prefix=f"{prefix}.o_proj")
        idx = nn.Module()
        idx.wq_b = ReplicatedLinear(cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim, bias=False)
        idx.wk_weights_proj = MergedColumnParallelLinear(h, [cfg.index_head_dim, cfg.index_n_heads],
                                                         bias=False, disable_tp=True)
        idx.k_norm = LayerNorm(cfg.index_head_dim, eps=1e-6)
        a.indexer = idx
        return a

    model = nn.Module()
    inner = nn.Module()
    inner.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, h)
    layers = nn.ModuleList()
    for i in range(2):  # layer 0 dense, layer 1 MoE (first_k_dense_replace 1)
        layer = nn.Module()
        prefix = f"model.layers.{i}"
        layer.self_attn = attn(f"{prefix}.self_attn")
        layer.input_layernorm = RMSNorm(h)
        layer.post_attention_layernorm = RMSNorm(h)
        if i < cfg.first_k_dense_replace:
            layer.mlp = DeepseekV2MLP(h, cfg.intermediate_size, cfg.hidden_act, prefix=f"{prefix}.mlp")
        else:
            layer.mlp = DeepseekV2MoE(cfg, ParallelConfig(), prefix=f"{prefix}.mlp")
        layers.append(layer)
    inner.layers = layers
    inner.norm = RMSNorm(h)
    model.model = inner
    model.lm_head = ParallelLMHead(cfg.vocab_size, h)
    return model.to(dtype)


def _layout(model: nn.Module) -> dict[str, tuple]:
    """Parameter name -> how TP lays it out: ("column", dim, segment sizes), ("row", dim),
    ("vocab", rows), ("w13", I), ("w2",) or ("replicated",)."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    out = {}
    for name, param in model.named_parameters():
        owner = model.get_submodule(name.rpartition(".")[0])
        pname = name.rpartition(".")[2]
        kind = ("replicated",)
        if isinstance(owner, ColumnParallelLinear) and owner.tp_size > 1:
            kind = ("column", 0, list(getattr(owner, "output_sizes", [owner.output_size])))
        elif isinstance(owner, RowParallelLinear) and owner.tp_size > 1 and pname == "weight":
            kind = ("row", 1)
        elif isinstance(owner, VocabParallelEmbedding) and owner.tp_size > 1:
            kind = ("vocab", owner.org_vocab_size)
        elif type(owner).__name__ == "RoutedExperts" and owner.moe_config.moe_parallel_config.tp_size > 1:
            kind = ("w13", owner.moe_config.intermediate_size) if pname == "w13_weight" else ("w2",)
        out[name] = kind
    return out


def _gather(kind: tuple, shards: list[torch.Tensor]) -> torch.Tensor:
    tp = len(shards)
    if kind[0] == "replicated":
        return shards[0]
    if kind[0] == "column":  # each output segment split over the ranks on its own
        segs, off = [], 0
        for size in kind[2]:
            part = size // tp
            segs.append(torch.cat([s.narrow(0, off, part) for s in shards], 0))
            off += part
        return torch.cat(segs, 0)
    if kind[0] == "row":
        return torch.cat(shards, 1)
    if kind[0] == "vocab":  # the tiny vocabularies need no padding at any TP size here
        return torch.cat(shards, 0)[: kind[1]]
    if kind[0] == "w13":  # [gate; up] per rank, each half split over the ranks
        half = kind[1] // tp
        return torch.cat([torch.cat([s[:, :half] for s in shards], 1),
                          torch.cat([s[:, half:] for s in shards], 1)], 1)
    if kind[0] == "w2":
        return torch.cat(shards, 2)
    raise AssertionError(kind)


def _legacy(name: str, data: torch.Tensor, seed: int) -> torch.Tensor:
    """The per-name draw of a 2-D weight as the loader made it before (TP=1 comparability)."""
    gen = torch.Generator(device=data.device)
    gen.manual_seed(seed ^ zlib.crc32(name.encode()))
    out = torch.empty_like(data)
    bound = math.sqrt(3.0) if "embed_tokens" in name else math.sqrt(3.0 / data.shape[-1])
    return out.uniform_(-bound, bound, generator=gen)


def _cpu_platform() -> None:
    """vLLM's CPU platform (no accelerator here): the MoE layer asks it for a kernel backend."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


def check(cfg, dtype, plugin) -> dict:
    """The report of one model geometry (see the module docstring)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    full: dict[str, torch.Tensor] = {}
    report: dict = {"tp": {}}
    for tp in TP_SIZES:
        ranks, layout = [], None
        for rank in range(tp):
            _set_groups(tp, rank)
            # a fresh config per model: the MoE layer registers its name in it
            with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
                model = _build(cfg, dtype)
            layout = layout or _layout(model)
            plugin.fill_model(model)
            ranks.append({n: p.detach().clone() for n, p in model.named_parameters()})
        if tp == 1:
            full = ranks[0]
            report["parameters"] = sorted(full)
            report["tp1_legacy_mismatch"] = [
                n for n, t in full.items() if t.dim() == 2 and not n.endswith("mlp.gate.weight")
                and not torch.equal(t, _legacy(n, t, plugin.SEED))]
            continue
        split = sorted(n for n, k in layout.items() if k[0] != "replicated")
        report["tp"][tp] = {
            "split": split,
            "mismatch": sorted(n for n in full if not torch.equal(
                _gather(layout[n], [r[n] for r in ranks]), full[n])),
            "replicas_differ": sorted(n for n in full if layout[n][0] == "replicated"
                                      and any(not torch.equal(r[n], ranks[0][n]) for r in ranks)),
            "equal_shards": [n for n in split if torch.equal(ranks[0][n], ranks[1][n])],
        }
    return report


def main(argv: list[str]) -> None:
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    _cpu_platform()
    import e2e_plugin

    dtype = getattr(torch, argv[0])
    out = {}
    for model in argv[1:]:
        # the fields the layers read, as attributes (the layers use getattr with defaults)
        cfg = types.SimpleNamespace(**json.loads((here / "models" / model / "config.json").read_text()))
        out[model] = check(cfg, dtype, e2e_plugin)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
