"""Write a tiny DeepSeek-V3.2 / GLM-5 checkpoint with 4-bit MLP weights (AWQ, GPTQ, compressed-tensors, NVFP4).

usage: python make_checkpoint.py OUT_DIR --base deepseek-v32-tiny|glm5-tiny --format awq|gptq|ct|nvfp4
                                 [--seed N]

Writes OUT_DIR/model.safetensors and OUT_DIR/config.json (the base model's config from
tests/e2e/models/BASE/config.json with a `quantization_config`). The tensors are the ones
vLLM 0.26.0 reads for `DeepseekV3ForCausalLM` / `GlmMoeDsaForCausalLM` (models/deepseek_v2.py)
and their MTP draft (`DeepSeekMTP`, models/deepseek_mtp.py), in the names of the released
Hugging Face checkpoints:

  model.embed_tokens.weight, model.norm.weight, lm_head.weight
  model.layers.{i}.  input_layernorm, post_attention_layernorm
      self_attn.{q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj}.weight
      self_attn.{q_a_layernorm, kv_a_layernorm}.weight
      self_attn.indexer.{wq_b, wk, weights_proj}.weight, self_attn.indexer.k_norm.{weight,bias}
      mlp.{gate,up,down}_proj                                    (dense layers, 4-bit)
      mlp.gate.weight, mlp.gate.e_score_correction_bias (fp32)   (MoE layers)
      mlp.experts.{e}.{gate,up,down}_proj, mlp.shared_experts.{gate,up,down}_proj (4-bit)
  model.layers.{L}.  (the MTP layer, L = num_hidden_layers) a decoder layer as above plus
      embed_tokens, enorm, hnorm, eh_proj, shared_head.norm, shared_head.head

What is 4-bit, what stays 16-bit: every MLP projection (dense MLP, routed experts, shared
experts, in the target layers and the MTP layer) is 4-bit, group size 128; attention (MLA
projections), the indexer, the router, embeddings, heads, norms and the MTP's eh_proj stay
bf16. That is what the published 4-bit checkpoints of these models keep out of 4-bit
(tests/e2e/README.md, "4-bit checkpoints": MLA projections and routers in every one of
them, the indexer where they say).

Formats (the layouts vLLM 0.26.0's loaders read: quantization/auto_awq.py, auto_gptq.py):
- AWQ (AutoAWQ GEMM, `quant_method` "awq", zero_point true): per linear with in-features K and
  out-features N, `qweight` int32 [K, N/8] (8 codes per int32 along N, nibble j holding column
  AWQ_ORDER[j] of its 8: vLLM's _REVERSE_AWQ_PACK_ORDER undoes it), `qzeros` int32 [K/128, N/8]
  packed the same way, `scales` fp16 [K/128, N]; w = (q - z) * s, q and z in 0..15.
- GPTQ (`quant_method` "gptq", sym true, desc_act false, checkpoint_format "gptq"):
  `qweight` int32 [K/8, N] (8 codes per int32 along K, nibble j = row 8i + j), `qzeros` int32
  [K/128, N/8] (along N, each 8 - 1 = 7: the v1 format's stored zero), `scales` fp16 [K/128, N],
  `g_idx` int32 [K] = k // 128; w = (q - 8) * s (vLLM's uint4b8).
- compressed-tensors W4A16 (`quant_method` "compressed-tensors", format "pack-quantized",
  symmetric int4, strategy group 128, targets Linear, the 16-bit modules in `ignore` as
  "re:" patterns): `weight_packed` int32 [N, K/8] (8 codes per int32 along K, nibble j =
  column 8i + j, each code q + 8), `weight_scale` [N, K/128] (bf16), `weight_shape` int32
  [N, K]; w = (code - 8) * s. GPTQ's symmetric grid, the scales rounded to bf16 first.
- NVFP4 (ModelOpt, `quant_method` "modelopt", quant_algo NVFP4, group size 16, the 16-bit
  modules in `ignore` as wildcards): `weight` uint8 [N, K/2] (two E2M1 codes per byte, low
  nibble first: element 2i low, 2i+1 high; bit 3 the sign), `weight_scale` float8_e4m3fn
  [N, K/16] (per 16 inputs), `weight_scale_2` fp32 scalar (per tensor: amax / (448 * 6)),
  `input_scale` fp32 scalar (1.0: the activation scale of W4A4 kernels, which the W4A16
  Marlin path does not read); w = e2m1 * weight_scale * weight_scale_2.

Values: each full-precision tensor from its own generator seeded by (seed, tensor name), as
in the DeepSeek-V4 generator: linear weights N(0, 1/fan_in) (the 4-bit ones are quantised
from such a draw: a real checkpoint of these seeded weights, round to nearest), norms
U(0.9, 1.1), k_norm bias U(-0.02, 0.02), embeddings N(0, 1), router zero (tests/e2e/README.md,
"Weights"), e_score_correction_bias U(0, 0.05).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent
SEED = 20261202
GROUP = 128
BITS = 4
PACK = 32 // BITS
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # column held by nibble j (AutoAWQ GEMM)
FORMATS = ("awq", "gptq", "ct", "nvfp4")
NVFP4_GROUP = 16
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of code & 7
FP8_MAX = 448.0
BASES = ("deepseek-v32-tiny", "glm5-tiny")
# Substrings of vLLM module prefixes that stay 16-bit. AWQ: `modules_to_not_convert`
# (is_layer_skipped, substring match); GPTQ: the same as GPTQModel's negative `dynamic` rules.
# ".head": the MTP layer's shared head, whose quant prefix is model.layers.L.head
# (deepseek_mtp.py builds SharedHead with the layer's prefix).
NOT_4BIT = ("self_attn", "eh_proj", "shared_head", "lm_head", "embed_tokens", ".head")
# GPTQ `modules_in_block_to_quantize` (is_layer_gptq_quantized: substring of the prefix):
# the dense / shared-expert MLP projections (routed experts are the FusedMoE layer, which
# the GPTQ config quantises unless a `dynamic` rule says otherwise). Substrings, not full
# names, so that the MTP layer's prefix (model.layers.L.mtp_block.mlp...) matches too.
GPTQ_IN_BLOCK = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "shared_experts.gate_proj",
                 "shared_experts.up_proj", "shared_experts.down_proj")


def quantization_config(fmt: str) -> dict:
    """The `quantization_config` written into config.json."""
    if fmt == "awq":
        return {"quant_method": "awq", "bits": BITS, "group_size": GROUP, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": list(NOT_4BIT)}
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": BITS, "group_size": GROUP, "sym": True,
                "desc_act": False, "lm_head": False, "checkpoint_format": "gptq",
                "dynamic": {f"-:.*{m}.*": {} for m in NOT_4BIT},
                "modules_in_block_to_quantize": [list(GPTQ_IN_BLOCK)]}
    if fmt == "ct":
        weights = {"num_bits": BITS, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": GROUP, "dynamic": False, "actorder": None, "observer": "minmax",
                   "observer_kwargs": {}, "block_structure": None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed", "kv_cache_scheme": None,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                              "input_activations": None, "output_activations": None,
                                              "format": "pack-quantized"}},
                "ignore": [f"re:.*{m}.*" for m in NOT_4BIT] + ["re:.*mlp[.]gate$"]}
    if fmt == "nvfp4":
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": NVFP4_GROUP,
                "kv_cache_scheme": None, "ignore": [f"*{m}*" for m in NOT_4BIT] + ["*mlp.gate"]}
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


def _layer_specs(cfg: dict, p: str, layer: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of one decoder layer; kind: linear, q4 (4-bit linear), norm, bias,
    gate, gate_bias."""
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qlr, kvr, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, vh = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    inh, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
    a = f"{p}self_attn."
    out = [(f"{p}input_layernorm.weight", (h,), "norm"),
           (f"{p}post_attention_layernorm.weight", (h,), "norm"),
           (f"{a}q_a_proj.weight", (qlr, h), "linear"),
           (f"{a}q_a_layernorm.weight", (qlr,), "norm"),
           (f"{a}q_b_proj.weight", (nh * (nope + rope), qlr), "linear"),
           (f"{a}kv_a_proj_with_mqa.weight", (kvr + rope, h), "linear"),
           (f"{a}kv_a_layernorm.weight", (kvr,), "norm"),
           (f"{a}kv_b_proj.weight", (nh * (nope + vh), kvr), "linear"),
           (f"{a}o_proj.weight", (h, nh * vh), "linear"),
           (f"{a}indexer.wq_b.weight", (inh * ihd, qlr), "linear"),
           (f"{a}indexer.wk.weight", (ihd, h), "linear"),
           (f"{a}indexer.k_norm.weight", (ihd,), "norm"),
           (f"{a}indexer.k_norm.bias", (ihd,), "bias"),
           (f"{a}indexer.weights_proj.weight", (inh, h), "linear")]
    m = f"{p}mlp."
    if layer < cfg["first_k_dense_replace"]:
        inter = cfg["intermediate_size"]
        return out + [(f"{m}gate_proj", (inter, h), "q4"), (f"{m}up_proj", (inter, h), "q4"),
                      (f"{m}down_proj", (h, inter), "q4")]
    n_exp, mi = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    out += [(f"{m}gate.weight", (n_exp, h), "gate"),
            (f"{m}gate.e_score_correction_bias", (n_exp,), "gate_bias")]
    for e in range(n_exp):
        out += [(f"{m}experts.{e}.gate_proj", (mi, h), "q4"), (f"{m}experts.{e}.up_proj", (mi, h), "q4"),
                (f"{m}experts.{e}.down_proj", (h, mi), "q4")]
    si = mi * cfg["n_shared_experts"]
    return out + [(f"{m}shared_experts.gate_proj", (si, h), "q4"),
                  (f"{m}shared_experts.up_proj", (si, h), "q4"),
                  (f"{m}shared_experts.down_proj", (h, si), "q4")]


def checkpoint_specs(cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """Every tensor group of the checkpoint ("q4" entries name a module: its 4-bit tensors are
    that name + .qweight / .qzeros / .scales [/ .g_idx])."""
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out = [("model.embed_tokens.weight", (v, h), "embed"), ("model.norm.weight", (h,), "norm"),
           ("lm_head.weight", (v, h), "linear")]
    for i in range(n + cfg.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}."
        out += _layer_specs(cfg, p, i)
        if i >= n:  # the MTP layer
            out += [(f"{p}embed_tokens.weight", (v, h), "embed"), (f"{p}enorm.weight", (h,), "norm"),
                    (f"{p}hnorm.weight", (h,), "norm"), (f"{p}eh_proj.weight", (h, 2 * h), "linear"),
                    (f"{p}shared_head.norm.weight", (h,), "norm"),
                    (f"{p}shared_head.head.weight", (v, h), "linear")]
    return out


def stored_tensors(cfg: dict, fmt: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of every tensor the checkpoint holds."""
    out = {}
    for name, shape, kind in checkpoint_specs(cfg):
        if kind != "q4":
            out[name] = (shape, torch.float32 if kind == "gate_bias" else torch.bfloat16)
            continue
        n, k = shape
        if fmt == "nvfp4":
            out[f"{name}.weight"] = ((n, k // 2), torch.uint8)
            out[f"{name}.weight_scale"] = ((n, k // NVFP4_GROUP), torch.float8_e4m3fn)
            out[f"{name}.weight_scale_2"] = ((), torch.float32)
            out[f"{name}.input_scale"] = ((), torch.float32)
            continue
        if fmt == "ct":
            out[f"{name}.weight_packed"] = ((n, k // PACK), torch.int32)
            out[f"{name}.weight_scale"] = ((n, k // GROUP), torch.bfloat16)
            out[f"{name}.weight_shape"] = ((2,), torch.int32)
            continue
        out[f"{name}.qweight"] = ((k, n // PACK) if fmt == "awq" else (k // PACK, n), torch.int32)
        out[f"{name}.qzeros"] = ((k // GROUP, n // PACK), torch.int32)
        out[f"{name}.scales"] = ((k // GROUP, n), torch.float16)
        if fmt == "gptq":
            out[f"{name}.g_idx"] = ((k,), torch.int32)
    return out


def _generator(seed: int, name: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed ^ zlib.crc32(name.encode())) & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def _to_int32(packed: torch.Tensor) -> torch.Tensor:
    """int64 holding 32-bit patterns -> int32 with the same bits."""
    return (packed - ((packed >> 31) & 1) * (1 << 32)).to(torch.int32)


def pack_along_cols(codes: torch.Tensor, order=tuple(range(PACK))) -> torch.Tensor:
    """[R, C] codes 0..15 -> int32 [R, C/8]: nibble j of word i = column 8i + order[j]."""
    r, c = codes.shape
    g = codes.to(torch.int64).reshape(r, c // PACK, PACK)[:, :, list(order)]
    shifts = torch.arange(PACK, dtype=torch.int64) * BITS
    return _to_int32((g << shifts).sum(dim=-1))


def pack_along_rows(codes: torch.Tensor) -> torch.Tensor:
    """[R, C] codes -> int32 [R/8, C]: nibble j of word (i, c) = row 8i + j."""
    return pack_along_cols(codes.t().contiguous()).t().contiguous()


def unpack_along_cols(packed: torch.Tensor, order=tuple(range(PACK))) -> torch.Tensor:
    """Inverse of pack_along_cols."""
    r, w = packed.shape
    shifts = torch.arange(PACK, dtype=torch.int64) * BITS
    nib = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF  # [R, W, 8]: nibble j
    out = torch.empty_like(nib)
    out[:, :, list(order)] = nib
    return out.reshape(r, w * PACK).to(torch.int32)


def pack_along_rows_inverse(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_along_rows."""
    return unpack_along_cols(packed.t().contiguous()).t().contiguous()


def quantize_awq(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """w [N, K] fp32 -> AWQ tensors (asymmetric, zero point, group 128 along K)."""
    n, k = w.shape
    wt = w.t().reshape(k // GROUP, GROUP, n)  # [G, 128, N]
    lo, hi = wt.amin(dim=1), wt.amax(dim=1)
    scale = ((hi - lo).clamp(min=1e-8) / 15).half()
    s = scale.float()
    zero = torch.round(-lo / s).clamp(0, 15)
    q = torch.clamp(torch.round(wt / s[:, None]) + zero[:, None], 0, 15).reshape(k, n)
    return {"qweight": pack_along_cols(q, AWQ_ORDER), "qzeros": pack_along_cols(zero, AWQ_ORDER),
            "scales": scale}


def quantize_gptq(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """w [N, K] fp32 -> GPTQ v1 tensors (symmetric, uint4 with bias 8, group 128 along K)."""
    n, k = w.shape
    wt = w.t().reshape(k // GROUP, GROUP, n)
    amax = wt.abs().amax(dim=1)
    scale = (amax.clamp(min=1e-8) * 2 / 15).half()
    q = torch.clamp(torch.round(wt / scale.float()[:, None]) + 8, 0, 15).reshape(k, n)
    zeros = torch.full((k // GROUP, n), 8 - 1, dtype=torch.int64)
    return {"qweight": pack_along_rows(q), "qzeros": pack_along_cols(zeros), "scales": scale,
            "g_idx": (torch.arange(k) // GROUP).to(torch.int32)}


def quantize_ct(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """w [N, K] fp32 -> compressed-tensors pack-quantized tensors: GPTQ's symmetric grid, the
    scale stored (and used for the codes) in bf16."""
    n, k = w.shape
    g = w.reshape(n, k // GROUP, GROUP)
    scale = (g.abs().amax(dim=2).clamp(min=1e-8) * 2 / 15).bfloat16()  # [N, K/128]
    codes = torch.clamp(torch.round(g / scale.float()[:, :, None]) + 8, 0, 15).reshape(n, k)
    return {"weight_packed": pack_along_cols(codes), "weight_scale": scale,
            "weight_shape": torch.tensor([n, k], dtype=torch.int32)}


def quantize_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """w [N, K] fp32 -> ModelOpt NVFP4 tensors (E2M1 codes, e4m3 scale per 16, fp32 global)."""
    n, k = w.shape
    grid = torch.tensor(E2M1)
    g = w.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
    scale_2 = (w.abs().amax().clamp(min=1e-12) / (FP8_MAX * E2M1[-1])).float()
    block = (g.abs().amax(dim=2) / E2M1[-1] / scale_2).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    eff = block.float() * scale_2  # [N, K/16]
    x = g / torch.where(eff > 0, eff, torch.ones_like(eff))[:, :, None]
    mag = torch.bucketize(x.abs(), (grid[1:] + grid[:-1]) / 2)  # code & 7: nearest on the grid
    codes = (mag | ((x < 0) & (mag > 0)).to(mag.dtype) << 3).reshape(n, k).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return {"weight": packed.contiguous(), "weight_scale": block.contiguous(),
            "weight_scale_2": scale_2.reshape(()), "input_scale": torch.tensor(1.0)}


def dequantize(t: dict[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """The [N, K] weight the 4-bit tensors of one module stand for (fp32)."""
    if fmt == "nvfp4":
        p = t["weight"].to(torch.int64)
        codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)
        val = torch.tensor(E2M1)[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
        s = t["weight_scale"].float().repeat_interleave(NVFP4_GROUP, dim=1) * t["weight_scale_2"]
        return val * s
    if fmt == "ct":
        q = unpack_along_cols(t["weight_packed"]).float()  # [N, K]
        s = t["weight_scale"].float()  # [N, K / 128]
        return (q - 8) * s.repeat_interleave(GROUP, dim=1)
    s = t["scales"].float()
    if fmt == "awq":
        q = unpack_along_cols(t["qweight"], AWQ_ORDER).float()
        z = unpack_along_cols(t["qzeros"], AWQ_ORDER).float()
    else:
        q = pack_along_rows_inverse(t["qweight"]).float()
        z = torch.full_like(s, 8.0)
    k = q.shape[0]
    gi = torch.arange(k) // GROUP
    return ((q - z[gi]) * s[gi]).t().contiguous()



def full_precision(name: str, shape: tuple[int, ...], kind: str, seed: int) -> torch.Tensor:
    """The seeded fp32 draw of one tensor (the 4-bit modules' weights before quantisation)."""
    g = _generator(seed, name)
    if kind in ("linear", "q4"):
        return torch.randn(shape, generator=g) * shape[1] ** -0.5
    if kind == "embed":
        return torch.randn(shape, generator=g)
    if kind == "norm":
        return torch.rand(shape, generator=g) * 0.2 + 0.9
    if kind == "bias":
        return torch.rand(shape, generator=g) * 0.04 - 0.02
    if kind == "gate":
        return torch.zeros(shape)
    if kind == "gate_bias":
        return torch.rand(shape, generator=g) * 0.05
    raise ValueError(f"unknown kind {kind} for {name}")


def make_tensors(cfg: dict, fmt: str, seed: int = SEED) -> dict[str, torch.Tensor]:
    quantize = {"awq": quantize_awq, "gptq": quantize_gptq, "ct": quantize_ct, "nvfp4": quantize_nvfp4}[fmt]
    out: dict[str, torch.Tensor] = {}
    for name, shape, kind in checkpoint_specs(cfg):
        t = full_precision(name, shape, kind, seed)
        if kind == "q4":
            out.update({f"{name}.{k}": v.contiguous() for k, v in quantize(t).items()})
        else:
            out[name] = t if kind == "gate_bias" else t.bfloat16()
    return out


def write_checkpoint(out_dir: str | os.PathLike, base: str, fmt: str, seed: int = SEED) -> Path:
    """Write model.safetensors + config.json into out_dir; returns the safetensors path."""
    from safetensors.torch import save_file

    if base not in BASES:
        raise ValueError(f"base must be one of {BASES}, got {base!r}")
    cfg = json.loads((MODELS / base / "config.json").read_text())
    cfg["quantization_config"] = quantization_config(fmt)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.safetensors"
    save_file(make_tensors(cfg, fmt, seed), str(path), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--base", choices=BASES, required=True)
    ap.add_argument("--format", choices=FORMATS, required=True)
    ap.add_argument("--seed", type=int, default=SEED)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    path = write_checkpoint(a.out_dir, a.base, a.format, a.seed)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
