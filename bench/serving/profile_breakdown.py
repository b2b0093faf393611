"""One decode step's GPU time by kind: attention, indexer logits, top-k, the rest.

Reads the Chrome trace (`*.pt.trace.json[.gz]`) that vLLM's own worker profiler
(`profiler_config`, `torch.profiler`, `tensorboard_trace_handler`) writes for a window
of whole decode steps (`delay_iterations` / `max_iterations`), sums the GPU kernels
(trace events of category "kernel"; memcpy / memset go to the rest) by bucket and
divides by the number of steps. Standard library only.

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


def gpu_events(trace: dict) -> list[tuple[str, float]]:
    """(name, duration in µs) of every GPU kernel, memcpy and memset in the trace."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise TraceError("no traceEvents list")
    out = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", ""))
        if cat in KERNEL_CATS or cat in OTHER_GPU_CATS:
            out.append((str(ev.get("name", "?")) if cat in KERNEL_CATS else f"[{cat}]", float(ev.get("dur", 0.0))))
    return out


def breakdown(events: list[tuple[str, float]], steps: int) -> dict:
    """Per bucket: µs in the window, µs per step, share of the GPU time; the kernels."""
    if steps < 1:
        raise TraceError(f"{steps} steps in the profiled window")
    if not events:
        raise TraceError("no GPU kernel in the profiled window (CUDA activity not traced?)")
    total = {b: 0.0 for b in BUCKETS}
    kernels: dict[str, dict] = {}
    for name, dur in events:
        b = "rest" if name.startswith("[") else classify(name)
        total[b] += dur
        k = kernels.setdefault(name, {"bucket": b, "count": 0, "us": 0.0})
        k["count"] += 1
        k["us"] += dur
    gpu_us = sum(total.values())
    missing = [b for b in ("attention", "indexer_logits", "topk") if total[b] == 0.0]
    return {
        "steps": steps,
        "gpu_us_per_step": gpu_us / steps,
        "buckets": {b: {"us_per_step": total[b] / steps, "share": total[b] / gpu_us} for b in BUCKETS},
        "kernels": {n: {"bucket": k["bucket"], "count": k["count"], "us_per_step": k["us"] / steps}
                    for n, k in sorted(kernels.items(), key=lambda kv: (-kv[1]["us"], kv[0]))},
        "ok": not missing,
        "why": f"no {', '.join(missing)} kernel matched (see kernels)" if missing else None,
    }


def breakdown_file(path: Path, steps: int) -> dict:
    out = breakdown(gpu_events(load_trace(path)), steps)
    out["trace"] = Path(path).name
    return out
