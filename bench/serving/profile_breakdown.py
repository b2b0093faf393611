"""One decode step's GPU time by kind: attention, indexer logits, top-k, the rest.

Reads the Chrome trace (`*.pt.trace.json[.gz]`) that vLLM's own worker profiler
(`profiler_config`, `torch.profiler`, `tensorboard_trace_handler`) writes for a window
of whole decode steps (`delay_iterations` / `max_iterations`), takes the GPU kernels
(trace events of category "kernel"; memcpy / memset go to the rest), credits each the
GPU time it alone adds to the timeline, sums that by bucket and divides by the number
of steps. Standard library only.

Why not the kernels' durations: kernels may overlap. The series' split-K merge grid is
launched with programmatic dependent launch (PDL): it starts while the main attention
grid runs and waits in `griddepcontrol.wait`, so its trace duration covers most of the
main grid's (0.26.0 H200 run: 59 µs per merge call beside 57 µs per main call), and a
sum of durations counts that time twice. Here the events are walked in start order
and each is credited only the part of [start, end) that no earlier event covered; the
buckets then add up to the GPU's busy time (the union of the intervals), and a kernel's
summed duration is kept beside its credited time (`dur_us_per_step`).

Buckets, first matching rule wins (kernel names: vLLM 0.26.0's csrc and the series'
Triton files; DeepGEMM's, FlashMLA's and FlashAttention-3's as their names contain):
- topk: the indexer's top-k (`top_k_per_row_*` = topKPerRow*, persistent_topk,
  cooperative_topk, FilteredTopK); the MoE router's top-k kernels (grouped_topk,
  topk_softmax, moe*) are *not* here (named after these rules: they go to the rest);
- indexer_logits: DeepGEMM's `*mqa_logits*` (incl. its paged schedule metadata) and
  our `_mqa_logits_kernel` / `_paged_mqa_logits_kernel`;
- rest, named before attention: KV / indexer-key cache writes and gathers
  (concat_and_cache_*mla*, indexer_k_quant_and_cache, cp_gather_*cache*), the
  request-local -> slot conversion of the top-k (`_convert_req_local_to_slots_kernel`,
  `_convert_req_index_to_global_index_kernel`), MoE kernels;
- attention: `_sparse_mla_*` (ours), FlashMLA (`flash*mla*`, `*sparse*attn*`),
  FlashAttention-3 (`flash*`, `*FlashAttn*`), any `*mla*` / `*attention*` kernel left;
- rest: everything else (GEMMs, MoE, norms, rotary, sampling, ...).
Every kernel name seen is kept with its bucket (`kernels`), so a wrong rule shows.

Host share (issue 34): the GPU's idle time in the profiled window. The window's span
runs from the first GPU event's start to the last one's end (the profiled steps,
back to back); busy is the union of the events' intervals; `gpu_idle_share` =
(span - busy) / span: the part of the steps' time in which no kernel, copy or set ran,
i.e. the GPU waited for the host (scheduling, input preparation, the launches of
eagerly run layers). `span_us_per_step` = span / steps. Under the profiler each launch
costs a little more host time than without it, so the share is measured on slightly
slowed steps: compare the sides, and the unprofiled step times, beside it.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

BUCKETS = ("attention", "indexer_logits", "topk", "rest")
RULES: list[tuple[str, re.Pattern]] = [
    ("topk", re.compile(r"topKPerRow|top_k_per_row|persistent_topk|cooperative_topk|FilteredTopK|"
                        r"filtered_topk|radix_topk|buffered_topk", re.I)),
    ("indexer_logits", re.compile(r"mqa_logits", re.I)),
    ("rest", re.compile(r"concat_and_cache|and_cache_|cache_kernel|copy_blocks|_to_slots|"
                        r"_global_index|moe|topk_softmax|grouped_topk", re.I)),
    ("attention", re.compile(r"_sparse_mla_|flash.*mla|mla.*flash|sparse.*attn|flash|fmha|mla|attention", re.I)),
]
KERNEL_CATS = {"kernel"}
OTHER_GPU_CATS = {"gpu_memcpy", "gpu_memset"}


class TraceError(ValueError):
    """A trace that cannot give a breakdown."""


def classify(name: str) -> str:
    for bucket, rx in RULES:
        if rx.search(name):
            return bucket
    return "rest"


def load_trace(path: Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError) as exc:
        raise TraceError(f"{path}: not a readable Chrome trace: {exc}") from exc


def gpu_events(trace: dict) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of every GPU kernel, memcpy and memset in the trace."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise TraceError("no traceEvents list")
    out = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", ""))
        if cat in KERNEL_CATS or cat in OTHER_GPU_CATS:
            name = str(ev.get("name", "?")) if cat in KERNEL_CATS else f"[{cat}]"
            out.append((name, float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0))))
    return out


def exclusive_times(events: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """(name, credited µs, duration µs) per event: in start order, the part of each
    event's interval that no earlier event covered (their sum is the busy time)."""
    out = []
    covered = float("-inf")
    for name, start, dur in sorted(events, key=lambda e: (e[1], -e[2])):
        end = start + dur
        out.append((name, max(0.0, end - max(start, covered)), dur))
        covered = max(covered, end)
    return out


def breakdown(events: list[tuple[str, float, float]], steps: int) -> dict:
    """Per bucket: credited µs per step and share of the GPU's busy time; the kernels."""
    if steps < 1:
        raise TraceError(f"{steps} steps in the profiled window")
    if not events:
        raise TraceError("no GPU kernel in the profiled window (CUDA activity not traced?)")
    total = {b: 0.0 for b in BUCKETS}
    kernels: dict[str, dict] = {}
    for name, credit, dur in exclusive_times(events):
        b = "rest" if name.startswith("[") else classify(name)
        total[b] += credit
        k = kernels.setdefault(name, {"bucket": b, "count": 0, "us": 0.0, "dur": 0.0})
        k["count"] += 1
        k["us"] += credit
        k["dur"] += dur
    busy = sum(total.values())
    durations = sum(k["dur"] for k in kernels.values())
    missing = [b for b in ("attention", "indexer_logits", "topk")
               if not any(k["bucket"] == b for k in kernels.values())]
    span = max(s + d for _, s, d in events) - min(s for _, s, _ in events)
    return {
        "steps": steps,
        "gpu_us_per_step": busy / steps,
        "span_us_per_step": span / steps,
        "idle_us_per_step": max(span - busy, 0.0) / steps,
        "gpu_idle_share": max(span - busy, 0.0) / span if span > 0 else 0.0,
        "overlap_us_per_step": (durations - busy) / steps,
        "buckets": {b: {"us_per_step": total[b] / steps, "share": total[b] / busy if busy else 0.0}
                    for b in BUCKETS},
        "kernels": {n: {"bucket": k["bucket"], "count": k["count"], "us_per_step": k["us"] / steps,
                        "dur_us_per_step": k["dur"] / steps}
                    for n, k in sorted(kernels.items(), key=lambda kv: (-kv[1]["us"], kv[0]))},
        "ok": not missing,
        "why": f"no {', '.join(missing)} kernel matched (see kernels)" if missing else None,
    }


def timeline(events: list[tuple[str, float, float]]) -> list[list]:
    """The GPU events as [name, start µs relative to the first, duration µs]: small
    enough to keep with the logs, enough to redo the breakdown."""
    t0 = min((e[1] for e in events), default=0.0)
    return [[n, round(s - t0, 3), round(d, 3)] for n, s, d in sorted(events, key=lambda e: e[1])]


def breakdown_file(path: Path, steps: int, keep_timeline: Path | None = None) -> dict:
    """The breakdown of one trace; with keep_timeline, its GPU events also go there
    (gzipped JSON, see timeline) so that the breakdown can be redone without the trace."""
    events = gpu_events(load_trace(path))
    out = breakdown(events, steps)
    out["trace"] = Path(path).name
    if keep_timeline is not None:
        with gzip.open(keep_timeline, "wt") as f:
            json.dump({"steps": steps, "events": timeline(events)}, f)
    return out


def breakdown_timeline(path: Path) -> dict:
    """The breakdown again from a kept timeline file."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    return breakdown([(n, s, d) for n, s, d in data["events"]], int(data["steps"]))
