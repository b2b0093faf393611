"""CPU checks of the tiny DeepSeek-V4 checkpoint (tests/e2e/models/deepseek-v4-tiny).

No vLLM import: the generator (make_checkpoint.py) is checked against
- the config keys vLLM 0.26.0's DeepSeek-V4 code reads (models/deepseek_v4/attention.py,
  compressor.py, quant_config.py, nvidia/model.py, nvidia/mtp.py, common/rope.py);
- vllm_params.json, the parameter table of vLLM's own DeepseekV4ForCausalLM and
  DeepSeekV4MTP as built on the CPU by cpu_load_check.py (which also loads a generated
  checkpoint through vLLM's loader and checks every parameter byte was written);
- a restatement of vLLM's checkpoint-name mapping written from the code:
  nvidia/model.py::_make_deepseek_v4_weights_mapper and DeepseekV4Model.load_weights
  (stacked shards, FusedMoE expert mapping), nvidia/mtp.py::DeepSeekV4MTP.load_weights.
The full-size checkpoint is generated once into a temporary directory (about 440 MiB,
half a minute on two cores); the two tests that read it are marked `slow` (make test-fast
leaves them out).
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import lineproofs

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

MODEL_DIR = Path(__file__).resolve().parent / "e2e" / "models" / "deepseek-v4-tiny"
CONFIG = json.loads((MODEL_DIR / "config.json").read_text())
VLLM_PARAMS = json.loads((MODEL_DIR / "vllm_params.json").read_text())


def _load_generator():
    spec = importlib.util.spec_from_file_location("v4_make_checkpoint",
                                                  MODEL_DIR / "make_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()

# Keys vLLM 0.26.0's DeepSeek-V4 path reads from the HF config (attribute accesses in the
# files named in the module docstring, plus quantization_config for DeepseekV4FP8Config).
KEYS_READ = {
    "architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
    "num_nextn_predict_layers", "compress_ratios", "num_attention_heads", "head_dim",
    "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "sliding_window",
    "index_n_heads", "index_head_dim", "index_topk", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
    "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
    "num_hash_layers", "scoring_func", "topk_method", "norm_topk_prob", "routed_scaling_factor",
    "swiglu_limit", "expert_dtype", "hidden_act", "rms_norm_eps", "rope_theta",
    "compress_rope_theta", "rope_scaling", "max_position_embeddings", "quantization_config",
}

# DeepSeek-V4-Flash's values (its released config.json, as copied in public code) that the
# tiny model keeps: the whole attention / indexer / compressor / mHC geometry.
REAL = {
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
    "sliding_window": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "num_experts_per_tok": 6, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0, "hidden_act": "silu", "rope_theta": 10000,
    "compress_rope_theta": 160000, "max_position_embeddings": 1048576,
    "num_nextn_predict_layers": 1, "expert_dtype": "fp4",
    "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
}
# Shrunk from DeepSeek-V4-Flash (43 layers, hidden 4096, vocab 129280, 256 experts,
# moe_intermediate 2048, 3 hash layers).
SHRUNK = {"num_hidden_layers": 3, "hidden_size": 1024, "vocab_size": 8192,
          "n_routed_experts": 16, "moe_intermediate_size": 512, "num_hash_layers": 1,
          "compress_ratios": [0, 4, 128, 0]}

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "int32": torch.int32,
          "uint8": torch.uint8, "float8_e4m3fn": torch.float8_e4m3fn,
          "float8_e8m0fnu": torch.float8_e8m0fnu}
# (checkpoint dtype, parameter dtype) pairs that vLLM's loaders copy byte for byte:
# int8 packed E2M1 into the uint8 MXFP4 parameter (copy_ wraps), e8m0 expert scales viewed
# as uint8 (DeepseekV4Model.load_weights), everything else the same dtype.
BYTE_COPY = {(torch.int8, torch.uint8), (torch.float8_e8m0fnu, torch.uint8)}


def test_config_has_every_key_the_v4_code_reads():
    assert KEYS_READ <= set(CONFIG), sorted(KEYS_READ - set(CONFIG))
    assert CONFIG["architectures"] == ["DeepseekV4ForCausalLM"]
    assert CONFIG["model_type"] == "deepseek_v4"


def test_config_keeps_the_real_geometry_and_shrinks_the_rest():
    for key, value in {**REAL, **SHRUNK}.items():
        assert CONFIG[key] == value, key
    c = CONFIG
    # one layer of each kind: SWA only (0), C4 + indexer (4), C128 (128); the trailing
    # entry is the MTP layer's, as in the released list (43 layers + 1).
    assert c["compress_ratios"][: c["num_hidden_layers"]] == [0, 4, 128]
    assert len(c["compress_ratios"]) == c["num_hidden_layers"] + c["num_nextn_predict_layers"]
    assert c["head_dim"] - c["qk_rope_head_dim"] == 448
    assert 0 < c["num_hash_layers"] < c["num_hidden_layers"]  # hash and bias-routed layers
    # TP 1 and 2 without padding: heads, o_groups and experts split evenly; block-fp8
    # shards stay whole 128-blocks; Marlin MXFP4 rounds hidden to 256 and the per-rank
    # intermediate to 128 (fused_moe/oracle/mxfp4.py), so nothing is padded.
    for tp in (1, 2):
        assert c["num_attention_heads"] % tp == 0 and c["o_groups"] % tp == 0
        assert c["n_routed_experts"] % tp == 0
        assert (c["moe_intermediate_size"] // tp) % 128 == 0
        assert (c["o_groups"] * c["o_lora_rank"] // tp) % 128 == 0
    assert c["hidden_size"] % 256 == 0 and c["q_lora_rank"] % 128 == 0


def _target_name(name: str, expert_dtype: str) -> str:
    """nvidia/model.py::_make_deepseek_v4_weights_mapper (regex, substr, prefix, suffix)."""
    if expert_dtype == "fp4":
        name = re.sub(r"(\.experts\.\d+\.w[123])\.scale$", r"\1.weight_scale", name)
    name = re.sub(r"\.scale$", ".weight_scale_inv", name)
    name = name.replace(".shared_experts.w2", ".shared_experts.down_proj", 1)
    for old, new in (("layers.", "model.layers."), ("embed.", "model.embed."),
                     ("norm.", "model.norm."), ("hc_head", "model.hc_head")):
        if name.startswith(old):
            name = new + name[len(old):]
    for old, new in (("head.weight", "lm_head.weight"), ("embed.weight", "embed_tokens.weight"),
                     (".ffn.gate.bias", ".ffn.gate.e_score_correction_bias")):
        if name.endswith(old):
            name = name[: -len(old)] + new
    return name


def _mtp_name(name: str, expert_dtype: str, n_layers: int) -> str:
    """nvidia/mtp.py::DeepSeekV4MTP.load_weights up to the stacked/expert placement."""
    k = int(name.split(".")[1])
    spec = n_layers + k
    name = name.replace(f"mtp.{k}.", f"model.layers.{spec}.", 1)
    for old, new in ((".emb.tok_emb.weight", ".embed_tokens.weight"),
                     (".head.weight", ".shared_head.head.weight"),
                     (".norm.weight", ".shared_head.norm.weight")):
        name = name.replace(old, new)
    top = ("embed_tokens", "enorm", "hnorm", "h_proj", "e_proj", "shared_head",
           "hc_head_fn", "hc_head_base", "hc_head_scale")
    hit = next((t for t in top if t in name), None)
    if hit is None:
        name = name.replace(f"model.layers.{spec}.", f"model.layers.{spec}.mtp_block.")
    elif hit == "embed_tokens":
        name = name.replace(f"model.layers.{spec}.", "model.")
    if name.endswith(".scale"):
        expert = re.search(r"\.experts\.\d+\.w[123]\.scale$", name)
        name = name.removesuffix(".scale") + (
            ".weight_scale" if expert and expert_dtype == "fp4" else ".weight_scale_inv")
    name = name.replace(".shared_experts.w2", ".shared_experts.down_proj")
    if name.endswith(".ffn.gate.bias"):
        name = name.replace(".ffn.gate.bias", ".ffn.gate.e_score_correction_bias")
    return name


STACKED = (("gate_up_proj", "w1", 0), ("gate_up_proj", "w3", 1),
           ("attn.fused_wqa_wkv", "attn.wq_a", 0), ("attn.fused_wqa_wkv", "attn.wkv", 1),
           ("compressor.fused_wkv_wgate", "compressor.wkv", 0),
           ("compressor.fused_wkv_wgate", "compressor.wgate", 1))
EXPERT = re.compile(r"\.experts\.(\d+)\.(w[123])\.")


def _place(name: str) -> tuple[str, int | None, int | None]:
    """(parameter, expert id, shard index) as load_weights places a mapped name: FusedMoE's
    expert mapping (experts.{e}.w1|w3 -> experts.routed_experts.w13_*, w2 -> w2_*) or the
    stacked mapping (first match), else the name itself."""
    m = EXPERT.search(name)
    if m:
        e, w = int(m.group(1)), m.group(2)
        dst = "experts.routed_experts." + ("w2_" if w == "w2" else "w13_")
        return name.replace(m.group(0)[1:], dst), e, {"w1": 0, "w3": 1, "w2": None}[w]
    for param, shard_name, shard in STACKED:
        if shard_name in name:
            return name.replace(shard_name, param), None, shard
    return name, None, None


def _placements(expert_dtype: str):
    cfg = dict(CONFIG, expert_dtype=expert_dtype)
    out = {"target": defaultdict(list), "mtp": defaultdict(list)}
    for name, (shape, dtype) in gen.stored_tensors(cfg, expert_dtype).items():
        if name.startswith("mtp."):
            which, mapped = "mtp", _mtp_name(name, expert_dtype, cfg["num_hidden_layers"])
        else:
            which, mapped = "target", _target_name(name, expert_dtype)
        param, expert, shard = _place(mapped)
        out[which][param].append((name, tuple(shape), dtype, expert, shard))
    return out


@pytest.mark.parametrize("expert_dtype", ["fp4", "fp8"])
def test_every_tensor_lands_in_a_vllm_parameter_and_covers_it(expert_dtype):
    table = VLLM_PARAMS[expert_dtype]
    for which, placed in _placements(expert_dtype).items():
        params = {n: (tuple(s), DTYPES[d]) for n, (s, d) in table[which].items()}
        assert set(placed) == set(params), (
            which, sorted(set(placed) - set(params))[:5], sorted(set(params) - set(placed))[:5])
        for param, parts in placed.items():
            pshape, pdtype = params[param]
            for name, shape, dtype, _, _ in parts:
                assert dtype == pdtype or (dtype, pdtype) in BYTE_COPY, (name, dtype, param, pdtype)
            experts = {e for *_, e, _ in parts}
            if experts != {None}:  # FusedMoE: [E, rows, cols] filled per expert and shard
                assert experts == set(range(pshape[0])), param
                layout = [sorted((p[4] is None, p[4] or 0, p[1]) for p in parts if p[3] == e)
                          for e in range(pshape[0])]
                assert all(x == layout[0] for x in layout), param
                per_expert = [p for p in parts if p[3] == 0]
            else:
                per_expert, pshape = parts, (None, *pshape)
            shards = sorted(per_expert, key=lambda p: -1 if p[4] is None else p[4])
            assert [p[4] for p in shards] in ([None], [0, 1]), (param, shards)
            rows = sum(p[1][0] for p in shards)
            assert (rows, *shards[0][1][1:]) == pshape[1:], (param, pshape, shards)
            assert all(p[1][1:] == shards[0][1][1:] for p in shards), param


def test_quantizers_round_trip():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(300, 260, generator=g) * torch.logspace(-3, 1, 260)  # ragged blocks
    for ue8m0 in (True, False):
        codes, scale = gen.quantize_block_fp8(w, ue8m0)
        assert codes.dtype == torch.float8_e4m3fn and codes.shape == w.shape
        assert scale.shape == (3, 3)
        s = (torch.exp2(scale.view(torch.uint8).float() - 127) if ue8m0 else scale)
        if ue8m0:
            assert scale.dtype == torch.float8_e8m0fnu
        amax = torch.zeros(3, 3)
        for i in range(3):
            for j in range(3):
                amax[i, j] = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max()
        ratio = amax / s
        assert (ratio <= 448 * (1 + 1e-6)).all() and (ratio > (224 if ue8m0 else 447.9)).all()
        sfull = s.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :260]
        deq = codes.float() * sfull  # independent of gen.dequantize_block_fp8
        assert torch.equal(deq, gen.dequantize_block_fp8(codes, scale))
        err = (deq - w).abs()
        assert (err <= w.abs() * 2**-4 + sfull * 2**-10).all()  # e4m3: 3 mantissa bits


def test_mxfp4_layout():
    # by hand: scale 2^0 (byte 127); values 0.5, 1.0 -> codes 1, 2 -> byte 0x21 (low nibble
    # first); -6, 0 -> codes 0xF, 0 -> byte 0x0F; 3, -0.5 -> 5, 0x9 -> 0x95
    w = torch.zeros(1, 32)
    w[0, :6] = torch.tensor([0.5, 1.0, -6.0, 0.0, 3.0, -0.5])
    packed, scale = gen.quantize_mxfp4(w)
    assert packed.dtype == torch.int8 and packed.shape == (1, 16)
    assert scale.dtype == torch.float8_e8m0fnu and scale.view(torch.uint8).tolist() == [[127]]
    assert packed.view(torch.uint8)[0, :3].tolist() == [0x21, 0x0F, 0x95]
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-2, 1, 64)[:, None]
    packed, scale = gen.quantize_mxfp4(w)
    b = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack((b & 15, b >> 4), -1).flatten(-2)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    s = torch.exp2(scale.view(torch.uint8).float() - 127).repeat_interleave(32, -1)
    deq = grid[codes & 7] * (1 - 2 * (codes >> 3)) * s
    assert torch.equal(deq, gen.dequantize_mxfp4(packed, scale))
    x = w / s
    amax = x.view(64, 8, 32).abs().amax(-1)
    assert (amax <= 6).all() and (amax > 3).all()
    step = torch.where(x.abs() <= 2, 0.5, torch.where(x.abs() <= 4, 1.0, 2.0))
    assert ((deq / s - x).abs() <= step / 2).all()


MINI = dict(CONFIG, hidden_size=256, vocab_size=64, num_attention_heads=4, head_dim=128,
            qk_rope_head_dim=64, q_lora_rank=128, o_lora_rank=128, o_groups=2,
            index_n_heads=2, n_routed_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=128)


@pytest.mark.slow  # long CPU work: three tiny checkpoints' tensors drawn
def test_values_are_seeded_per_tensor_name():
    a = gen.make_tensors(MINI, seed=7)
    b = gen.make_tensors(MINI, seed=7)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fewer = gen.make_tensors(dict(MINI, num_hidden_layers=2, num_nextn_predict_layers=0), seed=7)
    assert all(torch.equal(fewer[k], a[k]) for k in fewer)  # independent of the others
    c = gen.make_tensors(MINI, seed=8, router="random")
    assert not torch.equal(a["layers.1.attn.wq_b.weight"].float(),
                           c["layers.1.attn.wq_b.weight"].float())
    assert not a["layers.1.ffn.gate.weight"].any() and c["layers.1.ffn.gate.weight"].any()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("deepseek-v4-tiny")
    path = gen.write_checkpoint(out)
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    return out, tensors, meta


@pytest.mark.slow  # generates the full checkpoint (about half a minute on two cores)
def test_checkpoint_holds_exactly_the_specified_tensors(checkpoint):
    out, tensors, meta = checkpoint
    assert json.loads((out / "config.json").read_text()) == CONFIG
    assert meta == {"format": "pt"}
    spec = gen.stored_tensors(CONFIG, "fp4")
    assert set(tensors) == set(spec), (sorted(set(spec) - set(tensors))[:5],
                                       sorted(set(tensors) - set(spec))[:5])
    for name, t in tensors.items():
        assert (tuple(t.shape), t.dtype) == (tuple(spec[name][0]), spec[name][1]), name
    n_ckpt = sum(t.numel() * t.element_size() for t in tensors.values())
    assert n_ckpt < 500 * 2**20  # MiB on disk, generated on the device machine


@pytest.mark.slow
def test_checkpoint_values_keep_activations_unit_scale(checkpoint):
    _, t, _ = checkpoint
    for name, x in t.items():
        if x.dtype == torch.float8_e4m3fn:  # NaN is the only non-finite e4m3fn code
            assert ((x.view(torch.uint8) & 0x7F) != 0x7F).all(), name
        elif x.dtype == torch.float8_e8m0fnu:  # 0xFF is NaN
            assert (x.view(torch.uint8) != 0xFF).all(), name
        elif x.is_floating_point():
            assert torch.isfinite(x.float()).all(), name
    for sp in gen.checkpoint_specs(CONFIG, "fp4"):
        if sp.kind in ("fp8", "fp4"):
            w, s = t[f"{sp.name}.weight"], t[f"{sp.name}.scale"]
            rows = 128  # one block row (fp8) / 128 output rows (fp4) of each linear
            deq = (gen.dequantize_mxfp4(w[:rows], s[:rows]) if sp.kind == "fp4"
                   else gen.dequantize_block_fp8(w[:rows], s[:1]))
            assert deq.shape == (min(rows, sp.shape[0]), sp.shape[1])
            std = deq.std().item() * math.sqrt(sp.shape[1])
            assert 0.85 < std < 1.15, (sp.name, std)  # y = W x keeps rms(x)
        elif sp.kind == "norm":
            assert ((t[sp.name] >= 0.9) & (t[sp.name] <= 1.1)).all(), sp.name
        elif sp.kind == "hc_fn":
            std = t[sp.name].std().item() * math.sqrt(sp.shape[1])
            assert 0.9 < std < 1.1, sp.name  # mHC mixing logits O(1)
        elif sp.kind == "gate":
            assert not t[sp.name].any(), sp.name  # --router zero (default)
        elif sp.kind == "tid2eid":
            ids = t[sp.name]
            assert ids.min() >= 0 and ids.max() < CONFIG["n_routed_experts"]
            assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()  # distinct experts per token
        elif sp.kind == "gate_bias":
            assert t[sp.name].unique().numel() == CONFIG["n_routed_experts"]  # no routing ties
        elif sp.kind == "copy":
            assert torch.equal(t[sp.name], t[sp.source]), sp.name


# tests/lines/<line>/v4/test_v4_tiny_checkpoint_load_sm86.py: the checkpoint loaded into the line's own
# DeepseekV4ForCausalLM / DeepSeekV4MTP on the CPU with an sm86 GPU faked (cpu_load_check.py), the
# portable path asserted; the least number of tests it must pass.
LINE_PROOFS = {"0.33.0": [("v4", "test_v4_tiny_checkpoint_load_sm86.py", 1)]}


@pytest.mark.slow
@pytest.mark.parametrize("case", lineproofs.cases(LINE_PROOFS, "cpu_load_check.py runs on the H200's "
                                                 "image (tests/e2e); vllm_params.json is its table"))
def test_line_tiny_checkpoint_loads(vllm_tree, case):
    lineproofs.check(case, vllm_tree)
