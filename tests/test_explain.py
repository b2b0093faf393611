"""`smla explain`: vLLM's own backend selection for a model, per tree (CPU).

The selection cases run in two subprocesses (patched work tree and pristine
base, concurrently); the pristine export is cached (smla.explain.pristine_tree).
CLI tests check input errors (exit 2, no subprocess) and one full run.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from smla import explain, selection
from smla.cli import main
from smla.errors import UsageError

from gitfixtures import REPO_ROOT

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


CASES = {
    # name: (model, capability, dtype[, backend])
    "glm5-12.0-fp16": ("glm-5", "12.0", "float16"),
    "glm5-12.0-bf16": ("glm-5", "12.0", "bfloat16"),
    "glm5-8.6-bf16": ("glm-5", "8.6", "bfloat16"),
    "glm5-9.0-bf16": ("glm-5", "9.0", "bfloat16"),
    "dsv32-9.0-bf16": ("deepseek-v3.2", "9.0", "bfloat16"),
    "dsv32-12.0-auto": ("deepseek-v3.2", "12.0", "auto"),
    "cfg-glm5-12.0-fp16": ("@glm5", "12.0", "float16"),
    "cfg-glm5-12.0-bf16": ("@glm5", "12.0", "bfloat16"),
    "cfg-glm5-8.6-bf16": ("@glm5", "8.6", "bfloat16"),
    "cfg-glm5-9.0-auto": ("@glm5", "9.0", "auto"),
    "cfg-dsv32-9.0-bf16": ("@dsv32", "9.0", "bfloat16"),
    "cfg-dsv32-12.0-auto": ("@dsv32", "12.0", "auto"),
    "cfg-dsv3-12.0-bf16": ("@dsv3", "12.0", "bfloat16"),
    "cfg-dsv3-9.0-bf16": ("@dsv3", "9.0", "bfloat16"),
    "cfg-llama-12.0-auto": ("@llama", "12.0", "auto"),
    "glm5-12.0-explicit": ("glm-5", "12.0", "bfloat16", "TRITON_MLA_SPARSE"),
    "glm5-12.0-bad-backend": ("glm-5", "12.0", "bfloat16", "NO_SUCH_BACKEND"),
    "glm5-12.0-bad-kv": ("glm-5", "12.0", "bfloat16", None, "fp4_nonsense"),
    "glm5-10.0-tp4": ("glm-5", "10.0", "bfloat16", None, "auto", 4),
    "glm5-10.0-tp3": ("glm-5", "10.0", "bfloat16", None, "auto", 3),
}
# Compared between the trees (the rest is about the explain layer itself).
BOTH = ["glm5-12.0-fp16", "glm5-12.0-bf16", "glm5-8.6-bf16", "glm5-9.0-bf16", "dsv32-9.0-bf16",
        "dsv32-12.0-auto", "cfg-dsv3-12.0-bf16", "cfg-dsv3-9.0-bf16"]


def _case(spec, configs):
    model, cap, dtype, *rest = spec
    backend, kv, tp = (list(rest) + [None, "auto", 1][len(rest):])[:3]
    if model.startswith("@"):
        model = configs[model[1:]]
    return explain.cell(model, cap, dtype, kv_cache_dtype=kv, backend=backend, tp=tp)


@pytest.fixture(scope="module")
def results(vllm_tree, configs):
    """{"patched"|"pristine": {name: raw result}}: one subprocess per tree."""
    pristine = explain.pristine_tree(vllm_tree)
    jobs = [(vllm_tree, CASES), (pristine, {k: CASES[k] for k in BOTH})]
    out = selection.run_selections(
        [(tree, [_case(s, configs) for s in cases.values()])
         for tree, cases in jobs])
    return {label: dict(zip(cases, res))
            for label, (_, cases), res in zip(("patched", "pristine"), jobs, out)}


def _reasons(r):
    return {p["backend"]: p["reasons"] for p in r["priority"]}


@pytest.mark.parametrize("name", BOTH)
def test_text_shows_every_backend_and_the_outcome(results, name):
    """The text names each backend of the priority list with vLLM's own
    reasons, then the pick or vLLM's error, for either tree."""
    for side in ("patched", "pristine"):
        r = results[side][name]
        explain._check(r)
        text = explain.text(r, side)
        assert text.startswith(f"tree:  {side}\n")
        for i, p in enumerate(r["priority"], 1):
            row = next(line for line in text.splitlines() if line.split()[:2] == [str(i), p["backend"]])
            assert ("yes" if p["valid"] else "no") in row.split()
            assert row.endswith("; ".join(p["reasons"]))
        if r["selected"]:
            assert f"auto-selection: {r['selected']}\n" in text
        else:
            assert f"auto-selection: none; vLLM error: {r['error']}\n" in text
        assert "\nindexer: " + explain._indexer_line(r["indexer"]) + "\n" in text
        assert "\nstand-ins: mocked CUDA platform + capability" in text


@pytest.mark.parametrize("name", BOTH)
def test_patched_adds_ours_and_keeps_upstream(results, name):
    """Same question on both trees: every upstream backend keeps its verdict
    and reasons; the patched tree picks pristine's backend where pristine has
    one, TRITON_MLA_SPARSE where it has none (sparse cases), and dense MLA is
    not changed at all."""
    pat, pri = results["patched"][name], results["pristine"][name]
    assert [p for p in pat["priority"] if p["backend"] != "TRITON_MLA_SPARSE"] == pri["priority"]
    if not pri["model"]["use_sparse"]:
        assert pat["selected"] == pri["selected"] and pat["error"] == pri["error"]
        assert "dense MLA" in explain.text(pat, "patched")
    elif pri["selected"]:
        assert pat["selected"] == pri["selected"]
    else:
        assert pat["selected"] == "TRITON_MLA_SPARSE"
        assert pri["error"].startswith("No valid attention backend found")


def test_explicit_backend_text(results):
    r = results["patched"]["glm5-12.0-explicit"]
    text = explain.text(r, "patched")
    assert "requested backend TRITON_MLA_SPARSE: valid\n" in text
    assert "selection (--backend): TRITON_MLA_SPARSE\n" in text


def test_kv_cache_format_line(results):
    """ "kv cache: A -> B" appears exactly when vLLM changes the cache format
    after selection (0.24+'s _canonicalize_sparse_mla_kv_cache_dtype)."""
    for name, r in results["patched"].items():
        if r.get("selected") and "priority" in r:
            used = r["kv_cache_dtype_used"]
            text = explain.text(r, "patched")
            assert (f"kv cache: {r['kv_cache_dtype']} -> {used} " in text) == (used != r["kv_cache_dtype"])


@pytest.mark.parametrize("cfg_name,preset_name", [
    ("cfg-glm5-12.0-fp16", "glm5-12.0-fp16"),
    ("cfg-glm5-12.0-bf16", "glm5-12.0-bf16"),
    ("cfg-glm5-8.6-bf16", "glm5-8.6-bf16"),
    ("cfg-glm5-9.0-auto", "glm5-9.0-bf16"),
    ("cfg-dsv32-9.0-bf16", "dsv32-9.0-bf16"),
    ("cfg-dsv32-12.0-auto", "dsv32-12.0-auto"),
])
def test_config_json_same_as_preset(results, cfg_name, preset_name):
    a, b = results["patched"][cfg_name], results["patched"][preset_name]
    explain._check(a)
    for key in ("priority", "selected", "error", "heads_per_gpu", "kv_cache_dtype_used"):
        assert a[key] == b[key], key
    assert a["model"] == b["model"]  # model_type, use_mla, use_sparse, head_size, dtype, heads


def test_dtype_auto_is_config_dtype(results):
    assert results["patched"]["cfg-glm5-9.0-auto"]["model"]["dtype"] == "bfloat16"


def test_heads_per_gpu_from_config_and_tp(results):
    r = results["patched"]["glm5-12.0-bf16"]
    assert r["model"]["num_attention_heads"] == 64 and r["heads_per_gpu"] == 64
    r = results["patched"]["glm5-10.0-tp4"]
    assert r["heads_per_gpu"] == 16
    assert "16 heads per GPU (64 / tp 4)" in explain.text(r, "patched")
    with pytest.raises(UsageError, match="not divisible by tensor parallel size 3"):
        explain._check(results["patched"]["glm5-10.0-tp3"])


def test_dense_mla_config_is_explained_without_sparse(results):
    r = results["patched"]["cfg-dsv3-12.0-bf16"]
    explain._check(r)
    assert r["model"]["use_mla"] and not r["model"]["use_sparse"]
    assert r["selected"] is not None and r["selected"] != "TRITON_MLA_SPARSE"


def test_non_mla_config_refused(results):
    r = results["patched"]["cfg-llama-12.0-auto"]
    with pytest.raises(UsageError, match="does not use MLA"):
        explain._check(r)


def test_unknown_backend_refused(results):
    with pytest.raises(UsageError, match="Unknown attention backend: 'NO_SUCH_BACKEND'"):
        explain._check(results["patched"]["glm5-12.0-bad-backend"])


def test_unknown_kv_cache_dtype_refused_by_vllm(results):
    with pytest.raises(UsageError, match="Invalid kv_cache_dtype: fp4_nonsense"):
        explain._check(results["patched"]["glm5-12.0-bad-kv"])


# --- CLI --------------------------------------------------------------------

def _cli(vllm_tree, *args):
    return CliRunner().invoke(main, ["--root", str(REPO_ROOT), "--tree", str(vllm_tree), "explain", *args])


@pytest.mark.parametrize("args,msg", [
    (["--model", "glm-6", "--capability", "12.0"], "neither a preset nor a config.json"),
    (["--model", "glm-5", "--capability", "abc"], "is not MAJOR.MINOR"),
    (["--model", "glm-5", "--capability", "13"], "is not MAJOR.MINOR"),
    (["--model", "glm-5"], "--capability is required"),
    (["--model", "glm-5", "--capability", "12.0", "--tree", "/nonexistent/tree"], "not patched, pristine"),
    (["--model", "@bad", "--capability", "12.0"], "not a readable JSON file"),
    (["--model", "@list", "--capability", "12.0"], "holds a JSON object"),
    (["--model", "glm-5", "--capability", "12.0", "--heads", "16", "--tp", "4"], "not both"),
    (["--model", "glm-5", "--capability", "12.0", "--heads", "0"], "heads per GPU"),
    (["--model", "glm-5", "--matrix", "--capability", "12.0"], "drop --capability"),
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
    res = _cli(vllm_tree, "--model", "glm-5", "--capability", "8.6", "--dtype", "bfloat16",
               "--kv-cache-dtype", "bfloat16", "--heads", "8", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["selected"] == "TRITON_MLA_SPARSE"
    assert data["tree"].startswith("patched work tree")
    assert data["heads_per_gpu"] == 8 and data["kv_cache_dtype"] == "bfloat16"
    assert data["selector_config"]["kv_cache_dtype"] == "bfloat16"
    assert "TRITON_MLA_SPARSE" in {p["backend"] for p in data["priority"]}


def test_cli_matrix(vllm_tree):
    """--matrix: one row per capability x model dtype, one column per KV
    dtype; each cell agrees with the JSON of the same run."""
    res = _cli(vllm_tree, "--model", "deepseek-v3.2", "--matrix", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data) == (len(selection.CAPABILITIES) * len(selection.DTYPES)
                         * len(selection.KV_CACHE_DTYPES) * len(selection.HEADS))
    text = explain.matrix_text(data, "patched")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].split(" | ")[2:] == [f"kv {kv}" for kv in selection.KV_CACHE_DTYPES[:-1]] + [
        f"kv {selection.KV_CACHE_DTYPES[-1]} |"]
    body = rows[1:]
    assert len(body) == len(selection.CAPABILITIES) * len(selection.DTYPES)
    for r in data:
        row = next(x for x in body if x.startswith(f"| {r['capability']} | {r['model']['dtype']} |"))
        cell = row.strip("| ").split(" | ")[2 + selection.KV_CACHE_DTYPES.index(r["kv_cache_dtype"])]
        assert (r["selected"] or "none") in cell


def test_indexer_path_is_the_trees_own_choice(results):
    """The indexer line comes from the tree's own dispatch: the patched tree
    runs the portable kernels where DeepGEMM has none (sm86) and keeps
    DeepGEMM where it has kernels (sm90); the pristine tree has only
    DeepGEMM, so at sm86 its indexer has no path at all."""
    patched, pristine = results["patched"], results["pristine"]
    assert patched["glm5-8.6-bf16"]["indexer"]["path"] == "triton"
    assert "sm86" in patched["glm5-8.6-bf16"]["indexer"]["reason"]
    assert patched["glm5-9.0-bf16"]["indexer"]["path"] == "deepgemm"
    assert pristine["glm5-8.6-bf16"]["indexer"]["path"] == "none"
    assert pristine["glm5-9.0-bf16"]["indexer"]["path"] == "deepgemm"
    assert "indexer: portable Triton kernels" in explain.text(patched["glm5-8.6-bf16"], "patched")
    assert "indexer: none" in explain.text(pristine["glm5-8.6-bf16"], "pristine")
