"""`smla explain`: vLLM's own backend selection for a model, per tree (CPU).

The selection cases run in two subprocesses (patched work tree and pristine
base, concurrently); the pristine export is cached (smla.explain.pristine_tree).
CLI tests check input errors (exit 2, no subprocess) and one full run.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import explain, selection
from smla.cli import main
from smla.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]

GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 6144,
    "num_attention_heads": 64,
    "num_hidden_layers": 78,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "torch_dtype": "bfloat16",
}
DSV32_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "index_topk": 2048,
    "torch_dtype": "bfloat16",
}
# DeepSeek-V3: MLA without the DSA indexer (dense MLA).
DSV3_CONFIG = {k: v for k, v in DSV32_CONFIG.items() if k != "index_topk"} | {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "hidden_size": 4096, "num_attention_heads": 32, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    d = tmp_path_factory.mktemp("configs")
    out = {}
    for name, cfg in [("glm5", GLM5_CONFIG), ("dsv32", DSV32_CONFIG),
                      ("dsv3", DSV3_CONFIG), ("llama", LLAMA_CONFIG)]:
        (d / f"{name}.json").write_text(json.dumps(cfg))
        out[name] = str(d / f"{name}.json")
    return out


PATCHED = {
    # name: (model, capability, dtype[, backend])
    "glm5-12.0-fp16": ("glm-5", "12.0", "float16"),
    "glm5-8.6-bf16": ("glm-5", "8.6", "bfloat16"),
    "glm5-8.0-fp16": ("glm-5", "8.0", "float16"),
    "glm5-9.0-bf16": ("glm-5", "9.0", "bfloat16"),
    "dsv32-9.0-bf16": ("deepseek-v3.2", "9.0", "bfloat16"),
    "dsv32-12.0-auto": ("deepseek-v3.2", "12.0", "auto"),
    "cfg-glm5-12.0-fp16": ("@glm5", "12.0", "float16"),
    "cfg-glm5-8.6-bf16": ("@glm5", "8.6", "bfloat16"),
    "cfg-glm5-9.0-auto": ("@glm5", "9.0", "auto"),
    "cfg-dsv32-9.0-bf16": ("@dsv32", "9.0", "bfloat16"),
    "cfg-dsv32-12.0-auto": ("@dsv32", "12.0", "auto"),
    "cfg-dsv3-12.0-bf16": ("@dsv3", "12.0", "bfloat16"),
    "cfg-llama-12.0-auto": ("@llama", "12.0", "auto"),
    "glm5-12.0-explicit": ("glm-5", "12.0", "bfloat16", "TRITON_MLA_SPARSE"),
    "glm5-12.0-bad-backend": ("glm-5", "12.0", "bfloat16", "NO_SUCH_BACKEND"),
}
PRISTINE = {"glm5-12.0-fp16": ("glm-5", "12.0", "float16")}


def _case(spec, configs):
    model, cap, dtype, *backend = spec
    if model.startswith("@"):
        model = configs[model[1:]]
    return explain.Case(model, cap, dtype, backend=backend[0] if backend else None)


@pytest.fixture(scope="module")
def results(vllm_tree, configs):
    """{"patched"|"pristine": {name: raw result}}: one subprocess per tree."""
    pristine = explain.pristine_tree(vllm_tree)
    jobs = [(vllm_tree, PATCHED), (pristine, PRISTINE)]
    out = selection.run_selections(
        [(tree, [explain.to_cell(_case(s, configs)) for s in cases.values()])
         for tree, cases in jobs])
    return {label: dict(zip(cases, res))
            for label, (_, cases), res in zip(("patched", "pristine"), jobs, out)}


def _reasons(r):
    return {p["backend"]: p["reasons"] for p in r["priority"]}


def test_pristine_12_0_glm5_fp16_reproduces_seed_refusal(results):
    r = results["pristine"]["glm5-12.0-fp16"]
    explain._check(r)
    reasons = _reasons(r)
    assert "TRITON_MLA_SPARSE" not in reasons
    assert reasons["TRITON_MLA"] == ["sparse not supported"]
    assert reasons["FLASHMLA_SPARSE"] == ["dtype not supported", "compute capability not supported"]
    assert ("FlashInfer MLA kernel requires qk_nope_head_dim == 128, but got 192"
            in reasons["FLASHINFER_MLA"])
    assert r["selected"] is None
    assert r["error"].startswith("No valid attention backend found for cuda with ")
    text = explain.text(r, "pristine")
    assert "auto-selection: none; vLLM error: No valid attention backend found" in text


@pytest.mark.parametrize("name,pick", [
    ("glm5-12.0-fp16", "TRITON_MLA_SPARSE"),
    ("glm5-8.6-bf16", "TRITON_MLA_SPARSE"),
    ("glm5-8.0-fp16", "TRITON_MLA_SPARSE"),
    ("glm5-9.0-bf16", "FLASHMLA_SPARSE"),
    ("dsv32-9.0-bf16", "FLASHMLA_SPARSE"),
    ("dsv32-12.0-auto", "TRITON_MLA_SPARSE"),
    ("glm5-12.0-explicit", "TRITON_MLA_SPARSE"),
])
def test_patched_picks(results, name, pick):
    r = results["patched"][name]
    explain._check(r)
    assert r["error"] is None and r["selected"] == pick
    assert r["model"]["use_sparse"] and r["model"]["head_size"] == 576
    label = "selection (--backend)" if r["backend"] else "auto-selection"
    assert f"{label}: {pick}\n" in explain.text(r, "patched")


@pytest.mark.parametrize("cfg_name,preset_name", [
    ("cfg-glm5-12.0-fp16", "glm5-12.0-fp16"),
    ("cfg-glm5-8.6-bf16", "glm5-8.6-bf16"),
    ("cfg-glm5-9.0-auto", "glm5-9.0-bf16"),
    ("cfg-dsv32-9.0-bf16", "dsv32-9.0-bf16"),
    ("cfg-dsv32-12.0-auto", "dsv32-12.0-auto"),
])
def test_config_json_same_as_preset(results, cfg_name, preset_name):
    a, b = results["patched"][cfg_name], results["patched"][preset_name]
    explain._check(a)
    for key in ("priority", "selected", "error"):
        assert a[key] == b[key], key
    assert a["model"] == b["model"]  # model_type, use_mla, use_sparse, head_size, dtype


def test_dtype_auto_is_config_dtype(results):
    assert results["patched"]["cfg-glm5-9.0-auto"]["model"]["dtype"] == "bfloat16"


def test_dense_mla_config_is_explained_without_sparse(results):
    r = results["patched"]["cfg-dsv3-12.0-bf16"]
    explain._check(r)
    assert r["model"]["use_mla"] and not r["model"]["use_sparse"]
    assert r["selected"] == "TRITON_MLA"
    assert "dense MLA" in explain.text(r, "patched")


def test_non_mla_config_refused(results):
    r = results["patched"]["cfg-llama-12.0-auto"]
    with pytest.raises(UsageError, match="does not use MLA"):
        explain._check(r)


def test_unknown_backend_refused(results):
    with pytest.raises(UsageError, match="Unknown attention backend: 'NO_SUCH_BACKEND'"):
        explain._check(results["patched"]["glm5-12.0-bad-backend"])


# --- CLI --------------------------------------------------------------------

def _cli(vllm_tree, *args):
    return CliRunner().invoke(main, ["--root", str(ROOT), "--tree", str(vllm_tree), "explain", *args])


@pytest.mark.parametrize("args,msg", [
    (["--model", "glm-6", "--capability", "12.0"], "neither a preset nor a config.json"),
    (["--model", "glm-5", "--capability", "abc"], "is not MAJOR.MINOR"),
    (["--model", "glm-5", "--capability", "13"], "is not MAJOR.MINOR"),
    (["--model", "glm-5", "--capability", "12.0", "--tree", "/nonexistent/tree"], "not patched, pristine"),
    (["--model", "@bad", "--capability", "12.0"], "not a readable JSON file"),
    (["--model", "@list", "--capability", "12.0"], "holds a JSON object"),
])
def test_cli_bad_input_exit_2(vllm_tree, tmp_path, args, msg):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    args = [str(tmp_path / (a[1:] + ".json")) if a.startswith("@") else a for a in args]
    res = _cli(vllm_tree, *args)
    assert res.exit_code == 2, res.output
    assert msg in res.output


def test_cli_capability_auto_without_gpu(vllm_tree):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    res = _cli(vllm_tree, "--model", "glm-5", "--capability", "auto")
    assert res.exit_code == 2 and "no CUDA GPU" in res.output


def test_cli_json_run(vllm_tree):
    res = _cli(vllm_tree, "--model", "glm-5", "--capability", "8.6", "--dtype", "bfloat16", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["selected"] == "TRITON_MLA_SPARSE"
    assert data["tree"].startswith("patched work tree")
    assert {p["backend"] for p in data["priority"]} >= {"TRITON_MLA", "FLASHMLA_SPARSE"}
