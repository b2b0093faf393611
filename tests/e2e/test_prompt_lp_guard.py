"""CPU tests of the prompt-logprob guard (prompt_lp_guard.py, SMLA_E2E_PROMPT_LP_GUARD=1): a
stand-in runner whose sample_tokens runs a "drafter" that overwrites the target's hidden states
in place (as a graph replay sharing the CUDA-graph pool can) before it reads the prompt
logprobs from them, as vLLM 0.26.0's GPUModelRunner.sample_tokens does."""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402
import e2e_plugin  # noqa: E402
import log_records  # noqa: E402
import prompt_lp_guard  # noqa: E402


class State(NamedTuple):  # the fields of ExecuteModelState the runner reads here
    scheduler_output: object
    hidden_states: torch.Tensor


def _module():
    """A stand-in for vllm.v1.worker.gpu_model_runner: GPUModelRunner.sample_tokens drafts
    (the drafter writes `drafter_rows` of the pool) and then reads the prompt logprobs."""

    class GPUModelRunner:
        def __init__(self, hidden, prompt_lp_reqs=("req-0",), spec=True, drafter_rows=()):
            self.pool = hidden  # the graph pool the target's output lives in
            self.execute_model_state = State(None, hidden[: hidden.shape[0]])
            self.num_prompt_logprobs = {r: 1 for r in prompt_lp_reqs}
            self.speculative_config = object() if spec else None
            self.drafter_rows = drafter_rows

        def sample_tokens(self, grammar_output):
            state, self.execute_model_state = self.execute_model_state, None
            for r in self.drafter_rows:  # the drafter's replay, in the shared pool
                self.pool[r] = -7.0
            self.num_prompt_logprobs = {}  # bookkeeping: these prefills are done
            return state.hidden_states.sum(dim=-1)  # "prompt logprobs" from the hidden states

    return types.SimpleNamespace(__name__=prompt_lp_guard.MODULE, GPUModelRunner=GPUModelRunner)


@pytest.fixture
def guarded(capsys, monkeypatch):
    """The stand-in module with the guard installed, and a reader of the guard's records."""
    monkeypatch.setitem(prompt_lp_guard._state, "lines", 0)
    monkeypatch.setitem(prompt_lp_guard._state, "steps", 0)
    module = _module()
    prompt_lp_guard.patch_module(module)
    prompt_lp_guard.patch_module(module)  # once only

    def records():
        return log_records.parse(prompt_lp_guard.PREFIX, capsys.readouterr().err)

    return module, records


def test_prompt_logprobs_read_the_targets_hidden_states(guarded):
    module, records = guarded
    assert [r["check"] for r in records()] == ["installed"]
    hidden = torch.arange(12.0).view(4, 3)
    want = hidden.sum(dim=-1).clone()
    runner = module.GPUModelRunner(hidden, drafter_rows=(1, 2))
    got = runner.sample_tokens(None)
    torch.testing.assert_close(got, want)  # from the copy, not the overwritten pool
    (rec,) = records()
    assert rec == {"check": "overwritten", "step": 1, "tokens": 4, "rows_changed": 2, "requests": ["req-0"]}


def test_unguarded_runner_reads_the_overwritten_rows():
    """The defect the guard removes, on the same stand-in (the test would pass vacuously if
    the stand-in's drafter did not change what sample_tokens returns)."""
    hidden = torch.arange(12.0).view(4, 3)
    want = hidden.sum(dim=-1).clone()
    got = _module().GPUModelRunner(hidden, drafter_rows=(1,)).sample_tokens(None)
    assert not torch.equal(got, want)


@pytest.mark.parametrize("kwargs", [dict(prompt_lp_reqs=()), dict(spec=False)],
                         ids=["no-prompt-logprobs", "no-drafter"])
def test_steps_without_prompt_logprobs_or_drafter_pass_through(guarded, kwargs):
    module, records = guarded
    records()
    hidden = torch.ones(2, 3)
    runner = module.GPUModelRunner(hidden, **kwargs)
    state = runner.execute_model_state
    runner.sample_tokens(None)
    assert state.hidden_states.data_ptr() == hidden.data_ptr()  # no copy taken
    assert records() == []


def test_unchanged_rows_and_nan_rows_are_no_record(guarded):
    module, records = guarded
    records()
    hidden = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    module.GPUModelRunner(hidden).sample_tokens(None)
    assert records() == []


def test_summary_and_plugin_switch(tmp_path, monkeypatch):
    log = tmp_path / "engine.log"
    assert prompt_lp_guard.summarize(prompt_lp_guard.read_records(log)) == {}
    first = {"check": "overwritten", "step": 1, "tokens": 8, "rows_changed": 8, "requests": ["0"]}
    lines = [prompt_lp_guard.INSTALLED, first, dict(first, step=2, rows_changed=3)]
    log.write_text("noise\n" + "\n".join(prompt_lp_guard.line(r) for r in lines) + "\n")
    assert prompt_lp_guard.summarize(prompt_lp_guard.read_records(log)) == {
        "installed": True, "steps_changed": 2, "rows_changed": 11, "first": first}

    assert e2e_plugin.install_prompt_lp_guard({}) is None
    patched = []
    monkeypatch.setattr(prompt_lp_guard, "patch_module", patched.append)
    module = _module()
    monkeypatch.setitem(sys.modules, prompt_lp_guard.MODULE, module)
    assert e2e_plugin.install_prompt_lp_guard({prompt_lp_guard.GUARD_ENV: "1"}) == "patched"
    assert patched == [module]


def test_run_sets_the_guard_unless_told_not_to():
    import run_e2e

    on = run_e2e.build_jobs(run_e2e.parse_args(["--models", "deepseek-v4-tiny"]))
    off = run_e2e.build_jobs(run_e2e.parse_args(["--models", "deepseek-v4-tiny", "--no-prompt-lp-guard"]))
    assert on and all(j["env"][prompt_lp_guard.GUARD_ENV] == "1" for j in on)
    assert off and all(prompt_lp_guard.GUARD_ENV not in j["env"] for j in off)


def test_compare_reports_overwrites_and_a_guard_that_never_installed(tmp_path):
    import json

    import run_e2e
    from test_e2e_v4 import V4, _run

    first = {"check": "overwritten", "step": 1, "tokens": 8, "rows_changed": 8, "requests": ["0"]}
    s, bounds = _run(tmp_path, logs={"ref-o16": prompt_lp_guard.line(first) + "\n"})
    assert s["failures"] == [] and s["exit_code"] == 0
    (name,) = [n for n, e in s["engines"].items() if e.get("prompt_lp_guard", {}).get("steps_changed")]
    assert name.endswith("-ref-o16")
    report = compare.write_report(s)
    assert f"- {name}: 1 step(s), 8 row(s); first: step 1, 8 tokens, 8 rows" in report

    (tmp_path / name / "engine.log").write_text("no guard here\n")
    jobs = run_e2e.select_jobs(run_e2e.parse_args(["--models", V4, "--sides", "ref", "ref2", "ref-o16", "ours"]))
    s = compare.compare_all(jobs, tmp_path, bounds)
    assert s["failures"] == [f"{name}: the prompt-logprob guard was asked for "
                             f"({prompt_lp_guard.GUARD_ENV}=1) and never installed (engine log)"]
    assert s["exit_code"] != 0
    json.dumps(s)  # the summary stays JSON


def test_the_runner_the_guard_wraps_in_the_patched_tree(vllm_tree):
    """What the guard relies on in the pinned vLLM: GPUModelRunner.sample_tokens reads
    execute_model_state (whose hidden_states field the guard replaces) and runs the drafter
    before _bookkeeping_sync computes the prompt logprobs (the defect; when a vLLM release
    reorders them, this fails and the guard can go)."""
    import ast

    src = (vllm_tree / (prompt_lp_guard.MODULE.replace(".", "/") + ".py")).read_text()
    tree = ast.parse(src)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    fields = [s.target.id for s in classes["ExecuteModelState"].body if isinstance(s, ast.AnnAssign)]
    assert "hidden_states" in fields
    runner = classes[prompt_lp_guard.RUNNER_CLASS]
    (sample,) = [n for n in runner.body if isinstance(n, ast.FunctionDef) and n.name == "sample_tokens"]
    body = ast.get_source_segment(src, sample)
    for name in ("self.execute_model_state", "self.speculative_config"):
        assert name in body, name
    assert "self.num_prompt_logprobs" in src
    draft = body.index("propose_draft_token_ids(sampled_token_ids)")
    assert draft < body.index("self._bookkeeping_sync(")
