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
    mark("end")
    rec.close()
    os._exit(0)
