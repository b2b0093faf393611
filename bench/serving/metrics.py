"""Figures of one workload from what vLLM reports (pure functions, standard library only).

Definitions (bench/serving/README.md "What is measured"):
- prefill tok/s: prompt tokens / wall time of the prefill call (B fresh prompts,
  max_tokens=1), as `vllm bench throughput` divides tokens by its elapsed time.
- decode tok/s: output tokens after each request's first / (last token of any request
  - first token of any request), engine-core timestamps of the decode call (the same
  prompts again, served from the prefix cache, 256 tokens).
- TPOT p50 / p99: percentiles of the inter-token latencies of every output token after
  the first of the decode call (vLLM's IterationStats.inter_token_latencies_iter:
  engine-core time between a request's consecutive tokens).
"""
from __future__ import annotations

import math


def percentile(values, q: float) -> float:
    """numpy.percentile's default ('linear') on a list; NaN for an empty one."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def prefill_figures(prompt_lens: list[int], elapsed_s: float, cached_tokens: list[int]) -> dict:
    """The prefill call: tokens, wall time, tok/s; cached tokens must be 0 (fresh prompts)."""
    if elapsed_s <= 0:
        raise ValueError(f"prefill elapsed time {elapsed_s} s")
    tokens = sum(prompt_lens)
    return {"prompt_tokens": tokens, "elapsed_s": elapsed_s, "tok_s": tokens / elapsed_s,
            "cached_tokens": sum(cached_tokens)}


def decode_figures(requests: list[dict], itls_s: list[float], elapsed_s: float) -> dict:
    """The decode call. `requests`: per request first_token_ts, last_token_ts (engine-core
    seconds), num_generation_tokens, prompt_len, cached_tokens; `itls_s`: every
    inter-token latency the engine reported during the call."""
    if not requests:
        raise ValueError("decode call without requests")
    firsts = [r["first_token_ts"] for r in requests]
    lasts = [r["last_token_ts"] for r in requests]
    after_first = sum(max(int(r["num_generation_tokens"]) - 1, 0) for r in requests)
    window = max(lasts) - min(firsts)
    if window <= 0 or after_first == 0:
        raise ValueError(f"no decode window (window {window} s, {after_first} tokens after the first)")
    prompt = sum(r["prompt_len"] for r in requests)
    cached = sum(r["cached_tokens"] for r in requests)
    per_req = [(r["last_token_ts"] - r["first_token_ts"]) / (r["num_generation_tokens"] - 1)
               for r in requests if r["num_generation_tokens"] > 1]
    return {
        "generated_tokens": sum(int(r["num_generation_tokens"]) for r in requests),
        "elapsed_s": elapsed_s,
        "window_s": window,
        "tok_s": after_first / window,
        "itl_count": len(itls_s),
        "tpot_p50_ms": 1e3 * percentile(itls_s, 50),
        "tpot_p99_ms": 1e3 * percentile(itls_s, 99),
        "tpot_mean_ms": 1e3 * (sum(itls_s) / len(itls_s)) if itls_s else math.nan,
        "request_tpot_p50_ms": 1e3 * percentile(per_req, 50),
        "request_tpot_p99_ms": 1e3 * percentile(per_req, 99),
        "cached_tokens": cached,
        "cache_hit_frac": cached / prompt if prompt else math.nan,
        "first_token_spread_s": max(firsts) - min(firsts),
    }


def check_itls(itls_s: list[float], requests: list[dict]) -> str | None:
    """Why the ITL list cannot be the decode call's (None when it can): one latency per
    output token after the first, every one positive."""
    want = sum(max(int(r["num_generation_tokens"]) - 1, 0) for r in requests)
    if len(itls_s) != want:
        return f"{len(itls_s)} inter-token latencies for {want} tokens after the first"
    if any(not (x > 0) for x in itls_s):
        return "an inter-token latency <= 0"
    return None


def step_figures(steps: list[dict]) -> dict:
    """A mixed workload's engine steps (bench_serving._StepRecorder entries) -> figures.

    A step is one engine-core output batch holding a decode stream's token; its time
    `step_s` is the smallest inter-token latency in it (vLLM's
    IterationStats.inter_token_latencies_iter: engine-core time since the stream's token
    of the step before, i.e. the step's duration). Steps of the measured phase only
    (every decode stream has its first token, none has its last). A step is *mixed* when
    vLLM's iteration details give it context (prefill) tokens; without iteration details
    (`ctx_tokens` None) when a prefill of the workload was queued or running
    (`prefill_pending`); otherwise *decode-only*. Percentiles: numpy's linear rule.
    """
    measured = [s for s in steps if s.get("phase") == "measure" and s.get("step_s")]
    by_details = bool(measured) and all(s.get("ctx_tokens") is not None for s in measured)

    def is_mixed(s: dict) -> bool:
        return (s["ctx_tokens"] or 0) > 0 if by_details else bool(s.get("prefill_pending"))

    out: dict = {"classified_by": "iteration_details" if by_details else "prefill_pending",
                 "measured_steps": len(measured)}
    for label, group in (("mixed", [s for s in measured if is_mixed(s)]),
                         ("decode", [s for s in measured if not is_mixed(s)])):
        ms = [1e3 * s["step_s"] for s in group]
        out[f"{label}_steps"] = len(ms)
        out[f"{label}_step_p50_ms"] = percentile(ms, 50)
        out[f"{label}_step_p90_ms"] = percentile(ms, 90)
        out[f"{label}_step_mean_ms"] = sum(ms) / len(ms) if ms else math.nan
        if by_details and group:
            out[f"{label}_ctx_tokens_mean"] = sum(s["ctx_tokens"] for s in group) / len(group)
            out[f"{label}_gen_reqs_mean"] = sum(s.get("gen_reqs") or 0 for s in group) / len(group)
    return out
