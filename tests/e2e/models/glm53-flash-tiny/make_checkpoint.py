"""Write the tiny GLM-5.3-Flash checkpoint: seeded random bf16 weights in the released
checkpoints' tensor naming, for vLLM's Glm5NextForCausalLM + its MTP draft (Glm5NextMTP).

usage: python make_checkpoint.py OUT_DIR [--config CONFIG] [--seed N]

Writes OUT_DIR/model.safetensors and OUT_DIR/config.json (a copy of --config, default the
config.json next to this script). The config is the released model's layout: model_type
glm5_next (transformers' Glm5NextConfig) with the text model in text_config (what vLLM's MTP
set-up rewrites to glm5_next_mtp), architecture Glm5NextForCausalLM (the text model; no vision
weights). Geometry (config.json): GLM-5.3-Flash's where it decides which
kernels run -- 64 MLA heads, kv_lora_rank 512, qk_nope 256, qk_rope 0 (NoPE: head size 512),
v_head 256, index_topk 2048 over keys pooled 4:1 (index_kpool 4), 16 index heads of 128, KDA
64 heads of 128 with conv 4 and lower bound -5, mHC 4 streams / 20 Sinkhorn iterations, top-8
routing with clamped SwiGLU (swiglu_limit 10), one MTP layer -- and KDA/DSA layers interleaved as
the real config does (three linear_attention layers, then one deepseek_sparse_attention);
small: hidden 512, 8 layers, 16 experts, vocab 4096.

Tensor names (what vLLM 0.33.0's Glm5NextModel.load_weights and Glm5NextMTP.load_weights read;
the same names transformers' conversion_mapping["glm5_next"] renames to its own modules):
  model.embed_tokens.weight, model.norm.weight, lm_head.weight
  model.layers.{i}.  input_layernorm, post_attention_layernorm (.weight)
                     hc_{attn,ffn}_{fn,base,scale}                       fp32 (mHC)
    KDA layers:      self_attn.{q,k,v}_proj, {q,k,v}_conv1d [H*D, 1, K], b_proj, f_a_proj,
                     f_b_proj, g_a_proj, g_b_proj, o_norm, o_proj (.weight); A_log [H],
                     dt_bias [H*D] (fp32)
    DSA layers:      self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
                     kv_a_layernorm, kv_b_proj, o_proj}.weight; self_attn.indexer.{wq_b, wk,
                     weights_proj}.weight, indexer.k_norm.{weight, bias},
                     indexer.index_kpool_compress_gate [128, hidden],
                     indexer.index_kpool_compress_ape [kpool, 128] (fp32)
    MLP:             dense: mlp.{gate,up,down}_proj.weight; sparse: mlp.gate.weight,
                     mlp.gate.e_score_correction_bias (fp32), mlp.experts.{e}.{gate,up,down}_proj
                     .weight, mlp.shared_experts.{gate,up,down}_proj.weight
  model.layers.{L}.  (L = num_hidden_layers: the MTP layer) a DSA layer without mHC, plus
                     enorm, hnorm, eh_proj [hidden, 2*hidden], shared_head.norm,
                     embed_tokens [vocab, hidden] (.weight); no shared_head.head (the MTP
                     head is the target's lm_head: SharedHead(defer_lm_head=True))

Values: each tensor from its own generator seeded by (seed, tensor name). Linear weights
N(0, 1/fan_in), norms U(0.9, 1.1), embedding N(0, 1), mHC fn N(0, 1/(hc_mult*hidden)) with
scale U(0.5, 1.5) and base N(0, 0.5^2), KDA A_log N(0, 0.5^2) and dt_bias N(0, 0.5^2), router
N(0, 1/hidden) with correction bias U(0, 0.05), kpool ape N(0, 0.5^2), k_norm bias 0.
"""
from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def tensor_specs(cfg: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, kind)}: every tensor of the checkpoint; kind picks dtype and init."""
    hid, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, nope, rope, v = (cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                         cfg["v_head_dim"])
    qr, ih, idim = cfg["q_lora_rank"], cfg["index_n_heads"], cfg["index_head_dim"]
    lh, ld, conv = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"]
    n, mix = cfg["hc_mult"], (2 + cfg["hc_mult"]) * cfg["hc_mult"]
    ne, mi, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    shared = cfg["n_shared_experts"] * mi
    vocab, L = cfg["vocab_size"], cfg["num_hidden_layers"]
    specs: dict[str, tuple[tuple[int, ...], str]] = {}

    def lin(name, out, inp):
        specs[name + ".weight"] = ((out, inp), "linear")

    def dsa(p):
        lin(p + "self_attn.q_a_proj", qr, hid)
        specs[p + "self_attn.q_a_layernorm.weight"] = ((qr,), "norm")
        lin(p + "self_attn.q_b_proj", heads * (nope + rope), qr)
        lin(p + "self_attn.kv_a_proj_with_mqa", kv + rope, hid)
        specs[p + "self_attn.kv_a_layernorm.weight"] = ((kv,), "norm")
        lin(p + "self_attn.kv_b_proj", heads * (nope + v), kv)
        lin(p + "self_attn.o_proj", hid, heads * v)
        ix = p + "self_attn.indexer."
        lin(ix + "wq_b", ih * idim, qr)
        lin(ix + "wk", idim, hid)
        lin(ix + "weights_proj", ih, hid)
        specs[ix + "index_kpool_compress_gate"] = ((idim, hid), "linear")
        specs[ix + "index_kpool_compress_ape"] = ((cfg["index_kpool"], idim), "ape")
        specs[ix + "k_norm.weight"] = ((idim,), "norm")
        specs[ix + "k_norm.bias"] = ((idim,), "zero")

    def kda(p):
        a = p + "self_attn."
        for x in "qkv":
            lin(a + f"{x}_proj", lh * ld, hid)
            specs[a + f"{x}_conv1d.weight"] = ((lh * ld, 1, conv), "conv")
        lin(a + "b_proj", lh, hid)
        lin(a + "f_a_proj", ld, hid)
        lin(a + "f_b_proj", lh * ld, ld)
        lin(a + "g_a_proj", ld, hid)
        lin(a + "g_b_proj", lh * ld, ld)
        specs[a + "o_norm.weight"] = ((ld,), "norm")
        lin(a + "o_proj", hid, lh * ld)
        specs[a + "A_log"] = ((lh,), "a_log")
        specs[a + "dt_bias"] = ((lh * ld,), "dt_bias")

    def mlp(p, kind):
        if kind == "dense":
            for proj, (o, i) in (("gate_proj", (inter, hid)), ("up_proj", (inter, hid)),
                                 ("down_proj", (hid, inter))):
                lin(p + "mlp." + proj, o, i)
            return
        specs[p + "mlp.gate.weight"] = ((ne, hid), "router")
        specs[p + "mlp.gate.e_score_correction_bias"] = ((ne,), "router_bias")
        for e in range(ne):
            lin(p + f"mlp.experts.{e}.gate_proj", mi, hid)
            lin(p + f"mlp.experts.{e}.up_proj", mi, hid)
            lin(p + f"mlp.experts.{e}.down_proj", hid, mi)
        lin(p + "mlp.shared_experts.gate_proj", shared, hid)
        lin(p + "mlp.shared_experts.up_proj", shared, hid)
        lin(p + "mlp.shared_experts.down_proj", hid, shared)

    def norms(p):
        specs[p + "input_layernorm.weight"] = ((hid,), "norm")
        specs[p + "post_attention_layernorm.weight"] = ((hid,), "norm")

    specs["model.embed_tokens.weight"] = ((vocab, hid), "embed")
    specs["model.norm.weight"] = ((hid,), "norm")
    specs["lm_head.weight"] = ((vocab, hid), "linear")
    for i in range(L):
        p = f"model.layers.{i}."
        (kda if cfg["layer_types"][i] == "linear_attention" else dsa)(p)
        mlp(p, cfg["mlp_layer_types"][i])
        norms(p)
        for blk in ("attn", "ffn"):
            specs[p + f"hc_{blk}_fn"] = ((mix, n * hid), "hc_fn")
            specs[p + f"hc_{blk}_base"] = ((mix,), "hc_base")
            specs[p + f"hc_{blk}_scale"] = ((3,), "hc_scale")
    for j in range(cfg.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{L + j}."
        dsa(p)
        mlp(p, "sparse")
        norms(p)
        specs[p + "enorm.weight"] = ((hid,), "norm")
        specs[p + "hnorm.weight"] = ((hid,), "norm")
        lin(p + "eh_proj", hid, 2 * hid)
        specs[p + "shared_head.norm.weight"] = ((hid,), "norm")
        specs[p + "embed_tokens.weight"] = ((vocab, hid), "embed")
    return specs


FP32_KINDS = {"hc_fn", "hc_base", "hc_scale", "a_log", "dt_bias", "router_bias", "ape"}


def make_tensor(name: str, shape: tuple[int, ...], kind: str, seed: int, cfg: dict) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed << 32) ^ zlib.crc32(name.encode()))

    def normal(std):
        return torch.randn(shape, generator=gen) * std

    def uniform(lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    if kind == "linear":
        t = normal(shape[-1] ** -0.5)
    elif kind == "conv":
        t = normal(shape[-1] ** -0.5)
    elif kind == "norm":
        t = uniform(0.9, 1.1)
    elif kind == "zero":
        t = torch.zeros(shape)
    elif kind == "embed":
        t = normal(1.0)
    elif kind == "router":
        t = normal(cfg["hidden_size"] ** -0.5)
    elif kind == "router_bias":
        t = uniform(0.0, 0.05)
    elif kind == "hc_fn":
        t = normal((cfg["hc_mult"] * cfg["hidden_size"]) ** -0.5)
    elif kind == "hc_scale":
        t = uniform(0.5, 1.5)
    elif kind in ("hc_base", "a_log", "dt_bias", "ape"):
        t = normal(0.5)
    else:
        raise ValueError(kind)
    return t.float() if kind in FP32_KINDS else t.bfloat16()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--config", type=Path, default=HERE / "config.json")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from safetensors.torch import save_file

    cfg = json.loads(args.config.read_text())
    text = cfg.get("text_config", cfg)
    args.out.mkdir(parents=True, exist_ok=True)
    tensors = {name: make_tensor(name, shape, kind, args.seed, text)
               for name, (shape, kind) in sorted(tensor_specs(text).items())}
    save_file(tensors, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"wrote {len(tensors)} tensors, {total / 2**20:.1f} MiB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
