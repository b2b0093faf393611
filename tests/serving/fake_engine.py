"""A stand-in for bench_serving.engine_main in the CPU tests: no vLLM, no GPU.

Writes the records a real engine process writes (records.jsonl), with synthetic
figures. FAKE_MODE (environment): ok (default), bad-kernels, crash, hang (never
finishes: the parent must kill it), die-after-one (one workload, then exits).
FAKE_INIT_S: the start-up it reports. FAKE_LOG: a file each start appends
"start <engine> <t>" / "end <engine> <t>" to (to check that engines never overlap).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def engine_main(job: dict, result_dir: str) -> None:
    rdir = Path(result_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("FAKE_MODE", "ok")
    name = "-".join([job["engine"]["model"], job["engine"]["kv_cache"] + "kv", job["engine"]["side"]])
    log = os.environ.get("FAKE_LOG")

    def mark(what: str) -> None:
        if log:
            with open(log, "a") as f:
                f.write(f"{what} {name} {time.time():.6f}\n")

    mark("start")
    rec = open(rdir / "records.jsonl", "a")

    def emit(kind: str, **payload) -> None:
        rec.write(json.dumps({"kind": kind, **payload}) + "\n")
        rec.flush()

    if mode == "crash":
        mark("end")
        os._exit(1)
    ok = mode != "bad-kernels"
    emit("start", ok=ok, init_s=float(os.environ.get("FAKE_INIT_S", "1.0")),
         meta={"config": {"max_num_batched_tokens": 16384}, "versions": {"vllm": "fake"}},
         error=None if ok else "attention backends ['FLASH_ATTN_MLA_SPARSE'], expected ['TRITON_MLA_SPARSE']")
    if not ok:
        mark("end")
        os._exit(0)
    emit("driver", name="fake")
    emit("warmup", s=0.01)
    if mode == "hang":  # with a grandchild, as vLLM's engine-core process
        import subprocess
        import sys

        core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        (rdir / "core.pid").write_text(str(core.pid))
        time.sleep(3600)
    up = job["engine"]["side"] == "upstream"
    profiled = {w["context"] * 1000 + w["batch"] for w in job["todo_profiles"]}
    def profile(c: int, b: int) -> None:
        emit("profile", workload=f"c{c}-b{b}", ok=True, why=None, steps=8, context=c, batch=b,
             gpu_us_per_step=100.0,
             buckets={"attention": {"us_per_step": 30.0, "share": 0.3},
                      "indexer_logits": {"us_per_step": 20.0, "share": 0.2},
                      "topk": {"us_per_step": 10.0, "share": 0.1},
                      "rest": {"us_per_step": 40.0, "share": 0.4}},
             kernels={"_sparse_mla_fwd_kernel": {"bucket": "attention", "count": 24, "us_per_step": 30.0}})

    todo = {w["context"] * 1000 + w["batch"] for w in job["todo"]}
    for i, w in enumerate(job["todo"]):
        c, b = w["context"], w["batch"]
        dec = 1000.0 * b / (1.0 + c / 65536) * (1.0 if up else 0.8)
        emit("item", workload=f"c{c}-b{b}", s=0.01,
             prefill={"prompt_tokens": c * b, "elapsed_s": 0.001, "tok_s": 1e5 * (1.0 if up else 0.9),
                      "cached_tokens": 0},
             decode={"elapsed_s": 0.002, "window_s": 0.002, "tok_s": dec, "tpot_p50_ms": 5.0 + c / 65536,
                     "tpot_p99_ms": 6.0 + c / 65536, "itl_count": b * (w["output_len"] - 1),
                     "cache_hit_frac": 0.999, "itl_problem": None})
        if c * 1000 + b in profiled:
            profile(c, b)
        if mode == "die-after-one" and i == 0:
            mark("end")
            os._exit(0)
    for w in job["todo_profiles"]:
        if w["context"] * 1000 + w["batch"] not in todo:
            profile(w["context"], w["batch"])
    for i, name in enumerate(job.get("todo_mixed", [])):
        mixed_step = 40.0 if up else 52.0
        steps = ([{"phase": "ramp", "step_s": 0.05, "ctx_tokens": 8192, "gen_reqs": 8, "prefill_pending": False}]
                 + [{"phase": "measure", "step_s": 0.004 + 1e-5 * k, "ctx_tokens": 0, "gen_reqs": 32,
                     "prefill_pending": False} for k in range(16)]
                 + [{"phase": "measure", "step_s": mixed_step / 1e3 + 1e-4 * k, "ctx_tokens": 8160, "gen_reqs": 32,
                     "prefill_pending": True} for k in range(22)])
        from metrics import step_figures  # bench/serving is on sys.path (the parent's module)

        figures = step_figures(steps)
        figures.update(wall_s=1.0, arrivals=[[16, 65536]], prefill_latency_s=[0.5], steps=steps)
        emit("item", workload=name, workload_kind="mixed", s=0.01, est_s=0.02, mixed=figures)
        busy = 30000.0 if up else 31000.0
        span = mixed_step * 1000.0
        emit("profile", workload=name, workload_kind="mixed", ok=True, why=None, steps=8, gpu_us_per_step=busy,
             span_us_per_step=span, idle_us_per_step=span - busy, gpu_idle_share=(span - busy) / span,
             buckets={"attention": {"us_per_step": 9000.0, "share": 0.3},
                      "indexer_logits": {"us_per_step": 6000.0, "share": 0.2},
                      "topk": {"us_per_step": 3000.0, "share": 0.1},
                      "rest": {"us_per_step": busy - 18000.0, "share": 0.4}},
             kernels={"_sparse_mla_fwd_kernel": {"bucket": "attention", "count": 624, "us_per_step": 9000.0}})
    mark("end")
    rec.close()
    os._exit(0)
