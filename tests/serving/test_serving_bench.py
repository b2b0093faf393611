"""CPU tests of the serving benchmark harness (bench/serving): plan and device calls, engine
arguments, the resumable manifest (runner driven end to end with a stand-in engine process),
the figures, the profile breakdown, results.json + table + plot, the GLM-5 share calculator.

The GPU run itself is `make bench-e2e-pieces` on the lent H200 (`make bench-e2e` on one's own
CUDA machine; bench/serving/README.md).
"""
from __future__ import annotations

import ast
import gzip
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "serving"
FIX = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_serving  # noqa: E402
import fake_engine  # noqa: E402
import glm5_share  # noqa: E402
import keep_state  # noqa: E402
import metrics  # noqa: E402
import plan as planmod  # noqa: E402
import profile_breakdown as pb  # noqa: E402
import report  # noqa: E402
import state as st  # noqa: E402

SMALL = ["--models", "glm5-tiny", "--kv-caches", "bf16", "--contexts", "4096", "65536", "--batches", "1", "64"]


# ------------------------------------------------------------------------- plan

def test_default_plan_is_the_issue_matrix_in_priority_order():
    plan = planmod.build_plan()
    assert [e.name for e in plan.engines] == [
        "glm5-tiny-bf16kv-upstream", "glm5-tiny-bf16kv-ours", "glm5-tiny-fp8kv-upstream", "glm5-tiny-fp8kv-ours",
        "deepseek-v32-tiny-bf16kv-upstream", "deepseek-v32-tiny-bf16kv-ours",
        "deepseek-v32-tiny-fp8kv-upstream", "deepseek-v32-tiny-fp8kv-ours"]
    assert [(w.context, w.batch, w.output_len) for w in plan.workloads] == [
        (c, b, 256) for c in (4096, 16384, 65536) for b in (1, 16, 64)]
    assert {(e.side, e.kv_cache): (e.backend, e.indexer) for e in plan.engines} == {
        ("upstream", "bf16"): ("FLASH_ATTN_MLA_SPARSE", "deepgemm"),
        ("upstream", "fp8"): ("FLASHMLA_SPARSE", "deepgemm"),
        ("ours", "bf16"): ("TRITON_MLA_SPARSE", "triton"), ("ours", "fp8"): ("TRITON_MLA_SPARSE", "triton")}
    assert [w.name for w in plan.profiles_for(plan.engines[0])] == ["c65536-b64"]
    assert planmod.build_plan(profile_batches=(1, 64, 128)).profile_batches == (1, 64)
    assert planmod.max_model_len(plan) >= 65536 + 256
    # the KV budget holds the largest batch at full length: latent 576 x 2 B + indexer keys 132 B, 3 layers
    assert planmod.kv_cache_bytes(plan) >= 64 * (65536 + 256) * 3 * (1152 + 132)


def test_plan_id_is_stable_and_follows_the_work():
    a, b = planmod.build_plan(), planmod.build_plan()
    assert a.plan_id() == b.plan_id()
    assert planmod.build_plan(batches=[1, 16]).plan_id() != a.plan_id()
    assert planmod.build_plan(output_len=128).plan_id() != a.plan_id()


@pytest.mark.parametrize("kw,msg", [({"models": ["llama"]}, "unknown models"), ({"sides": ["ours", "ours"]}, "repeated"),
                                    ({"sides": []}, "no sides"), ({"output_len": 1}, "output_len"),
                                    ({"batches": [0]}, "positive")])
def test_bad_plans_are_refused_clearly(kw, msg):
    with pytest.raises(planmod.PlanError, match=msg):
        planmod.build_plan(**kw)


def test_the_calls_fit_the_call_limit_and_the_whole_run_the_session_budget():
    plan = planmod.build_plan()
    cost = planmod.CostModel()
    est = planmod.pack_calls(plan, cost)
    assert all(t <= planmod.CALL_BUDGET_S for t in est.call_s)
    assert planmod.CALL_BUDGET_S + 30 <= planmod.CALL_LIMIT_S
    named = [n.split("[")[0] for c in est.calls for n in c]
    assert sorted(set(named)) == sorted(e.name for e in plan.engines)
    assert est.device_s <= planmod.SESSION_BUDGET_S, "the plan no longer fits 30 device minutes (README)"
    assert est.call_s[0] >= cost.install_s


def test_an_engine_longer_than_a_call_is_split_at_workloads():
    cost = planmod.CostModel(start_s=420.0)
    est = planmod.pack_calls(planmod.build_plan(models=["glm5-tiny"], kv_caches=["bf16"], sides=["ours"]), cost)
    assert len(est.calls) >= 2 and all("[" in c[0] for c in est.calls)
    assert all(t <= planmod.CALL_BUDGET_S for t in est.call_s)


def test_device_calls_stage_then_run_with_the_manifest_carried():
    est = planmod.pack_calls(planmod.build_plan())
    calls = planmod.device_calls(est)
    assert calls[0].startswith("run(kind=nvidia-h200, carry=[.e2e/manifest.json, .e2e/pieces/01]")
    assert calls[1] == "run(carry=[.e2e/manifest.json, .e2e/pieces/02]): bash bench/serving/device-run.sh stage"
    first_run = planmod.N_PIECES - 1  # one staging call per piece but the last
    assert all("device-run.sh stage" in c for c in calls[:first_run])
    assert f".e2e/pieces/{planmod.N_PIECES:02d}" in calls[first_run] and "device-run.sh run" in calls[first_run]
    assert all(".e2e/serving-state" in c and "timeout_s=600" in c for c in calls[first_run:])
    assert len(calls) == planmod.N_PIECES - 1 + len(est.calls)


def test_the_readme_shows_the_plan_the_code_makes():
    readme = (BENCH / "README.md").read_text()
    est = planmod.pack_calls(planmod.build_plan())
    for line in planmod.device_calls(est):
        assert line in readme, f"README lacks the device call: {line}"
    assert f"{est.device_s:.0f} s" in readme
    plan_cli = subprocess.run([sys.executable, str(BENCH / "plan.py")], capture_output=True, text=True, check=True)
    assert f"estimated device time: {est.device_s:.0f} s" in plan_cli.stdout


def test_make_targets_run_the_bench_scripts():
    mk = (REPO / "Makefile").read_text()
    assert re.search(r"^bench-e2e-pieces:\n\tbash bench/serving/device-run.sh run \$\(BENCH_E2E_ARGS\)", mk, re.M)
    assert re.search(r"^bench-e2e:\n\t\$\(GPU_ENV\) bash tools/gpu-local.sh bench-e2e \$\(BENCH_E2E_ARGS\)", mk, re.M)
    for target in ("bench-e2e-plan", "bench-e2e-keep", "bench-e2e-report", "bench-e2e-share"):
        assert re.search(rf"^{target}:", mk, re.M), target


# ------------------------------------------------------------- engine arguments

def test_engine_arguments_graphs_on_mtp_off_forced_kernels():
    out = subprocess.run([sys.executable, str(BENCH / "bench_serving.py"), "--dry-run"], capture_output=True,
                         text=True, check=True)
    dry = json.loads(out.stdout)
    assert dry["driver"] == "vllm.benchmarks.throughput._run_vllm_requests"
    plan = planmod.build_plan()
    assert dry["plan_id"] == plan.plan_id(), "the runner's default plan is not plan.py's"
    assert [e["name"] for e in dry["engines"]] == [e.name for e in plan.engines]
    for e, spec in zip(plan.engines, dry["engines"]):
        kw = spec["llm_kwargs"]
        assert kw["attention_config"] == {"backend": e.backend}
        assert spec["env"]["VLLM_SPARSE_INDEXER_BACKEND"] == e.indexer
        assert spec["env"]["NCCL_NVLS_ENABLE"] == "0"
        assert "speculative_config" not in kw, "MTP must be off"
        assert not kw.get("enforce_eager") and "cudagraph_mode" not in kw["compilation_config"]
        assert kw["compilation_config"]["cudagraph_capture_sizes"] == [1, 16, 64]
        assert kw.get("kv_cache_dtype", "auto") == ("fp8" if e.kv_cache == "fp8" else "auto")
        assert kw["enable_prefix_caching"] and kw["disable_log_stats"] is False
        assert kw["load_format"] == "e2e_dummy" and kw["dtype"] == "bfloat16"
        assert kw["model"].endswith(f"tests/e2e/models/{e.model}")
        prof = kw["profiler_config"]
        assert prof["profiler"] == "torch" and prof["delay_iterations"] >= 2 and prof["max_iterations"] >= 1
    same = {json.dumps({k: v for k, v in s["llm_kwargs"].items() if k not in ("attention_config", "kv_cache_dtype")},
                       sort_keys=True) for s in dry["engines"] if "glm5" in s["name"]}
    assert len(same) == 1, "both sides of a model must get the same engine arguments but the kernels"


def test_prompts_are_deterministic_random_ids_in_the_vocabulary():
    a = bench_serving.make_prompts(8192, 4096, 2, "measure")
    assert a == bench_serving.make_prompts(8192, 4096, 2, "measure")
    assert len(a) == 2 and all(len(p) == 4096 for p in a) and a[0] != a[1]
    assert min(min(p) for p in a) >= 3 and max(max(p) for p in a) < 8192
    assert a[0] != bench_serving.make_prompts(8192, 4096, 2, "warmup")[0]


def _probe(backend, logits, kv="bfloat16"):
    return [{"attention_backends": [backend], "indexer_logits": [logits, "why"], "kv_cache_dtypes": [kv]}]


def test_probe_failures_catch_wrong_kernels_caches_and_missing_graphs():
    ours = planmod.Engine("glm5-tiny", "bf16", "ours")
    graphs = [{"cudagraph_mode": "CUDAGraphMode.FULL_AND_PIECEWISE"}]
    assert bench_serving.probe_failures(ours, _probe("TRITON_MLA_SPARSE", "triton"), graphs) == []
    assert bench_serving.probe_failures(ours, _probe("FLASH_ATTN_MLA_SPARSE", "triton"), graphs)
    assert bench_serving.probe_failures(ours, _probe("TRITON_MLA_SPARSE", "deepgemm"), graphs)
    assert bench_serving.probe_failures(ours, _probe("TRITON_MLA_SPARSE", "triton"),
                                        [{"cudagraph_mode": "CUDAGraphMode.NONE"}])
    up8 = planmod.Engine("glm5-tiny", "fp8", "upstream")
    assert bench_serving.probe_failures(up8, _probe("FLASHMLA_SPARSE", "deepgemm", "fp8_ds_mla"), graphs) == []
    assert bench_serving.probe_failures(up8, _probe("FLASHMLA_SPARSE", "deepgemm", "bfloat16"), graphs)


def test_the_pinned_vllm_has_what_the_runner_calls(vllm_tree):
    """The private entry point and the interfaces the runner uses, in the pinned tree."""
    src = (vllm_tree / "vllm/benchmarks/throughput.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_run_vllm_requests")
    assert [a.arg for a in fn.args.args] == ["llm", "requests", "n", "disable_detokenize", "do_profile",
                                             "prequeue_requests", "enable_lora"]
    ds = (vllm_tree / "vllm/benchmarks/datasets/datasets.py").read_text()
    for field in ("prompt:", "prompt_len: int", "expected_output_len: int"):
        assert field in ds
    stats = (vllm_tree / "vllm/v1/metrics/stats.py").read_text()
    assert "self.inter_token_latencies_iter" in stats and "first_token_ts" in stats
    assert "self.stat_loggers" in (vllm_tree / "vllm/v1/metrics/loggers.py").read_text()
    prof = (vllm_tree / "vllm/config/profiler.py").read_text()
    for field in ("delay_iterations", "max_iterations", "ignore_frontend", "torch_profiler_with_stack",
                  "torch_profiler_use_gzip", "torch_profiler_record_shapes", "torch_profiler_dir"):
        assert re.search(rf"^    {field}: ", prof, re.M), field
    assert "profiler_config:" in (vllm_tree / "vllm/entrypoints/llm.py").read_text()
    assert "num_cached_tokens" in (vllm_tree / "vllm/outputs.py").read_text()


def test_the_bench_device_script_installs_exactly_as_the_e2e_one():
    """Both device scripts take the bundle, install and environment from the one
    sourced setup, and neither installs anything itself."""
    e2e = (REPO / "tests/e2e/device-run.sh").read_text()
    ours = (BENCH / "device-run.sh").read_text()
    for text in (e2e, ours):
        assert 'source tests/e2e/device-setup.sh "$mode"' in text
        assert "pip install" not in text and "device_pieces.py assemble" not in text
    setup = (REPO / "tests/e2e/device-setup.sh").read_text()
    assert "device_pieces.py stage" in setup and "device_pieces.py assemble" in setup
    assert "--deadline $((t0 + budget))" in ours and "BENCH_BUDGET_S:-560" in ours
    for script in (BENCH / "device-run.sh", REPO / "tests/e2e/device-run.sh",
                   REPO / "tests/e2e/device-setup.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


# ----------------------------------------------------- the runner, resumable

@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_serving, "engine_main", fake_engine.engine_main)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.log"))
    monkeypatch.setenv("FAKE_MODE", "ok")
    return tmp_path


def _run(tmp: Path, *extra: str, machine: str = "m1", out: str = "out", carried: str = "none") -> int:
    return bench_serving.main(["--out", str(tmp / out), "--state-dir", str(tmp / machine),
                               "--carried-state", str(tmp / carried), *SMALL, *extra])


def _spans(log: Path) -> list[tuple[float, float]]:
    starts, spans = {}, []
    for ln in log.read_text().splitlines():
        what, name, t = ln.split()
        if what == "start":
            starts[name] = float(t)
        else:
            spans.append((starts.pop(name), float(t)))
    return sorted(spans)


def test_a_full_run_does_every_item_one_engine_at_a_time(fake):
    assert _run(fake) == bench_serving.EXIT_OK
    plan = planmod.build_plan(["glm5-tiny"], ["bf16"], planmod.SIDES, [4096, 65536], [1, 64])
    state = st.load(fake / "m1", plan)
    assert state == st.load(fake / "out", plan)
    assert len(state["items"]) == 2 * 4 and len(state["profiles"]) == 2
    assert st.pending(state, plan) == []
    spans = _spans(fake / "fake.log")
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], "two engines ran at once"
    assert [c["exit"] for c in state["calls"]] == [0]


def test_a_call_stops_before_an_engine_that_cannot_finish_and_the_next_resumes(fake, monkeypatch):
    monkeypatch.setenv("FAKE_INIT_S", "600")  # measured start-up: the second engine no longer fits
    assert _run(fake) == bench_serving.EXIT_MORE
    plan = planmod.build_plan(["glm5-tiny"], ["bf16"], planmod.SIDES, [4096, 65536], [1, 64])
    first = st.load(fake / "m1", plan)
    assert {k.split("/")[0] for k in first["items"]} == {"glm5-tiny-bf16kv-upstream"}
    monkeypatch.setenv("FAKE_INIT_S", "1")
    monkeypatch.setattr(bench_serving, "start_estimate", lambda state, engine=None: 1.0)
    assert _run(fake) == bench_serving.EXIT_OK
    done = st.load(fake / "m1", plan)
    assert len(done["items"]) == 8 and [c["call"] for c in done["calls"]] == [1, 2]
    assert all(done["items"][k]["call"] == 1 for k in first["items"]), "done work was run again"
    assert {done["items"][k]["call"] for k in done["items"] if k not in first["items"]} == {2}


def test_a_cold_machine_resumes_from_the_carried_manifest(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "die-after-one")
    assert _run(fake) == bench_serving.EXIT_MORE
    keep_state.keep(fake / "out", fake / "carried")
    monkeypatch.setenv("FAKE_MODE", "ok")
    assert _run(fake, machine="m2", out="out2", carried="carried") == bench_serving.EXIT_OK
    plan = planmod.build_plan(["glm5-tiny"], ["bf16"], planmod.SIDES, [4096, 65536], [1, 64])
    state = st.load(fake / "out2", plan)
    assert len(state["items"]) == 8 and [c["call"] for c in state["calls"]] == [1, 2]


def test_a_manifest_of_another_plan_is_refused(fake, capsys):
    assert _run(fake) == bench_serving.EXIT_OK
    code = bench_serving.main(["--out", str(fake / "o"), "--state-dir", str(fake / "m1"),
                               "--carried-state", str(fake / "none"), "--batches", "1"])
    assert code == bench_serving.EXIT_USAGE
    assert "belongs to plan" in capsys.readouterr().err


def test_an_engine_on_the_wrong_kernels_stops_the_call_and_stays_failed(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "bad-kernels")
    assert _run(fake) == bench_serving.EXIT_FAILED
    plan = planmod.build_plan(["glm5-tiny"], ["bf16"], planmod.SIDES, [4096, 65536], [1, 64])
    state = st.load(fake / "m1", plan)
    assert list(st.failed(state)) == ["glm5-tiny-bf16kv-upstream"] and not state["items"]
    assert len(_spans(fake / "fake.log")) == 1, "the call went on after a failed engine"
    monkeypatch.setenv("FAKE_MODE", "ok")
    assert _run(fake) == bench_serving.EXIT_FAILED  # ours runs, the failed one is skipped
    assert len(st.load(fake / "m1", plan)["items"]) == 4
    assert _run(fake, "--retry-failed") == bench_serving.EXIT_OK


def test_an_engine_process_that_dies_is_reported(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash")
    assert _run(fake) == bench_serving.EXIT_FAILED
    state = st.load(fake / "m1")
    assert "without starting an engine" in st.failed(state)["glm5-tiny-bf16kv-upstream"]


def test_an_engine_still_running_at_the_deadline_is_killed_and_its_work_kept(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setattr(bench_serving, "KILL_MARGIN_S", 2.0)
    monkeypatch.setattr(bench_serving, "engine_estimate", lambda *a: 1.0)
    t = time.time()
    assert _run(fake, "--deadline", str(time.time() + 6)) == bench_serving.EXIT_MORE
    assert time.time() - t < 30
    state = st.load(fake / "m1")
    start = state["engines"]["glm5-tiny-bf16kv-upstream"]["starts"][0]
    assert start["killed"] and start["error"] is None and not st.failed(state)
    core = int(next((fake / "m1" / "engines").glob("*/core.pid")).read_text())
    assert not Path(f"/proc/{core}").exists() or "Z" in Path(f"/proc/{core}/stat").read_text().split()[2], \
        "the engine's own child process outlived the kill"


def test_a_fresh_call_starts_an_engine_too_long_for_it_and_refuses_one_that_cannot_start(fake, monkeypatch, capsys):
    monkeypatch.setattr(bench_serving, "engine_estimate", lambda *a: 10_000.0)
    assert _run(fake) == bench_serving.EXIT_MORE  # the first engine ran, the second waits
    assert {k.split("/")[0] for k in st.load(fake / "m1")["items"]} == {"glm5-tiny-bf16kv-upstream"}
    monkeypatch.setattr(bench_serving, "start_estimate", lambda state, engine=None: 10_000.0)
    assert _run(fake) == bench_serving.EXIT_FAILED
    assert "even a start with one workload needs" in capsys.readouterr().out


def test_the_resolved_config_never_fails():
    class C:
        pass

    cfg = C()
    cfg.scheduler_config = C()
    cfg.scheduler_config.max_num_batched_tokens = 16384
    cfg.compilation_config = C()
    cfg.compilation_config.cudagraph_mode = object()
    out = bench_serving.resolved_config(cfg)
    assert out["max_num_batched_tokens"] == 16384 and out["block_size"] is None
    assert isinstance(out["cudagraph_mode"], str)


def test_merge_keeps_the_union_and_prefers_the_first():
    plan = planmod.build_plan(["glm5-tiny"], ["bf16"], ["ours"], [4096], [1])
    a, b = st.new_state(plan), st.new_state(plan)
    st.add_item(a, "e", "w1", {"v": 1})
    st.add_item(b, "e", "w1", {"v": 2})
    st.add_item(b, "e", "w2", {"v": 3})
    m = st.merge(a, b)
    assert m["items"] == {"e/w1": {"v": 1}, "e/w2": {"v": 3}}
    other = st.new_state(planmod.build_plan(["glm5-tiny"], ["bf16"], ["ours"], [4096], [16]))
    with pytest.raises(st.StateError):
        st.merge(a, other)


def test_a_torn_manifest_or_record_line_is_handled(tmp_path):
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(st.StateError, match="unreadable"):
        st.load(tmp_path)
    (tmp_path / "records.jsonl").write_text('{"kind": "warmup", "s": 1}\n{"kind": "ite')
    assert bench_serving.read_records(tmp_path / "records.jsonl") == [{"kind": "warmup", "s": 1}]


# ------------------------------------------------------------------- figures

def test_percentile_matches_numpys_default():
    np = pytest.importorskip("numpy")
    xs = [0.5, 3.0, 1.25, 7.0, 2.0, 2.0, 9.5]
    for q in (0, 1, 50, 90, 99, 100):
        assert metrics.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert math.isnan(metrics.percentile([], 50))


def test_decode_figures_from_engine_timestamps_and_itls():
    reqs = [{"first_token_ts": 10.0, "last_token_ts": 10.0 + 255 * 0.004, "num_generation_tokens": 256,
             "prompt_len": 4096, "cached_tokens": 4032} for _ in range(4)]
    itls = [0.004] * (4 * 255 - 20) + [0.010] * 20
    d = metrics.decode_figures(reqs, itls, elapsed_s=1.2)
    assert d["tok_s"] == pytest.approx(4 * 255 / (255 * 0.004))
    assert d["tpot_p50_ms"] == pytest.approx(4.0) and d["tpot_p99_ms"] == pytest.approx(10.0)
    assert d["cache_hit_frac"] == pytest.approx(4032 / 4096)
    assert metrics.check_itls(itls, reqs) is None
    assert "inter-token latencies" in metrics.check_itls(itls[:-1], reqs)
    p = metrics.prefill_figures([4096] * 4, 0.5, [0] * 4)
    assert p["tok_s"] == pytest.approx(4 * 4096 / 0.5) and p["cached_tokens"] == 0
    with pytest.raises(ValueError):
        metrics.decode_figures([dict(reqs[0], num_generation_tokens=1, last_token_ts=10.0)], [], 1.0)


@pytest.mark.parametrize("name,bucket", [
    ("_sparse_mla_fwd_kernel", "attention"), ("_sparse_mla_merge_kernel", "attention"),
    ("_sparse_mla_fwd_fp8_kernel", "attention"),
    ("void flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>(...)", "attention"),
    ("void flash_fwd_splitkv_mla_kernel<...>", "attention"),
    ("_paged_mqa_logits_kernel", "indexer_logits"), ("_mqa_logits_kernel", "indexer_logits"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<...>", "indexer_logits"),
    ("void deep_gemm::smxx_paged_mqa_logits_metadata<...>", "indexer_logits"),
    ("void vllm::persistent_topk_kernel<2048u, 1u>(...)", "topk"),
    ("void cooperative_topk_cs8<2048u>(...)", "topk"), ("void vllm::topKPerRowDecode<...>", "topk"),
    ("void vllm::grouped_topk_fused_kernel<...>", "rest"), ("void vllm::moe::topkGatingSoftmax<...>", "rest"),
    ("void vllm::concat_and_cache_ds_mla_kernel<...>", "rest"),
    ("void vllm::indexer_k_quant_and_cache_kernel<...>", "rest"),
    ("_convert_req_local_to_slots_kernel", "rest"), ("_convert_req_index_to_global_index_kernel", "rest"),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NNT", "rest"), ("triton_red_fused_rms_norm_0", "rest")])
def test_kernel_names_land_in_their_bucket(name, bucket):
    assert pb.classify(name) == bucket


def _trace(path: Path, kernels: list[tuple], gap: float = 1.0) -> Path:
    """A trace of kernels back to back (gap µs apart); a kernel given as
    (name, dur, start) starts at that time instead."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 999.0}]
    t = 0.0
    for k in kernels:
        n, d = k[0], k[1]
        start = k[2] if len(k) > 2 else t
        ev.append({"ph": "X", "cat": "kernel", "name": n, "ts": start, "dur": d})
        t = max(t, start + d + gap)
    ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": t, "dur": 2.0})
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    return path


def test_a_profiled_window_gives_per_step_buckets(tmp_path):
    steps = 4
    ks = [("_sparse_mla_fwd_kernel", 30.0), ("_paged_mqa_logits_kernel", 20.0),
          ("persistent_topk_kernel", 10.0), ("nvjet_gemm", 38.0)] * steps
    out = pb.breakdown_file(_trace(tmp_path / "w.pt.trace.json.gz", ks), steps)
    assert out["ok"] and out["steps"] == steps
    assert out["buckets"]["attention"]["us_per_step"] == pytest.approx(30.0)
    assert out["buckets"]["rest"]["us_per_step"] == pytest.approx(38.0 + 2.0 / steps)
    assert sum(b["share"] for b in out["buckets"].values()) == pytest.approx(1.0)
    assert out["kernels"]["_sparse_mla_fwd_kernel"] == {"bucket": "attention", "count": 4, "us_per_step": 30.0,
                                                        "dur_us_per_step": 30.0}
    assert out["overlap_us_per_step"] == pytest.approx(0.0)
    gone = pb.breakdown_file(_trace(tmp_path / "x.pt.trace.json.gz", [("nvjet_gemm", 1.0)]), 1)
    assert not gone["ok"] and "attention" in gone["why"]
    with pytest.raises(pb.TraceError, match="no GPU kernel"):
        pb.breakdown([], 1)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(pb.TraceError):
        pb.breakdown_file(tmp_path / "bad.json", 1)


def test_overlapping_kernels_are_not_counted_twice(tmp_path):
    """A PDL-launched merge grid starts beside the main grid and waits for it: its
    trace duration covers the main kernel's; only its tail is attention time added."""
    ks = []
    t = 0.0
    for _ in range(2):
        ks += [("_sparse_mla_fwd_kernel", 57.0, t), ("_sparse_mla_merge_kernel", 59.0, t + 1.0),
               ("nvjet_gemm", 10.0, t + 61.0), ("_paged_mqa_logits_kernel", 20.0, t + 72.0),
               ("persistent_topk_kernel", 5.0, t + 93.0)]
        t += 100.0
    path = _trace(tmp_path / "p.pt.trace.json.gz", ks)
    out = pb.breakdown_file(path, 2, keep_timeline=tmp_path / "p.gpu-timeline.json.gz")
    att = out["buckets"]["attention"]["us_per_step"]
    assert att == pytest.approx(57.0 + 3.0)  # main grid + the merge's 3 µs tail, not 57 + 59
    assert out["kernels"]["_sparse_mla_merge_kernel"]["us_per_step"] == pytest.approx(3.0)
    assert out["kernels"]["_sparse_mla_merge_kernel"]["dur_us_per_step"] == pytest.approx(59.0)
    assert out["overlap_us_per_step"] == pytest.approx(56.0)
    busy = sum(b["us_per_step"] for b in out["buckets"].values())
    assert out["gpu_us_per_step"] == pytest.approx(busy) and busy == pytest.approx(60 + 10 + 20 + 5 + 1)
    # a kernel wholly inside another still counts as seen (ok), with 0 credited
    inside = pb.breakdown([("nvjet_gemm", 0.0, 50.0), ("_sparse_mla_fwd_kernel", 5.0, 10.0),
                           ("_paged_mqa_logits_kernel", 60.0, 5.0), ("topKPerRowDecode", 70.0, 1.0)], 1)
    assert inside["ok"] and inside["buckets"]["attention"]["us_per_step"] == 0.0
    # the kept timeline gives the same breakdown without the trace
    assert pb.breakdown_timeline(tmp_path / "p.gpu-timeline.json.gz") == {k: v for k, v in out.items() if k != "trace"}


# ------------------------------------------------------------ results, table, plot

def _fixture() -> dict:
    return json.loads((FIX / "results.json").read_text())


def test_the_fixture_and_a_run_manifest_give_valid_results(fake):
    assert report.validate(_fixture())
    assert _run(fake) == bench_serving.EXIT_OK
    res = report.results_from_state(st.load(fake / "m1"), command="cmd", env="H200")
    assert len(res["rows"]) == 8 and all(set(r) == set(report.ROW_FIELDS) for r in res["rows"])
    assert [r["side"] for r in res["rows"][:4]] == ["upstream"] * 4
    assert res["meta"]["command"] == "cmd" and len(res["profiles"]) == 2


@pytest.mark.parametrize("change,msg", [
    (lambda r: r.pop("tpot_p99_ms"), "missing"), (lambda r: r.update(extra=1), "unknown fields"),
    (lambda r: r.update(side="ref"), "side"), (lambda r: r.update(decode_tok_s=float("nan")), "positive finite"),
    (lambda r: r.update(prefill_tok_s=-1.0), "positive finite"), (lambda r: r.update(batch=1.5), "positive integer"),
    (lambda r: r.update(tpot_p99_ms=0.1), "tpot_p99_ms < tpot_p50_ms"), (lambda r: r.update(model=""), "non-empty")])
def test_a_bad_row_is_refused(change, msg):
    res = _fixture()
    change(res["rows"][3])
    with pytest.raises(report.ResultsError, match=msg):
        report.validate(res)


def test_a_duplicate_row_or_no_rows_list_is_refused():
    res = _fixture()
    res["rows"].append(dict(res["rows"][0]))
    with pytest.raises(report.ResultsError, match="second row"):
        report.validate(res)
    with pytest.raises(report.ResultsError):
        report.validate({"runs": []})


def test_the_table_pairs_the_sides_with_their_ratio():
    md = report.markdown(_fixture())
    assert md.count("### ") == 5  # 2 models x 2 caches + the profile table
    assert "### glm5-tiny, bf16 KV cache" in md
    assert "| 64k | 64 | 66,667 | 50,000 | 0.75 | 6,400 | 4,800 | 0.75 | 10.0 | 13.3 | 12.0 | 16.0 |" in md
    assert "| glm5-tiny | bf16 | ours | 64 | 300.0 | 200.0 | 100.0 | 400.0 | 60% |" in md
    assert md == report.markdown(_fixture())


def test_profiles_with_summed_durations_are_marked():
    """A breakdown made before overlapping kernels were credited once (no
    overlap_us_per_step) is marked in the table, with the PDL merge grid shown apart."""
    res = _fixture()
    prof = next(p for p in res["profiles"] if p["side"] == "ours")
    prof["overlap_us_per_step"] = None
    prof["top_kernels"] = {report.MERGE_KERNEL: {"bucket": "attention", "count": 3, "us_per_step": 120.0}}
    md = report.markdown(res)
    assert "| 300.0[1] |" in md and "attention without it: 180.0 µs" in md
    prof["overlap_us_per_step"] = 110.0
    assert "[1]" not in report.markdown(res)


@pytest.mark.slow  # long CPU work: two matplotlib renders
def test_the_plot_is_a_deterministic_png(tmp_path):
    pytest.importorskip("matplotlib")
    a = report.plot(_fixture(), tmp_path / "a.png").read_bytes()
    b = report.plot(_fixture(), tmp_path / "b.png").read_bytes()
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and a == b and len(a) > 20_000
    width, height = int.from_bytes(a[16:20], "big"), int.from_bytes(a[20:24], "big")
    assert (width, height) == (1680, 700)


@pytest.mark.slow  # long CPU work: report.py renders the plot in a child process
def test_the_report_cli_writes_json_table_and_plot(fake, tmp_path):
    pytest.importorskip("matplotlib")
    assert _run(fake) == bench_serving.EXIT_OK
    out = tmp_path / "rep"
    r = subprocess.run([sys.executable, str(BENCH / "report.py"), "--state", str(fake / "out" / "state.json"),
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert report.validate(json.loads((out / "results.json").read_text()))
    assert (out / report.PLOT_NAME).stat().st_size > 0 and "upstream" in (out / report.TABLE_NAME).read_text()
    r = subprocess.run([sys.executable, str(BENCH / "report.py"), "--results", str(FIX / "results.json"),
                        "--out", str(tmp_path / "again")], capture_output=True, text=True)
    assert r.returncode == 0 and not (tmp_path / "again" / "results.json").exists()
    (tmp_path / "bad.json").write_text(json.dumps({"rows": [{"model": "x"}]}))
    r = subprocess.run([sys.executable, str(BENCH / "report.py"), "--results", str(tmp_path / "bad.json"),
                        "--out", str(tmp_path / "bad")], capture_output=True, text=True)
    assert r.returncode == 2 and "missing" in r.stderr


# ------------------------------------------------------------ the GLM-5 share

def _share(**kw) -> dict:
    att = json.loads((FIX / "attention.json").read_text())
    idx = json.loads((FIX / "indexer.json").read_text())
    return glm5_share.compute(att, idx, glm5_share.load_config(kw.pop("config", None)), **kw)


def test_glm5_weights_per_gpu_and_layer_by_hand():
    cfg = glm5_share.GLM5
    h, tp = 6144, 8
    replicated = h * (2048 + 512 + 64) + 2048 * 32 * 128 + h * (128 + 32) + h * 256
    sharded = 2048 * 64 * 256 + 512 * 64 * (192 + 256) + 64 * 256 * h + 3 * h * 2048 * (1 + 8)
    assert glm5_share.layer_params(cfg, tp, 1, dense=False) == pytest.approx(replicated + sharded / tp)
    touched64 = 256 * (1 - (1 - 8 / 256) ** 64)
    assert 200 < touched64 < 256
    assert glm5_share.layer_params(cfg, tp, 64, dense=False) > glm5_share.layer_params(cfg, tp, 1, dense=False)


def test_glm5_share_uses_the_measured_rows_and_bounds_the_share():
    res = _share(tp=8, weight_bytes=2.0)
    assert res["heads_per_gpu"] == 8
    p = {(q["batch"], q["cache"], q["side"]): q for q in res["points"]}
    one = p[(1, "bfloat16", "ours")]
    assert one["attention_from"] == "measured" and one["attention_us"] == pytest.approx(14.27, abs=0.01)
    assert one["indexer_us"] == pytest.approx(11.68, abs=0.01)
    assert one["topk_us"] == pytest.approx(34.21 - 10.50, abs=0.02)
    assert p[(1, "bfloat16", "upstream")]["attention_us"] == pytest.approx(65.38, abs=0.01)
    assert p[(32, "bfloat16", "ours")]["attention_from"].startswith("interpolated 1-64")
    for q in res["points"]:
        assert 0 < q["layer_share"] < 1 and 0 < q["step_share"] < 1
    fp8w = {(q["batch"], q["cache"], q["side"]): q for q in _share(tp=8, weight_bytes=1.0)["points"]}
    assert all(fp8w[k]["layer_share"] > p[k]["layer_share"] for k in p)  # fewer rest bytes: larger share
    tiny = _share(config=REPO / "tests/e2e/models/glm5-tiny/config.json", tp=1)
    big = {(q["batch"], q["cache"], q["side"]): q["layer_share"] for q in res["points"]}
    assert all(q["layer_share"] > big[(q["batch"], q["cache"], q["side"])] for q in tiny["points"])


def test_glm5_share_refuses_what_it_cannot_compute(tmp_path):
    with pytest.raises(glm5_share.ShareError, match="do not split"):
        _share(tp=3)
    with pytest.raises(glm5_share.ShareError, match="no bfloat16 rows at 32 heads"):
        _share(tp=2)
    (tmp_path / "c.json").write_text(json.dumps({"hidden_size": 1}))
    with pytest.raises(glm5_share.ShareError, match="lacks"):
        glm5_share.load_config(tmp_path / "c.json")
    r = subprocess.run([sys.executable, str(BENCH / "glm5_share.py"), "--attention", str(FIX / "attention.json"),
                        "--indexer", str(FIX / "indexer.json")], capture_output=True, text=True)
    assert r.returncode == 0 and "GLM-5 at TP 8 (8 attention heads per GPU" in r.stdout
    assert r.stdout == subprocess.run([sys.executable, str(BENCH / "glm5_share.py"), "--attention",
                                       str(FIX / "attention.json"), "--indexer", str(FIX / "indexer.json")],
                                      capture_output=True, text=True).stdout
