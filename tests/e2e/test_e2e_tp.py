"""CPU tests of the harness's tensor-parallel runs (issue 37): engines per TP size, each TP=k
engine compared with its TP=1 twin as well as with upstream at the same TP, the machine kind
in the report, the README's multi-GPU commands. The weights behind the TP=1 reference are
tested in test_tp_shards.py."""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402
import run_e2e  # noqa: E402
from test_e2e_harness import _arrays, _engine, _shifted  # noqa: E402

README = (HERE / "README.md").read_text()
# the README's multi-GPU commands (section "Tensor parallel"), verbatim: per kind one call per
# DSA model (the GLM-5 call is the DeepSeek one with --models glm5-tiny), DeepSeek-V4 on x2
DSA_CMD = ("bash tests/e2e/device-run.sh run --kind {kind} --models deepseek-v32-tiny --tp 1 {k} "
           "--kv-dtypes auto fp8 --sides ref ref2 ours --parallel 20 --engine-timeout 480")
TP_CMDS = {kind: DSA_CMD.format(kind=kind, k=kind[-1]) for kind in ("nvidia-h200-x2", "nvidia-h200-x4",
                                                                      "nvidia-h200-x8")}
TP_CMDS["v4-x2"] = ("SMLA_E2E_KEEP_ARRAYS=1 bash tests/e2e/device-run.sh run --kind nvidia-h200-x2 "
                    "--models deepseek-v4-tiny --tp 1 2 --sides ref ref2 ref-o16 ours --parallel 8 "
                    "--engine-timeout 500")


def _args(cmd: str):
    argv = shlex.split(cmd)
    return run_e2e.parse_args(argv[argv.index("run") + 1:])


def test_every_tp_k_engine_names_its_tp1_twin_and_tp1_engines_none():
    jobs = run_e2e.build_jobs(run_e2e.parse_args(["--tp", "1", "2", "4", "8", "--kv-dtypes", "auto", "fp8",
                                                  "--sides", "ref", "ref2", "ours"]))
    names = {j["name"] for j in jobs}
    for j in jobs:
        assert j["name"].startswith(f"tp{j['tp']}-")
        if j["tp"] == 1:
            assert j["tp1_ref"] is None
        else:
            assert j["tp1_ref"] == "tp1-" + j["name"].split("-", 1)[1] and j["tp1_ref"] in names
    assert {j["tp"] for j in jobs} == {1, 2, 4, 8}
    v4 = run_e2e.build_jobs(run_e2e.parse_args(["--models", "deepseek-v4-tiny", "--tp", "1", "2",
                                                "--sides", "ref", "ours"]))
    assert {j["name"]: j["tp1_ref"] for j in v4} == {
        "tp1-deepseek-v4-tiny-bfloat16-fp8kv-ref": None, "tp1-deepseek-v4-tiny-bfloat16-fp8kv-ours": None,
        "tp2-deepseek-v4-tiny-bfloat16-fp8kv-ref": "tp1-deepseek-v4-tiny-bfloat16-fp8kv-ref",
        "tp2-deepseek-v4-tiny-bfloat16-fp8kv-ours": "tp1-deepseek-v4-tiny-bfloat16-fp8kv-ours"}


def _tp_run(tmp_path, shifts: dict[str, float], jobs_edit=None):
    """--tp 1 2, GLM-5 bf16, ref / ref2 / ours on synthetic arrays: ref2 0.02 from ref at each
    TP (the calibration), shifts[name without -glm5-tiny-bfloat16] moves every prompt logprob."""
    jobs = run_e2e.select_jobs(run_e2e.parse_args(["--tp", "1", "2", "--models", "glm5-tiny", "--dtypes",
                                                   "bfloat16", "--sides", "ref", "ref2", "ours"]))
    if jobs_edit:
        jobs = [jobs_edit(j) for j in jobs]
    base = _arrays()
    for job in jobs:
        short = job["name"].replace("-glm5-tiny-bfloat16", "")
        d = shifts.get(short, 0.0) + (0.02 if job["side"] == "ref2" else 0.0)
        _engine(tmp_path, job, _shifted(base, d) if d else base)
    return compare.compare_all(jobs, tmp_path, json.loads((HERE / "bounds.json").read_text()))


def _tp_rows(s: dict) -> dict[str, dict]:
    return {c["name"]: c for c in s["comparisons"] if c.get("role") == "tp"}


def test_tp2_engines_are_compared_with_tp1_and_with_upstream_at_tp2(tmp_path):
    s = _tp_run(tmp_path, {"tp2-ours": 0.01, "tp2-ref": 0.005})
    assert s["failures"] == [] and s["exit_code"] == 0
    tp = _tp_rows(s)
    assert set(tp) == {f"tp2-glm5-tiny-bfloat16-{side}" for side in ("ref", "ref2", "ours")}
    for name, c in tp.items():
        assert c["ref"] == name.replace("tp2-", "tp1-") and c["broken"] == []
        assert c["bounds_from"].startswith(f"same side at TP=1 ({c['ref']}); 2.0 x ref2-vs-ref spread of "
                                           "tp2-glm5-tiny-bfloat16-ref2")
    assert tp["tp2-glm5-tiny-bfloat16-ours"]["teacher_forced"]["all"]["mean"] == pytest.approx(0.01, abs=1e-5)
    # ours vs ref at TP=2 is still there, under the engine's own name
    plain = [c for c in s["comparisons"] if c.get("role") != "tp" and c["name"] == "tp2-glm5-tiny-bfloat16-ours"]
    assert len(plain) == 1 and plain[0]["ref"] == "tp2-glm5-tiny-bfloat16-ref"
    report = compare.write_report(s)
    assert "| tp2-glm5-tiny-bfloat16-ours vs tp1-glm5-tiny-bfloat16-ours |" in report
    assert "| tp2-glm5-tiny-bfloat16-ours |" in report


def test_a_tp2_engine_that_is_not_the_tp1_model_breaks_its_bound(tmp_path):
    # the TP=2 reference moved by 0.5 nats (e.g. a rank that read another rank's weights):
    # ours and ref agree at TP=2, so only the TP comparison can see it
    s = _tp_run(tmp_path, {"tp2-ref": 0.5, "tp2-ours": 0.5, "tp2-ref2": 0.5})
    assert s["exit_code"] == 1
    tp = _tp_rows(s)
    assert all(any("tf_mean_abs" in b for b in c["broken"]) for c in tp.values())
    plain = [c for c in s["comparisons"] if c.get("role") != "tp" and c["name"] == "tp2-glm5-tiny-bfloat16-ours"]
    assert plain[0]["broken"] == []


def test_jobs_without_a_tp1_twin_field_get_no_tp_comparison(tmp_path):
    # earlier results (rank-XOR weights: TP=2 was another model) are re-evaluated as before
    def old(j):
        j = dict(j)
        j.pop("tp1_ref")
        return j

    s = _tp_run(tmp_path, {"tp2-ref": 0.5, "tp2-ours": 0.5, "tp2-ref2": 0.5}, jobs_edit=old)
    assert _tp_rows(s) == {} and s["exit_code"] == 0


def test_the_machine_kind_is_in_the_report_and_tp_beyond_the_gpus_is_refused(tmp_path, capsys):
    s = {"engines": {}, "comparisons": [], "failures": [], "exit_code": 0, "kind": "nvidia-h200-x8",
         "command": "run_e2e.py --tp 1 8"}
    assert "machine: nvidia-h200-x8" in compare.write_report(s)
    out = tmp_path / "out"
    assert run_e2e.main(["--tp", "1", "2", "--gpus", "1", "--out", str(out), "--results", str(tmp_path / "r")]) == 2
    assert "--tp 2 needs 2 GPUs" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("kind", sorted(TP_CMDS))
def test_the_readme_tp_commands_are_there_and_select_these_engines(kind):
    cmd = TP_CMDS[kind]
    assert cmd in README.replace("\n    ", " ")
    args = _args(cmd)
    jobs = run_e2e.select_jobs(args)
    names = {j["name"] for j in jobs}
    assert all(j["tp1_ref"] in names for j in jobs if j["tp"] > 1)  # every TP=k engine has its twin
    # one wave, and the call's limit holds even if every engine runs into its timeout
    assert len(jobs) <= args.parallel
    est = run_e2e.estimate(jobs, args.parallel)
    assert est["install_s"] + est["checkpoint_s"] + args.engine_timeout + est["compare_s"] < 600
    if kind == "v4-x2":
        assert {j["tp"] for j in jobs} == {1, 2} and len(jobs) == 8
        assert {j["env"]["VLLM_DSV4_PORTABLE"] for j in jobs if j["side"] == "ours"} == {"1"}
        return
    k = int(kind[-1])
    assert args.kind == kind and {j["tp"] for j in jobs} == {1, k} and len(jobs) == 20
    for dtype in ("bfloat16", "float16"):
        for kv in ("auto", "fp8"):
            assert any(j["dtype"] == dtype and j["kv_cache_dtype"] == kv and j["side"] == "ours"
                       and j["tp"] == k for j in jobs)
    glm = run_e2e.select_jobs(_args(cmd.replace("deepseek-v32-tiny", "glm5-tiny")))
    assert {j["name"].replace("glm5-tiny", "deepseek-v32-tiny") for j in glm} == names
