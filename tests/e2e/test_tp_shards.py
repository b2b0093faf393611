"""Rank-seeded weights of the `e2e_dummy` loader (issue 37): at TP 2, 4 and 8 every rank holds
a different shard of each TP-split parameter, and the shards gathered are exactly the TP=1
model, so the TP=1 engine is the reference of the TP=k engines. vLLM 0.26.0's own layers of
the DeepSeek-V3.2 and GLM-5 tiny geometries, built on the CPU per rank with a stand-in TP
group, in a child process with the patched tree first on the path (tp_shards_cpu.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MODELS = ("deepseek-v32-tiny", "glm5-tiny")
# what TP splits in these models (per MLA / MoE layer; the indexer, the router, the fused
# q_a / kv_a projection and the norms stay replicated)
SPLIT = {"lm_head.weight", "model.embed_tokens.weight",
         "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
         "model.layers.1.mlp.experts.routed_experts.w13_weight",
         "model.layers.1.mlp.experts.routed_experts.w2_weight",
         "model.layers.1.mlp.shared_experts.down_proj.weight",
         "model.layers.1.mlp.shared_experts.gate_up_proj.weight"} | {
    f"model.layers.{i}.self_attn.{p}.weight" for i in (0, 1) for p in ("q_b_proj", "kv_b_proj", "o_proj")}


@pytest.fixture(scope="module")
def reports(vllm_tree) -> dict:
    env = dict(os.environ, PYTHONPATH=str(vllm_tree))
    proc = subprocess.run([sys.executable, str(HERE / "tp_shards_cpu.py"), "bfloat16", *MODELS],
                          cwd=vllm_tree, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", MODELS)
def test_the_shards_of_every_tp_size_gather_to_the_tp1_model(reports, model):
    rep = reports[model]
    assert sorted(rep["tp"]) == ["2", "4", "8"]
    for tp, r in rep["tp"].items():
        assert set(r["split"]) == SPLIT, tp
        assert r["mismatch"] == [], f"TP={tp}: gathered shards are not the TP=1 tensors"
        assert r["replicas_differ"] == [], f"TP={tp}: replicated parameters differ between ranks"


@pytest.mark.parametrize("model", MODELS)
def test_two_ranks_hold_different_shards(reports, model):
    for tp, r in reports[model]["tp"].items():
        assert r["equal_shards"] == [], f"TP={tp}: ranks 0 and 1 hold the same values"


@pytest.mark.parametrize("model", MODELS)
def test_tp1_weights_are_the_per_name_draws_of_earlier_runs(reports, model):
    rep = reports[model]
    assert len(rep["parameters"]) == 35
    assert rep["tp1_legacy_mismatch"] == []
