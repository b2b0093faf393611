"""Compare the engines of one e2e run (tests/e2e/run_e2e.py) against the reference and the bounds.

Pure numpy; imported by run_e2e.py on the device and usable here on saved
results (`python3 tests/e2e/compare.py RESULTS_DIR`).

For each (TP, model, dtype) every side other than `ref` is compared with `ref`:
- teacher-forced: |logprob difference| of each prompt token, over all positions
  and split into "dense" positions (the query sees <= index_topk tokens, so the
  indexer keeps them all) and "sparse" positions (> index_topk: the top-k
  selection decides what attention sees); top-1 agreement of the prompt logits;
- greedy: tokens matched before the first divergence; at the divergence, the
  reference's logprob margin between its token and the other side's token (a
  divergence only means something when that margin is large; when the other
  token is outside the reference's returned top-2, the margin is at least the
  reference's top-1 minus top-2, and that lower bound is used; exact ties,
  margin 0, are counted apart); the |difference|
  of the top-1 logprob at every step up to the divergence, where both sides
  still have the same context (decode path: prefix cache, MTP, CUDA graphs).

fp8 KV cache engines (names tpN-model-dtype-fp8kv-side, README "fp8 KV cache"):
- fp8 `ours` with an fp8 `ref` of the same dtype (bf16): compared with it (same
  quantised cache, two kernels), bounded like the 16-bit `ours` (factor x the
  ref2-vs-ref spread of the model);
- bf16 all-MQA fp8 `ours` (tpN-model-bfloat16-fp8kv-mqa-ours) with the all-MQA fp8
  `ref` (fp8kv-mqa-ref): the same rule (same cache, same prefill path, two kernels);
- fp8 `ours` without a same-cache `ref` (fp16: upstream has no fp16 + fp8 sparse backend
  on sm90): compared with the kv-auto `ref` (16-bit cache), so the difference holds the fp8
  quantisation; bounded by fp8_cost_factor x upstream's own fp8 cost, never below the bf16
  floors. The cost is read from the bf16 engine that quantises the same positions as our
  fp16 side (every prefill from the fp8 cache): fp8kv-mqa-ref vs the bf16 kv-auto `ref`,
  all positions; without it in the run, fp8kv-ref vs that `ref` at the sparse positions
  only (the previous rule; its dense positions partly read fresh 16-bit K/V); without
  either, the fixed bf16 bounds;
- fp8 `ref` / `mqa-ref` vs kv-auto `ref`: reported, not bounded (the calibrations above).

DeepSeek-V4 (V4_MODELS; bf16, fp8 cache; README "DeepSeek-V4"), per TP:
- `ref2` vs `ref`: the calibration (upstream vs upstream: same kernels, prefill chunks of 1024
  instead of 2048 tokens), reported;
- `ref-o16` vs `ref`: what the portable path's bf16 output projection (no fp8 quantisation of
  the attention output) costs; bounded by the fixed bf16 bounds, a gross-error check of the
  bf16 projection that `ours` and `ref-o16` share;
- `ours` vs `ref-o16` (same output-projection arithmetic; attention, indexer, mHC and
  compressor kernels swapped): factor x the ref2-vs-ref spread, bf16 floors (the fixed bf16
  bounds without a `ref2`);
- `ours` vs `ref` (the whole portable path vs upstream): per statistic the ours-vs-ref-o16
  bound plus o_proj_cost_factor x the ref-o16-vs-ref statistic (triangle inequality), the
  divergence margin the larger of the two; the fixed bf16 bounds without a `ref-o16`.
Engine checks: the probe's DeepSeek-V4 record (e2e_plugin.describe_dsv4) in the target and
the MTP drafter must show the side's attention class, backend, fp8_ds_mla cache, output
projection, mHC kernels and compressor (V4_EXPECT).

TP (issue 37; compare_tp): every TP=k engine whose job names a `tp1_ref` (run_e2e sets it
where the weights are the same at every TP size) is also compared with that TP=1 engine of
the same model, dtype, side and cache, bounded as a kernel swap (factor x the ref2-vs-ref
spread of the model, same TP else TP=1; the fixed bounds without one). Rows "X vs Y".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import nan_probe  # the probe's records in the engine logs (same folder)
import prompt_lp_guard  # the guard's records in the engine logs
import quant_probe  # 4-bit kernels and IndexCache layers in the probe
import sm80_paths  # which kernels took their sm80 paths (engine logs)

INDEX_TOPK = 2048
# DeepSeek-V4: its C4 layer's indexer keeps index_topk 512 of the compressed entries (one per 4
# tokens), so it selects once a query sees more than 4 x 512 = 2048 tokens: the same split.
V4_MODELS = ("deepseek-v4-tiny",)
V4_SELECTS_FROM = 4 * 512
# What each DeepSeek-V4 side must show (e2e_plugin.describe_dsv4), target and MTP drafter.
V4_EXPECT = {
    "ours": {"class": "DeepseekV4TritonAttention", "backend": "TRITON_MLA_SPARSE_DSV4", "o_proj": "bf16",
             "mhc_suffixes": ("_torch", "_triton"), "compressor": "triton"},
    "ref": {"class": "DeepseekV4FlashMLAAttention", "backend": "FLASHMLA_SPARSE_DSV4", "o_proj": "deep_gemm"},
    "ref2": {"class": "DeepseekV4FlashMLAAttention", "backend": "FLASHMLA_SPARSE_DSV4", "o_proj": "deep_gemm"},
    "ref-o16": {"class": "DeepseekV4FlashMLAAttention", "backend": "FLASHMLA_SPARSE_DSV4", "o_proj": "bf16"},
}
# --v4-ref-kernels complete: the upstream sides must also run pristine 0.26.0's mHC and compressor
V4_COMPLETE = {"mhc_suffixes": ("_tilelang",), "compressor": "cutedsl"}
V4_RATIOS = [1, 4, 128]  # the target's layers: SWA only (0 -> 1), C4 + indexer, C128
SIXTEEN_BIT_OR_AUTO = {"auto", "bfloat16", "float16", "half", "bf16", "fp16", "float", "float32"}


def engine_name(tp: int, model: str, dtype: str, side: str, kv: str = "auto", mqa: bool = False) -> str:
    """tpN-model-dtype-side for the model-dtype KV cache; tpN-model-dtype-fp8kv-side for fp8;
    tpN-model-dtype-fp8kv-mqa-side for the all-MQA variant (sparse_mla_force_mqa on that engine)."""
    return (f"tp{tp}-{model}-{dtype}-" + ("" if kv == "auto" else f"{kv}kv-") + ("mqa-" if mqa else "")
            + side)


def _load(res: Path, name: str):
    d = res / name
    meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").exists() else {
        "ok": False, "error": "no meta.json" + (" (timed out)" if (d / "timeout").exists() else "")}
    arrays = dict(np.load(d / "arrays.npz")) if meta.get("ok") else None
    return meta, arrays


def _stats(x: np.ndarray) -> dict:
    if x.size == 0:
        return {"n": 0}
    return {"n": int(x.size), "mean": float(x.mean()), "p50": float(np.percentile(x, 50)),
            "p99": float(np.percentile(x, 99)), "p999": float(np.percentile(x, 99.9)),
            "max": float(x.max())}


WORST = 8  # teacher-forced positions listed per comparison, largest difference first


def _where(lens: np.ndarray, flat: np.ndarray) -> list:
    """[prompt, token index] of flat prompt-logprob indices (token i of a prompt, i >= 1, is
    scored by the query at position i - 1)."""
    starts = np.concatenate([[0], np.cumsum(lens - 1)])
    prompt = np.searchsorted(starts, flat, side="right") - 1
    return [[int(p), int(f - starts[p] + 1)] for p, f in zip(prompt, flat)]


def compare_pair(ref: dict, oth: dict) -> dict:
    """Teacher-forced and greedy statistics of `oth` against `ref`. Non-finite prompt
    logprobs are counted and located, on either side (`nan`/`nan_at` for `oth`, which
    breaks it; `ref_nan`/`ref_nan_at` for `ref`), and left out of the statistics, so one
    side's NaN does not turn every statistic (and every bound derived from it) into NaN."""
    lens = ref["prompt_lens"]
    assert np.array_equal(lens, oth["prompt_lens"]), "different workloads"
    seen = np.concatenate([np.arange(1, n) for n in lens])
    a, b = oth["prompt_lp"].astype(np.float64), ref["prompt_lp"].astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    diff = np.abs(a - b)
    agree = oth["prompt_top1"] == ref["prompt_top1"]
    sparse = seen > INDEX_TOPK
    tf = {"all": _stats(diff[finite]), "dense": _stats(diff[finite & ~sparse]),
          "sparse": _stats(diff[finite & sparse]),
          "top1_agree": float(agree[finite].mean()),
          "top1_agree_sparse": float(agree[finite & sparse].mean()),
          "nan": int((~np.isfinite(a)).sum())}
    if tf["nan"]:  # first 64
        tf["nan_at"] = _where(lens, np.nonzero(~np.isfinite(a))[0][:64])
    ref_bad = ~np.isfinite(b)
    if ref_bad.any():
        tf["ref_nan"] = int(ref_bad.sum())
        tf["ref_nan_at"] = _where(lens, np.nonzero(ref_bad)[0][:64])
    if finite.any():
        order = np.argsort(np.where(finite, diff, -1.0), kind="stable")[::-1][:WORST]
        order = order[finite[order]]
        tf["worst"] = [[*w, float(diff[f])] for w, f in zip(_where(lens, order), order)]

    g_ref, g_oth = ref["gen_ids"], oth["gen_ids"]
    rows = []
    dec = []
    for r in range(g_ref.shape[0]):
        neq = np.nonzero(g_ref[r] != g_oth[r])[0]
        m = int(neq[0]) if neq.size else g_ref.shape[1]
        upto = min(m + 1, g_ref.shape[1])  # same context through step m
        dec.append(np.abs(oth["gen_lp"][r, :upto, 0].astype(np.float64) - ref["gen_lp"][r, :upto, 0]))
        row = {"matched": m}
        if m < g_ref.shape[1]:
            lp = ref["gen_lp"][r, m].astype(np.float64)
            top = list(ref["gen_top"][r, m])
            # greedy took the maximum; on an exact tie the returned order of the two may differ
            mine = lp[top.index(g_ref[r, m])] if g_ref[r, m] in top else lp[0]
            if g_oth[r, m] in top:
                row["ref_margin"] = float(mine - lp[top.index(g_oth[r, m])])
            else:  # their token is below the reference's top-2: the margin is at least this
                row["ref_margin_at_least"] = float(mine - lp[1])
        rows.append(row)
    dec = np.concatenate(dec)
    matched = np.array([r["matched"] for r in rows])
    margins = [r.get("ref_margin", r.get("ref_margin_at_least")) for r in rows if "ref_margin" in r
               or "ref_margin_at_least" in r]
    greedy = {"rows": len(rows), "identical_rows": int((matched == g_ref.shape[1]).sum()),
              "matched_total": int(matched.sum()), "tokens_total": int(g_ref.size),
              "matched_min": int(matched.min()), "matched_median": float(np.median(matched)),
              "divergences": len(margins),
              "divergence_margin_max": float(max(margins)) if margins else 0.0,
              "divergence_below_top2": sum(r.get("ref_margin_at_least", 0) > 0 for r in rows),
              "divergence_ties": sum(r.get("ref_margin", r.get("ref_margin_at_least", 1)) == 0 for r in rows),
              "decode_top1_lp_diff": _stats(dec), "per_row": rows}
    return {"teacher_forced": tf, "greedy": greedy}


STATS = {  # bound name -> statistic of a comparison (larger is worse)
    "tf_mean_abs": lambda c: c["teacher_forced"]["all"]["mean"],
    "tf_p99_abs": lambda c: c["teacher_forced"]["all"]["p99"],
    "tf_top1_disagree": lambda c: 1.0 - c["teacher_forced"]["top1_agree"],
    "decode_mean_abs": lambda c: c["greedy"]["decode_top1_lp_diff"]["mean"],
    "decode_p99_abs": lambda c: c["greedy"]["decode_top1_lp_diff"]["p99"],
    "divergence_margin_max": lambda c: c["greedy"]["divergence_margin_max"],
}


def bounds_for(dtype: str, calib: dict | None, cfg: dict) -> tuple[dict, str]:
    """Per-statistic bounds: factor x the upstream-vs-upstream spread (ref2 vs ref, bf16) of
    the same model, never below the floor; the fixed bounds when no calibration ran."""
    if calib is None:
        return dict(cfg["fixed"][dtype]), "fixed (no ref2 calibration in this run)"
    f = cfg["factor"][dtype]
    floor = cfg["floor"][dtype]
    return ({k: max(f * STATS[k](calib), floor[k]) for k in STATS},
            f"{f} x ref2-vs-ref spread of {calib['name']}, floors {floor}")


def _sparse_or_all(c: dict, key: str):
    tf = c["teacher_forced"]
    return tf["sparse"][key] if tf["sparse"].get("n") else tf["all"][key]


# Upstream's fp8 cost, read where upstream reads every key from the fp8 cache. In the bf16
# fp8 `ref`, a prefill batch whose longest sequence is <= index_topk goes to vLLM's dense MHA
# prefill, which attends to the current chunk's fresh 16-bit K/V (only earlier chunks come
# from the cache, upconverted): those "dense" teacher-forced positions carry little or no
# quantisation. The fp16 fp8 `ours` runs every prefill through our kernel from the fp8 cache
# (forced MQA, docs/fp8-kv.md). So the teacher-forced statistics are calibrated on the
# sparse positions (> index_topk seen: always the sparse kernel, every key from the cache);
# decode steps read the cache on every side and keep their statistic.
FP8_COST_STATS = dict(
    STATS,
    tf_mean_abs=lambda c: _sparse_or_all(c, "mean"),
    tf_p99_abs=lambda c: _sparse_or_all(c, "p99"),
    tf_top1_disagree=lambda c: 1.0 - (c["teacher_forced"]["top1_agree_sparse"]
                                      if c["teacher_forced"]["sparse"].get("n") else c["teacher_forced"]["top1_agree"]),
)


def bounds_fp8_cost(calib: dict | None, cfg: dict) -> tuple[dict, str]:
    """Bounds of an fp8-cache `ours` compared with a 16-bit-cache `ref`: fp8_cost_factor x
    upstream's own fp8 cost (a bf16 fp8 `ref` vs the bf16 kv-auto `ref`, same model), never
    below the bf16 floors (the quantisation noise is the same for both model dtypes); the
    fixed bf16 bounds when no fp8 `ref` ran.

    An all-MQA calibration (calib["force_mqa"]: the fp8kv-mqa-ref, or any fp8 `ref` under
    --force-mqa) quantises every position, as our fp16 side does: every statistic as it is
    (STATS, all positions). Otherwise (fp8kv-ref, vLLM's dense MHA prefill for short batches)
    the teacher-forced statistics of the sparse positions (FP8_COST_STATS)."""
    if calib is None:
        return (dict(cfg["fixed"]["bfloat16"]),
                "fixed bfloat16 (no fp8kv-mqa-ref or fp8kv-ref calibration in this run)")
    f = cfg["fp8_cost_factor"]
    floor = cfg["floor"]["bfloat16"]
    if calib.get("force_mqa"):
        stats, how = STATS, "all-MQA prefill; teacher-forced: all positions"
    else:
        stats, how = FP8_COST_STATS, "teacher-forced: sparse positions; no all-MQA fp8kv-mqa-ref in this run"
    return ({k: max(f * stats[k](calib), floor[k]) for k in STATS},
            f"{f} x upstream fp8 cost ({calib['name']} vs {calib['ref']}; {how}), bfloat16 floors {floor}")


def _kv_failures(name: str, meta: dict) -> list[str]:
    """An fp8-cache engine whose cache turned out 16-bit (or auto)."""
    seen = {"config": [(meta.get("kv_cache") or {}).get("dtype_used")],
            "layers": sorted({d for p in meta.get("model_probe") or [] for d in p.get("kv_cache_dtypes", [])})}
    bad = [f"{where} {','.join(map(str, v))}" for where, v in seen.items() if set(v) & SIXTEEN_BIT_OR_AUTO]
    return [f"{name}: fp8 KV cache requested, used {', '.join(bad)}"] if bad else []


def _capacity(engines: dict, jobs: list[dict]) -> None:
    """engines[*]["kv_capacity_vs"]: tokens / tokens of the kv-auto engine of the same
    tp/model/dtype/side, else of that tp/model/dtype's kv-auto `ref` (fp8 engines only)."""
    for job in jobs:
        kv = job.get("kv_cache_dtype", "auto")
        e = engines[job["name"]]
        tokens = (e.get("kv_cache") or {}).get("tokens")
        if kv == "auto" or not tokens:
            continue
        for side in (job["side"], "ref"):
            base = engine_name(job["tp"], job["model"], job["dtype"], side)
            btok = ((engines.get(base) or {}).get("kv_cache") or {}).get("tokens")
            if btok:
                e["kv_capacity_vs"] = {"engine": base, "ratio": tokens / btok}
                break


def check_bounds(cmp: dict, b: dict) -> list[str]:
    """Descriptions of the broken bounds (empty: within bounds)."""
    bad = []
    if cmp["teacher_forced"]["nan"]:
        bad.append(f"{cmp['teacher_forced']['nan']} NaN prompt logprobs")
    for k, stat in STATS.items():
        v = stat(cmp)
        if not v <= b[k]:
            bad.append(f"{k} {v:.4g} > {b[k]:.4g}")
    return bad


def is_v4_job(job: dict) -> bool:
    return job.get("model") in V4_MODELS


def _dsv4_records(probes) -> list[dict | None]:
    return [(p or {}).get("dsv4") for p in probes or []]


def v4_engine_failures(job: dict, meta: dict) -> list[str]:
    """A DeepSeek-V4 engine that did not run the kernels its side stands for (V4_EXPECT), in
    the target model or in the MTP drafter (the indexer logits, the cache dtype and the CUDA
    graphs are checked as for every engine)."""
    name, side = job["name"], job["side"]
    want = dict(V4_EXPECT[side])
    if side != "ours" and job.get("v4_ref_kernels") == "complete":
        want.update(V4_COMPLETE)
    out = []
    for where, key in (("target", "model_probe"), ("MTP drafter", "drafter_probe")):
        recs = _dsv4_records(meta.get(key))
        if not recs or not all(recs):
            out.append(f"{name}: {where}: no DeepSeek-V4 attention layer in the probe")
            continue
        classes = sorted({c for r in recs for c in r["attention_classes"]})
        if classes != [want["class"]]:
            out.append(f"{name}: {where}: attention classes {classes}, expected {[want['class']]}")
        backends = sorted({b for r in recs for b in r["attention_backends"]})
        if backends != [want["backend"]]:
            out.append(f"{name}: {where}: attention backends {backends}, expected {[want['backend']]}")
        kv = sorted({d for r in recs for d in r["kv_cache_dtypes"]})
        if kv != ["fp8_ds_mla"]:
            out.append(f"{name}: {where}: KV cache {kv}, expected ['fp8_ds_mla']")
        o_proj = sorted({o for r in recs for o in r.get("o_proj", [])})
        if o_proj != [want["o_proj"]]:
            out.append(f"{name}: {where}: output projection {o_proj}, expected {[want['o_proj']]}")
        if "mhc_suffixes" in want:
            mhc = sorted({k for r in recs for k in r.get("mhc_kernels", [])})
            bad = [k for k in mhc if not k.endswith(want["mhc_suffixes"])]
            if not mhc or bad:
                out.append(f"{name}: {where}: mHC kernels {bad or mhc}, expected *{'/*'.join(want['mhc_suffixes'])}")
        if "compressor" in want:
            comp = sorted({r.get("compressor") for r in recs})
            if comp != [want["compressor"]]:
                out.append(f"{name}: {where}: compressor {comp}, expected {[want['compressor']]}")
        if where == "target":
            ratios = sorted({x for r in recs for x in r.get("compress_ratios", [])})
            if ratios != V4_RATIOS:
                out.append(f"{name}: target: compress ratios {ratios}, expected {V4_RATIOS}")
    return out


def _v4_sum_bounds(kernel: dict, cost: dict, f: float) -> dict:
    """ours vs ref: the kernel-swap bound plus f x the o_proj cost per statistic (triangle
    inequality over ours -> ref-o16 -> ref); the divergence margin (a maximum, not a sum): the
    larger of the two."""
    return {k: (max(kernel[k], f * STATS[k](cost)) if k == "divergence_margin_max"
                else kernel[k] + f * STATS[k](cost)) for k in STATS}


def _v4_o_proj_sanity(fixed: dict, calibrated: dict | None) -> tuple[dict, str]:
    """ref-o16 vs ref, a gross-error check of the bf16 output projection: the fixed bf16 bounds,
    except top-1 disagreement, which is at least the calibrated bound. How often two engines
    pick different top-1 tokens is set by the near-ties of the tiny model's flat logits: two
    upstream engines that differ only in prefill chunking already disagree on 5.7-5.8% of the V4
    positions (2026-12-01, five runs), against the fixed 0.06 written for the DSA models."""
    if calibrated is None:
        return dict(fixed), "fixed bfloat16 (sanity of the bf16 output projection shared by ours and ref-o16)"
    top1 = "tf_top1_disagree"
    return ({**fixed, top1: max(fixed[top1], calibrated[top1])},
            f"fixed bfloat16 (sanity of the bf16 output projection shared by ours and ref-o16); "
            f"{top1}: at least the calibrated bound")


def compare_v4(jobs: list[dict], loaded: dict, bounds: dict) -> list[dict]:
    """The DeepSeek-V4 comparisons of one run (module docstring), in the order calibration,
    o_proj cost, ours vs ref-o16, ours vs ref, per (TP, model)."""
    cfg = bounds.get("deepseek_v4", {"factor": 2.0, "o_proj_cost_factor": 1.0})
    fixed = dict(bounds["fixed"]["bfloat16"])
    names = {j["name"] for j in jobs}
    ok = {n for n in names if n in loaded and loaded[n][0].get("ok")}
    out, done = [], {}

    def pair(ref: str, oth: str, job: dict, role: str) -> dict | None:
        if ref not in ok or oth not in ok:
            return None
        c = compare_pair(loaded[ref][1], loaded[oth][1])
        c.update(name=oth, ref=ref, side=job["side"], dtype=job["dtype"], model=job["model"], tp=job["tp"],
                 kv_cache_dtype=job["kv_cache_dtype"], force_mqa=False, role=role, broken=[])
        out.append(c)
        done[(oth, ref)] = c
        return c

    groups = {}
    for j in jobs:
        groups.setdefault((j["tp"], j["model"]), {})[j["side"]] = j
    for (tp, model), sides in groups.items():
        n = {side: j["name"] for side, j in sides.items()}
        ref = n.get("ref")
        if ref is None:
            continue
        calib = pair(ref, n["ref2"], sides["ref2"], "calibration") if "ref2" in n else None
        if calib is None and tp != 1:  # the TP=1 calibration of the model, as for the DSA models
            calib = next((c for (o, r), c in done.items() if c.get("role") == "calibration" and c["tp"] == 1
                          and c["model"] == model), None)
        kernel, kernel_from = bounds_for("bfloat16", calib, {**bounds, "factor": {"bfloat16": cfg["factor"]}})
        if calib is not None:
            kernel_from += " (ref2: prefill chunks of 1024 tokens, upstream vs upstream)"
        cost = pair(ref, n["ref-o16"], sides["ref-o16"], "o_proj cost") if "ref-o16" in n else None
        if cost is not None:
            cost["bounds"], cost["bounds_from"] = _v4_o_proj_sanity(fixed, kernel if calib else None)
            cost["broken"] = check_bounds(cost, cost["bounds"])
        if "ours" not in n:
            continue
        if cost is not None:
            c = pair(n["ref-o16"], n["ours"], sides["ours"], "kernels")
            if c is not None:
                c["bounds"], c["bounds_from"] = kernel, "same bf16 output projection on both sides; " + kernel_from
                c["broken"] = check_bounds(c, c["bounds"])
        c = pair(ref, n["ours"], sides["ours"], "whole path")
        if c is not None:
            if cost is not None:
                f = cfg["o_proj_cost_factor"]
                c["bounds"] = _v4_sum_bounds(kernel, cost, f)
                c["bounds_from"] = (f"ours-vs-ref-o16 bound + {f} x ref-o16-vs-ref (o_proj cost); "
                                    + kernel_from)
            else:
                c["bounds"], c["bounds_from"] = fixed, "fixed bfloat16 (no ref-o16 in this run)"
            c["broken"] = check_bounds(c, c["bounds"])
    return out


def compare_all(jobs: list[dict], res: Path, bounds: dict) -> dict:
    engines, comparisons, failures = {}, [], []
    loaded = {}
    for job in jobs:
        meta, arrays = _load(res, job["name"])
        loaded[job["name"]] = (meta, arrays)
        e = {k: meta.get(k) for k in ("ok", "error", "init_s", "pass1_s", "pass2_s", "pass1_prompt_tok_per_s",
                                      "pass2_gen_tok_per_s", "cudagraph_mode", "compilation_mode",
                                      "model_probe", "drafter_probe", "worker_cudagraphs", "versions", "metrics", "prompt_tokens",
                                      "generated_tokens")}
        e.update(side=job["side"], model=job["model"], indexer_calls=meta.get("indexer_calls"),
                 backend_forced=job["backend"], env=job["env"],
                 kv_cache_dtype=job.get("kv_cache_dtype", "auto"), kv_cache=meta.get("kv_cache"),
                 force_mqa=bool(job.get("force_mqa")), sparse_mla_force_mqa=meta.get("sparse_mla_force_mqa"))
        probe = nan_probe.count_checks(nan_probe.read_records(res / job["name"] / "engine.log"))
        if probe:
            e["nan_probe"] = probe
        guard = prompt_lp_guard.summarize(prompt_lp_guard.read_records(res / job["name"] / "engine.log"))
        if guard:
            e["prompt_lp_guard"] = guard
        engines[job["name"]] = e
        if not meta.get("ok"):
            failures.append(f"{job['name']}: engine failed: {meta.get('error')}")
            continue
        if job["env"].get(sm80_paths.SM80_ENV) == "1":
            e["sm80_paths"] = sm80_paths.patched_modules(res / job["name"] / "engine.log")
            if e["sm80_paths"] != sorted(sm80_paths.MODULES):
                failures.append(f"{job['name']}: sm80 code paths asked for ({sm80_paths.SM80_ENV}=1), "
                                f"patched only {e['sm80_paths']} of {sorted(sm80_paths.MODULES)}")
            seen = [p.get("kernel_capability") for p in meta.get("model_probe") or []]
            if not seen or any(v != sm80_paths.SM80_VIEW for v in seen):
                failures.append(f"{job['name']}: sm80 code paths asked for, the model's worker saw "
                                f"{seen} (want {sm80_paths.SM80_VIEW})")
        if job["env"].get(prompt_lp_guard.GUARD_ENV) == "1" and not guard.get("installed"):
            failures.append(f"{job['name']}: the prompt-logprob guard was asked for "
                            f"({prompt_lp_guard.GUARD_ENV}=1) and never installed (engine log)")
        fp8 = job.get("kv_cache_dtype", "auto") != "auto"
        if is_v4_job(job):
            failures += v4_engine_failures(job, meta)
        else:
            used = sorted({b for probe in meta["model_probe"] for b in probe["attention_backends"]})
            drafted = sorted({b for probe in meta.get("drafter_probe") or [] if probe
                              for b in probe["attention_backends"]})
            if drafted and drafted != used:
                failures.append(f"{job['name']}: MTP drafter attention {drafted}, target {used}")
            want = {"ours": ["TRITON_MLA_SPARSE"], "ref2": ["FLASHMLA_SPARSE"]}.get(job["side"])
            if want is not None and used != want:
                failures.append(f"{job['name']}: attention backends {used}, expected {want}")
            ref_ok = ("FLASHMLA_SPARSE",) if fp8 else ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE")
            if job["side"] == "ref" and not (len(used) == 1 and used[0] in ref_ok):
                failures.append(f"{job['name']}: reference selected {used}"
                                + (", expected ['FLASHMLA_SPARSE'] for the fp8 cache" if fp8 else ""))
        if fp8:
            failures += _kv_failures(job["name"], meta)
        failures += quant_probe.engine_failures(job, meta, quant_probe.model_config(job["model_dir"]))
        if job.get("force_mqa") and meta.get("sparse_mla_force_mqa") is False:  # None: not recorded
            failures.append(f"{job['name']}: attention_config.sparse_mla_force_mqa requested, "
                            "the engine's config says False")
        modes = {w.get("cudagraph_mode", "?").split(".")[-1] for w in meta.get("worker_cudagraphs") or []}
        if not modes or "NONE" in modes:
            failures.append(f"{job['name']}: CUDA graphs not in use (worker mode {sorted(modes)})")
        logits = sorted({p.get("indexer_logits", ["?"])[0] for p in meta["model_probe"]})
        want_idx = ["triton"] if job["side"] == "ours" else ["deepgemm"]
        if logits != want_idx:
            failures.append(f"{job['name']}: indexer logits on {logits}, expected {want_idx}")
    exit_code = 3 if failures else 0
    _capacity(engines, jobs)
    names = {j["name"] for j in jobs}
    by_name = {}

    def calib_of(job: dict, side: str, kv: str = "auto", mqa: bool = False) -> dict | None:
        """The bf16 comparison of `side` (kv, all-MQA variant or not) of the model: same TP, else
        TP=1; failing those, of the same base model in another checkpoint format
        (quant_probe.siblings: the attention and indexer the bounds are about are the same)."""
        for model in (job["model"], *quant_probe.siblings(job["model"])):
            for tp in (job["tp"], 1):
                c = by_name.get(engine_name(tp, model, "bfloat16", side, kv, mqa))
                if c is not None:
                    return c
        return None

    # ref2 first: its spread calibrates the bounds of `ours`; then the fp8 `ref`s (plain and
    # all-MQA): their distance to the kv-auto `ref` calibrates the fp8 `ours` compared with a
    # 16-bit `ref`
    def order(j: dict) -> tuple[bool, bool]:
        return j["side"] != "ref2", not (j["side"] == "ref" and j.get("kv_cache_dtype", "auto") != "auto")

    v4_cmps = compare_v4([j for j in jobs if is_v4_job(j)], loaded, bounds)
    comparisons += v4_cmps
    if any(c["broken"] for c in v4_cmps) and exit_code == 0:
        exit_code = 1
    for job in sorted((j for j in jobs if not is_v4_job(j)), key=order):
        kv = job.get("kv_cache_dtype", "auto")
        if job["side"] == "ref" and kv == "auto":
            continue
        ref_name = engine_name(job["tp"], job["model"], job["dtype"], "ref")
        # an upstream kernel reading the same fp8 cache on the same prefill path (all-MQA or not)
        same_cache_ref = engine_name(job["tp"], job["model"], job["dtype"], "ref", kv, bool(job.get("mqa")))
        if kv != "auto" and job["side"] == "ours" and same_cache_ref in names:
            ref_name = same_cache_ref
        if ref_name not in loaded or not loaded[ref_name][0].get("ok") or not loaded[job["name"]][0].get("ok"):
            continue
        cmp = compare_pair(loaded[ref_name][1], loaded[job["name"]][1])
        cmp.update(name=job["name"], ref=ref_name, side=job["side"], dtype=job["dtype"], model=job["model"],
                   tp=job["tp"], kv_cache_dtype=kv, force_mqa=bool(job.get("force_mqa")))
        by_name[job["name"]] = cmp
        comparisons.append(cmp)
        if job["side"] == "ours":
            if kv == "auto" or ref_name == same_cache_ref:
                cmp["bounds"], cmp["bounds_from"] = bounds_for(job["dtype"], calib_of(job, "ref2"), bounds)
                if kv != "auto":
                    path = ", all-MQA prefill" if job.get("mqa") else ""
                    cmp["bounds_from"] = f"same {kv} cache{path} on both sides; " + cmp["bounds_from"]
            else:
                # upstream's fp8 cost where it quantises the positions our side quantises: the
                # all-MQA fp8 ref, else (previous rule) the fp8 ref at its sparse positions
                calib = calib_of(job, "ref", kv, mqa=True) or calib_of(job, "ref", kv)
                cmp["bounds"], cmp["bounds_from"] = bounds_fp8_cost(calib, bounds)
            cmp["broken"] = check_bounds(cmp, cmp["bounds"])
            if cmp["broken"] and exit_code == 0:
                exit_code = 1
        else:
            cmp["broken"] = []
    tp_cmps = compare_tp(jobs, loaded, bounds, by_name, v4_cmps)
    comparisons += tp_cmps
    if any(c["broken"] for c in tp_cmps) and exit_code == 0:
        exit_code = 1
    return {"engines": engines, "comparisons": comparisons, "failures": failures, "exit_code": exit_code}


def compare_tp(jobs: list[dict], loaded: dict, bounds: dict, by_name: dict, v4_cmps: list[dict]) -> list[dict]:
    """Each TP=k engine against the TP=1 engine of the same model, dtype, side and cache
    (job field `tp1_ref`, set by run_e2e where the weights are the same at every TP size:
    e2e_dummy's TP-invariant draws, DeepSeek-V4's checkpoint). Only the TP split differs
    (partial sums reduced across GPUs, the heads of each GPU): rounding, bounded as a kernel
    swap is, by the upstream-vs-upstream spread of the model (`ref2` vs `ref`, same TP, else
    TP=1; DeepSeek-V4: its calibration and factor), so a rank that read another rank's heads
    or weights breaks it."""
    out = []
    for job in jobs:
        ref = job.get("tp1_ref")
        if not ref or any(n not in loaded or not loaded[n][0].get("ok") for n in (ref, job["name"])):
            continue
        c = compare_pair(loaded[ref][1], loaded[job["name"]][1])
        c.update(name=job["name"], ref=ref, side=job["side"], dtype=job["dtype"], model=job["model"], tp=job["tp"],
                 kv_cache_dtype=job.get("kv_cache_dtype", "auto"), force_mqa=bool(job.get("force_mqa")), role="tp")
        if is_v4_job(job):
            calib = next((x for tp in (job["tp"], 1) for x in v4_cmps if x.get("role") == "calibration"
                          and x["tp"] == tp and x["model"] == job["model"]), None)
            factor = bounds.get("deepseek_v4", {}).get("factor", 2.0)
            c["bounds"], why = bounds_for("bfloat16", calib, {**bounds, "factor": {"bfloat16": factor}})
        else:
            calib = next((by_name[n] for tp in (job["tp"], 1)
                          if (n := engine_name(tp, job["model"], "bfloat16", "ref2")) in by_name), None)
            c["bounds"], why = bounds_for(job["dtype"], calib, bounds)
        c["bounds_from"] = f"same side at TP=1 ({ref}); {why}"
        c["broken"] = check_bounds(c, c["bounds"])
        out.append(c)
    return out


def write_report(s: dict) -> str:
    out = ["# E2E comparison", ""]
    if s.get("command"):
        out += [f"command: `{s['command']}`", ""]
    if s.get("kind"):
        out += [f"machine: {s['kind']}", ""]
    out += ["| engine | ok | attention / indexer | cudagraph | init s | prefill tok/s | gen tok/s | spec/prefix metrics |",
            "|---|---|---|---|---|---|---|---|"]
    for name, e in s["engines"].items():
        probe = e.get("model_probe") or [{}]
        be = ",".join(sorted({b for p in probe for b in p.get("attention_backends", [])}))
        be += " / " + ",".join(sorted({p.get("indexer_logits", ["?"])[0] for p in probe}))
        be += " (force MQA)" if e.get("force_mqa") else ""
        met = e.get("metrics") or {}
        short = ", ".join(f"{k.split(':')[-1]}={v:g}" for k, v in sorted(met.items()) if isinstance(v, (int, float)))
        wcg = e.get("worker_cudagraphs") or [{}]
        # an engine that failed before its probes ran has no mode: "-" (the report must still come out)
        cg = str(wcg[0].get("cudagraph_mode", e.get("cudagraph_mode")) or "-")
        cg += " " + "/".join(f"{k.split('.')[-1]}:{v}" for k, v in sorted(wcg[0].get("graphs", {}).items()))
        out.append(f"| {name} | {e['ok']} | {be} | {cg} | {_f(e.get('init_s'))} | "
                   f"{_f(e.get('pass1_prompt_tok_per_s'))} | {_f(e.get('pass2_gen_tok_per_s'))} | {short} |")
    out += ["", "| vs ref | tf mean | tf p99 | tf max | sparse p99 | top-1 agree | dec mean | dec p99 | "
            "identical rows | matched tokens | max div. margin | broken |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in s["comparisons"]:
        tf, g = c["teacher_forced"], c["greedy"]
        label = _label(c)
        out.append(f"| {label} | {tf['all']['mean']:.2e} | {tf['all']['p99']:.2e} | {tf['all']['max']:.2e} | "
                   f"{tf['sparse'].get('p99', float('nan')):.2e} | {tf['top1_agree']:.4f} | "
                   f"{g['decode_top1_lp_diff']['mean']:.2e} | {g['decode_top1_lp_diff']['p99']:.2e} | "
                   f"{g['identical_rows']}/{g['rows']} | {g['matched_total']}/{g['tokens_total']} | "
                   f"{g['divergence_margin_max']:.3f} | {'; '.join(c['broken']) or '-'} |")
    for c in s["comparisons"]:
        if c.get("bounds_from"):
            out.append(f"- bounds of {_label(c)}: {c['bounds_from']}: "
                       + ", ".join(f"{k} {v:.3g}" for k, v in c["bounds"].items()))
    located = [c for c in s["comparisons"] if c["teacher_forced"].get("worst")]
    if located:  # where each comparison differs most, and any non-finite logprob on either side
        out += ["", "Teacher-forced positions, [prompt, token]: largest differences first; non-finite "
                "logprobs (left out of the statistics above)"]
        for c in located:
            tf = c["teacher_forced"]
            line = f"- {c['name']} vs {c['ref']}: " + ", ".join(
                f"[{p}, {t}] {d:.3g}" for p, t, d in tf["worst"])
            if tf.get("nan_at"):
                line += f"; non-finite here: {tf['nan']} at {tf['nan_at'][:16]}"
            if tf.get("ref_nan_at"):
                line += f"; non-finite in the reference: {tf['ref_nan']} at {tf['ref_nan_at'][:16]}"
            out.append(line)
    out += quant_probe.report_lines(s)
    kv_rows = [(n, e) for n, e in s["engines"].items() if e.get("kv_cache")]
    if kv_rows:
        out += ["", "| KV cache | dtype requested | dtype used (config / layers) | GPU KV cache tokens | "
                "max concurrency | ratio | to |", "|---|---|---|---|---|---|---|"]
        for name, e in kv_rows:
            kc = e["kv_cache"]
            layers = ",".join(sorted({d for p in e.get("model_probe") or [] for d in p.get("kv_cache_dtypes", [])}))
            vs = e.get("kv_capacity_vs")
            out.append(f"| {name} | {e.get('kv_cache_dtype', 'auto')} | {kc.get('dtype_used')} / {layers or '-'} | "
                       f"{'-' if kc.get('tokens') is None else format(kc['tokens'], ',')} | "
                       f"{'-' if kc.get('max_concurrency') is None else format(kc['max_concurrency'], '.2f')} | "
                       f"{'-' if not vs else format(vs['ratio'], '.3f')} | {'-' if not vs else vs['engine']} |")
    probed = [(n, e["nan_probe"]) for n, e in s["engines"].items() if e.get("nan_probe")]
    if probed:  # SMLA_E2E_NAN_CHECK=1: what the probe reported (lines in the engine logs)
        out += ["", "NaN probe (SMLA_E2E_NAN_CHECK=1): records per check, lines `SMLA_NANCHECK` of the engine logs:"]
        out += [f"- {n}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) for n, counts in probed]
    overwritten = [(n, e["prompt_lp_guard"]) for n, e in s["engines"].items()
                   if (e.get("prompt_lp_guard") or {}).get("steps_changed")]
    if overwritten:  # the prompt-logprob guard: steps whose hidden states the MTP drafter changed
        out += ["", "Hidden states the MTP drafter overwrote before the prompt logprobs were read "
                "(vLLM issue 53488; the logprobs above come from the guard's copy, lines `SMLA_PROMPT_LP`):"]
        out += [f"- {n}: {g['steps_changed']} step(s), {g['rows_changed']} row(s); first: step "
                f"{g['first']['step']}, {g['first']['tokens']} tokens, {g['first']['rows_changed']} rows"
                for n, g in overwritten]
    sm80 = [(n, e["sm80_paths"]) for n, e in s["engines"].items() if e.get("sm80_paths")]
    if sm80:  # --ours-sm80-paths: the capability helpers this engine's kernels saw as 8.0
        out += ["", "sm80/86 code paths of the series' kernels (SMLA_E2E_SM80_PATHS=1; capability 8.0 in):"]
        out += [f"- {n}: " + ", ".join(m.rsplit(".", 1)[1] for m in mods) for n, mods in sm80]
    if s["failures"]:
        out += ["", "failures:"] + [f"- {f}" for f in s["failures"]]
    out += ["", f"exit code {s['exit_code']}", ""]
    return "\n".join(out)


def _label(c: dict) -> str:
    """A comparison's row label: the engine, plus its reference where the engine has more than
    one comparison (fp8 engines, TP=k against TP=1)."""
    plain = c.get("kv_cache_dtype", "auto") == "auto" and c.get("role") != "tp"
    return c["name"] if plain else f"{c['name']} vs {c['ref']}"


def _f(x) -> str:
    return "-" if x is None else f"{x:.1f}"


if __name__ == "__main__":
    res = Path(sys.argv[1])
    jobs = json.loads((res / "jobs.json").read_text())
    bounds = json.loads((Path(__file__).with_name("bounds.json")).read_text())
    s = compare_all(jobs, res, bounds)
    print(write_report(s))
    sys.exit(s["exit_code"])
