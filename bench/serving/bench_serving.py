"""Serving speed through `vllm.LLM`: upstream's sparse-MLA kernels vs ours (issue 23).

Runs on the lent H200 (bench/serving/device-run.sh), one engine at a time, each in
its own spawned process (never two engines on the GPU): model x KV cache x side, as
bench/serving/plan.py lists them. Each engine is started once and runs every
workload (context x batch) still pending in the manifest, through vLLM's own
benchmark code: `vllm.benchmarks.throughput._run_vllm_requests` (the function
`vllm bench throughput` times) with `SampleRequest`s of random token ids:

  warm-up     a few short calls (JIT, graphs), not recorded
  prefill     B fresh prompts, max_tokens=1: prefill tok/s
  decode      the same B prompts again (prefix cache), 256 tokens each: decode tok/s
              and the inter-token latencies (TPOT p50/p99) from vLLM's iteration stats
  profile     at 64k for the batches of plan.PROFILE_BATCHES: vLLM's worker profiler
              (profiler_config, torch.profiler) over whole decode steps, broken down
              by bench/serving/profile_breakdown.py

A mixed workload (plan.MixedWorkload, `--deep`) instead drives the engine step by step
(`LLMEngine.add_request` / `step`): decode streams, then prefills arriving at fixed
decode steps; every engine step's duration (the decode streams' inter-token latency)
and composition (vLLM's iteration details: context tokens, generation requests) are
kept, and the worker profiler records PROFILE_ITERS mixed steps (GPU busy vs idle).

CUDA graphs on (vLLM's default mode, capture sizes = the batches), MTP off, prefix
caching on (the decode call needs it), chunked prefill at vLLM's default budget.

The parent keeps the manifest (bench/serving/state.py): what is done is never run
again, a call stops before it would pass its deadline (exit 10: call again), an
engine that fails stops the call (exit 3). `--dry-run` prints the engines' arguments
without vLLM (tests, planning).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import sys
import time
import traceback
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
import metrics  # noqa: E402
import plan as planmod  # noqa: E402
import profile_breakdown  # noqa: E402
import state as st  # noqa: E402

EXIT_OK, EXIT_USAGE, EXIT_FAILED, EXIT_MORE = 0, 2, 3, 10
BASE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
            "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "PYTHONUNBUFFERED": "1"}
SEED = 0
SAFETY = planmod.SAFETY  # estimates x this before a deadline check
KILL_MARGIN_S = 20.0  # a child still running this close to the deadline is killed
DRIVER = "vllm.benchmarks.throughput._run_vllm_requests"


# ---------------------------------------------------------------- engine arguments

def engine_env(engine: planmod.Engine) -> dict[str, str]:
    return dict(BASE_ENV, **{planmod.INDEXER_SWITCH: engine.indexer})


def profiler_config(trace_dir: str) -> dict:
    """vLLM's worker profiler over whole decode steps (ProfilerConfig fields, 0.26.0)."""
    return {"profiler": "torch", "torch_profiler_dir": trace_dir, "torch_profiler_with_stack": False,
            "torch_profiler_record_shapes": False, "torch_profiler_use_gzip": True,
            "delay_iterations": planmod.PROFILE_DELAY_ITERS, "max_iterations": planmod.PROFILE_ITERS,
            "ignore_frontend": True}


def engine_kwargs(engine: planmod.Engine, plan: planmod.Plan, trace_dir: str) -> dict:
    """The vllm.LLM(...) arguments of one engine."""
    batches = plan.batches()
    kw = dict(model=str(planmod.MODEL_DIRS[engine.model]), dtype=planmod.MODEL_DTYPE,
              load_format="e2e_dummy", skip_tokenizer_init=True, seed=SEED,
              max_model_len=planmod.max_model_len(plan), max_num_seqs=plan.max_num_seqs(),
              enable_prefix_caching=True, disable_log_stats=False,
              kv_cache_memory_bytes=planmod.kv_cache_bytes(plan, engine.model if plan.mixed else None),
              # vLLM's default compilation and CUDA-graph mode (FULL_AND_PIECEWISE);
              # capture only the batch sizes that decode here, to keep start-up short.
              compilation_config={"cudagraph_capture_sizes": batches},
              attention_config={"backend": engine.backend},
              profiler_config=profiler_config(trace_dir))
    if engine.kv_cache_dtype != "auto":
        kw["kv_cache_dtype"] = engine.kv_cache_dtype
    if plan.mixed:
        # the serving chunk size; each step's composition and time in the stats (EngineCore
        # attaches SchedulerIterationDetails to the stats of every step)
        kw["max_num_batched_tokens"] = planmod.MIXED_BATCHED_TOKENS
        kw["enable_logging_iteration_details"] = True
    return kw


def make_prompts(vocab: int, context: int, batch: int, tag: str) -> list[list[int]]:
    """batch random prompts of `context` token ids in [3, vocab) (0-2: bos/eos/pad),
    the same for every engine and call (seeded by tag, context, batch)."""
    import numpy as np

    rng = np.random.default_rng(zlib.crc32(f"{tag}/{context}/{batch}".encode()))
    return rng.integers(3, vocab, size=(batch, context), dtype=np.int64).tolist()


def probe_failures(engine: planmod.Engine, probes: list[dict], cudagraphs: list[dict]) -> list[str]:
    """What the engine really used, against what its side must use."""
    out = []
    used = sorted({b for p in probes for b in p.get("attention_backends", [])})
    if used != [engine.backend]:
        out.append(f"attention backends {used}, expected {[engine.backend]}")
    logits = sorted({(p.get("indexer_logits") or ["?"])[0] for p in probes})
    if logits != [engine.indexer]:
        out.append(f"indexer logits on {logits}, expected {[engine.indexer]}")
    layers = sorted({d for p in probes for d in p.get("kv_cache_dtypes", [])})
    if engine.kv_cache == "fp8" and (not layers or not all(d.startswith("fp8") for d in layers)):
        out.append(f"fp8 cache asked, the layers use {layers}")
    if engine.kv_cache == "bf16" and any(d.startswith("fp8") for d in layers):
        out.append(f"16-bit cache asked, the layers use {layers}")
    modes = {str(w.get("cudagraph_mode", "?")).split(".")[-1] for w in cudagraphs}
    if not modes or "NONE" in modes or "?" in modes:
        out.append(f"CUDA graphs not in use (worker mode {sorted(modes)})")
    return out


# ---------------------------------------------------------------- timing estimates

def scale_from(state: dict) -> float:
    """Measured / estimated over the workloads done so far (1.0 before any)."""
    cost = planmod.CostModel()
    est = meas = 0.0
    for rec in state["items"].values():
        if rec.get("kind") == "mixed":  # its estimate and wall time, recorded with it
            if rec.get("est_s") and rec.get("s"):
                est += rec["est_s"]
                meas += rec["s"]
            continue
        w = planmod.Workload(rec["context"], rec["batch"], rec["output_len"])
        est += cost.workload(w, rec["side"], planmod.model_layers(rec["model"]) if rec.get("model") in
                             planmod.MODEL_DIRS else 3)
        meas += rec["prefill"]["elapsed_s"] + rec["decode"]["elapsed_s"]
    return min(max(meas / est, 0.25), 10.0) if est > 0 else 1.0


def start_estimate(state: dict, engine=None) -> float:
    """Start-up seconds: the longest measured so far (of engines of the same model, when
    `engine` is given: a deep model starts slower), else the cost model's."""
    def model_of(name: str) -> str:
        return next((m for m in sorted(planmod.ALL_MODELS, key=len, reverse=True) if name.startswith(m + "-")), "")

    seen = [s["init_s"] for n, e in state["engines"].items() for s in e["starts"] if s.get("init_s")
            and (engine is None or model_of(n) == engine.model)]
    layers = planmod.model_layers(engine.model) if engine is not None else 3
    return max(seen) if seen else planmod.CostModel().start(layers)


def engine_estimate(engine, todo, todo_profiles, state, plan=None) -> float:
    cost = planmod.CostModel()
    k = scale_from(state)
    layers = planmod.model_layers(engine.model)
    warm = plan.warmup() if plan is not None else planmod.WARMUP
    work = cost.warmup(engine.side, layers, warm) + sum(cost.workload(w, engine.side, layers) for w in todo)
    return SAFETY * (start_estimate(state, engine) + k * work + len(todo_profiles) * cost.profile_s + cost.stop_s)


def min_start_need(state, engine=None, plan=None) -> float:
    """The least an engine start needs to be worth it: start-up, warm-up, one small workload."""
    cost = planmod.CostModel()
    layers = planmod.model_layers(engine.model) if engine is not None else 3
    warm = plan.warmup() if plan is not None else planmod.WARMUP
    return SAFETY * (start_estimate(state, engine) + cost.warmup("ours", layers, warm) + cost.stop_s + 5.0)


# ---------------------------------------------------------------- the engine process

class _StepRecorder:
    """A stat logger (vLLM's StatLoggerBase interface) keeping every inter-token latency,
    and, while `steps_on`, one entry per engine step (metrics.step_figures): the step's
    duration (the smallest inter-token latency of its outputs: a decode stream's, the time
    since the step before, engine-core clock) and its composition (vLLM's iteration
    details, when the engine attaches them), tagged with the driver's `phase`."""

    def __init__(self):
        self.on = False
        self.itls: list[float] = []
        self.steps_on = False
        self.steps: list[dict] = []
        self.phase = "ramp"
        self.pending = False  # a prefill of the mixed workload is queued or running

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        if self.on and iteration_stats is not None:
            self.itls.extend(float(x) for x in iteration_stats.inter_token_latencies_iter)
        if self.steps_on and iteration_stats is not None:
            itl = [float(x) for x in iteration_stats.inter_token_latencies_iter]
            d = getattr(scheduler_stats, "iteration_details", None)
            self.steps.append({"phase": self.phase, "step_s": min(itl) if itl else None, "n_itl": len(itl),
                               "ctx_tokens": getattr(d, "num_ctx_tokens", None),
                               "ctx_reqs": getattr(d, "num_ctx_requests", None),
                               "gen_reqs": getattr(d, "num_generation_requests", None),
                               "iteration": getattr(d, "iteration_index", None),
                               "wait_ms": getattr(d, "elapsed_ms", None), "prefill_pending": self.pending})

    def log(self):
        pass

    def log_engine_initialized(self):
        pass

    def record_sleep_state(self, *args, **kwargs):
        pass

    def start(self):
        self.itls, self.on = [], True

    def stop(self) -> list[float]:
        self.on = False
        return self.itls


def _driver():
    """vLLM's own timed call and request type; a copy of it if the import fails."""
    try:
        from vllm.benchmarks.datasets import SampleRequest
        from vllm.benchmarks.throughput import _run_vllm_requests

        def drive(llm, requests):
            return _run_vllm_requests(llm, requests, n=1, disable_detokenize=True, do_profile=False,
                                      prequeue_requests=False, enable_lora=False)

        return drive, SampleRequest, DRIVER
    except Exception as exc:  # recorded in the results; the timing is the same generate call
        import dataclasses

        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        @dataclasses.dataclass
        class SampleRequest:  # noqa: D401 (the fields _run_vllm_requests reads)
            prompt: dict
            prompt_len: int
            expected_output_len: int

        def drive(llm, requests):
            prompts = [TokensPrompt(prompt_token_ids=r.prompt["prompt_token_ids"]) for r in requests]
            params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True,
                                     max_tokens=r.expected_output_len, detokenize=False) for r in requests]
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            return time.perf_counter() - t, outs

        return drive, SampleRequest, f"local copy of {DRIVER} (import failed: {exc!r})"


def _requests(SampleRequest, prompts, output_len):
    return [SampleRequest(prompt={"prompt_token_ids": p}, prompt_len=len(p), expected_output_len=output_len)
            for p in prompts]


def run_workload(llm, drive, SampleRequest, recorder, w: planmod.Workload, vocab: int) -> dict:
    """Prefill call, then the decode call on the same (now cached) prompts."""
    prompts = make_prompts(vocab, w.context, w.batch, "measure")
    elapsed, outs = drive(llm, _requests(SampleRequest, prompts, 1))
    pre = metrics.prefill_figures([len(p) for p in prompts], elapsed, [o.num_cached_tokens or 0 for o in outs])
    recorder.start()
    elapsed, outs = drive(llm, _requests(SampleRequest, prompts, w.output_len))
    itls = recorder.stop()
    reqs = []
    for o in outs:
        m = o.metrics
        reqs.append({"first_token_ts": m.first_token_ts, "last_token_ts": m.last_token_ts,
                     "num_generation_tokens": len(o.outputs[0].token_ids), "prompt_len": len(o.prompt_token_ids),
                     "cached_tokens": o.num_cached_tokens or 0})
    dec = metrics.decode_figures(reqs, itls, elapsed)
    dec["itl_problem"] = metrics.check_itls(itls, reqs)
    if any(r["num_generation_tokens"] != w.output_len for r in reqs):
        raise RuntimeError(f"{w.name}: a request returned {[r['num_generation_tokens'] for r in reqs]} tokens")
    return {"prefill": pre, "decode": dec}


def _traces(trace_dir: Path) -> set:
    return set(trace_dir.glob("*.pt.trace.json*"))


def _breakdown_new_trace(trace_dir: Path, before: set, keep: Path, name: str) -> dict:
    """The trace the profiler wrote since `before`, moved to keep/, broken down (buckets and
    the GPU's idle time, profile_breakdown)."""
    new = sorted(_traces(trace_dir) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise RuntimeError(f"the profiler wrote no trace into {trace_dir}")
    keep.mkdir(parents=True, exist_ok=True)
    trace = shutil.move(str(new[-1]), keep / f"{name}.pt.trace.json.gz")
    table = trace_dir / "profiler_out_0.txt"
    if table.is_file():
        shutil.copyfile(table, keep / f"{name}.profiler_out_0.txt")
    out = profile_breakdown.breakdown_file(Path(trace), planmod.PROFILE_ITERS,
                                           keep_timeline=keep / f"{name}.gpu-timeline.json.gz")
    out["trace_bytes"] = Path(trace).stat().st_size
    return out


def run_profile(llm, drive, SampleRequest, w: planmod.Workload, vocab: int, trace_dir: Path, keep: Path) -> dict:
    """Profile whole decode steps of workload w's prompts (cached first by a 1-token call)."""
    prompts = make_prompts(vocab, w.context, w.batch, "measure")
    drive(llm, _requests(SampleRequest, prompts, 1))
    before = _traces(trace_dir)
    steps = planmod.PROFILE_ITERS
    llm.start_profile()
    try:
        drive(llm, _requests(SampleRequest, prompts, planmod.PROFILE_DELAY_ITERS + steps + 3))
    finally:
        llm.stop_profile()
    out = _breakdown_new_trace(trace_dir, before, keep, w.name)
    out.update(context=w.context, batch=w.batch)
    return out


def mixed_prompts(m: planmod.MixedWorkload, vocab: int) -> tuple[list[list[int]], list[tuple[int, list[int]]]]:
    """The decode streams' prompts and (arrival step, prompt) of every prefill: seeded by
    the workload (the same on every engine; fresh, so no prefix-cache hit)."""
    decodes = make_prompts(vocab, m.decode_context, m.decodes, f"mixed-decode/{m.seed}")
    prefills = [(a, make_prompts(vocab, n, 1, f"mixed-prefill/{m.seed}/{i}")[0])
                for i, (a, n) in enumerate(m.arrivals())]
    return decodes, prefills


def run_mixed(llm, recorder, m: planmod.MixedWorkload, vocab: int, trace_dir: Path, keep: Path,
              deadline: float) -> tuple[dict, dict]:
    """Decode streams, then the prefills at their decode steps, through vLLM's engine
    loop (LLMEngine.add_request / step). Returns the step figures and the profile of
    PROFILE_ITERS steps from the first arrival on (vLLM's worker profiler; its
    delay_iterations put the window inside the mixed phase)."""
    from vllm import SamplingParams

    eng = llm.llm_engine

    def params(n: int):
        return SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=n, detokenize=False)

    decodes, prefills = mixed_prompts(m, vocab)
    rid = f"mixed{time.monotonic_ns()}"
    dec_ids = [f"{rid}-d{i}" for i in range(len(decodes))]
    for r, p in zip(dec_ids, decodes):
        eng.add_request(r, {"prompt_token_ids": p}, params(m.stream_tokens))
    tokens = dict.fromkeys(dec_ids, 0)
    added: dict[str, float] = {}
    latency: dict[str, float] = {}
    nxt, profiled, step = 0, False, -1
    before = _traces(trace_dir)
    recorder.steps, recorder.steps_on, recorder.phase, recorder.pending = [], True, "ramp", False
    t0 = time.perf_counter()
    try:
        while eng.has_unfinished_requests():
            if time.time() > deadline:
                raise TimeoutError(f"{m.name}: the call's deadline came at decode step {step}")
            for o in eng.step():
                if o.request_id in tokens:
                    tokens[o.request_id] = len(o.outputs[0].token_ids)
                elif o.request_id in added and o.finished:
                    latency[o.request_id] = time.perf_counter() - added[o.request_id]
            # decode steps: every stream has its first token, then one per step
            step = min(tokens.values()) - 1
            if step >= 0 and recorder.phase == "ramp":
                recorder.phase = "measure"
            if min(tokens.values()) >= m.decode_tokens:
                recorder.phase = "after"
            while nxt < len(prefills) and step >= prefills[nxt][0]:
                r = f"{rid}-p{nxt}"
                added[r] = time.perf_counter()
                eng.add_request(r, {"prompt_token_ids": prefills[nxt][1]}, params(1))
                nxt += 1
                if not profiled:
                    llm.start_profile()
                    profiled = True
            recorder.pending = len(latency) < nxt
    finally:
        recorder.steps_on = False
        if profiled:
            llm.stop_profile()
    wall = time.perf_counter() - t0
    figures = metrics.step_figures(recorder.steps)
    figures.update(wall_s=wall, arrivals=[[a, len(p)] for a, p in prefills],
                   prefill_latency_s=[round(latency[f"{rid}-p{i}"], 6) if f"{rid}-p{i}" in latency else None
                                      for i in range(len(prefills))],
                   steps=recorder.steps)
    prof = _breakdown_new_trace(trace_dir, before, keep, m.name) if profiled else {"ok": False,
                                                                                    "why": "no prefill arrived"}
    return figures, prof


def _child(target, job: dict, result_dir: str) -> None:
    """Spawned process: a process group of its own (the parent ends the whole group,
    vLLM's engine-core process included), then the engine."""
    os.setpgrp()
    target(job, result_dir)


def resolved_config(cfg) -> dict:
    """The engine settings vLLM resolved (informative: a missing field is None, never an error)."""
    fields = {"max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
              "max_num_seqs": ("scheduler_config", "max_num_seqs"),
              "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
              "async_scheduling": ("scheduler_config", "async_scheduling"),
              "max_model_len": ("model_config", "max_model_len"), "block_size": ("cache_config", "block_size"),
              "cache_dtype": ("cache_config", "cache_dtype"),
              "cudagraph_mode": ("compilation_config", "cudagraph_mode"),
              "cudagraph_capture_sizes": ("compilation_config", "cudagraph_capture_sizes"),
              "compilation_mode": ("compilation_config", "mode")}
    out = {}
    for name, (part, attr) in fields.items():
        v = getattr(getattr(cfg, part, None), attr, None)
        out[name] = v if isinstance(v, (int, float, bool, list, type(None))) else str(v)
    return out


def engine_main(job: dict, result_dir: str) -> None:
    """Child process: one engine, its pending workloads and profiles; records.jsonl."""
    rdir = Path(result_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    log = open(rdir / "engine.log", "a")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.environ.update(job["env"])
    records = open(rdir / "records.jsonl", "a")

    def emit(kind: str, **payload) -> None:
        records.write(json.dumps({"kind": kind, **payload}, default=str) + "\n")
        records.flush()
        os.fsync(records.fileno())

    plan = planmod.build_plan(**job["plan_args"])
    engine = planmod.Engine(**job["engine"])
    todo = [planmod.Workload(**w) for w in job["todo"]]
    todo_mixed = [m for m in plan.mixed if m.name in job.get("todo_mixed", [])]
    todo_profiles = [planmod.Workload(**w) for w in job["todo_profiles"]]
    deadline, scale = job["deadline"], job["scale"]
    cost = planmod.CostModel()
    llm = None
    try:
        import torch
        import vllm
        from vllm import LLM

        from e2e_plugin import describe_model, worker_cudagraphs

        t0 = time.perf_counter()
        llm = LLM(**engine_kwargs(engine, plan, str(rdir / "traces")))
        init_s = time.perf_counter() - t0
        cfg = llm.llm_engine.vllm_config
        probes = llm.apply_model(describe_model)
        graphs = llm.collective_rpc(worker_cudagraphs)
        meta = {"init_s": init_s, "probe": probes, "worker_cudagraphs": graphs,
                "versions": {"vllm": vllm.__version__, "torch": torch.__version__,
                             "gpu": torch.cuda.get_device_name(0), "python": sys.version.split()[0]},
                "config": resolved_config(cfg)}
        try:
            from run_e2e import parse_kv_capacity

            sys.stdout.flush()
            meta["kv_capacity"] = parse_kv_capacity((rdir / "engine.log").read_text(errors="replace"))
        except Exception as exc:  # informative only
            meta["kv_capacity"] = {"error": repr(exc)}
        bad = probe_failures(engine, probes, graphs)
        emit("start", ok=not bad, init_s=init_s, meta=meta, error="; ".join(bad) or None)
        if bad:
            raise SystemExit(0)
        recorder = _StepRecorder()
        llm.llm_engine.logger_manager.stat_loggers.append(recorder)
        drive, SampleRequest, driver_name = _driver()
        vocab = cfg.model_config.hf_text_config.vocab_size
        emit("driver", name=driver_name)
        t = time.perf_counter()
        for c, b, n in plan.warmup():
            if c <= planmod.max_model_len(plan) - n:
                drive(llm, _requests(SampleRequest, make_prompts(vocab, c, b, "warmup"), n))
        emit("warmup", s=time.perf_counter() - t)
        profiled = {w.name for w in todo_profiles}
        for w in todo + [p for p in todo_profiles if p not in todo]:
            need = cost.profile_s if w.name in profiled else 0.0
            if w in todo:
                need += scale * cost.workload(w, engine.side)
            if time.time() + SAFETY * need > deadline:
                emit("stopped", at=w.name, why="deadline")
                break
            if w in todo:
                t = time.perf_counter()
                figures = run_workload(llm, drive, SampleRequest, recorder, w, vocab)
                emit("item", workload=w.name, s=time.perf_counter() - t, **figures)
            if w.name in profiled:
                try:
                    emit("profile", workload=w.name,
                         **run_profile(llm, drive, SampleRequest, w, vocab, rdir / "traces", rdir / "profiles"))
                except Exception as exc:  # a profile failure never loses the figures
                    emit("profile", workload=w.name, ok=False, why=f"{type(exc).__name__}: {exc}")
                    traceback.print_exc()
        layers = planmod.model_layers(engine.model)
        for m in todo_mixed:
            est = cost.mixed(m, engine.side, layers)
            if time.time() + SAFETY * scale * est > deadline:
                emit("stopped", at=m.name, why="deadline")
                break
            t = time.perf_counter()
            try:
                figures, prof = run_mixed(llm, recorder, m, vocab, rdir / "traces", rdir / "profiles", deadline)
            except TimeoutError:  # the estimate was short: the workload runs again next call
                emit("stopped", at=m.name, why="deadline (inside the workload)")
                break
            emit("item", workload=m.name, workload_kind="mixed", s=time.perf_counter() - t, est_s=est, mixed=figures)
            emit("profile", workload=m.name, workload_kind="mixed", **prof)
    except SystemExit:
        pass
    except BaseException as exc:
        emit("error", error=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    try:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
    except Exception:
        traceback.print_exc()
    records.close()
    log.flush()
    os._exit(0)


# ---------------------------------------------------------------- the parent

def end_group(p) -> None:
    """Kill what is left of an engine's process group (its engine core included) and
    wait until the group is gone, so the next engine has the GPU to itself."""
    import signal

    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()  # not a group leader (it never got to setpgrp)
    p.join()
    for _ in range(60):
        try:
            os.killpg(p.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.5)
    print(f"warning: processes of group {p.pid} still alive after SIGKILL", flush=True)


def read_records(path: Path) -> list[dict]:
    """records.jsonl of one engine start; a torn last line (killed child) is dropped."""
    out = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def apply_records(state: dict, engine: planmod.Engine, plan: planmod.Plan, records: list[dict],
                  call: int, started: str, wall_s: float, killed: bool) -> str | None:
    """Fold one engine start's records into the manifest; the failure text, if any."""
    by_name = {w.name: w for w in plan.all_workloads()}
    start = {"started": started, "wall_s": round(wall_s, 1), "killed": killed}
    failure = None
    for r in records:
        kind = r.get("kind")
        if kind == "start":
            start.update(init_s=r.get("init_s"), ok=r.get("ok"))
            state["engines"][engine.name]["meta"] = r.get("meta") or {}
            if not r.get("ok"):
                failure = f"wrong kernels: {r.get('error')}"
        elif kind == "driver":
            state["engines"][engine.name]["meta"]["driver"] = r.get("name")
        elif kind == "warmup":
            start["warmup_s"] = r.get("s")
        elif kind == "item" and r.get("workload_kind") == "mixed":
            w = by_name[r["workload"]]
            st.add_item(state, engine.name, w.name, {
                "engine": engine.name, "model": engine.model, "side": engine.side, "kv_cache": engine.kv_cache,
                "backend": engine.backend, "indexer": engine.indexer, "kind": "mixed", "workload": w.name,
                "mixed": r["mixed"], "s": r.get("s"), "est_s": r.get("est_s"), "call": call})
        elif kind == "item":
            w = by_name[r["workload"]]
            st.add_item(state, engine.name, w.name, {
                "engine": engine.name, "model": engine.model, "side": engine.side, "kv_cache": engine.kv_cache,
                "backend": engine.backend, "indexer": engine.indexer, "context": w.context, "batch": w.batch,
                "output_len": w.output_len, "prefill": r["prefill"], "decode": r["decode"], "s": r.get("s"),
                "call": call})
        elif kind == "profile":
            st.add_profile(state, engine.name, r["workload"], {k: v for k, v in r.items() if k != "kind"}
                           | {"engine": engine.name, "call": call})
        elif kind == "stopped":
            start["stopped_at"] = r.get("at")
        elif kind == "error":
            failure = r.get("error")
    if killed and failure is None:
        start["note"] = "killed at the call's deadline"
    if not any(r.get("kind") == "start" for r in records) and failure is None and not killed:
        failure = "the engine process ended without starting an engine (see engine.log)"
    start["error"] = failure
    st.record_start(state, engine.name, call, start)
    if failure:
        state["engines"][engine.name]["failed"] = failure
    return failure


def run(args, plan: planmod.Plan) -> int:
    """Every pending engine that fits before the deadline; the manifest after each."""
    machine_state = args.state_dir / "state.json"
    state = None if args.reset else st.merge(st.load(machine_state, plan), st.load(args.carried_state, plan))
    state = state or st.new_state(plan)
    if args.retry_failed:
        for e in state["engines"].values():
            e["failed"] = None
    call = st.next_call_number(state)
    t_call = time.time()
    entry = {"call": call, "started": st.now_iso(), "engines": [], "exit": None}
    state["calls"].append(entry)
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        entry["wall_s"] = round(time.time() - t_call, 1)
        st.save(state, machine_state)
        st.save(state, args.out / "state.json")

    save()
    code = EXIT_OK
    ctx = mp.get_context("spawn")
    for engine, todo, todo_profiles in st.pending(state, plan):
        need = engine_estimate(engine, todo, todo_profiles, state, plan)
        left = args.deadline - time.time()
        # An engine too long for what is left waits for the next call, unless this call has
        # run nothing yet: then it runs what fits (its child stops at the deadline) and the
        # rest resumes next call.
        if need > left and not entry["engines"] and min_start_need(state, engine, plan) > left:
            print(f"error: [call {call}] {engine.name}: even a start with one workload needs "
                  f"~{min_start_need(state, engine, plan):.0f} s, the call has {left:.0f} s: give the call more time "
                  "(BENCH_BUDGET_S, timeout_s) or look at the start-up in the engine logs", flush=True)
            code = EXIT_FAILED
            break
        if need > left and entry["engines"]:
            print(f"[call {call}] {engine.name}: needs ~{need:.0f} s, {left:.0f} s left: next call", flush=True)
            code = EXIT_MORE
            break
        rdir = args.state_dir / "engines" / f"{engine.name}-call{call}"
        if rdir.exists():
            shutil.rmtree(rdir)
        job = {"engine": {"model": engine.model, "kv_cache": engine.kv_cache, "side": engine.side},
               "plan_args": args.plan_args,
               "todo": [vars(w) for w in todo if isinstance(w, planmod.Workload)],
               "todo_mixed": [w.name for w in todo if isinstance(w, planmod.MixedWorkload)],
               "todo_profiles": [vars(w) for w in todo_profiles], "env": engine_env(engine),
               "deadline": args.deadline - KILL_MARGIN_S, "scale": scale_from(state)}
        started = st.now_iso()
        t0 = time.time()
        print(f"[call {call}] start {engine.name} ({len(todo)} workloads, {len(todo_profiles)} profiles, "
              f"~{need:.0f} s)", flush=True)
        p = ctx.Process(target=_child, args=(engine_main, job, str(rdir)), daemon=False)
        p.start()
        killed = False
        while p.is_alive():
            if time.time() > args.deadline - KILL_MARGIN_S / 2:
                killed = True
                break
            time.sleep(1)
        end_group(p)
        failure = apply_records(state, engine, plan, read_records(rdir / "records.jsonl"), call, started,
                                time.time() - t0, killed)
        entry["engines"].append(engine.name)
        save()
        done = sum(1 for w in plan.all_workloads() if st.item_key(engine.name, w.name) in state["items"])
        print(f"[call {call}] done {engine.name}: {done}/{len(plan.all_workloads())} workloads, "
              f"{time.time() - t0:.0f} s" + (f"; FAILED: {failure}" if failure else "")
              + ("; killed at the deadline" if killed else ""), flush=True)
        if failure and not args.keep_going:
            code = EXIT_FAILED
            break
        if killed:
            code = EXIT_MORE
            break
    left = st.pending(state, plan)
    if code != EXIT_FAILED:
        code = EXIT_MORE if left else (EXIT_FAILED if st.failed(state) else EXIT_OK)
    entry["exit"] = code
    save()
    print(progress(state, plan), flush=True)
    return code


def progress(state: dict, plan: planmod.Plan) -> str:
    """One line per engine: workloads and profiles done, failures; what the next call does."""
    lines = [f"plan {plan.plan_id()}, call {state['calls'][-1]['call'] if state['calls'] else 0}:"]
    for e in plan.engines:
        done = sum(1 for w in plan.all_workloads() if st.item_key(e.name, w.name) in state["items"])
        prof = sum(1 for w in plan.profiles_for(e) if st.item_key(e.name, w.name) in state["profiles"])
        fail = state["engines"].get(e.name, {}).get("failed")
        lines.append(f"  {e.name:34s} workloads {done}/{len(plan.all_workloads())} profiles "
                     f"{prof}/{len(plan.profiles_for(e))}" + (f"  FAILED: {fail}" if fail else ""))
    left = st.pending(state, plan)
    lines.append("complete" if not left else f"pending: {', '.join(e.name for e, _, _ in left)}")
    return "\n".join(lines)


def dry_run(plan: planmod.Plan) -> dict:
    """What each engine would get (no vLLM import)."""
    return {"plan_id": plan.plan_id(), "driver": DRIVER,
            "engines": [{"name": e.name, "env": engine_env(e),
                         "llm_kwargs": engine_kwargs(e, plan, "<engine dir>/traces"),
                         "workloads": [w.name for w in plan.all_workloads()],
                         "profiles": [w.name for w in plan.profiles_for(e)]} for e in plan.engines]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/smla-bench-out")))
    ap.add_argument("--state-dir", type=Path, default=Path("/tmp/smla-bench"),
                    help="manifest and engine logs on this machine (kept while it stays warm)")
    ap.add_argument("--carried-state", type=Path, default=REPO / ".e2e" / "serving-state",
                    help="a manifest carried from an earlier call (merged with the machine's)")
    ap.add_argument("--deadline", type=float, default=None, help="epoch seconds; default now + --budget-s")
    ap.add_argument("--budget-s", type=float, default=planmod.CALL_BUDGET_S)
    planmod.add_plan_options(ap)
    ap.add_argument("--reset", action="store_true", help="ignore any manifest and start over")
    ap.add_argument("--retry-failed", action="store_true", help="run engines marked failed again")
    ap.add_argument("--keep-going", action="store_true", help="go on with the next engine after a failure")
    ap.add_argument("--dry-run", action="store_true", help="print the engines' arguments and exit (no vLLM)")
    args = ap.parse_args(argv)
    args.plan_args = planmod.plan_args(args)
    if args.deadline is None:
        args.deadline = time.time() + args.budget_s
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = planmod.build_plan(**args.plan_args)
    except planmod.PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(json.dumps(dry_run(plan), indent=1, sort_keys=True))
        return EXIT_OK
    try:
        return run(args, plan)
    except st.StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
