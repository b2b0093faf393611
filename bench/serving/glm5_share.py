"""The share sparse attention + the indexer would take of a GLM-5 decode step at TP 8.

A calculator over the per-layer kernel times measured on the H200 (no GPU needed):
  bench/results/attention.json          sparse-MLA attention, ours vs FlashMLA, by heads
                                        per GPU x query tokens x cache dtype
  bench/indexer/results/indexer.json    indexer decode logits, ours vs DeepGEMM, and the
                                        logits + top-k step, by batch x context

Per decode step and per GPU:
  attention   the `engine` row at heads = num_attention_heads / TP and tokens = batch
              (linear in tokens between the two nearest rows where the batch has none);
              ours = ours_us, upstream = flashmla_us (FlashMLA: FLASHMLA_SPARSE's kernel;
              for the 16-bit cache vLLM 0.26.0 picks FLASH_ATTN_MLA_SPARSE on the H200,
              which the kernel benchmark did not time: FlashMLA stands in for it)
  indexer     the decode row (next_n 1) of that batch x context; ours = the fp8-mma path
              (what runs on sm90), upstream = DeepGEMM. Measured at 64 indexer heads
              (DeepSeek's); GLM-5 has 32, replicated on every GPU (vLLM's Indexer is not
              tensor-parallel). The decode logits read the same key bytes whatever the
              heads, so the 64-head time is used as it is (at most what 32 heads take)
  top-k       step_deepgemm_persistent_topk_us - deepgemm_us, on both sides (the series
              keeps upstream's persistent_topk on sm90; vLLM 0.26.0 takes cooperative_topk
              for <= 32 rows, not timed: persistent_topk stands in for it)
  rest        a floor: the bytes of every other weight the layer reads once per step on
              one GPU (TP-sharded projections and experts / TP, replicated ones whole, the
              routed experts the batch touches: E * (1 - (1 - k/E)^batch) under uniform
              routing) / the copy bandwidth measured in the same run. Communication (two
              all-reduces a layer at TP 8), norms, activations, the KV-cache write and
              the sampler are not in it: the real rest is longer, so every share below
              is an upper bound of what attention + indexer take.
Whole step: layers x (attention + indexer + top-k) + every layer's rest + the LM head's
bytes; the dense first layers read their dense MLP instead of experts.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ATTENTION_JSON = REPO / "bench" / "results" / "attention.json"
INDEXER_JSON = REPO / "bench" / "indexer" / "results" / "indexer.json"
# GLM-5: transformers 5.17's GlmMoeDsaConfig() defaults (zai-org/GLM-5's geometry; the
# attention part matches smla.selection.PRESETS["glm-5"]).
GLM5 = {"hidden_size": 6144, "num_hidden_layers": 78, "first_k_dense_replace": 3, "num_attention_heads": 64,
        "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
        "v_head_dim": 256, "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
        "moe_intermediate_size": 2048, "intermediate_size": 12288, "vocab_size": 154880}
KEYS = tuple(GLM5)


class ShareError(ValueError):
    """Inputs the calculator cannot use."""


def load_config(path: Path | None) -> dict:
    if path is None:
        return dict(GLM5)
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ShareError(f"{path}: {exc}") from exc
    missing = [k for k in KEYS if k not in cfg]
    if missing:
        raise ShareError(f"{path}: config lacks {missing}")
    return {k: cfg[k] for k in KEYS}


def layer_params(cfg: dict, tp: int, batch: int, dense: bool) -> float:
    """Weights (parameters) one GPU reads for one layer's non-attention work in one decode step."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    replicated = (h * (cfg["q_lora_rank"] + cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])  # fused_qkv_a_proj
                  + cfg["q_lora_rank"] * cfg["index_n_heads"] * cfg["index_head_dim"]  # indexer wq_b
                  + h * (cfg["index_head_dim"] + cfg["index_n_heads"]))  # indexer wk + weights_proj
    sharded = (cfg["q_lora_rank"] * heads * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])  # q_b_proj
               + cfg["kv_lora_rank"] * heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"])  # kv_b (W_UK, W_UV)
               + heads * cfg["v_head_dim"] * h)  # o_proj
    if dense:
        sharded += 3 * h * cfg["intermediate_size"]
    else:
        e, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
        replicated += h * e  # router
        touched = e * (1.0 - (1.0 - k / e) ** batch)
        sharded += 3 * h * cfg["moe_intermediate_size"] * (cfg["n_shared_experts"] + touched)
    return replicated + sharded / tp


def _attention_rows(att: dict, heads: int, cache: str) -> list[dict]:
    # fp8 rows come per e4m3 path since issue 34: the H200 runs the hardware conversion
    rows = [r for r in att["rows"] if r.get("call") == "engine" and r.get("heads") == heads
            and r.get("cache") == cache and r.get("path", "hw") == "hw"]
    if not rows:
        have = sorted({r.get("heads") for r in att["rows"] if r.get("call") == "engine"})
        raise ShareError(f"attention.json has no {cache} rows at {heads} heads per GPU (has {have})")
    return sorted(rows, key=lambda r: r["tokens"])


def attention_us(att: dict, heads: int, cache: str, tokens: int, key: str) -> tuple[float, str]:
    """(µs, how) at `tokens` query tokens: exact row, else linear between neighbours."""
    rows = _attention_rows(att, heads, cache)
    for r in rows:
        if r["tokens"] == tokens:
            return float(r[key]), "measured"
    lo = [r for r in rows if r["tokens"] < tokens]
    hi = [r for r in rows if r["tokens"] > tokens]
    if not lo or not hi:
        raise ShareError(f"attention.json: {tokens} tokens outside the rows' range at {heads} heads ({cache})")
    a, b = lo[-1], hi[0]
    f = (tokens - a["tokens"]) / (b["tokens"] - a["tokens"])
    return float(a[key]) + f * (float(b[key]) - float(a[key])), f"interpolated {a['tokens']}-{b['tokens']} tokens"


def decode_points(idx: dict) -> list[dict]:
    """The indexer's decode rows (next_n 1) on the path the H200 runs (fp8-mma)."""
    pts = [r for r in idx["rows"] if r.get("kind") == "decode" and r.get("next_n") == 1
           and r.get("path") == "fp8-mma" and r.get("step_deepgemm_persistent_topk_us")]
    if not pts:
        raise ShareError("indexer.json has no decode rows (next_n 1, fp8-mma, persistent top-k step)")
    return sorted(pts, key=lambda r: (r["batch"], str(r["context"])))


def compute(att: dict, idx: dict, cfg: dict, tp: int = 8, weight_bytes: float = 2.0) -> dict:
    """Per point (batch x context), cache and side: per-layer µs and the shares."""
    if cfg["num_attention_heads"] % tp:
        raise ShareError(f"{cfg['num_attention_heads']} heads do not split over TP {tp}")
    heads = cfg["num_attention_heads"] // tp
    bw = float(att.get("copy_tbps") or idx.get("copy_tbps")) * 1e6  # bytes per µs
    layers, dense = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    lm_head_us = cfg["vocab_size"] * cfg["hidden_size"] / tp * weight_bytes / bw
    out = []
    for p in decode_points(idx):
        batch = int(p["batch"])
        ctx = p["context"] if isinstance(p["context"], int) else f"{p['context']} (mean {p['keys'] // batch:,})"
        topk = float(p["step_deepgemm_persistent_topk_us"]) - float(p["deepgemm_us"])
        rest_moe = layer_params(cfg, tp, batch, dense=False) * weight_bytes / bw
        rest_dense = layer_params(cfg, tp, batch, dense=True) * weight_bytes / bw
        for cache in ("bfloat16", "fp8_ds_mla"):
            for side, akey, ikey in (("upstream", "flashmla_us", "deepgemm_us"), ("ours", "ours_us", "ours_us")):
                a, how = attention_us(att, heads, cache, batch, akey)
                i = float(p[ikey])
                sparse = a + i + topk
                step = layers * sparse + (layers - dense) * rest_moe + dense * rest_dense + lm_head_us
                out.append({"batch": batch, "context": ctx, "cache": cache, "side": side,
                            "attention_us": round(a, 2), "attention_from": how, "indexer_us": round(i, 2),
                            "topk_us": round(topk, 2), "rest_floor_us": round(rest_moe, 2),
                            "layer_share": round(sparse / (sparse + rest_moe), 4),
                            "step_floor_us": round(step, 1), "step_share": round(layers * sparse / step, 4)})
    return {"config": cfg, "tp": tp, "heads_per_gpu": heads, "weight_bytes": weight_bytes,
            "copy_tbps": bw / 1e6, "lm_head_floor_us": round(lm_head_us, 2), "points": out}


def markdown(res: dict, label: str) -> str:
    lines = [f"{label} at TP {res['tp']} ({res['heads_per_gpu']} attention heads per GPU, weights "
             f"{res['weight_bytes']:g} B, copy {res['copy_tbps']:.2f} TB/s): per MoE layer and GPU, one decode step",
             "", "| batch | context | cache | side | attention µs | indexer µs | top-k µs | rest floor µs | "
             "share of the layer | share of the step |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in res["points"]:
        att = f"{p['attention_us']:.1f}" + ("" if p["attention_from"] == "measured" else "*")
        ctx = f"{p['context']:,}" if isinstance(p["context"], int) else p["context"]
        lines.append(f"| {p['batch']} | {ctx} | {p['cache']} | {p['side']} | {att} | {p['indexer_us']:.1f} | "
                     f"{p['topk_us']:.1f} | {p['rest_floor_us']:.1f} | {p['layer_share']:.0%} | "
                     f"{p['step_share']:.0%} |")
    lines += ["", "\\* attention interpolated in tokens between the benchmark's rows. The rest is a bytes "
              "floor, so each share is an upper bound (bench/serving/README.md)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", type=Path, default=ATTENTION_JSON)
    ap.add_argument("--indexer", type=Path, default=INDEXER_JSON)
    ap.add_argument("--config", type=Path, default=None,
                    help="an HF config.json (e.g. tests/e2e/models/glm5-tiny); default: GLM-5's real sizes")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--weight-bytes", type=float, default=2.0, help="bytes per weight (2: bf16, 1: fp8)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        att = json.loads(args.attention.read_text())
        idx = json.loads(args.indexer.read_text())
        res = compute(att, idx, load_config(args.config), args.tp, args.weight_bytes)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ShareError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    label = "GLM-5" if args.config is None else str(args.config)
    print(json.dumps(res, indent=1, sort_keys=True) if args.json else markdown(res, label), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
