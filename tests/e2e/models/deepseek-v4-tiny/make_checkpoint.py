"""Write the tiny DeepSeek-V4 checkpoint: seeded random weights in DeepSeek's own tensor naming.

usage: python make_checkpoint.py OUT_DIR [--config CONFIG] [--seed N]
                                 [--expert-dtype fp4|fp8] [--router zero|random]

Writes OUT_DIR/model.safetensors and OUT_DIR/config.json (a copy of --config, default the
config.json next to this script, with `expert_dtype` set to the one written). The tensors are
the ones vLLM 0.26.0 reads for `DeepseekV4ForCausalLM` + its MTP draft, in the names of the
released checkpoints, i.e. the names `_make_deepseek_v4_weights_mapper`
(models/deepseek_v4/nvidia/model.py) and `DeepSeekV4MTP.load_weights` (nvidia/mtp.py) map:

  embed.weight, head.weight, norm.weight, hc_head_{fn,base,scale}
  layers.{i}. / mtp.0.  attn_norm, ffn_norm, hc_{attn,ffn}_{fn,base,scale}   (hc_* fp32)
      attn.{wq_a,wkv,wq_b,wo_a,wo_b}.{weight,scale}   block-fp8 (128 x 128) + scale
      attn.{q_norm,kv_norm}.weight, attn.attn_sink (fp32)
      attn.compressor.{wkv,wgate,norm}.weight + .ape (fp32)          compress ratio > 1
      attn.indexer.{wq_b (fp8), weights_proj, compressor.*}          compress ratio 4
      ffn.gate.weight, ffn.gate.bias (fp32) | ffn.gate.tid2eid (int32, hash layers)
      ffn.shared_experts.{w1,w2,w3}.{weight,scale}     block-fp8
      ffn.experts.{e}.{w1,w2,w3}.{weight,scale}        MXFP4 or block-fp8 (--expert-dtype)
  mtp.0.  also enorm, hnorm, norm, e_proj, h_proj (fp8), hc_head_*, and head.weight /
          emb.tok_emb.weight, copies of head.weight / embed.weight: DeepSeekV4MTP loads its
          shared_head.head only from mtp.0.head.weight (README.md, "Choices")

Formats (what vLLM's loaders expect):
- block-fp8 linears: weight float8_e4m3fn [out, in], scale per 128 x 128 block
  [ceil(out/128), ceil(in/128)], the dequant multiplier (w = code * scale). With fp4 experts
  the scales are UE8M0 (float8_e8m0fnu, a power of two: `DeepseekV4FP8Config.is_scale_e8m0`),
  with fp8 experts float32.
- MXFP4 experts: weight int8 [out, in/2], two E2M1 codes per byte, low nibble first (the
  order of vLLM's `nvfp4_emulation_utils.break_fp4_bytes`); scale float8_e8m0fnu
  [out, in/32], one power of two per 32 consecutive inputs.
- bf16: norms, embed/head, router, compressor wkv/wgate, indexer weights_proj (the linears
  built with quant_config=None).

Values: each tensor from its own generator seeded by (seed, tensor name), so a tensor does not
depend on which others are written. Linear weights N(0, 1/fan_in) before quantisation (unit-
scale activations: every layer moves the residual by O(1), so attention and its sparse top-k
decide the output), norms U(0.9, 1.1), embedding N(0, 1), mHC `fn` N(0, 1/(hc_mult*hidden))
with `scale` U(0.5, 1.5) and `base` N(0, 0.5^2) (mixing logits O(1)), attention sinks N(0, 1)
(comparable to the attention scores), compressor `ape` N(0, 0.5^2). Router: `--router zero`
(default) zeroes the non-hash gates, so every token goes to the experts picked by the
per-layer `gate.bias` (U(0, 0.05)); a random router flips experts on near-ties between two
correct kernels (tests/e2e/README.md, "Weights"). Hash layers (layer < num_hash_layers) route
by `tid2eid`: for each token id `num_experts_per_tok` distinct experts.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SEED = 20261201
BLOCK = 128            # fp8 weight block (quantization_config.weight_block_size)
MX_BLOCK = 32          # MXFP4 scale group
FP8_MAX = 448.0        # largest float8_e4m3fn
E2M1_MAX = 6.0         # largest E2M1
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # code & 7 -> magnitude
UE8M0_BIAS = 127


@dataclass(frozen=True)
class Spec:
    """One logical tensor; `kind` says how it is drawn and stored.

    fp8 / fp4: a linear [out, in] stored as `{name}.weight` + `{name}.scale`;
    every other kind is stored under `name` itself.
    """
    name: str
    kind: str          # fp8 | fp4 | linear | embed | norm | hc_fn | hc_base | hc_scale | sink
                       # | ape | gate | gate_bias | tid2eid | copy
    shape: tuple[int, ...]
    source: str = ""   # kind "copy": the tensor copied


def _layer_specs(cfg: dict, prefix: str, layer_id: int, expert_dtype: str) -> list[Spec]:
    h, nh, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    q_lora, o_lora, o_groups = cfg["q_lora_rank"], cfg["o_lora_rank"], cfg["o_groups"]
    hc = cfg["hc_mult"]
    mix_hc = (2 + hc) * hc
    n_layers = cfg["num_hidden_layers"]
    ratio = max(1, cfg["compress_ratios"][layer_id]) if layer_id < n_layers else 1
    e, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    p = prefix
    s = [
        Spec(f"{p}attn_norm.weight", "norm", (h,)),
        Spec(f"{p}ffn_norm.weight", "norm", (h,)),
    ]
    for part in ("attn", "ffn"):
        s += [Spec(f"{p}hc_{part}_fn", "hc_fn", (mix_hc, hc * h)),
              Spec(f"{p}hc_{part}_base", "hc_base", (mix_hc,)),
              Spec(f"{p}hc_{part}_scale", "hc_scale", (3,))]
    s += [
        Spec(f"{p}attn.attn_sink", "sink", (nh,)),
        Spec(f"{p}attn.wq_a", "fp8", (q_lora, h)),
        Spec(f"{p}attn.wkv", "fp8", (hd, h)),
        Spec(f"{p}attn.q_norm.weight", "norm", (q_lora,)),
        Spec(f"{p}attn.kv_norm.weight", "norm", (hd,)),
        Spec(f"{p}attn.wq_b", "fp8", (nh * hd, q_lora)),
        Spec(f"{p}attn.wo_a", "fp8", (o_groups * o_lora, nh * hd // o_groups)),
        Spec(f"{p}attn.wo_b", "fp8", (h, o_groups * o_lora)),
    ]

    def compressor(cp: str, dim: int) -> list[Spec]:
        coff = 2 if ratio == 4 else 1   # C4 overlaps two windows (compressor.py)
        return [Spec(f"{cp}ape", "ape", (ratio, coff * dim)),
                Spec(f"{cp}wkv.weight", "linear", (coff * dim, h)),
                Spec(f"{cp}wgate.weight", "linear", (coff * dim, h)),
                Spec(f"{cp}norm.weight", "norm", (dim,))]

    if ratio > 1:
        s += compressor(f"{p}attn.compressor.", hd)
    if ratio == 4:
        ni, di = cfg["index_n_heads"], cfg["index_head_dim"]
        s += [Spec(f"{p}attn.indexer.wq_b", "fp8", (ni * di, q_lora)),
              Spec(f"{p}attn.indexer.weights_proj.weight", "linear", (ni, h))]
        s += compressor(f"{p}attn.indexer.compressor.", di)
    s.append(Spec(f"{p}ffn.gate.weight", "gate", (e, h)))
    if layer_id < cfg["num_hash_layers"]:
        s.append(Spec(f"{p}ffn.gate.tid2eid", "tid2eid",
                      (cfg["vocab_size"], cfg["num_experts_per_tok"])))
    else:
        s.append(Spec(f"{p}ffn.gate.bias", "gate_bias", (e,)))
    shared = inter * cfg["n_shared_experts"]
    s += [Spec(f"{p}ffn.shared_experts.w1", "fp8", (shared, h)),
          Spec(f"{p}ffn.shared_experts.w3", "fp8", (shared, h)),
          Spec(f"{p}ffn.shared_experts.w2", "fp8", (h, shared))]
    for j in range(e):
        for w, shape in (("w1", (inter, h)), ("w3", (inter, h)), ("w2", (h, inter))):
            s.append(Spec(f"{p}ffn.experts.{j}.{w}", expert_dtype, shape))
    return s


def checkpoint_specs(cfg: dict, expert_dtype: str) -> list[Spec]:
    """Every logical tensor of the checkpoint, in file order."""
    h, v, hc = cfg["hidden_size"], cfg["vocab_size"], cfg["hc_mult"]
    s = [Spec("embed.weight", "embed", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        s += _layer_specs(cfg, f"layers.{i}.", i, expert_dtype)
    s += [Spec("norm.weight", "norm", (h,)),
          Spec("head.weight", "linear", (v, h)),
          Spec("hc_head_fn", "hc_fn", (hc, hc * h)),
          Spec("hc_head_base", "hc_base", (hc,)),
          Spec("hc_head_scale", "hc_scale", (1,))]
    for k in range(cfg.get("num_nextn_predict_layers", 0)):
        p = f"mtp.{k}."
        s += _layer_specs(cfg, p, cfg["num_hidden_layers"] + k, expert_dtype)
        s += [Spec(f"{p}enorm.weight", "norm", (h,)),
              Spec(f"{p}hnorm.weight", "norm", (h,)),
              Spec(f"{p}norm.weight", "norm", (h,)),
              Spec(f"{p}e_proj", "fp8", (h, h)),
              Spec(f"{p}h_proj", "fp8", (h, h)),
              Spec(f"{p}hc_head_fn", "hc_fn", (hc, hc * h)),
              Spec(f"{p}hc_head_base", "hc_base", (hc,)),
              Spec(f"{p}hc_head_scale", "hc_scale", (1,)),
              Spec(f"{p}emb.tok_emb.weight", "copy", (v, h), source="embed.weight"),
              Spec(f"{p}head.weight", "copy", (v, h), source="head.weight")]
    return s


def stored_tensors(cfg: dict, expert_dtype: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """name -> (shape, dtype) of every tensor in model.safetensors."""
    scale_dtype = torch.float8_e8m0fnu if expert_dtype == "fp4" else torch.float32
    out = {}
    for sp in checkpoint_specs(cfg, expert_dtype):
        if sp.kind == "fp8":
            o, i = sp.shape
            out[f"{sp.name}.weight"] = (sp.shape, torch.float8_e4m3fn)
            out[f"{sp.name}.scale"] = ((math.ceil(o / BLOCK), math.ceil(i / BLOCK)), scale_dtype)
        elif sp.kind == "fp4":
            o, i = sp.shape
            out[f"{sp.name}.weight"] = ((o, i // 2), torch.int8)
            out[f"{sp.name}.scale"] = ((o, i // MX_BLOCK), torch.float8_e8m0fnu)
        elif sp.kind in ("hc_fn", "hc_base", "hc_scale", "sink", "ape", "gate_bias"):
            out[sp.name] = (sp.shape, torch.float32)
        elif sp.kind == "tid2eid":
            out[sp.name] = (sp.shape, torch.int32)
        else:
            out[sp.name] = (sp.shape, torch.bfloat16)
    return out


def _generator(seed: int, name: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed ^ zlib.crc32(name.encode())) & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def _ue8m0_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Smallest power-of-two exponent e with amax / 2^e <= qmax (int32)."""
    return torch.ceil(torch.log2(amax.clamp(min=1e-30) / qmax)).to(torch.int32)


def quantize_block_fp8(w: torch.Tensor, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [out, in] -> (float8_e4m3fn [out, in], scale [ceil(out/128), ceil(in/128)])."""
    o, i = w.shape
    bo, bi = math.ceil(o / BLOCK), math.ceil(i / BLOCK)
    padded = torch.zeros(bo * BLOCK, bi * BLOCK, dtype=torch.float32)
    padded[:o, :i] = w
    blocks = padded.view(bo, BLOCK, bi, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    if ue8m0:
        exp = _ue8m0_exponent(amax, FP8_MAX)
        scale_f = torch.exp2(exp.to(torch.float32))
        scale = (exp + UE8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)
    else:
        scale_f = (amax / FP8_MAX).clamp(min=1e-30)
        scale = scale_f
    codes = (blocks / scale_f[:, None, :, None]).to(torch.float8_e4m3fn)
    return codes.view(bo * BLOCK, bi * BLOCK)[:o, :i].contiguous(), scale


def dequantize_block_fp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    o, i = codes.shape
    s = scale.float() if scale.dtype != torch.float8_e8m0fnu else torch.exp2(
        scale.view(torch.uint8).to(torch.float32) - UE8M0_BIAS)
    s = s.repeat_interleave(BLOCK, 0)[:o].repeat_interleave(BLOCK, 1)[:, :i]
    return codes.float() * s


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [out, in] -> (int8 [out, in/2] packed E2M1, float8_e8m0fnu [out, in/32])."""
    o, i = w.shape
    groups = w.view(o, i // MX_BLOCK, MX_BLOCK)
    exp = _ue8m0_exponent(groups.abs().amax(dim=-1), E2M1_MAX)
    x = groups / torch.exp2(exp.to(torch.float32))[..., None]
    grid = torch.tensor(E2M1_GRID)
    mag = torch.bucketize(x.abs(), (grid[1:] + grid[:-1]) / 2,  # nearest (ties: lower)
                          out_int32=True).to(torch.uint8)
    codes = (mag | ((x < 0).to(torch.uint8) << 3)).view(o, i)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scale = (exp + UE8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)
    return packed.view(torch.int8), scale


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8)
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2).to(torch.int64)
    vals = torch.tensor(E2M1_GRID)[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    s = torch.exp2(scale.view(torch.uint8).to(torch.float32) - UE8M0_BIAS)
    return vals * s.repeat_interleave(MX_BLOCK, dim=-1)


def make_tensors(cfg: dict, seed: int = SEED, expert_dtype: str = "fp4",
                 router: str = "zero") -> dict[str, torch.Tensor]:
    ue8m0 = expert_dtype == "fp4"
    out: dict[str, torch.Tensor] = {}
    for sp in checkpoint_specs(cfg, expert_dtype):
        g = _generator(seed, sp.name)

        def normal(std: float, shape=sp.shape, g=g) -> torch.Tensor:
            return torch.randn(shape, generator=g, dtype=torch.float32) * std

        def uniform(lo: float, hi: float, g=g) -> torch.Tensor:
            return torch.rand(sp.shape, generator=g, dtype=torch.float32) * (hi - lo) + lo

        k = sp.kind
        if k in ("fp8", "fp4"):
            w = normal(sp.shape[1] ** -0.5)
            if k == "fp4":
                out[f"{sp.name}.weight"], out[f"{sp.name}.scale"] = quantize_mxfp4(w)
            else:
                out[f"{sp.name}.weight"], out[f"{sp.name}.scale"] = quantize_block_fp8(w, ue8m0)
            continue
        if k == "linear":
            t = normal(sp.shape[1] ** -0.5).bfloat16()
        elif k == "embed":
            t = normal(1.0).bfloat16()
        elif k == "norm":
            t = uniform(0.9, 1.1).bfloat16()
        elif k == "hc_fn":
            t = normal(sp.shape[1] ** -0.5)
        elif k == "hc_base":
            t = normal(0.5)
        elif k == "hc_scale":
            t = uniform(0.5, 1.5)
        elif k == "sink":
            t = normal(1.0)
        elif k == "ape":
            t = normal(0.5)
        elif k == "gate":
            t = (normal(sp.shape[1] ** -0.5) if router == "random"
                 else torch.zeros(sp.shape)).bfloat16()
        elif k == "gate_bias":
            t = uniform(0.0, 0.05)
        elif k == "tid2eid":
            vocab, topk = sp.shape
            perm = torch.rand(vocab, cfg["n_routed_experts"], generator=g).argsort(dim=1)
            t = perm[:, :topk].to(torch.int32).contiguous()
        elif k == "copy":
            t = out[sp.source].clone()
        else:
            raise ValueError(f"unknown kind {k} for {sp.name}")
        out[sp.name] = t
    return out


def write_checkpoint(out_dir: str | os.PathLike, config: str | os.PathLike = HERE / "config.json",
                     seed: int = SEED, expert_dtype: str | None = None,
                     router: str = "zero") -> Path:
    """Write model.safetensors + config.json into out_dir; returns the safetensors path."""
    from safetensors.torch import save_file

    cfg = json.loads(Path(config).read_text())
    expert_dtype = expert_dtype or cfg.get("expert_dtype", "fp4")
    if expert_dtype not in ("fp4", "fp8"):
        raise ValueError(f"expert_dtype must be fp4 or fp8, got {expert_dtype!r}")
    cfg["expert_dtype"] = expert_dtype
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = make_tensors(cfg, seed, expert_dtype, router)
    path = out / "model.safetensors"
    # metadata: "format" only; safetensors writes a header map in arbitrary order, so more
    # keys would make the file's bytes differ between runs of the same seed
    save_file(tensors, str(path), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--config", default=str(HERE / "config.json"))
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--expert-dtype", choices=("fp4", "fp8"), default=None,
                    help="default: the config's expert_dtype")
    ap.add_argument("--router", choices=("zero", "random"), default="zero")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    path = write_checkpoint(a.out_dir, a.config, a.seed, a.expert_dtype, a.router)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
