"""`smla explain`: vLLM's own backend selection for a model, per tree (CPU).

The selection cases run in two subprocesses (patched work tree and pristine
base, concurrently); the pristine export is cached (smla.explain.pristine_tree).
CLI tests check input errors (exit 2, no subprocess) and one full run.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from smla import explain, explain_text, selection
from smla.cli import main
from smla.errors import UsageError

from gitfixtures import REPO_ROOT

import lineproofs

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
# DeepSeek-V4: the tiny checkpoint's config.json (real heads, head size and top-k).
DSV4_CONFIG = json.loads((REPO_ROOT / "tests" / "e2e" / "models" / "deepseek-v4-tiny" / "config.json").read_text())


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    d = tmp_path_factory.mktemp("configs")
    out = {}
    for name, cfg in [("glm5", GLM5_CONFIG), ("dsv32", DSV32_CONFIG),
                      ("dsv3", DSV3_CONFIG), ("llama", LLAMA_CONFIG), ("dsv4", DSV4_CONFIG)]:
        (d / f"{name}.json").write_text(json.dumps(cfg))
        out[name] = str(d / f"{name}.json")
    return out


CASES = {
    # name: (model, capability, dtype[, backend])
    # DeepSeek-V4 first: the MLA answers after it come from a worker that imported V4's model
    # code, the pristine ones (V4 last there) from one that had not (compared below).
    "dsv4-8.6": ("deepseek-v4", "8.6", "auto"),
    "dsv4-9.0": ("deepseek-v4", "9.0", "auto"),
    "dsv4-12.0": ("deepseek-v4", "12.0", "auto"),
    "cfg-dsv4-9.0": ("@dsv4", "9.0", "auto"),
    "dsv4-9.0-explicit": ("deepseek-v4", "9.0", "auto", "TRITON_MLA_SPARSE"),
    "dsv4-9.0-bad-backend": ("deepseek-v4", "9.0", "auto", "NO_SUCH_BACKEND"),
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
# smla explain's DeepSeek-V4 query asks the series' switch with each of its values: VLLM_DSV4_PORTABLE
# (auto, 1, 0) on the 0.26.0 line, KernelConfig.deepseek_v4_kernels (auto, portable, upstream; set with
# --kernel-config) on the 0.33.0 line. KEY: its key in a case; LABEL: how the text names it.
V4_BY_ENV = lineproofs.v4_by_env()
if V4_BY_ENV:
    KEY, LABEL, PORTABLE, UPSTREAM = "VLLM_DSV4_PORTABLE", "VLLM_DSV4_PORTABLE", "1", "0"
else:
    KEY, LABEL, PORTABLE, UPSTREAM = ("deepseek_v4_kernels", "--kernel-config deepseek_v4_kernels",
                                      "portable", "upstream")
# Compared between the trees (the rest is about the explain layer itself).
BOTH = ["glm5-12.0-fp16", "glm5-12.0-bf16", "glm5-8.6-bf16", "glm5-9.0-bf16", "dsv32-9.0-bf16",
        "dsv32-12.0-auto", "cfg-dsv3-12.0-bf16", "cfg-dsv3-9.0-bf16"]
DSV4_BOTH = ["dsv4-8.6", "dsv4-12.0"]


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
    jobs = [(vllm_tree, CASES), (pristine, {k: CASES[k] for k in BOTH + DSV4_BOTH})]
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
        assert "\nindexer: " + explain_text._indexer_line(r["indexer"]) + "\n" in text
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


# --- DeepSeek-V4 ------------------------------------------------------------

V4_CASE_KEYS = {KEY, "flashinfer_sm120", "flashmla", "attention", "error", "mhc", "o_proj",
                "cutedsl"}


def _v4_lines(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_dsv4_text_per_portable_value(results):
    """One block per value of the series' switch; in it the attention class with the tree's reason, and
    the mHC / o_proj reasons, each as the tree's functions answered."""
    r = results["patched"]["dsv4-8.6"]
    explain._check(r)
    text = explain.text(r, "patched")
    assert text.startswith("tree:  patched\n") and "model_type=deepseek_v4" in text
    assert "  attention class: vllm/models/deepseek_v4/nvidia/model.py::_select_dsv4_attn_cls\n" in text
    assert "CUDA MLA backends" not in text and "auto-selection" not in text
    assert r["dsv4"]["switch"] == KEY
    for env in ("auto", PORTABLE, UPSTREAM):
        case = next(c for c in r["dsv4"]["cases"] if c[KEY] == env)
        block = text.split(f"\n{LABEL}={env}")[1].split(f"\n{LABEL}=")[0]
        a = case["attention"]
        # on sm86 neither FlashInfer's kernel nor FlashMLA's build changes the answer: no labels
        assert f"\n  attention: {a['class']} (backend {a['backend']}" in block and block.count("attention") == 1
        assert a["reason"] in block
        assert f"\n  mHC: {case['mhc']['reason']}\n" in block
        assert f"\n  o_proj: {case['o_proj']['reason']}\n" in block
    assert "that backend does not support compute capability 8.6" in text  # upstream keeps FlashMLA
    assert "\nindexer: portable Triton kernels" in text
    assert "tilelang, cutlass DSL and DeepGEMM installed" in text


def test_dsv4_text_names_the_inputs_that_matter(results):
    """Where FlashInfer's sm120 kernel (12.0) or vLLM's FlashMLA build (9.0) changes the pick, each
    answer is printed with the input it depends on, and only then."""
    t12 = explain.text(results["patched"]["dsv4-12.0"], "patched")
    auto12 = t12.split(f"\n{LABEL}=auto")[1].split(f"\n{LABEL}=")[0]
    assert _v4_lines(auto12, "  attention") == [
        "  attention, with FlashInfer's sm120 kernel: DeepseekV4FlashInferSM120Attention "
        "(backend FLASHINFER_MLA_SPARSE_DSV4, fp8_ds_mla cache): FlashInfer sm120",
        "  attention, without FlashInfer's sm120 kernel: DeepseekV4TritonAttention "
        "(backend TRITON_MLA_SPARSE_DSV4, fp8_ds_mla cache): FlashInfer has no sm120 sparse MLA kernel"]
    assert "FlashMLA" not in auto12
    t9 = explain.text(results["patched"]["dsv4-9.0"], "patched")
    auto9 = t9.split(f"\n{LABEL}=auto")[1].split(f"\n{LABEL}=")[0]
    assert [line.split(":")[0] for line in _v4_lines(auto9, "  attention")] == [
        "  attention, vLLM built with FlashMLA", "  attention, vLLM built without FlashMLA"]
    assert "FlashInfer" not in auto9


def test_dsv4_explicit_backend(results):
    """--backend TRITON_MLA_SPARSE reaches the tree's function. 0.26.0 line: where FlashMLA runs, the
    tree refuses it and points to VLLM_DSV4_PORTABLE=1 (printed as vLLM's error). 0.33.0 line: it is
    the generic name of V4's own Triton class (as FLASHMLA_SPARSE is of FlashMLA's): taken as given."""
    r = results["patched"]["dsv4-9.0-explicit"]
    text = explain.text(r, "patched")
    assert ", --backend TRITON_MLA_SPARSE" in text
    auto = text.split(f"\n{LABEL}=auto")[1].split(f"\n{LABEL}=")[0]
    if V4_BY_ENV:
        assert "  attention, vLLM built with FlashMLA: none; vLLM error: " in auto
        assert "VLLM_DSV4_PORTABLE=1" in auto
        assert "  attention, vLLM built without FlashMLA: DeepseekV4TritonAttention" in auto
    else:
        assert {c["attention"]["class"] for c in r["dsv4"]["cases"]} == {"DeepseekV4TritonAttention"}
        assert _v4_lines(auto, "  attention") == [
            "  attention: DeepseekV4TritonAttention (backend TRITON_MLA_SPARSE_DSV4, fp8_ds_mla cache): "
            "attention backend"]
    with pytest.raises(UsageError, match="Unknown attention backend: 'NO_SUCH_BACKEND'"):
        explain._check(results["patched"]["dsv4-9.0-bad-backend"])


def test_dsv4_config_json_same_as_preset(results):
    a, b = results["patched"]["cfg-dsv4-9.0"], results["patched"]["dsv4-9.0"]
    explain._check(a)
    assert a["dsv4"] == b["dsv4"] and a["indexer"] == b["indexer"]
    for key in ("model_type", "head_size", "index_topk", "num_attention_heads", "dtype"):
        assert a["model"][key] == b["model"][key], key


@pytest.mark.parametrize("name", DSV4_BOTH)
def test_dsv4_pristine_tree(results, name):
    """The pristine tree: upstream's class from its own _select_dsv4_attn_cls, no switch
    and no mHC / o_proj / CuTe DSL choice (the series' route is absent), said so."""
    pri, pat = results["pristine"][name], results["patched"][name]
    explain._check(pri)
    assert not pri["dsv4"]["series_route"] and pat["dsv4"]["series_route"]
    text = explain.text(pri, "pristine")
    assert pri["dsv4"]["switch"] is None
    assert "\nthe series' DeepSeek-V4 switch: not in this tree:\n" in text
    assert "  mHC, o_proj, CuTe DSL: no choice in this tree: the series' route" in text
    assert "DeepseekV4TritonAttention" not in text and "\n  mHC: " not in text
    upstream = {c["attention"]["class"] for c in pri["dsv4"]["cases"]}
    assert upstream == {"DeepseekV4FlashMLAAttention" if pri["capability"] == "8.6"
                        else "DeepseekV4FlashInferSM120Attention"}
    # the patched tree's upstream value (VLLM_DSV4_PORTABLE=0, deepseek_v4_kernels=upstream) is pristine's choice
    assert {c["attention"]["class"] for c in pat["dsv4"]["cases"] if c[KEY] == UPSTREAM} == upstream
    assert "\nindexer: none" in text if pri["capability"] == "8.6" else "\nindexer: DeepGEMM" in text


def test_dsv4_matrix_text(results):
    rs = [results["patched"][k] for k in ("dsv4-8.6", "dsv4-9.0", "dsv4-12.0")]
    text = explain.matrix_text(rs, "patched")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == f"| cc | {LABEL} | attention | mHC, o_proj, compressor |"
    assert len(rows) == 1 + 3 * 3
    assert f"| 8.6 | {UPSTREAM} | FlashMLA (its backend: not 8.6) |" in text
    assert ("| 9.0 | auto | FlashMLA (vLLM built with FlashMLA) / Triton (vLLM built without FlashMLA) |"
            in text)
    for r in rs:
        assert (f"| {r['capability']} | {PORTABLE} | Triton | mHC torch/Triton, o_proj bf16, compressor Triton |"
                in text)


def test_dsv4_variants_label_only_inputs_that_change_the_answer():
    """dsv4_variants (no tree): an input is named only where two cases differing in it alone answer
    differently."""
    def case(fi, fm, cls):
        return {"VLLM_DSV4_PORTABLE": "auto", "flashinfer_sm120": fi, "flashmla": fm, "cls": cls}

    same = [case(fi, fm, "A") for fi in (True, False) for fm in (True, False)]
    assert explain.dsv4_variants(same, lambda c: c["cls"]) == [([], "A")]
    by_fm = [case(fi, fm, "A" if fm else "B") for fi in (True, False) for fm in (True, False)]
    assert explain.dsv4_variants(by_fm, lambda c: c["cls"]) == [
        (["vLLM built with FlashMLA"], "A"), (["vLLM built without FlashMLA"], "B")]
    no_fi = [case(None, fm, "A") for fm in (True, False)]
    assert explain.dsv4_variants(no_fi, lambda c: c["cls"]) == [([], "A")]


def test_cli_dsv4_json(vllm_tree):
    """--json for DeepSeek-V4: the cell, the model, the tree's functions and every case asked."""
    res = _cli(vllm_tree, "--model", "deepseek-v4", "--capability", "8.9", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["tree"].startswith("patched work tree") and data["capability"] == "8.9"
    assert data["model"]["model_type"] == "deepseek_v4" and "selected" not in data
    d = data["dsv4"]
    assert set(d) == {"selector", "series_route", "switch", "inputs", "cases", "stand_ins"}
    assert d["selector"] == "vllm.models.deepseek_v4.nvidia.model._select_dsv4_attn_cls"
    assert len(d["cases"]) == 3 * 2 * 2
    for c in d["cases"]:
        assert set(c) == V4_CASE_KEYS
        assert set(c["attention"]) == {"class", "reason", "backend", "backend_supports_capability",
                                       "fp8_ds_mla_layout"}
        assert set(c["mhc"]) == {"kernels", "reason"} and set(c["o_proj"]) == {"path", "reason"}
        assert isinstance(c["cutedsl"], bool)
    auto = [c for c in d["cases"] if c[KEY] == "auto"]
    assert {c["attention"]["class"] for c in auto} == {"DeepseekV4TritonAttention"}
    assert all(c["cutedsl"] for c in auto)  # sm89: the CuTe DSL compressor runs
    assert data["indexer"]["path"] == "deepgemm" or data["indexer"]["path"] == "triton"


@pytest.mark.parametrize("args,msg", [
    (["--dtype", "float16"], "--dtype do not enter DeepSeek-V4"),
    (["--kv-cache-dtype", "fp8", "--tp", "8"], "--kv-cache-dtype, --tp do not enter DeepSeek-V4"),
    (["--heads", "16"], "--heads do not enter DeepSeek-V4"),
])
def test_cli_dsv4_refuses_options_it_does_not_read(vllm_tree, args, msg):
    res = _cli(vllm_tree, "--model", "deepseek-v4", "--capability", "9.0", *args)
    assert res.exit_code == 2, res.output
    assert msg in res.output


def test_explain_runs_in_the_lines_python(tmp_path):
    """A line with its own requirements (requirements/line-<release>.txt) explains in its own Python,
    .venv-<release>; where that is missing, explain stops before any tree is read and names the make
    target that builds it. A line without such a file uses this interpreter."""
    from smla.project import Project

    root = tmp_path / "root"
    (root / "lines" / "0.33.0").mkdir(parents=True)
    (root / "lines" / "0.33.0" / "vllm-pin.txt").write_text((REPO_ROOT / "lines" / "0.33.0" / "vllm-pin.txt")
                                                            .read_text())
    project = Project.at(root, "0.33.0")
    assert explain.line_python(project) is None  # no requirements/line-0.33.0.txt here
    (root / "requirements").mkdir()
    (root / "requirements" / "line-0.33.0.txt").write_text("triton==3.8.0\n")
    with pytest.raises(UsageError, match=r"\.venv-0\.33\.0/bin/python, which is not there") as exc:
        explain.line_python(project)
    assert "make venv VLLM=0.33.0" in exc.value.hint
    py = root / ".venv-0.33.0" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("")
    assert explain.line_python(project) == str(py)
    py.unlink()
    res = CliRunner().invoke(main, ["--root", str(root), "--line", "0.33.0", "explain", "--model", "glm-5",
                                    "--capability", "8.6"])
    assert res.exit_code == 2, res.output
    assert "which is not there" in res.output and "make venv VLLM=0.33.0" in res.output
