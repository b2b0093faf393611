"""CPU tests of the serving benchmark's deep models and mixed workload (issue 34, item 3):
the deep configs and their memory estimate, the mixed workload's arrivals (seeded, fixed
rate), the deep plan and its device calls, the step figures and the host share, the
driver of the mixed workload against a stand-in engine loop, the runner end to end with
the stand-in engine process, and the report's mixed rows.

Nothing here needs vLLM or a GPU; the GPU run is `--deep` on the lent H200
(bench/serving/README.md "Deep models and the mixed workload").
"""
from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "serving"
MODELS = REPO / "tests" / "e2e" / "models"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_serving  # noqa: E402
import fake_engine  # noqa: E402
import metrics  # noqa: E402
import plan as planmod  # noqa: E402
import profile_breakdown as pb  # noqa: E402
import report  # noqa: E402
import state as st  # noqa: E402

DEEP_SMALL = ["--deep", "--models", "glm5-deep", "--kv-caches", "bf16"]


# ------------------------------------------------------------------ the deep models

@pytest.mark.parametrize("deep,tiny,layers", [("glm5-deep", "glm5-tiny", 78),
                                              ("deepseek-v32-deep", "deepseek-v32-tiny", 61)])
def test_a_deep_model_is_its_tiny_model_with_the_real_layer_count(deep, tiny, layers):
    d = json.loads((MODELS / deep / "config.json").read_text())
    t = json.loads((MODELS / tiny / "config.json").read_text())
    assert d["num_hidden_layers"] == layers and d["first_k_dense_replace"] == 3  # the real models' 3 dense
    changed = {k for k in d.keys() | t.keys() if d.get(k) != t.get(k)}
    assert changed == {"num_hidden_layers", "first_k_dense_replace"}, "hidden size, heads, experts stay tiny"
    assert deep in planmod.ALL_MODELS and planmod.MODEL_DIRS[deep] == MODELS / deep
    assert planmod.model_layers(deep) == layers and planmod.model_layers(tiny) == 3
    assert deep not in planmod.MODELS, "the default plan (the tiny models) stays as it was"


def test_the_weight_estimate_by_hand_for_the_tiny_glm5():
    cfg = json.loads((MODELS / "glm5-deep" / "config.json").read_text())
    h = 1024
    attn = h * 2048 + 2048 + 2048 * 16 * (192 + 64) + h * (512 + 64) + 512 + 512 * 16 * (192 + 256) + 16 * 256 * h
    indexer = 2048 * 32 * 128 + h * 128 + 2 * 128 + h * 32
    moe = (16 + 1) * 3 * h * 256 + h * 16 + 16
    w = planmod.weight_params(cfg)
    assert w["per_moe_layer"] == attn + indexer + 2 * h + moe
    assert w["total"] == 2 * 8192 * h + h + 78 * (attn + indexer + 2 * h) + 3 * 3 * h * 2048 + 75 * moe
    assert w["dense_layers"] == 3


def test_the_deep_engines_fit_an_h200_with_room_for_a_second():
    plan = planmod.build_plan(**planmod.DEEP_ARGS)
    m = plan.mixed[0]
    for model, layers in (("glm5-deep", 78), ("deepseek-v32-deep", 61)):
        mem = planmod.memory_gib(plan, model)
        assert 4 < mem["weights"] < 8  # ~40M parameters per MoE layer, bf16
        assert mem["total"] <= planmod.H200_GIB and mem["fits_two"], mem
        # the budget holds every decode stream at full length and two 64k prefills in progress
        need = (m.decodes * (m.decode_context + m.stream_tokens) + 2 * 65536) * layers * (1152 + 132)
        assert planmod.kv_cache_bytes(plan, model) >= need
    # a plan without deep models keeps the 3-layer budget of the first run (19 GiB)
    assert planmod.kv_cache_bytes(planmod.build_plan()) == 19 << 30


# ------------------------------------------------------------------ the mixed workload

def test_the_arrivals_are_seeded_and_come_at_a_fixed_rate():
    m = planmod.MixedWorkload()
    a = m.arrivals()
    assert a == planmod.MixedWorkload().arrivals(), "not deterministic"
    assert sorted(n for _, n in a) == sorted(m.prefills) and min(m.prefills) >= 4096 and max(m.prefills) == 65536
    assert [s for s, _ in a] == [m.lead + i * m.every for i in range(len(m.prefills))]
    orders = {tuple(n for _, n in planmod.MixedWorkload(seed=s).arrivals()) for s in range(6)}
    assert len(orders) > 1, "the seed does not pick the order"
    # arrivals bring more tokens per step than a step's budget drains: the mixed phase has no gap
    per_step = planmod.MIXED_BATCHED_TOKENS - m.decodes
    assert sum(m.prefills) / (m.every * len(m.prefills)) > per_step
    assert m.mixed_steps >= math.ceil(sum(m.prefills) / per_step) >= 16
    # each decode stream outlives the mixed phase: lead + mixed steps + tail, and the
    # measured phase (no stream ends in it, though the first started ramp_steps earlier)
    assert m.decode_tokens >= m.lead + m.mixed_steps + m.tail
    assert m.ramp_steps >= math.ceil(m.decodes * m.decode_context / planmod.MIXED_BATCHED_TOKENS)
    assert m.stream_tokens == m.decode_tokens + m.ramp_steps
    assert m.name == "mixed-d32x4k-p6x4k-16k-64k-e2"


def test_the_mixed_prompts_are_deterministic_fresh_and_of_the_planned_lengths():
    m = planmod.MixedWorkload()
    dec, pre = bench_serving.mixed_prompts(m, 8192)
    dec2, pre2 = bench_serving.mixed_prompts(m, 8192)
    assert dec == dec2 and pre == pre2
    assert len(dec) == m.decodes and all(len(p) == m.decode_context for p in dec)
    assert [(s, len(p)) for s, p in pre] == m.arrivals()
    firsts = {tuple(p[:64]) for p in dec} | {tuple(p[:64]) for _, p in pre}
    assert len(firsts) == m.decodes + len(pre), "two prompts share a prefix (the prefix cache would serve it)"
    assert all(3 <= t < 8192 for p in dec for t in p)


# ------------------------------------------------------------------ the deep plan

def test_the_deep_plan_runs_the_mixed_workload_on_the_deep_models_only():
    plan = planmod.build_plan(**planmod.DEEP_ARGS)
    assert [e.name for e in plan.engines] == [
        f"{m}-{kv}kv-{s}" for m in ("glm5-deep", "deepseek-v32-deep") for kv in ("bf16", "fp8")
        for s in ("upstream", "ours")]
    assert plan.workloads == () and [w.name for w in plan.all_workloads()] == [plan.mixed[0].name]
    assert plan.plan_id() != planmod.build_plan().plan_id()
    assert "mixed" not in planmod.build_plan().to_json(), "the first run's plan id must not move"
    assert "plan 6f1193473bc85505" in (BENCH / "README.md").read_text()
    assert planmod.build_plan().plan_id() == "6f1193473bc85505"
    assert plan.batches() == [1, 32] and plan.max_num_seqs() >= 32 + 6
    with pytest.raises(planmod.PlanError, match="no workloads"):
        planmod.build_plan(contexts=[], mixed=[])
    with pytest.raises(planmod.PlanError, match="unknown mixed"):
        planmod.build_plan(mixed=["bursty"])
    with pytest.raises(planmod.PlanError, match="does not fit an H200"):
        planmod.build_plan(models=["glm5-deep"])  # 64 x 64k tokens x 78 layers


def test_the_deep_calls_fit_the_call_limit_and_are_split_into_sessions():
    plan = planmod.build_plan(**planmod.DEEP_ARGS)
    cost = planmod.CostModel()
    est = planmod.pack_calls(plan, cost)
    assert all(t <= planmod.CALL_BUDGET_S for t in est.call_s)
    assert sorted({n.split("[")[0] for c in est.calls for n in c}) == sorted(e.name for e in plan.engines)
    ses = planmod.sessions(est, cost)
    assert [i for c, _ in ses for i in c] == list(range(1, len(est.calls) + 1))
    assert all(t <= planmod.SESSION_BUDGET_S for _, t in ses)
    # the deep engines start slower and their work grows with the layers
    assert est.per_engine["glm5-deep-bf16kv-ours"] > est.per_engine["deepseek-v32-deep-bf16kv-ours"]
    assert planmod.plan_tag(plan) == "deep" and planmod.plan_tag(planmod.build_plan()) == ""
    tiny_mixed = planmod.build_plan(**dict(planmod.DEEP_ARGS, models=planmod.MODELS))
    assert planmod.plan_tag(tiny_mixed) == "mixed" and tiny_mixed.plan_id() != plan.plan_id()
    calls = planmod.device_calls(est, run_args="--deep", tag=planmod.plan_tag(plan))
    assert all(".e2e/serving-state-deep" in c and c.endswith("BENCH_TAG=deep bash bench/serving/device-run.sh run "
                                                               "--deep") for c in calls[planmod.N_PIECES - 1:])
    out = subprocess.run([sys.executable, str(BENCH / "plan.py"), "--deep"], capture_output=True, text=True,
                         check=True).stdout
    for line in calls:
        assert line in out
    assert "GPU memory, glm5-deep (78 layers)" in out and "sessions" in out


def test_the_deep_engine_arguments():
    dry = json.loads(subprocess.run([sys.executable, str(BENCH / "bench_serving.py"), *DEEP_SMALL, "--dry-run"],
                                    capture_output=True, text=True, check=True).stdout)
    assert [e["name"] for e in dry["engines"]] == ["glm5-deep-bf16kv-upstream", "glm5-deep-bf16kv-ours"]
    for e in dry["engines"]:
        kw = e["llm_kwargs"]
        assert kw["model"].endswith("tests/e2e/models/glm5-deep")
        assert kw["max_num_batched_tokens"] == 8192 and kw["enable_logging_iteration_details"] is True
        assert kw["compilation_config"]["cudagraph_capture_sizes"] == [1, 32]
        assert kw["kv_cache_memory_bytes"] == planmod.kv_cache_bytes(planmod.build_plan(**planmod.DEEP_ARGS),
                                                                     "glm5-deep")
        assert "speculative_config" not in kw
        assert e["workloads"] == [planmod.MixedWorkload().name] and e["profiles"] == []
    same = {json.dumps({k: v for k, v in s["llm_kwargs"].items() if k != "attention_config"}, sort_keys=True)
            for s in dry["engines"]}
    assert len(same) == 1
    default = bench_serving.engine_kwargs(planmod.build_plan().engines[0], planmod.build_plan(), "t")
    assert "max_num_batched_tokens" not in default and "enable_logging_iteration_details" not in default


# ------------------------------------------------------------------ step figures, host share

def _step(phase, ms, ctx, gen=32, pending=None):
    return {"phase": phase, "step_s": ms / 1e3, "ctx_tokens": ctx, "gen_reqs": gen,
            "prefill_pending": bool(ctx) if pending is None else pending}


def test_step_figures_split_mixed_and_decode_steps_of_the_measured_phase():
    steps = ([_step("ramp", 90.0, 8192, 4)] + [_step("measure", 4.0, 0)] * 9 + [_step("measure", 5.0, 0)]
             + [_step("measure", float(ms), 8160) for ms in range(40, 60)] + [_step("after", 1.0, 0)]
             + [{"phase": "measure", "step_s": None, "ctx_tokens": 8192, "gen_reqs": 0, "prefill_pending": True}])
    f = metrics.step_figures(steps)
    assert f["classified_by"] == "iteration_details" and f["measured_steps"] == 30
    assert f["decode_steps"] == 10 and f["mixed_steps"] == 20
    assert f["decode_step_p50_ms"] == pytest.approx(4.0) and f["decode_step_p90_ms"] == pytest.approx(4.1)
    assert f["mixed_step_p50_ms"] == pytest.approx(49.5) and f["mixed_step_p90_ms"] == pytest.approx(57.1)
    assert f["mixed_ctx_tokens_mean"] == 8160 and f["decode_gen_reqs_mean"] == 32
    # without iteration details the driver's flag (a prefill queued or running) decides
    bare = [dict(s, ctx_tokens=None) for s in steps]
    g = metrics.step_figures(bare)
    assert g["classified_by"] == "prefill_pending" and (g["mixed_steps"], g["decode_steps"]) == (20, 10)
    none = metrics.step_figures([_step("measure", 4.0, 0)])
    assert none["mixed_steps"] == 0 and math.isnan(none["mixed_step_p50_ms"])


def test_the_recorder_keeps_one_entry_per_engine_step():
    rec = bench_serving._StepRecorder()
    details = types.SimpleNamespace(num_ctx_tokens=8160, num_ctx_requests=1, num_generation_requests=32,
                                    iteration_index=7, elapsed_ms=3.0)
    stats = types.SimpleNamespace(iteration_details=details)
    it = types.SimpleNamespace(inter_token_latencies_iter=[0.041, 0.040, 0.040])
    rec.record(stats, it)
    assert rec.steps == []  # off until the mixed driver turns it on
    rec.steps_on, rec.phase, rec.pending = True, "measure", True
    rec.record(stats, it)
    rec.record(types.SimpleNamespace(), types.SimpleNamespace(inter_token_latencies_iter=[]))
    assert rec.steps[0] == {"phase": "measure", "step_s": 0.040, "n_itl": 3, "ctx_tokens": 8160, "ctx_reqs": 1,
                            "gen_reqs": 32, "iteration": 7, "wait_ms": 3.0, "prefill_pending": True}
    assert rec.steps[1]["step_s"] is None and rec.steps[1]["ctx_tokens"] is None


def test_the_host_share_is_the_gpus_idle_share_of_the_profiled_steps():
    # 2 steps of 100 µs: 60 µs of kernels each (two overlapping), 40 µs idle
    ev = []
    for t in (0.0, 100.0):
        ev += [("_sparse_mla_fwd_kernel", t, 30.0), ("_sparse_mla_merge_kernel", t + 10.0, 25.0),
               ("_paged_mqa_logits_kernel", t + 50.0, 10.0), ("persistent_topk_kernel", t + 70.0, 5.0),
               ("nvjet_gemm", t + 80.0, 10.0 if t else 20.0)]
    out = pb.breakdown(ev, 2)
    busy = (35 + 10 + 5 + 20) + (35 + 10 + 5 + 10)
    assert out["gpu_us_per_step"] == pytest.approx(busy / 2)
    assert out["span_us_per_step"] == pytest.approx(190.0 / 2)
    assert out["gpu_idle_share"] == pytest.approx((190.0 - busy) / 190.0)
    assert out["idle_us_per_step"] == pytest.approx((190.0 - busy) / 2)


# ------------------------------------------------------------------ the driver, on a stand-in loop

class _Out:
    def __init__(self, rid, n, finished):
        self.request_id, self.finished = rid, finished
        self.outputs = [types.SimpleNamespace(token_ids=list(range(n)))]


class _Loop:
    """A stand-in for vLLM's LLMEngine: FCFS, a token budget per step, decode streams
    scheduled first; it calls the stat logger once per step as vLLM does."""

    def __init__(self, recorder, budget=8192, step_s=0.004):
        self.reqs: dict[str, dict] = {}
        self.recorder, self.budget, self.step_s = recorder, budget, step_s
        self.log: list[tuple] = []  # (step, event, request, prompt length)
        self.n = 0

    def add_request(self, rid, prompt, params):
        self.reqs[rid] = {"left": len(prompt["prompt_token_ids"]), "max": params.max_tokens, "out": 0}
        self.log.append((self.n, "add", rid, len(prompt["prompt_token_ids"])))

    def has_unfinished_requests(self):
        return any(r["out"] < r["max"] for r in self.reqs.values())

    def step(self):
        self.n += 1
        budget, outs, ctx, gen = self.budget, [], 0, 0
        live = [(k, r) for k, r in self.reqs.items() if r["out"] < r["max"]]
        for k, r in [x for x in live if x[1]["left"] == 0] + [x for x in live if x[1]["left"] > 0]:
            if budget <= 0:
                break
            if r["left"] == 0:
                r["out"] += 1
                budget -= 1
                gen += 1
            else:
                take = min(r["left"], budget)
                r["left"] -= take
                budget -= take
                ctx += take
                if r["left"]:
                    continue
                r["out"] += 1
            outs.append(_Out(k, r["out"], r["out"] >= r["max"]))
        self.recorder.record(types.SimpleNamespace(iteration_details=types.SimpleNamespace(
            num_ctx_tokens=ctx, num_ctx_requests=0, num_generation_requests=gen, iteration_index=self.n,
            elapsed_ms=1.0)), types.SimpleNamespace(inter_token_latencies_iter=[self.step_s * (1 + ctx / 8192)] * gen))
        return outs


def test_the_mixed_driver_adds_each_prefill_at_its_decode_step_and_profiles_the_mixed_phase(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(
        SamplingParams=lambda **kw: types.SimpleNamespace(**kw)))
    rec = bench_serving._StepRecorder()
    loop = _Loop(rec)
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    prof = []

    class LLM:
        llm_engine = loop

        def start_profile(self):
            prof.append(("start", loop.n))

        def stop_profile(self):
            prof.append(("stop", loop.n))
            ev = [{"ph": "X", "cat": "kernel", "name": n, "ts": 10.0 * i, "dur": 6.0}
                  for i, n in enumerate(["_sparse_mla_fwd_kernel", "_mqa_logits_kernel", "FilteredTopK", "gemm"] * 8)]
            with gzip.open(trace_dir / "w0.pt.trace.json.gz", "wt") as f:
                json.dump({"traceEvents": ev}, f)

    m = planmod.MixedWorkload(decodes=4, decode_context=4096, prefills=(4096, 16384, 65536), every=2, lead=4, tail=4)
    figures, profile = bench_serving.run_mixed(LLM(), rec, m, 8192, trace_dir, tmp_path / "keep",
                                               deadline=float("inf"))
    decode_ids = {r for _, e, r, n in loop.log if e == "add" and n == 4096 and r.split("-")[-1].startswith("d")}
    assert len(decode_ids) == 4
    adds = [(s, n) for s, e, r, n in loop.log if e == "add" and "-p" in r]
    first_decode = min(s for s, e, r, n in loop.log if e == "add" and "-p" in r) - m.lead  # step of token 1
    assert [(s - first_decode, n) for s, n in adds] == m.arrivals(), "a prefill came at another decode step"
    assert all(loop.reqs[r]["max"] == 1 for _, e, r, _ in loop.log if "-p" in r)
    assert prof[0] == ("start", adds[0][0]), "the profile must start at the first arrival"
    assert figures["mixed_steps"] >= math.ceil(sum(m.prefills) / (8192 - 4)) - 1
    assert figures["decode_steps"] >= m.lead + m.tail - 2
    measured = [s for s in rec.steps if s["phase"] == "measure"]
    assert len(measured) == m.decode_tokens - 1 == figures["measured_steps"]
    assert all(s["gen_reqs"] == m.decodes for s in measured), "a decode stream ended inside the measured phase"
    assert all(loop.reqs[r]["max"] == m.stream_tokens for r in decode_ids)
    assert figures["mixed_step_p50_ms"] > figures["decode_step_p50_ms"]
    assert figures["arrivals"] == [[a, n] for a, n in m.arrivals()]
    assert all(x is not None and x >= 0 for x in figures["prefill_latency_s"]), "a prefill never finished"
    assert profile["ok"] and profile["gpu_idle_share"] == pytest.approx(0.4, abs=0.01)
    assert (tmp_path / "keep" / f"{m.name}.pt.trace.json.gz").is_file()


# ------------------------------------------------------------------ the runner and the report

@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_serving, "engine_main", fake_engine.engine_main)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.log"))
    monkeypatch.setenv("FAKE_MODE", "ok")
    return tmp_path


def test_a_deep_run_records_the_mixed_workload_and_reports_step_time_and_host_share(fake):
    code = bench_serving.main(["--out", str(fake / "out"), "--state-dir", str(fake / "m"),
                               "--carried-state", str(fake / "none"), *DEEP_SMALL])
    assert code == bench_serving.EXIT_OK
    plan = planmod.build_plan(**dict(planmod.DEEP_ARGS, models=["glm5-deep"], kv_caches=["bf16"]))
    state = st.load(fake / "m", plan)
    assert st.pending(state, plan) == []
    name = planmod.MixedWorkload().name
    assert {k for k in state["items"]} == {f"glm5-deep-bf16kv-{s}/{name}" for s in ("upstream", "ours")}
    res = report.results_from_state(state, command="cmd")
    assert res["rows"] == [] and res["profiles"] == []
    up, ours = res["mixed"]
    assert (up["side"], ours["side"], up["layers"]) == ("upstream", "ours", 78)
    assert up["mixed_steps"] == 22 and up["decode_steps"] == 16 and up["classified_by"] == "iteration_details"
    assert up["host_share"] == pytest.approx(0.25) and ours["host_share"] == pytest.approx(21 / 52, abs=1e-4)
    assert ours["mixed_step_p50_ms"] > up["mixed_step_p50_ms"]
    md = report.markdown(res)
    assert "### Mixed workload: engine step time and its host share" in md
    assert f"| glm5-deep (78) | bf16 | {name} | 41.05 | 53.05 | 1.29 |" in md
    assert "| 25% | 40% |" in md
    report.write_all(res, fake / "rep")
    assert not (fake / "rep" / report.PLOT_NAME).exists(), "no throughput rows: no plot"
    assert report.validate(json.loads((fake / "rep" / "results.json").read_text()))


@pytest.mark.parametrize("change,msg", [
    (lambda r: r.update(host_share=1.5), "outside"), (lambda r: r.pop("layers"), "missing"),
    (lambda r: r.update(side="ref"), "side"), (lambda r: r.update(mixed_step_p90_ms=1.0), "p90_ms <"),
    (lambda r: r.update(decode_step_p50_ms=-2.0), "valid float")])
def test_a_bad_mixed_row_is_refused(change, msg):
    row = {"model": "glm5-deep", "side": "ours", "kv_cache": "bf16", "workload": "w", "layers": 78,
           "mixed_steps": 20, "mixed_step_p50_ms": 40.0, "mixed_step_p90_ms": 45.0, "decode_steps": 16,
           "decode_step_p50_ms": 4.0, "decode_step_p90_ms": 4.5, "classified_by": "iteration_details",
           "host_share": 0.3, "gpu_busy_us_per_step": 28000.0, "profiled_step_us": 40000.0}
    assert report.validate({"rows": [], "mixed": [dict(row)]})
    assert report.validate({"rows": [], "mixed": [dict(row, host_share=None, profiled_step_us=None)]})
    change(row)
    with pytest.raises(report.ResultsError, match=msg):
        report.validate({"rows": [], "mixed": [row]})


def test_the_readme_documents_the_deep_plan_as_the_code_makes_it():
    readme = (BENCH / "README.md").read_text()
    plan = planmod.build_plan(**planmod.DEEP_ARGS)
    est = planmod.pack_calls(plan)
    for line in planmod.device_calls(est, run_args="--deep", tag="deep"):
        assert line in readme, f"README lacks the deep device call: {line}"
    assert f"plan {plan.plan_id()}" in readme and f"{est.device_s:.0f} s" in readme
    # Measured rows (deep/results.json) are in the README's table, figure for figure; none: it
    # says the deep run has not been made.
    measured = BENCH / "deep" / "results.json"
    if not measured.is_file():
        assert "not run yet" in readme.lower()
        return
    rows = json.loads(measured.read_text())["mixed"]
    assert rows
    for r in rows:
        for key in ("mixed_step_p50_ms", "mixed_step_p90_ms"):
            assert f"{r[key]:,.1f}" in readme, (r["side"], key)
        assert f"{r['decode_step_p50_ms']:.2f}" in readme, (r["side"], "decode_step_p50_ms")


def test_the_pinned_vllm_has_what_the_mixed_driver_calls(vllm_tree):
    """LLMEngine.add_request / step / has_unfinished_requests, the iteration details the
    engine core attaches to every step's stats, and the engine argument switching them on."""
    src = (vllm_tree / "vllm/v1/engine/llm_engine.py").read_text()
    for sig in ("def add_request(", "def step(self)", "def has_unfinished_requests(self)",
                "iteration_stats=iteration_stats"):
        assert sig in src, sig
    stats = (vllm_tree / "vllm/v1/metrics/stats.py").read_text()
    for field in ("num_ctx_tokens: int", "num_generation_requests: int", "iteration_index: int",
                  "iteration_details: SchedulerIterationDetails | None"):
        assert field in stats, field
    assert "enable_logging_iteration_details: bool" in (vllm_tree / "vllm/engine/arg_utils.py").read_text()
    core = (vllm_tree / "vllm/v1/engine/core.py").read_text()
    assert core.count("self._attach_iteration_details(engine_core_outputs, iteration_details)") >= 2
