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
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

INDEX_TOPK = 2048


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


def compare_pair(ref: dict, oth: dict) -> dict:
    lens = ref["prompt_lens"]
    assert np.array_equal(lens, oth["prompt_lens"]), "different workloads"
    # token i of a prompt (i >= 1) is scored by the query at position i-1, which sees i tokens
    seen = np.concatenate([np.arange(1, n) for n in lens])
    diff = np.abs(oth["prompt_lp"].astype(np.float64) - ref["prompt_lp"])
    agree = oth["prompt_top1"] == ref["prompt_top1"]
    sparse = seen > INDEX_TOPK
    tf = {"all": _stats(diff), "dense": _stats(diff[~sparse]), "sparse": _stats(diff[sparse]),
          "top1_agree": float(agree.mean()), "top1_agree_sparse": float(agree[sparse].mean()),
          "nan": int(np.isnan(oth["prompt_lp"]).sum())}

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
        e.update(side=job["side"], backend_forced=job["backend"], env=job["env"])
        engines[job["name"]] = e
        if not meta.get("ok"):
            failures.append(f"{job['name']}: engine failed: {meta.get('error')}")
            continue
        used = sorted({b for probe in meta["model_probe"] for b in probe["attention_backends"]})
        drafted = sorted({b for probe in meta.get("drafter_probe") or [] if probe
                          for b in probe["attention_backends"]})
        if drafted and drafted != used:
            failures.append(f"{job['name']}: MTP drafter attention {drafted}, target {used}")
        want = {"ours": ["TRITON_MLA_SPARSE"], "ref2": ["FLASHMLA_SPARSE"]}.get(job["side"])
        if want is not None and used != want:
            failures.append(f"{job['name']}: attention backends {used}, expected {want}")
        if job["side"] == "ref" and not (len(used) == 1 and used[0] in ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE")):
            failures.append(f"{job['name']}: reference selected {used}")
        modes = {w.get("cudagraph_mode", "?").split(".")[-1] for w in meta.get("worker_cudagraphs") or []}
        if not modes or "NONE" in modes:
            failures.append(f"{job['name']}: CUDA graphs not in use (worker mode {sorted(modes)})")
        logits = sorted({p.get("indexer_logits", ["?"])[0] for p in meta["model_probe"]})
        want_idx = ["triton"] if job["side"] == "ours" else ["deepgemm"]
        if logits != want_idx:
            failures.append(f"{job['name']}: indexer logits on {logits}, expected {want_idx}")
    exit_code = 3 if failures else 0
    by_name = {}
    # ref2 first: its spread calibrates the bounds of `ours`
    for job in sorted(jobs, key=lambda j: j["side"] != "ref2"):
        if job["side"] == "ref":
            continue
        ref_name = job["name"].rsplit("-", 1)[0] + "-ref"
        if ref_name not in loaded or not loaded[ref_name][0].get("ok") or not loaded[job["name"]][0].get("ok"):
            continue
        cmp = compare_pair(loaded[ref_name][1], loaded[job["name"]][1])
        cmp.update(name=job["name"], ref=ref_name, side=job["side"], dtype=job["dtype"], model=job["model"],
                   tp=job["tp"])
        by_name[job["name"]] = cmp
        comparisons.append(cmp)
        if job["side"] == "ours":
            calib = next((by_name.get(f"tp{tp}-{job['model']}-bfloat16-ref2") for tp in (job["tp"], 1)
                          if f"tp{tp}-{job['model']}-bfloat16-ref2" in by_name), None)
            cmp["bounds"], cmp["bounds_from"] = bounds_for(job["dtype"], calib, bounds)
            cmp["broken"] = check_bounds(cmp, cmp["bounds"])
            if cmp["broken"] and exit_code == 0:
                exit_code = 1
        else:
            cmp["broken"] = []
    return {"engines": engines, "comparisons": comparisons, "failures": failures, "exit_code": exit_code}


def write_report(s: dict) -> str:
    out = ["# E2E comparison", ""]
    if s.get("command"):
        out += [f"command: `{s['command']}`", ""]
    out += ["| engine | ok | attention / indexer | cudagraph | init s | prefill tok/s | gen tok/s | spec/prefix metrics |",
            "|---|---|---|---|---|---|---|---|"]
    for name, e in s["engines"].items():
        probe = e.get("model_probe") or [{}]
        be = ",".join(sorted({b for p in probe for b in p.get("attention_backends", [])}))
        be += " / " + ",".join(sorted({p.get("indexer_logits", ["?"])[0] for p in probe}))
        met = e.get("metrics") or {}
        short = ", ".join(f"{k.split(':')[-1]}={v:g}" for k, v in sorted(met.items()) if isinstance(v, (int, float)))
        wcg = e.get("worker_cudagraphs") or [{}]
        cg = wcg[0].get("cudagraph_mode", e.get("cudagraph_mode"))
        cg += " " + "/".join(f"{k.split('.')[-1]}:{v}" for k, v in sorted(wcg[0].get("graphs", {}).items()))
        out.append(f"| {name} | {e['ok']} | {be} | {cg} | {_f(e.get('init_s'))} | "
                   f"{_f(e.get('pass1_prompt_tok_per_s'))} | {_f(e.get('pass2_gen_tok_per_s'))} | {short} |")
    out += ["", "| vs ref | tf mean | tf p99 | tf max | sparse p99 | top-1 agree | dec mean | dec p99 | "
            "identical rows | matched tokens | max div. margin | broken |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in s["comparisons"]:
        tf, g = c["teacher_forced"], c["greedy"]
        out.append(f"| {c['name']} | {tf['all']['mean']:.2e} | {tf['all']['p99']:.2e} | {tf['all']['max']:.2e} | "
                   f"{tf['sparse'].get('p99', float('nan')):.2e} | {tf['top1_agree']:.4f} | "
                   f"{g['decode_top1_lp_diff']['mean']:.2e} | {g['decode_top1_lp_diff']['p99']:.2e} | "
                   f"{g['identical_rows']}/{g['rows']} | {g['matched_total']}/{g['tokens_total']} | "
                   f"{g['divergence_margin_max']:.3f} | {'; '.join(c['broken']) or '-'} |")
    for c in s["comparisons"]:
        if c.get("bounds_from"):
            out.append(f"- bounds of {c['name']}: {c['bounds_from']}: "
                       + ", ".join(f"{k} {v:.3g}" for k, v in c["bounds"].items()))
    if s["failures"]:
        out += ["", "failures:"] + [f"- {f}" for f in s["failures"]]
    out += ["", f"exit code {s['exit_code']}", ""]
    return "\n".join(out)


def _f(x) -> str:
    return "-" if x is None else f"{x:.1f}"


if __name__ == "__main__":
    res = Path(sys.argv[1])
    jobs = json.loads((res / "jobs.json").read_text())
    bounds = json.loads((Path(__file__).with_name("bounds.json")).read_text())
    s = compare_all(jobs, res, bounds)
    print(write_report(s))
    sys.exit(s["exit_code"])
