"""results.json, the markdown table and the plot of the serving benchmark.

  python bench/serving/report.py --state STATE.json [--out bench/serving]
      the device run's manifest -> results.json (+ results.md, throughput_vs_context.png)
  python bench/serving/report.py --results bench/serving/results.json [--out DIR]
      table and plot again from an existing results.json (checked first)

results.json: {"rows": [...], "profiles": [...], "meta": {...}}; one row per run
(engine x workload), exactly the fields of ROW_FIELDS; rows sorted by model, KV
cache, side, context, batch. A run with mixed workloads adds "mixed": one row per
engine x mixed workload, exactly the fields of MIXED_FIELDS (step times and host share). The same input gives the same bytes (JSON, markdown
and PNG: no dates, no versions in the PNG).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROW_FIELDS = {"model": str, "side": str, "kv_cache": str, "context": int, "batch": int,
              "prefill_tok_s": float, "decode_tok_s": float, "tpot_p50_ms": float, "tpot_p99_ms": float}
SIDES = ("upstream", "ours")
KV_ORDER = {"bf16": 0, "fp8": 1}
MODEL_ORDER = {"glm5-tiny": 0, "deepseek-v32-tiny": 1, "glm5-deep": 2, "deepseek-v32-deep": 3}
# A mixed-workload row (bench/serving/README.md "What is measured"): engine-step times in
# ms from vLLM's inter-token latencies, split by vLLM's iteration details into mixed and
# decode-only steps; the host share and the profiled step from the worker profiler's trace
# (None when the profile failed).
MIXED_FIELDS = {"model": str, "side": str, "kv_cache": str, "workload": str, "layers": int,
                "mixed_steps": int, "mixed_step_p50_ms": (float, None), "mixed_step_p90_ms": (float, None),
                "decode_steps": int, "decode_step_p50_ms": (float, None), "decode_step_p90_ms": (float, None),
                "classified_by": str, "host_share": (float, None), "gpu_busy_us_per_step": (float, None),
                "profiled_step_us": (float, None)}
PLOT_NAME = "throughput_vs_context.png"
TABLE_NAME = "results.md"


class ResultsError(ValueError):
    """results.json that does not follow the schema."""


def row_key(r: dict) -> tuple:
    return (MODEL_ORDER.get(r["model"], 99), r["model"], KV_ORDER.get(r["kv_cache"], 99), r["kv_cache"],
            SIDES.index(r["side"]) if r["side"] in SIDES else 99, r["context"], r["batch"])


def validate(obj) -> dict:
    """Raise ResultsError listing every problem; return obj."""
    problems = []
    if not isinstance(obj, dict) or not isinstance(obj.get("rows"), list):
        raise ResultsError('results.json must be an object {"rows": [...]}')
    seen = set()
    for i, r in enumerate(obj["rows"]):
        if not isinstance(r, dict):
            problems.append(f"row {i}: not an object")
            continue
        missing = sorted(set(ROW_FIELDS) - set(r))
        extra = sorted(set(r) - set(ROW_FIELDS))
        if missing:
            problems.append(f"row {i}: missing {missing}")
        if extra:
            problems.append(f"row {i}: unknown fields {extra}")
        for k, typ in ROW_FIELDS.items():
            if k not in r:
                continue
            v = r[k]
            if typ is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            elif typ is int:
                ok = isinstance(v, int) and not isinstance(v, bool) and v > 0
            else:
                ok = isinstance(v, str) and v != ""
            if not ok:
                problems.append(f"row {i}: {k}={v!r} is not a {'positive finite number' if typ is float else 'positive integer' if typ is int else 'non-empty string'}")
        if r.get("side") not in SIDES:
            problems.append(f"row {i}: side {r.get('side')!r} is not one of {list(SIDES)}")
        if isinstance(r.get("tpot_p50_ms"), (int, float)) and isinstance(r.get("tpot_p99_ms"), (int, float)) \
                and r["tpot_p99_ms"] < r["tpot_p50_ms"]:
            problems.append(f"row {i}: tpot_p99_ms < tpot_p50_ms")
        key = tuple(r.get(k) for k in ("model", "side", "kv_cache", "context", "batch"))
        if key in seen:
            problems.append(f"row {i}: a second row for {key}")
        seen.add(key)
    problems += validate_mixed(obj.get("mixed", []))
    if problems:
        raise ResultsError("results.json: " + "; ".join(problems))
    return obj


def validate_mixed(rows) -> list[str]:
    """Problems of the mixed rows (none: [])."""
    if not isinstance(rows, list):
        return ["mixed is not a list"]
    problems, seen = [], set()
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            problems.append(f"mixed row {i}: not an object")
            continue
        if set(r) != set(MIXED_FIELDS):
            problems.append(f"mixed row {i}: fields missing {sorted(set(MIXED_FIELDS) - set(r))}, "
                            f"unknown {sorted(set(r) - set(MIXED_FIELDS))}")
            continue
        for k, typ in MIXED_FIELDS.items():
            v = r[k]
            optional = isinstance(typ, tuple)
            typ = typ[0] if optional else typ
            if optional and v is None:
                continue
            if typ is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                ok = ok and (v > 0 or k == "host_share")
            elif typ is int:
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
            else:
                ok = isinstance(v, str) and v != ""
            if not ok:
                problems.append(f"mixed row {i}: {k}={v!r} is not a valid {typ.__name__}")
        if r["side"] not in SIDES:
            problems.append(f"mixed row {i}: side {r['side']!r} is not one of {list(SIDES)}")
        if isinstance(r["host_share"], (int, float)) and not 0 <= r["host_share"] <= 1:
            problems.append(f"mixed row {i}: host_share {r['host_share']} outside [0, 1]")
        for c in ("mixed", "decode"):
            lo, hi = r.get(f"{c}_step_p50_ms"), r.get(f"{c}_step_p90_ms")
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and hi < lo:
                problems.append(f"mixed row {i}: {c}_step_p90_ms < {c}_step_p50_ms")
        key = tuple(r.get(k) for k in ("model", "side", "kv_cache", "workload"))
        if key in seen:
            problems.append(f"mixed row {i}: a second row for {key}")
        seen.add(key)
    return problems


def rows_from_state(state: dict) -> list[dict]:
    """One row per done workload of the manifest."""
    rows = []
    for rec in state["items"].values():
        if rec.get("kind") == "mixed":
            continue
        rows.append({"model": rec["model"], "side": rec["side"], "kv_cache": rec["kv_cache"],
                     "context": rec["context"], "batch": rec["batch"],
                     "prefill_tok_s": round(rec["prefill"]["tok_s"], 1),
                     "decode_tok_s": round(rec["decode"]["tok_s"], 1),
                     "tpot_p50_ms": round(rec["decode"]["tpot_p50_ms"], 4),
                     "tpot_p99_ms": round(rec["decode"]["tpot_p99_ms"], 4)})
    return sorted(rows, key=row_key)


def _layers(model: str) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plan as planmod

    return planmod.model_layers(model)


def mixed_rows_from_state(state: dict) -> list[dict]:
    """One row per done mixed workload: its step figures, and the host share of its profile."""
    rows = []
    for key, rec in state["items"].items():
        if rec.get("kind") != "mixed":
            continue
        m = rec["mixed"]
        prof = state["profiles"].get(key) or {}
        good = bool(prof.get("ok")) and prof.get("gpu_idle_share") is not None

        def num(v, nd=4):
            return round(v, nd) if isinstance(v, (int, float)) and math.isfinite(v) else None

        rows.append({"model": rec["model"], "side": rec["side"], "kv_cache": rec["kv_cache"],
                     "workload": rec["workload"], "layers": _layers(rec["model"]),
                     "mixed_steps": m["mixed_steps"], "mixed_step_p50_ms": num(m["mixed_step_p50_ms"]),
                     "mixed_step_p90_ms": num(m["mixed_step_p90_ms"]), "decode_steps": m["decode_steps"],
                     "decode_step_p50_ms": num(m["decode_step_p50_ms"]),
                     "decode_step_p90_ms": num(m["decode_step_p90_ms"]), "classified_by": m["classified_by"],
                     "host_share": num(prof.get("gpu_idle_share")) if good else None,
                     "gpu_busy_us_per_step": num(prof.get("gpu_us_per_step"), 1) if good else None,
                     "profiled_step_us": num(prof.get("span_us_per_step"), 1) if good else None})
    return sorted(rows, key=lambda r: (MODEL_ORDER.get(r["model"], 99), r["model"], KV_ORDER.get(r["kv_cache"], 99),
                                       r["kv_cache"], SIDES.index(r["side"]) if r["side"] in SIDES else 99,
                                       r["workload"]))


def warnings_from_state(state: dict) -> list[str]:
    """Runs whose figures need a caveat (cache misses in the decode call, ITL mismatch;
    a mixed workload with too few steps of a kind, or without its profile)."""
    out = []
    for key, rec in sorted(state["items"].items()):
        if rec.get("kind") == "mixed":
            m = rec["mixed"]
            for c in ("mixed", "decode"):
                if m.get(f"{c}_steps", 0) < 8:
                    out.append(f"{key}: only {m.get(f'{c}_steps', 0)} {c} steps measured")
            if m.get("classified_by") != "iteration_details":
                out.append(f"{key}: steps classified by the driver's prefill flag (vLLM gave no iteration details)")
            prof = state["profiles"].get(key) or {}
            if not prof.get("ok"):
                out.append(f"{key}: no host share (profile: {prof.get('why') or 'missing'})")
            continue
        d = rec["decode"]
        if d.get("cache_hit_frac", 1.0) < 0.95:
            out.append(f"{key}: decode call found {d['cache_hit_frac']:.0%} of the prompts in the prefix cache "
                       "(its window then holds prefill steps)")
        if d.get("itl_problem"):
            out.append(f"{key}: {d['itl_problem']}")
        if rec["prefill"].get("cached_tokens"):
            out.append(f"{key}: prefill call hit the prefix cache ({rec['prefill']['cached_tokens']} tokens)")
    return out


def results_from_state(state: dict, command: str | None = None, env: str | None = None) -> dict:
    profiles = []
    for key, p in sorted(state["profiles"].items()):
        if p.get("workload_kind") == "mixed":
            continue  # in the mixed rows (host share, profiled step)
        engine = p.get("engine", key.split("/")[0])
        info = state["plan"]["engines"]
        e = next((x for x in info if x["name"] == engine), {})
        profiles.append({"model": e.get("model"), "side": e.get("side"), "kv_cache": e.get("kv_cache"),
                         "context": p.get("context"), "batch": p.get("batch"), "ok": p.get("ok", False),
                         "why": p.get("why"), "steps": p.get("steps"),
                         "gpu_us_per_step": p.get("gpu_us_per_step"), "buckets": p.get("buckets"),
                         "overlap_us_per_step": p.get("overlap_us_per_step"),
                         "top_kernels": dict(list((p.get("kernels") or {}).items())[:12])})
    meta = {"plan_id": state["plan_id"], "plan": state["plan"],
            "engines": {n: {"starts": e["starts"], "failed": e.get("failed"),
                            "driver": e.get("meta", {}).get("driver"),
                            "config": e.get("meta", {}).get("config"),
                            "versions": e.get("meta", {}).get("versions"),
                            "kv_capacity": e.get("meta", {}).get("kv_capacity")}
                        for n, e in sorted(state["engines"].items())},
            "calls": state["calls"], "warnings": warnings_from_state(state),
            "command": command, "environment": env,
            "definitions": "bench/serving/README.md, section 'What is measured'"}
    out = {"rows": rows_from_state(state), "profiles": profiles, "meta": meta}
    mixed = mixed_rows_from_state(state)
    if mixed:
        out["mixed"] = mixed
        out["mixed_profiles"] = [{"key": k, **{f: p.get(f) for f in (
            "ok", "why", "steps", "gpu_us_per_step", "span_us_per_step", "idle_us_per_step", "gpu_idle_share",
            "buckets", "overlap_us_per_step")}, "top_kernels": dict(list((p.get("kernels") or {}).items())[:12])}
            for k, p in sorted(state["profiles"].items()) if p.get("workload_kind") == "mixed"]
    return validate(out)


def _fmt(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if v < 10 else f"{v:.1f}"


def _ctx(c: int) -> str:
    return f"{c // 1024}k" if c % 1024 == 0 else str(c)


def markdown(results: dict) -> str:
    """Per model and KV cache: each context x batch, upstream vs ours, ratio ours / upstream."""
    validate(results)
    rows = results["rows"]
    out = []
    meta = results.get("meta") or {}
    if meta.get("command"):
        out += ["Command (device calls): `" + str(meta["command"]).strip() + "`", ""]
    if meta.get("environment"):
        out += ["Environment (env.txt):", "", "```", str(meta["environment"]).strip(), "```", ""]
    groups = sorted({(r["model"], r["kv_cache"]) for r in rows},
                    key=lambda g: (MODEL_ORDER.get(g[0], 99), g[0], KV_ORDER.get(g[1], 99), g[1]))
    for model, kv in groups:
        out += [f"### {model}, {kv} KV cache", "",
                "| context | batch | prefill tok/s upstream | ours | ours/up | decode tok/s upstream | ours | "
                "ours/up | TPOT p50 ms upstream | ours | TPOT p99 ms upstream | ours |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        cells = {(r["side"], r["context"], r["batch"]): r for r in rows if r["model"] == model and r["kv_cache"] == kv}
        for c, b in sorted({(k[1], k[2]) for k in cells}):
            up, ours = cells.get(("upstream", c, b)), cells.get(("ours", c, b))

            def val(r, k):
                return _fmt(r[k]) if r else "-"

            def ratio(k):
                return f"{ours[k] / up[k]:.2f}" if up and ours else "-"

            out.append(f"| {_ctx(c)} | {b} | {val(up, 'prefill_tok_s')} | {val(ours, 'prefill_tok_s')} | "
                       f"{ratio('prefill_tok_s')} | {val(up, 'decode_tok_s')} | {val(ours, 'decode_tok_s')} | "
                       f"{ratio('decode_tok_s')} | {val(up, 'tpot_p50_ms')} | {val(ours, 'tpot_p50_ms')} | "
                       f"{val(up, 'tpot_p99_ms')} | {val(ours, 'tpot_p99_ms')} |")
        out.append("")
    profs = [p for p in results.get("profiles", []) if p.get("buckets")]
    if profs:
        out += profile_table(profs, rows)
    if results.get("mixed"):
        out += mixed_table(results["mixed"])
    warns = (results.get("meta") or {}).get("warnings") or []
    if warns:
        out += ["Caveats:", ""] + [f"- {w}" for w in warns] + [""]
    return "\n".join(out)


MERGE_KERNEL = "_sparse_mla_merge_kernel"


def mixed_table(mixed: list[dict]) -> list[str]:
    """Per model x KV cache x mixed workload: engine-step times, upstream vs ours, and the
    host share (the GPU's idle share of the profiled mixed steps)."""
    def ms(v):
        return f"{v:.2f}" if isinstance(v, (int, float)) else "-"

    def pct(v):
        return f"{v:.0%}" if isinstance(v, (int, float)) else "-"

    out = ["### Mixed workload: engine step time and its host share", "",
           "Step: vLLM's inter-token latency of the decode streams (one per engine step), ms; mixed = steps with "
           "prefill tokens (vLLM's iteration details), decode = decode-only steps. Host share: the GPU's idle share "
           "of the profiled mixed steps (worker profiler).", "",
           "| model (layers) | KV | workload | mixed p50 upstream | ours | ours/up | mixed p90 upstream | ours | "
           "decode p50 upstream | ours | ours/up | host share upstream | ours | GPU busy µs/step upstream | ours |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["model"], r["kv_cache"], r["workload"]) for r in mixed},
                  key=lambda k: (MODEL_ORDER.get(k[0], 99), k[0], KV_ORDER.get(k[1], 99), k[1], k[2]))
    for model, kv, wl in keys:
        cell = {r["side"]: r for r in mixed if (r["model"], r["kv_cache"], r["workload"]) == (model, kv, wl)}
        up, ours = cell.get("upstream", {}), cell.get("ours", {})
        layers = (up or ours).get("layers")

        def ratio(k):
            return f"{ours[k] / up[k]:.2f}" if up.get(k) and ours.get(k) else "-"

        def us(v):
            return f"{v:,.0f}" if isinstance(v, (int, float)) else "-"

        out.append(f"| {model} ({layers}) | {kv} | {wl} | {ms(up.get('mixed_step_p50_ms'))} | "
                   f"{ms(ours.get('mixed_step_p50_ms'))} | {ratio('mixed_step_p50_ms')} | "
                   f"{ms(up.get('mixed_step_p90_ms'))} | {ms(ours.get('mixed_step_p90_ms'))} | "
                   f"{ms(up.get('decode_step_p50_ms'))} | {ms(ours.get('decode_step_p50_ms'))} | "
                   f"{ratio('decode_step_p50_ms')} | {pct(up.get('host_share'))} | {pct(ours.get('host_share'))} | "
                   f"{us(up.get('gpu_busy_us_per_step'))} | {us(ours.get('gpu_busy_us_per_step'))} |")
    return out + [""]


def profile_table(profs: list[dict], rows: list[dict]) -> list[str]:
    """The profiled decode steps by bucket, with the GPU's busy time beside the step's
    TPOT (how much of a step is GPU work). Profiles made before the breakdown credited
    overlapping kernels once (no overlap_us_per_step) summed durations: their attention
    is marked, with the PDL merge grid's duration and the attention without it."""
    out = ["### One decode step at 64k (vLLM's worker profiler, GPU kernel time per step)", "",
           "| model | KV | side | batch | attention µs | indexer logits µs | top-k µs | rest µs | "
           "attention + indexer + top-k share | GPU busy µs | TPOT p50 µs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    tpot = {(r["model"], r["side"], r["kv_cache"], r["context"], r["batch"]): r["tpot_p50_ms"] for r in rows}
    for p in sorted(profs, key=lambda p: (MODEL_ORDER.get(p["model"], 99), KV_ORDER.get(p["kv_cache"], 99),
                                          SIDES.index(p["side"]) if p["side"] in SIDES else 99, p["batch"])):
        b = p["buckets"]
        share = sum(b[k]["share"] for k in ("attention", "indexer_logits", "topk"))
        flag = "" if p.get("ok") else f" ({p.get('why')})"
        att = f"{b['attention']['us_per_step']:.1f}"
        busy = f"{p['gpu_us_per_step']:.0f}" if p.get("gpu_us_per_step") else "-"
        merge = (p.get("top_kernels") or {}).get(MERGE_KERNEL)
        if p.get("overlap_us_per_step") is None and merge:
            mark = f"[{len(notes) + 1}]"
            att += mark
            busy = f"≤ {busy}{mark}"
            notes.append(f"{mark} {p['model']} {p['kv_cache']} {p['side']}: durations summed (made before the "
                         f"breakdown credited overlapping kernels once); it includes `{MERGE_KERNEL}` at "
                         f"{merge['us_per_step']:.1f} µs per step, a grid launched with PDL that waits beside the "
                         f"main grid; attention without it: {b['attention']['us_per_step'] - merge['us_per_step']:.1f} µs.")
        t = tpot.get((p["model"], p["side"], p["kv_cache"], p["context"], p["batch"]))
        out.append(f"| {p['model']} | {p['kv_cache']} | {p['side']} | {p['batch']} | {att} | "
                   f"{b['indexer_logits']['us_per_step']:.1f} | {b['topk']['us_per_step']:.1f} | "
                   f"{b['rest']['us_per_step']:.1f} | {share:.0%}{flag} | {busy} | "
                   f"{f'{t * 1000:.0f}' if t else '-'} |")
    return out + [""] + notes + ([""] if notes else [])


def plot(results: dict, path: Path) -> Path:
    """Decode and prefill tok/s vs context, one column per model x KV cache, one line per
    side x batch (upstream dashed, ours solid)."""
    validate(results)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    groups = sorted({(r["model"], r["kv_cache"]) for r in rows},
                    key=lambda g: (MODEL_ORDER.get(g[0], 99), g[0], KV_ORDER.get(g[1], 99), g[1]))
    batches = sorted({r["batch"] for r in rows})
    colors = {b: c for b, c in zip(batches, ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"] * 4)}
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 7.0), squeeze=False)
    for j, (model, kv) in enumerate(groups):
        for i, (metric, label) in enumerate((("decode_tok_s", "decode tok/s"), ("prefill_tok_s", "prefill tok/s"))):
            ax = axes[i][j]
            for side in SIDES:
                for b in batches:
                    pts = sorted((r["context"], r[metric]) for r in rows if r["model"] == model
                                 and r["kv_cache"] == kv and r["side"] == side and r["batch"] == b)
                    if not pts:
                        continue
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if side == "upstream" else "-",
                            marker="o" if side == "ours" else "s", color=colors[b], label=f"{side}, batch {b}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ctxs = sorted({r["context"] for r in rows})
            ax.set_xticks(ctxs)
            ax.set_xticklabels([_ctx(c) for c in ctxs])
            ax.set_xlabel("context (prompt tokens)")
            ax.set_ylabel(label)
            ax.set_title(f"{model}, {kv} KV", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(1, min(6, len(labels))), fontsize=8)
    fig.suptitle("vLLM 0.26.0 on one H200, tiny DSA models: upstream (dashed) vs ours (solid)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def write_all(results: dict, out: Path, write_json: bool = True) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if write_json:
        p = out / "results.json"
        p.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        written.append(p)
    p = out / TABLE_NAME
    p.write_text(markdown(results))
    written.append(p)
    if results["rows"]:  # a plan of mixed workloads only has no throughput to plot
        written.append(plot(results, out / PLOT_NAME))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--state", type=Path, help="a device run's state.json")
    src.add_argument("--results", type=Path, help="an existing results.json")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--command", default=None, help="the device command(s), recorded in meta")
    ap.add_argument("--env", type=Path, default=None, help="env.txt of the device run, recorded in meta")
    args = ap.parse_args(argv)
    try:
        if args.state:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import state as st

            state = st.load(args.state)
            if state is None:
                raise ResultsError(f"{args.state}: no manifest there")
            env = args.env.read_text() if args.env else None
            results = results_from_state(state, args.command, env)
            written = write_all(results, args.out)
        else:
            try:
                results = json.loads(args.results.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ResultsError(f"{args.results}: {exc}") from exc
            written = write_all(validate(results), args.out, write_json=False)
    except (ResultsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
