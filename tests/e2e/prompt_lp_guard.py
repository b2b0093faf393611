"""Teacher-forced logprobs from the target model's own hidden states (SMLA_E2E_PROMPT_LP_GUARD=1).

Upstream defect this works around (vLLM 0.26.0, gpu_model_runner.GPUModelRunner.sample_tokens;
vLLM issue 53488, fix proposed in PR 53520): with an MTP/EAGLE drafter that runs on the GPU
before bookkeeping, `propose_draft_token_ids` runs the drafter and only then
`_bookkeeping_sync` computes the prompt logprobs from `hidden_states`. When the target's step
was a replayed CUDA graph, `hidden_states` is a view of the graph pool, which every CUDA graph
of the process shares, the drafter's included: the drafter's replay can overwrite it, and the
prompt logprobs of that step come from whatever the drafter left there. Sampling is not
affected (it reads the logits, computed before the drafter). In the e2e runs this is the first
small prefill step of an engine (later prefill steps are larger than every captured size and run
eagerly; decode steps need no prompt logprobs).

The guard wraps `sample_tokens`: on a step that computes prompt logprobs and has a drafter, it
hands `sample_tokens` a copy of the target's hidden states, and afterwards compares the copy
with the original rows. Each step where they differ is one line `SMLA_PROMPT_LP {json}` on
stderr (the engine's log): the step, its token count, and how many rows the drafter changed,
so a run shows where the defect would have corrupted its reference. It changes no kernel and
no output other than these prompt logprobs; every side of a run gets it.
"""
from __future__ import annotations

import functools
from pathlib import Path

import log_records

GUARD_ENV = "SMLA_E2E_PROMPT_LP_GUARD"
PREFIX = "SMLA_PROMPT_LP"  # each record: one stderr line, PREFIX and its JSON
MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"
MAX_LINES = 200
_state = {"lines": 0, "steps": 0}


def line(record: dict) -> str:
    """A record as the guard writes it to the engine's log."""
    return log_records.line(PREFIX, record)


INSTALLED = {"check": "installed", "module": MODULE}


def _emit(record: dict) -> None:
    if _state["lines"] >= MAX_LINES:
        return
    _state["lines"] += 1
    log_records.emit(PREFIX, record)


def read_records(log: Path) -> list[dict]:
    """The guard's records in an engine log (none when it was off or the log is missing)."""
    return log_records.read(PREFIX, log)


def summarize(records: list[dict]) -> dict:
    """{"installed": whether the guard wrapped the runner, "steps_changed": steps whose hidden
    states the drafter changed, "rows_changed": their rows in all, "first": the first such
    step's record or None}; {} without records."""
    if not records:
        return {}
    changed = [r for r in records if r.get("check") == "overwritten"]
    return {"installed": any(r.get("check") == "installed" for r in records),
            "steps_changed": len(changed), "rows_changed": sum(r["rows_changed"] for r in changed),
            "first": changed[0] if changed else None}


def _changed_rows(before, after) -> int:
    """Rows (first dim) where `after` differs from `before`; NaN equal to NaN."""
    import torch

    same = (before == after) | (torch.isnan(before) & torch.isnan(after))
    return int((~same.reshape(same.shape[0], -1).all(dim=1)).sum())


def _wrap_sample_tokens(fn):
    @functools.wraps(fn)
    def sample_tokens(self, grammar_output):
        state = self.execute_model_state
        if state is None or self.speculative_config is None or not self.num_prompt_logprobs:
            return fn(self, grammar_output)
        _state["steps"] += 1
        requests = sorted(self.num_prompt_logprobs)[:8]  # bookkeeping drops finished prefills
        hidden = state.hidden_states
        kept = hidden.clone()
        self.execute_model_state = state._replace(hidden_states=kept)
        out = fn(self, grammar_output)
        rows = _changed_rows(kept, hidden)
        if rows:
            _emit({"check": "overwritten", "step": _state["steps"], "tokens": int(hidden.shape[0]),
                   "rows_changed": rows, "requests": requests})
        return out

    sample_tokens.smla_prompt_lp_guard = True
    return sample_tokens


def patch_module(module) -> None:
    """Wrap `GPUModelRunner.sample_tokens` of `module` (once)."""
    cls = getattr(module, RUNNER_CLASS, None)
    if cls is None or getattr(cls.sample_tokens, "smla_prompt_lp_guard", False):
        return
    cls.sample_tokens = _wrap_sample_tokens(cls.sample_tokens)
    _emit(dict(INSTALLED, module=module.__name__))
