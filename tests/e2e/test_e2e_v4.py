"""CPU tests of the DeepSeek-V4 entry of the e2e harness (README "DeepSeek-V4").

Engine arguments and sides' environments (run_e2e.py), the generated checkpoint's reuse
(ensure_checkpoint), the probe (e2e_plugin.describe_dsv4) and the output-projection override,
the engine checks and bounds (compare.py), the README's device commands and the device-time
estimate. The tests marked by the `vllm_tree` fixture read the patched vLLM tree (SMLA_TREE)
for the names and switches the harness relies on.
"""
from __future__ import annotations

import json
import shlex
import sys
import types
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402
import lineproofs  # noqa: E402  (tests/ is on sys.path: pyproject pythonpath)
import e2e_plugin  # noqa: E402
import prompt_lp_guard  # noqa: E402
import run_e2e  # noqa: E402
from test_e2e_harness import _arrays  # noqa: E402 (the same engine outputs)

V4 = "deepseek-v4-tiny"
SIDES = ["ref", "ref2", "ref-o16", "ours"]
# the README's DeepSeek-V4 device command (the last call, after the staging calls), verbatim
V4_CMD = ("bash tests/e2e/device-run.sh run --models deepseek-v4-tiny --sides ref ref2 ref-o16 ours "
          "--parallel 4 --engine-timeout 500")
V4_CALL_TIMEOUT_S = 600  # its run(..., timeout_s=600)
V4_CMD_COMPLETE = V4_CMD + " --v4-ref-kernels complete"


def _args(*extra: str):
    return run_e2e.parse_args(["--models", V4, "--sides", *SIDES, *extra])


def _jobs(*extra: str) -> dict[str, dict]:
    return {j["name"]: j for j in run_e2e.select_jobs(_args(*extra))}


def name(side: str, tp: int = 1) -> str:
    return f"tp{tp}-{V4}-bfloat16-fp8kv-{side}"


# --- engines and their arguments -------------------------------------------------------------


def test_v4_engines_are_bf16_fp8_cache_and_named_by_side():
    jobs = _jobs()
    assert list(jobs) == [name(s) for s in SIDES]
    for j in jobs.values():
        assert (j["model"], j["dtype"], j["kv_cache_dtype"], j["backend"], j["mqa"], j["force_mqa"]) == (
            V4, "bfloat16", "fp8", None, False, False)
        assert j["model_dir"] == str(run_e2e.V4_CHECKPOINTS / V4)  # where ensure_checkpoint writes
    # no fp16 engine (mHC asserts bf16), the fp8 cache whatever --kv-dtypes says, no global force-MQA
    assert list(_jobs("--dtypes", "float16")) == []
    assert list(_jobs("--kv-dtypes", "auto", "fp8", "--force-mqa")) == list(jobs)
    assert not any(j["force_mqa"] for j in _jobs("--force-mqa").values())
    # the DSA models' jobs and the default model list are unchanged
    assert run_e2e.parse_args([]).models == ["deepseek-v32-tiny", "glm5-tiny"]
    dsa = run_e2e.select_jobs(run_e2e.parse_args(["--sides", "ref", "ref2", "ref-o16", "ours"]))
    assert not any("ref-o16" in j["name"] or j["model"] == V4 for j in dsa) and len(dsa) == 10
    # TP=2: 64 heads split to 32 per GPU
    assert list(_jobs("--tp", "1", "2")) == [name(s) for s in SIDES] + [name(s, 2) for s in SIDES]


def test_v4_llm_arguments():
    jobs = _jobs("--v4-checkpoints", "/tmp/x")
    for side, j in jobs.items():
        kw = run_e2e.engine_kwargs(j)
        assert kw["model"] == f"/tmp/x/{V4}" and kw["load_format"] == "auto"
        assert kw["skip_tokenizer_init"] is True and kw["dtype"] == "bfloat16" and kw["kv_cache_dtype"] == "fp8"
        assert kw["enable_chunked_prefill"] and kw["enable_prefix_caching"]
        assert kw["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}  # no backend
        assert "attention_config" not in kw  # V4 picks its class itself; VLLM_DSV4_PORTABLE decides
        assert kw["compilation_config"] == run_e2e.ENGINE["compilation_config"]
        assert "cudagraph_mode" not in kw["compilation_config"] and "mode" not in kw["compilation_config"]
        assert kw["kv_cache_memory_bytes"] == 4 << 30 and kw["tensor_parallel_size"] == 1
        assert kw["max_num_batched_tokens"] == (1024 if side.endswith("-ref2") else 2048)
        assert kw["max_num_batched_tokens"] < max(map(len, run_e2e.workload(8192)[0]))  # chunked prefill
    # the arguments are copies: one engine's cannot change another's
    a, b = (run_e2e.engine_kwargs(j) for j in list(jobs.values())[:2])
    a["speculative_config"]["x"] = 1
    assert "x" not in b["speculative_config"] and "x" not in run_e2e.ENGINE["speculative_config"]


def test_v4_sides_environment():
    jobs = _jobs()
    env = {side: jobs[name(side)]["env"] for side in SIDES}
    assert env["ours"]["VLLM_DSV4_PORTABLE"] == "1" and env["ours"]["VLLM_SPARSE_INDEXER_BACKEND"] == "triton"
    for side in ("ref", "ref2", "ref-o16"):
        assert env[side]["VLLM_DSV4_PORTABLE"] == "auto"
        assert env[side]["VLLM_SPARSE_INDEXER_BACKEND"] == "deepgemm"
    assert env["ref-o16"]["SMLA_E2E_DSV4_O_PROJ"] == "bf16"
    assert not any("SMLA_E2E_DSV4_O_PROJ" in env[s] for s in ("ref", "ref2", "ours"))
    for e in env.values():  # NVLink multicast stays off in every engine (device notes)
        assert (e["NCCL_NVLS_ENABLE"], e["TORCH_SYMM_MEM_DISABLE_MULTICAST"], e["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")
        assert e["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # flashinfer is not on the device
    # --v4-ref-kernels complete forces the upstream mHC / o_proj on the upstream sides only
    jobs = _jobs("--v4-ref-kernels", "complete")
    assert {s: jobs[name(s)]["env"]["VLLM_DSV4_PORTABLE"] for s in SIDES} == {
        "ref": "0", "ref2": "0", "ref-o16": "0", "ours": "1"}
    # --ours-env applies on top of the portable switch
    jobs = _jobs("--ours-env", "VLLM_SPARSE_INDEXER_BACKEND=triton", "--ours-env", "X=1")
    assert jobs[name("ours")]["env"]["VLLM_DSV4_PORTABLE"] == "1" and jobs[name("ours")]["env"]["X"] == "1"


def test_v4_workload_reaches_the_indexer_selection():
    cfg = json.loads((HERE / "models" / V4 / "config.json").read_text())
    assert cfg["compress_ratios"][:3] == [0, 4, 128] and cfg["num_hidden_layers"] == 3
    assert (cfg["num_attention_heads"], cfg["head_dim"], cfg["index_topk"]) == (64, 512, 512)
    assert cfg["num_nextn_predict_layers"] == 1
    # the C4 layer compresses 4:1 and keeps index_topk entries: it selects past 4 x 512 tokens,
    # the same split compare.py makes for the DSA models (index_topk 2048 tokens)
    assert cfg["compress_ratios"][1] * cfg["index_topk"] == compare.V4_SELECTS_FROM == compare.INDEX_TOPK
    prompts, _ = run_e2e.workload(cfg["vocab_size"])
    lens = [len(p) for p in prompts]
    assert sum(n > compare.V4_SELECTS_FROM + 4 for n in lens) >= 8
    seen = np.concatenate([np.arange(1, n) for n in lens])
    assert (seen >= compare.V4_SELECTS_FROM + 4).sum() > 20000  # positions where the indexer selects
    assert max(lens) + run_e2e.GEN_TOKENS <= run_e2e.ENGINE["max_model_len"]
    assert max(lens) > 128 * 8  # the C128 layer holds several compressed entries
    assert all(3 <= t < cfg["vocab_size"] for p in prompts for t in p)


# --- the generated checkpoint ----------------------------------------------------------------

FAKE_GEN = """import json, sys, pathlib
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
(out / "model.safetensors").write_bytes(b"w" * 1000 + {tag!r}.encode())
(out / "config.json").write_text("{{}}")
print("wrote")
"""


def _fake_model(tmp_path, monkeypatch, tag="a", fail=False):
    d = tmp_path / "cfg"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text('{"x": 1}')
    (d / "make_checkpoint.py").write_text("raise SystemExit(3)\n" if fail else FAKE_GEN.format(tag=tag))
    monkeypatch.setitem(run_e2e.MODELS, V4, d)
    return d


def test_checkpoint_is_generated_once_timed_and_reused(tmp_path, monkeypatch):
    d = _fake_model(tmp_path, monkeypatch)
    root = tmp_path / "models"
    first = run_e2e.ensure_checkpoint(V4, root)
    assert first["cached"] is False and first["generate_s"] >= 0 and first["bytes"] == 1001
    assert first["dir"] == str(root / V4) and (root / V4 / "model.safetensors").is_file()
    assert first["generator_output"] == "wrote"
    again = run_e2e.ensure_checkpoint(V4, root)
    assert again["cached"] is True and again["sha256"] == first["sha256"] and again["key"] == first["key"]
    # a changed generator (or config) is a new checkpoint
    (d / "make_checkpoint.py").write_text(FAKE_GEN.format(tag="b"))
    third = run_e2e.ensure_checkpoint(V4, root)
    assert third["cached"] is False and third["key"] != first["key"] and third["sha256"] != first["sha256"]
    # a damaged file is made again, not used
    (root / V4 / "model.safetensors").write_bytes(b"x" * 1001)
    assert run_e2e.ensure_checkpoint(V4, root)["cached"] is False


def test_a_failing_generator_fails_only_that_models_engines(tmp_path, monkeypatch):
    _fake_model(tmp_path, monkeypatch, fail=True)
    jobs = run_e2e.select_jobs(run_e2e.parse_args(["--models", V4, "deepseek-v32-tiny", "--sides", *SIDES]))
    done, failed = run_e2e.prepare_checkpoints(jobs, tmp_path / "models")
    assert failed == [V4] and "make_checkpoint.py failed (3)" in done[V4]["error"]
    assert list(done) == [V4]  # the DSA models need no checkpoint


def test_the_real_generator_is_what_the_key_hashes():
    key = run_e2e.checkpoint_key(V4)
    assert len(key) == 16 and key == run_e2e.checkpoint_key(V4)
    assert (run_e2e.MODELS[V4] / "make_checkpoint.py").is_file()


# --- the probe and the output-projection override ----------------------------------------------


def _fake_dsv4_model(attn_cls: str, backend: str, o_proj_bf16: bool, mhc_names: tuple[str, ...],
                     ratios=(1, 4, 128)):
    """A module tree shaped like vLLM's DeepseekV4ForCausalLM as describe_dsv4 reads it."""
    import torch.nn as nn

    DeepseekV4Attention = type("DeepseekV4Attention", (nn.Module,), {})
    Backend = type("B", (), {"get_name": staticmethod(lambda: backend)})
    SWA = type("S", (), {"get_name": staticmethod(lambda: "DEEPSEEK_SPARSE_SWA")})
    Cls = type(attn_cls, (DeepseekV4Attention,), {"backend_cls": Backend})
    from collections import namedtuple

    Mhc = namedtuple("MHCKernels", ("pre", "post", "head"))

    class Cache(nn.Module):
        def get_attn_backend(self):
            return SWA

    def fn(n):
        f = lambda: None  # noqa: E731
        f.__name__ = n
        return f

    class Layer(nn.Module):
        def __init__(self, r):
            super().__init__()
            self.attn = Cls()
            self.attn.compress_ratio, self.attn.kv_cache_dtype = r, "fp8_ds_mla"
            self.attn._bf16_o_proj = o_proj_bf16
            self.attn.swa_cache_layer = Cache()
            self.attn.indexer = nn.Identity() if r == 4 else None
            self.mhc = Mhc(*(fn(n) for n in mhc_names))

    model = nn.Module()
    model.layers = nn.ModuleList(Layer(r) for r in ratios)
    return model


TILELANG = ("mhc_pre_tilelang", "mhc_post_tilelang", "hc_head_fused_kernel_tilelang")
PORTABLE = ("mhc_pre_torch", "mhc_post_torch", "hc_head_fused_triton")


def test_describe_dsv4_reports_the_kernels_the_layers_hold():
    m = _fake_dsv4_model("DeepseekV4TritonAttention", "TRITON_MLA_SPARSE_DSV4", True, PORTABLE)
    d = e2e_plugin.describe_model(m)
    v = d["dsv4"]
    assert v["attention_classes"] == ["DeepseekV4TritonAttention"] and v["compress_ratios"] == [1, 4, 128]
    assert d["attention_backends"] == ["TRITON_MLA_SPARSE_DSV4"] and d["kv_cache_dtypes"] == ["fp8_ds_mla"]
    assert v["o_proj"] == ["bf16"] and v["mhc_kernels"] == sorted(
        ["pre=mhc_pre_torch", "post=mhc_post_torch", "head=hc_head_fused_triton"])
    assert [x["indexer"] for x in v["layers"]] == [None, "Identity", None]
    assert {x["swa_backend"] for x in v["layers"]} == {"DEEPSEEK_SPARSE_SWA"}
    # no vLLM here: the series' switches cannot be read, and say so
    assert v["compressor"] == "cutedsl (pristine vLLM)" and v["mhc_reason"] == "pristine vLLM"
    # a DSA model's probe has no dsv4 record
    import torch.nn as nn

    assert "dsv4" not in e2e_plugin.describe_model(nn.Linear(2, 2))


def test_o_proj_override_patches_the_selector_before_and_after_import(tmp_path, monkeypatch):
    # already imported (the front end may import the model while resolving the quant config)
    o_proj = types.ModuleType("o_proj")
    portable = types.ModuleType("portable")
    o_proj.select_dsv4_o_proj = portable.select_dsv4_o_proj = lambda: ("deep_gemm", "DeepGEMM fp8_einsum")
    monkeypatch.setitem(sys.modules, e2e_plugin.DSV4_O_PROJ_MODULE, o_proj)
    monkeypatch.setitem(sys.modules, e2e_plugin.DSV4_PORTABLE_MODULE, portable)
    assert e2e_plugin.install_dsv4_o_proj_override({}) is None
    assert o_proj.select_dsv4_o_proj()[0] == "deep_gemm"
    assert e2e_plugin.install_dsv4_o_proj_override({"SMLA_E2E_DSV4_O_PROJ": "bf16"}) == "patched"
    assert o_proj.select_dsv4_o_proj() == portable.select_dsv4_o_proj() == ("bf16", e2e_plugin.DSV4_O_PROJ_REASON)
    with pytest.raises(ValueError):
        e2e_plugin.install_dsv4_o_proj_override({"SMLA_E2E_DSV4_O_PROJ": "fp8"})
    # not yet imported: patched right after its import (a stand-in package with the same shape)
    pkg = tmp_path / "fakev4pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "o_proj.py").write_text("def select_dsv4_o_proj():\n    return 'deep_gemm', 'x'\n\n"
                                   "def use_bf16_o_proj():\n    return select_dsv4_o_proj()[0] == 'bf16'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(e2e_plugin, "DSV4_O_PROJ_MODULE", "fakev4pkg.o_proj")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    assert e2e_plugin.install_dsv4_o_proj_override({"SMLA_E2E_DSV4_O_PROJ": "bf16"}) == "hooked"
    assert e2e_plugin.install_dsv4_o_proj_override({"SMLA_E2E_DSV4_O_PROJ": "bf16"}) == "hooked"
    assert sum(isinstance(f, e2e_plugin._PatchAfterImport) for f in sys.meta_path) == 1
    import importlib

    mod = importlib.import_module("fakev4pkg.o_proj")
    try:
        assert mod.use_bf16_o_proj() is True
        assert not any(isinstance(f, e2e_plugin._PatchAfterImport) for f in sys.meta_path)
        assert not isinstance(mod.__loader__, e2e_plugin._PatchAfterImport)
        assert mod.__spec__.loader is mod.__loader__
    finally:
        sys.modules.pop("fakev4pkg.o_proj", None)
        sys.modules.pop("fakev4pkg", None)


# --- engine checks and bounds ------------------------------------------------------------------


def _record(side: str, complete: bool = False, **over) -> dict:
    want = dict(compare.V4_EXPECT[side], **(compare.V4_COMPLETE if complete and side != "ours" else {}))
    suffix = want.get("mhc_suffixes", ("_tilelang",))[0]
    rec = {"attention_classes": [want["class"]], "attention_backends": [want["backend"]],
           "kv_cache_dtypes": ["fp8_ds_mla"], "o_proj": [want["o_proj"]], "compress_ratios": [1, 4, 128],
           "mhc_kernels": [f"pre=mhc_pre{suffix}", f"head=hc_head{suffix}"],
           "compressor": want.get("compressor", "triton")}
    rec.update(over)
    return rec


def _probe(side: str, rec: dict, drafter: dict | None = None) -> dict:
    idx = "triton" if side == "ours" else "deepgemm"
    def one(r: dict) -> dict:  # an empty record: a probe without the dsv4 part
        out = {"attention_backends": r.get("attention_backends", []),
               "kv_cache_dtypes": r.get("kv_cache_dtypes", ["fp8_ds_mla"]), "indexer_logits": [idx, "why"]}
        return dict(out, dsv4=r) if r else out

    d = drafter if drafter is not None else (dict(rec, compress_ratios=[1]) if rec else {})
    return {"model_probe": [one(rec)], "drafter_probe": [one(d)]}


def _run(tmp_path, shifts=None, records=None, extra=(), sides=SIDES, top1_flips=None, logs=None):
    """Engines of the V4 command on synthetic arrays: shifts[side] moves every prompt logprob;
    top1_flips[side] changes the teacher-forced top-1 token at that fraction of positions;
    logs[side] is that engine's engine.log."""
    args = run_e2e.parse_args(["--models", V4, "--sides", *sides, *extra])
    jobs = run_e2e.select_jobs(args)
    base = _arrays()
    for job in jobs:
        arrays = {k: v.copy() for k, v in base.items()}
        arrays["prompt_lp"] += np.float32((shifts or {}).get(job["side"], 0.0))
        flips = int((top1_flips or {}).get(job["side"], 0.0) * arrays["prompt_top1"].size)
        arrays["prompt_top1"][:flips] += 1
        complete = job["v4_ref_kernels"] == "complete"
        rec = (records or {}).get(job["side"], _record(job["side"], complete))
        meta = {"ok": True, **_probe(job["side"], rec),
                "worker_cudagraphs": [{"cudagraph_mode": "CUDAGraphMode.FULL_AND_PIECEWISE"}],
                "sparse_mla_force_mqa": False,
                "kv_cache": {"dtype_used": "fp8", "tokens": 100000, "max_concurrency": 12.0, "line": "x"}}
        (tmp_path / job["name"]).mkdir(parents=True)
        (tmp_path / job["name"] / "meta.json").write_text(json.dumps(meta))
        np.savez_compressed(tmp_path / job["name"] / "arrays.npz", **arrays)
        log = prompt_lp_guard.line(prompt_lp_guard.INSTALLED) + "\n" + (logs or {}).get(job["side"], "")
        (tmp_path / job["name"] / "engine.log").write_text(log)
    bounds = json.loads((HERE / "bounds.json").read_text())
    return compare.compare_all(jobs, tmp_path, bounds), bounds


def _by(s):
    return {(c["name"].rsplit("-fp8kv-", 1)[1], c["ref"].rsplit("-fp8kv-", 1)[1]): c for c in s["comparisons"]}


def test_v4_comparisons_and_their_bounds(tmp_path):
    # calibration 0.02 (ref2), o_proj cost 0.05 (ref-o16), ours 0.06 from ref (0.01 from ref-o16)
    s, bounds = _run(tmp_path, shifts={"ref2": 0.02, "ref-o16": 0.05, "ours": 0.06})
    assert s["failures"] == [] and s["exit_code"] == 0
    c = _by(s)
    assert set(c) == {("ref2", "ref"), ("ref-o16", "ref"), ("ours", "ref-o16"), ("ours", "ref")}
    assert c[("ref2", "ref")]["role"] == "calibration" and "bounds" not in c[("ref2", "ref")]
    cost = c[("ref-o16", "ref")]
    assert cost["bounds"] == bounds["fixed"]["bfloat16"] and cost["broken"] == []
    kern = c[("ours", "ref-o16")]
    assert kern["bounds"]["tf_mean_abs"] == pytest.approx(2 * 0.02, rel=1e-4)  # factor 2 x calibration
    assert kern["bounds"]["tf_p99_abs"] == bounds["floor"]["bfloat16"]["tf_p99_abs"]  # floor 0.05 > 0.04
    assert kern["bounds_from"].startswith("same bf16 output projection on both sides; 2.0 x ref2-vs-ref spread")
    whole = c[("ours", "ref")]
    assert whole["bounds"]["tf_mean_abs"] == pytest.approx(0.04 + 0.05, rel=1e-4)  # kernel bound + o_proj cost
    assert whole["bounds"]["tf_p99_abs"] == pytest.approx(0.05 + 0.05, rel=1e-4)
    assert whole["bounds"]["divergence_margin_max"] == kern["bounds"]["divergence_margin_max"]
    assert whole["bounds_from"].startswith("ours-vs-ref-o16 bound + 1.0 x ref-o16-vs-ref (o_proj cost)")
    report = compare.write_report(s)
    assert f"| {name('ours')} vs {name('ref-o16')} |" in report and f"| {name('ours')} vs {name('ref')} |" in report
    assert "| True | TRITON_MLA_SPARSE_DSV4 / triton |" in report


@pytest.mark.parametrize("shifts,broken", [
    ({"ref2": 0.02, "ref-o16": 0.05, "ours": 0.05 + 0.06}, {("ours", "ref-o16"), ("ours", "ref")}),
    ({"ref2": 0.02, "ref-o16": 0.0, "ours": 0.2}, {("ours", "ref-o16"), ("ours", "ref")}),
    # a broken bf16 projection (shared by ours and ref-o16): only the o_proj-cost sanity bound sees it
    ({"ref2": 0.02, "ref-o16": 0.5, "ours": 0.5}, {("ref-o16", "ref")}),
])
def test_v4_bounds_break(tmp_path, shifts, broken):
    s, _ = _run(tmp_path, shifts=shifts)
    assert s["failures"] == [] and s["exit_code"] == 1
    assert {k for k, c in _by(s).items() if c["broken"]} == broken


@pytest.mark.parametrize("o16_flips,broken", [(0.09, False), (0.13, True)])
def test_v4_o_proj_sanity_top1_bound_is_at_least_the_calibrated_one(tmp_path, o16_flips, broken):
    # upstream vs upstream disagrees on 6% of the top-1 tokens: calibrated bound 0.12 > fixed 0.06
    s, bounds = _run(tmp_path, top1_flips={"ref2": 0.06, "ref-o16": o16_flips, "ours": o16_flips})
    cost = _by(s)[("ref-o16", "ref")]
    assert cost["bounds"]["tf_top1_disagree"] == pytest.approx(0.12, abs=1e-3)
    assert cost["bounds"]["tf_mean_abs"] == bounds["fixed"]["bfloat16"]["tf_mean_abs"]
    assert cost["bounds_from"].endswith("tf_top1_disagree: at least the calibrated bound")
    assert bool(cost["broken"]) is broken
    assert bounds["fixed"]["bfloat16"]["tf_top1_disagree"] < o16_flips  # the fixed bound alone fails


def test_v4_report_counts_the_nan_probe_records_of_each_engine(tmp_path):
    line = "(EngineCore pid=1) SMLA_NANCHECK " + json.dumps({"layer": "model.layers.0.attn", "check": "attn_out"})
    log = "\n".join(["INFO start", line, line.replace("attn_out", "o_proj"), line, "INFO done"])
    s, _ = _run(tmp_path, logs={"ours": log, "ref": "INFO no probe here\n"})
    assert s["engines"][name("ours")]["nan_probe"] == {"attn_out": 2, "o_proj": 1}
    assert "nan_probe" not in s["engines"][name("ref")] and "nan_probe" not in s["engines"][name("ref2")]
    report = compare.write_report(s)
    assert f"- {name('ours')}: attn_out 2, o_proj 1" in report
    assert "NaN probe" not in compare.write_report(_run(tmp_path / "b")[0])


def test_v4_without_calibration_or_o_proj_engine_falls_back_to_fixed_bounds(tmp_path):
    s, bounds = _run(tmp_path, sides=["ref", "ours"], shifts={"ours": 0.05})
    assert s["exit_code"] == 0
    (c,) = s["comparisons"]
    assert c["ref"] == name("ref") and c["bounds"] == bounds["fixed"]["bfloat16"]
    assert c["bounds_from"] == "fixed bfloat16 (no ref-o16 in this run)"
    s, bounds = _run(tmp_path / "b", sides=["ref", "ref-o16", "ours"], shifts={"ref-o16": 0.05, "ours": 0.06})
    kern = _by(s)[("ours", "ref-o16")]
    assert kern["bounds"] == bounds["fixed"]["bfloat16"] and kern["bounds_from"].startswith(
        "same bf16 output projection on both sides; fixed (no ref2 calibration")


@pytest.mark.parametrize("side,over,drafter,msg", [
    ("ours", {"attention_classes": ["DeepseekV4FlashMLAAttention"]}, None,
     "target: attention classes ['DeepseekV4FlashMLAAttention'], expected ['DeepseekV4TritonAttention']"),
    ("ours", {"o_proj": ["deep_gemm"]}, None, "target: output projection ['deep_gemm'], expected ['bf16']"),
    ("ours", {"mhc_kernels": ["pre=mhc_pre_tilelang"]}, None, "target: mHC kernels ['pre=mhc_pre_tilelang']"),
    ("ours", {"compressor": "cutedsl"}, None, "target: compressor ['cutedsl'], expected ['triton']"),
    ("ours", {}, dict(_record("ours"), attention_classes=["DeepseekV4FlashMLAAttention"], compress_ratios=[1]),
     "MTP drafter: attention classes ['DeepseekV4FlashMLAAttention']"),
    ("ref", {"attention_backends": ["TRITON_MLA_SPARSE_DSV4"]}, None,
     "target: attention backends ['TRITON_MLA_SPARSE_DSV4'], expected ['FLASHMLA_SPARSE_DSV4']"),
    ("ref", {"kv_cache_dtypes": ["bfloat16"]}, None, "target: KV cache ['bfloat16'], expected ['fp8_ds_mla']"),
    ("ref", {"compress_ratios": [1, 4]}, None, "target: compress ratios [1, 4], expected [1, 4, 128]"),
    ("ref-o16", {"o_proj": ["deep_gemm"]}, None, "target: output projection ['deep_gemm'], expected ['bf16']"),
    ("ref2", {"o_proj": ["bf16"]}, None, "target: output projection ['bf16'], expected ['deep_gemm']"),
])
def test_a_v4_engine_on_the_wrong_kernels_fails(tmp_path, side, over, drafter, msg):
    rec = _record(side, **over)
    s, _ = _run(tmp_path, records={side: rec} if drafter is None else None)
    if drafter is not None:  # rewrite that engine's drafter probe
        meta_f = tmp_path / name(side) / "meta.json"
        meta = json.loads(meta_f.read_text())
        meta.update(_probe(side, _record(side), drafter))
        meta_f.write_text(json.dumps(meta))
        jobs = run_e2e.select_jobs(run_e2e.parse_args(["--models", V4, "--sides", *SIDES]))
        s = compare.compare_all(jobs, tmp_path, json.loads((HERE / "bounds.json").read_text()))
    assert s["exit_code"] == 3
    assert [f for f in s["failures"] if f.startswith(f"{name(side)}: ") and msg in f], s["failures"]


def test_v4_ref_kernels_complete_requires_tilelang_mhc_and_the_cutedsl_compressor(tmp_path):
    # what `available` accepts (portable mHC and Triton compressor on the upstream sides, as the
    # patched wheel picks without tilelang / nvidia-cutlass-dsl) fails under `complete`
    fallback = {s: _record(s, mhc_kernels=list(PORTABLE), compressor="triton") for s in ("ref", "ref2", "ref-o16")}
    s, _ = _run(tmp_path / "a", records=fallback)
    assert s["failures"] == [] and s["exit_code"] == 0
    s, _ = _run(tmp_path / "b", records=fallback, extra=["--v4-ref-kernels", "complete"])
    assert s["exit_code"] == 3
    for side in ("ref", "ref2", "ref-o16"):
        assert any(f.startswith(f"{name(side)}: target: mHC kernels") for f in s["failures"])
        assert any(f.startswith(f"{name(side)}: target: compressor ['triton'], expected ['cutedsl']")
                   for f in s["failures"])
    s, _ = _run(tmp_path / "c", extra=["--v4-ref-kernels", "complete"])
    assert s["failures"] == [] and s["exit_code"] == 0


def test_a_v4_engine_without_the_dsv4_probe_fails(tmp_path):
    # e.g. the official wheel's vLLM or a DSA model loaded by mistake: no record, no pass
    s, _ = _run(tmp_path, records={"ours": {}})
    msgs = [f for f in s["failures"] if f.startswith(name("ours"))]
    assert s["exit_code"] == 3 and msgs and "no DeepSeek-V4 attention layer in the probe" in msgs[0]


# --- the README's device commands and the estimate ---------------------------------------------


def test_the_readme_v4_commands_select_the_v4_engines_and_fit_the_call():
    readme = (HERE / "README.md").read_text()
    for cmd in (V4_CMD, V4_CMD_COMPLETE):
        assert cmd in readme
        argv = shlex.split(cmd)
        assert argv[:3] == ["bash", "tests/e2e/device-run.sh", "run"]
        args = run_e2e.parse_args(argv[3:] + ["--gpus", "1"])
        jobs = run_e2e.select_jobs(args)
        assert [j["name"] for j in jobs] == [name(s) for s in SIDES]
        est = run_e2e.estimate(jobs, args.parallel)
        assert est["waves"] == 1  # one wave: every engine starts at once
        assert args.engine_timeout >= est["engine_timeout_needed_s"]
        # the call ends inside its limit even when every engine runs into its timeout
        assert est["install_s"] + est["checkpoint_s"] + args.engine_timeout + est["compare_s"] <= V4_CALL_TIMEOUT_S
    assert f"timeout_s={V4_CALL_TIMEOUT_S}" in readme
    assert "--v4-ref-kernels complete" in readme and "stage-extra" in readme


def test_plan_prints_engines_and_estimate(capsys):
    assert run_e2e.main(shlex.split(V4_CMD)[3:] + ["--plan"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["name"] for e in out["engines"]] == [name(s) for s in SIDES]
    assert out["engines"][3]["env"]["VLLM_DSV4_PORTABLE"] == "1"
    assert out["engines"][0]["llm_kwargs"]["load_format"] == "auto"
    assert out["estimate"]["checkpoint_s"] == run_e2e.ESTIMATE["checkpoint_s"]
    assert out["estimate"]["total_s"] == (run_e2e.ESTIMATE["install_s"] + run_e2e.ESTIMATE["checkpoint_s"]
                                          + run_e2e.ESTIMATE["v4_start_s"] + run_e2e.ESTIMATE["v4_passes_s"]
                                          + run_e2e.ESTIMATE["compare_s"])
    assert run_e2e.estimate(run_e2e.select_jobs(_args()), 4, checkpoint_cached=True)["checkpoint_s"] == 0


# --- what the harness relies on in the patched vLLM tree (read, not run) -------------------------


def _src(tree: Path, rel: str) -> str:
    return (tree / "vllm" / rel).read_text()


@lineproofs.replaced_on(v0_33_0="the V4 e2e harness drives the 0.26.0 series' switch VLLM_DSV4_PORTABLE; "
                                 "0.33.0's is KernelConfig.deepseek_v4_kernels and its engine has not run here "
                                 "(torch 2.14); tests/lines/0.33.0/v4 checks its selection")
def test_the_tree_has_the_switches_and_names_the_harness_relies_on(vllm_tree):
    v4 = "models/deepseek_v4/"
    portable = _src(vllm_tree, v4 + "nvidia/portable.py")
    model = _src(vllm_tree, v4 + "nvidia/model.py")
    ops = _src(vllm_tree, v4 + "nvidia/ops/__init__.py")
    o_proj = _src(vllm_tree, v4 + "nvidia/ops/o_proj.py")
    # VLLM_DSV4_PORTABLE=1 forces every part of the portable path (the V4 attention selection patch)
    assert 'if portable == "1":' in model and 'return DeepseekV4TritonAttention, "forced by VLLM_DSV4_PORTABLE=1"' in model
    assert 'kernels, reason = PORTABLE_MHC, "torch/Triton, forced by VLLM_DSV4_PORTABLE=1"' in portable
    assert 'path, reason = "bf16", "bf16, forced by VLLM_DSV4_PORTABLE=1"' in portable
    assert '(envs.VLLM_DSV4_PORTABLE or "auto").lower() != "1"' in ops
    # ... and conflicts with a named upstream backend: the harness names none for V4
    assert "VLLM_DSV4_PORTABLE=1 runs DeepSeek V4 attention on" in model
    # auto on sm90 keeps FlashMLA where vLLM has it
    assert 'elif major in (9, 10) and is_flashmla_sparse_supported()[0]:' in model
    # the names the probe and compare.py expect
    assert "class DeepseekV4TritonAttention(DeepseekV4FlashMLAAttention):" in _src(vllm_tree, v4 + "nvidia/triton_sparse.py")
    assert 'return "TRITON_MLA_SPARSE_DSV4"' in _src(vllm_tree, v4 + "nvidia/triton_sparse.py")
    assert 'return "FLASHMLA_SPARSE_DSV4"' in _src(vllm_tree, v4 + "sparse_mla.py")
    flashmla = _src(vllm_tree, v4 + "nvidia/flashmla.py")
    assert "class DeepseekV4FlashMLAAttention(DeepseekV4Attention):" in flashmla
    assert "self._bf16_o_proj = use_bf16_o_proj(self.wo_a)" in flashmla
    attention = _src(vllm_tree, v4 + "attention.py")
    assert "self.swa_cache_layer = DeepseekV4SWACache(" in attention and "self.compress_ratio = max(1," in attention
    assert "self.kv_cache_dtype, self.kv_cache_torch_dtype = _resolve_dsv4_kv_cache_dtype(" in attention
    # V4's fp8_ds_mla classes need an fp8 cache: kv_cache_dtype "fp8" is required, not a choice
    assert 'assert kv_cache_dtype.startswith("fp8")' in attention
    for fn in ("mhc_pre_broadcast_torch", "mhc_pre_torch", "mhc_fused_post_pre_torch", "mhc_post_torch",
               "hc_head_fused_triton", "mhc_pre_broadcast_tilelang", "mhc_pre_tilelang",
               "mhc_fused_post_pre_tilelang", "mhc_post_tilelang", "hc_head_fused_kernel_tilelang"):
        assert f"={fn}," in portable.replace(" ", "").replace("\n", "")
    assert "self.mhc, _ = select_dsv4_mhc_kernels()" in model
    assert "self.mhc, _ = select_dsv4_mhc_kernels()" in _src(vllm_tree, v4 + "nvidia/mtp.py")
    # the ref-o16 override: use_bf16_o_proj looks select_dsv4_o_proj up in o_proj's namespace
    assert "from vllm.models.deepseek_v4.nvidia.portable import select_dsv4_o_proj" in o_proj
    assert 'use_bf16 = select_dsv4_o_proj()[0] == "bf16"' in o_proj
    # the probe's indexer path and V4's breakable CUDA graph
    assert "def select_sparse_indexer_logits()" in _src(vllm_tree, "v1/attention/backends/mla/indexer.py")
    assert '"DeepseekV4ForCausalLM",' in _src(vllm_tree, "config/vllm.py")


# --- the optional upstream bundle (TileLang + CuTe DSL) -------------------------------------------


def test_store_wheel_keeps_every_member_and_stores_it_uncompressed(tmp_path):
    import zipfile

    import bundle

    w = tmp_path / "pkg-1.0-py3-none-any.whl"
    members = {"pkg/__init__.py": b"x = 1\n" * 100, "pkg/lib.so": bytes(range(256)) * 50,
               "pkg-1.0.dist-info/RECORD": b"pkg/__init__.py,,\n"}
    with zipfile.ZipFile(w, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            info = zipfile.ZipInfo(n, date_time=(2026, 4, 22, 8, 55, 0))
            info.external_attr = 0o755 << 16
            z.writestr(info, d, compress_type=zipfile.ZIP_DEFLATED)
    bundle.store_wheel(w)
    with zipfile.ZipFile(w) as z:
        assert [i.filename for i in z.infolist()] == list(members)
        for i in z.infolist():
            assert i.compress_type == zipfile.ZIP_STORED and z.read(i.filename) == members[i.filename]
            assert i.date_time == (2026, 4, 22, 8, 55, 0) and i.external_attr == 0o755 << 16
    assert not list(tmp_path.glob("*.stored"))


def test_the_extra_bundle_has_no_vllm_wheel_and_stores_its_deps(tmp_path, monkeypatch):
    import zipfile

    import bundle

    def fake_download(req_file, dst):
        assert req_file.name == "device-requirements-v4-upstream.txt"
        dst.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(dst / "tilelang-0.1.9-cp38-abi3-x.whl", "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("tilelang/__init__.py", "x" * 5000)
        return ["tilelang-0.1.9-cp38-abi3-x.whl"]

    monkeypatch.setattr(bundle, "download_deps", fake_download)
    monkeypatch.setattr(bundle.proc, "run", lambda cmd, **kw: __import__("subprocess").run(
        [str(c) for c in cmd], check=True))
    out = tmp_path / ".e2e-extra"
    assert bundle.main(["--extra", "--out", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["extra"] is True and m["wheel"] is None and m["deps"] == ["tilelang-0.1.9-cp38-abi3-x.whl"]
    assert list(m["files"]) == ["deps/tilelang-0.1.9-cp38-abi3-x.whl"] and len(m["pieces"]) == 1
    with zipfile.ZipFile(out / "build" / "deps" / m["deps"][0]) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    assert bundle.main(["--out", str(tmp_path / "x")]) != 0  # the main bundle still needs --wheel
    reqs = [ln.split("#")[0].strip() for ln in (HERE / "device-requirements-v4-upstream.txt").read_text().splitlines()]
    assert [r.split("==")[0] for r in reqs if r] == [
        "tilelang", "z3-solver", "torch-c-dlpack-ext", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
        "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu13"]
    main_reqs = (HERE / "device-requirements.txt").read_text()
    assert "\ncompressed-tensors==0.17.0\n" in main_reqs and "\nloguru==0.7.3\n" in main_reqs


def test_extra_pieces_staged_in_their_own_calls_assemble_with_the_stored_manifest(tmp_path):
    import hashlib
    import io
    import lzma
    import tarfile

    import bundle
    import device_pieces

    src = tmp_path / "src"
    src.mkdir()
    raw = io.BytesIO()
    data = np.random.default_rng(1).bytes(9000)
    with tarfile.open(fileobj=raw, mode="w") as tar:
        ti = tarfile.TarInfo("deps/a.whl")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    payload = src / "payload.tar.xz"
    payload.write_bytes(lzma.compress(raw.getvalue()))
    pieces = bundle.split(payload, src, 4096)
    manifest = {"files": {"deps/a.whl": hashlib.sha256(data).hexdigest()}, "pieces": pieces,
                "payload": {"sha256": hashlib.sha256(payload.read_bytes()).hexdigest()}}
    (src / "manifest.json").write_text(json.dumps(manifest))
    store = tmp_path / "store"
    for p in pieces:  # one stage-extra call per piece, each carrying the manifest
        call = tmp_path / f"call{p['index']}" / ".e2e-extra"
        (call / "pieces" / f"{p['index']:02d}").mkdir(parents=True)
        (call / "manifest.json").write_bytes((src / "manifest.json").read_bytes())
        (call / p["path"]).write_bytes((src / p["path"]).read_bytes())
        device_pieces.stage(call, store)
    # the run call carries only the main bundle: the extra bundle's manifest comes from the store
    bare = tmp_path / "run" / ".e2e-extra"
    with pytest.raises(device_pieces.PieceError) as exc:
        device_pieces.assemble(bare, store)
    assert exc.value.code == device_pieces.NO_MANIFEST
    out = device_pieces.assemble(bare, store, use_stored=True)
    assert (out / "deps" / "a.whl").read_bytes() == data


def test_device_scripts_stage_and_install_the_extra_bundle():
    setup = (HERE / "device-setup.sh").read_text()
    assert 'if [ "$1" = stage-extra ]; then' in setup
    assert "device_pieces.py stage --bundle .e2e-extra --store \"$extra_store\"" in setup
    assert "--use-stored-manifest" in setup
    # the .pth of nvidia-cutlass-dsl is not read on PYTHONPATH: its folder is named
    assert "extra_path=:$site_extra:$site_extra/nvidia_cutlass_dsl/dsl_packages" in setup
    assert "export PYTHONPATH=$site$extra_path:$PWD/tests/e2e" in setup
    run = (HERE / "device-run.sh").read_text()
    assert '("tilelang", "tilelang")' in run and '("cutlass", "nvidia-cutlass-dsl")' in run


@pytest.mark.slow  # long CPU work: spawns engine processes that import torch (about half a minute)
def test_main_makes_the_checkpoint_before_the_engines_and_reports_it(tmp_path, monkeypatch):
    """run_e2e.main end to end on the CPU: the (stand-in) checkpoint is made first, the engines
    are spawned with its directory, and summary.json carries it; the engines themselves fail
    here (no vLLM), which must be an engine failure (exit 3), not a crash of the run."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: the engines would really start")
    _fake_model(tmp_path, monkeypatch)
    out, res, ckpt = tmp_path / "out", tmp_path / "res", tmp_path / "models"
    rc = run_e2e.main(["--models", V4, "--sides", "ref", "ours", "--parallel", "2", "--engine-timeout", "120",
                       "--out", str(out), "--results", str(res), "--v4-checkpoints", str(ckpt)])
    assert rc == 3
    s = json.loads((out / "summary.json").read_text())
    assert s["checkpoints"][V4]["cached"] is False and s["checkpoints"][V4]["dir"] == str(ckpt / V4)
    jobs = json.loads((res / "jobs.json").read_text())
    assert [j["model_dir"] for j in jobs] == [str(ckpt / V4)] * 2
    assert sorted(s["engines"]) == [name("ours"), name("ref")]
    assert all("vllm" in e["error"] for e in s["engines"].values())
    # a second run on the same machine reuses the checkpoint
    run_e2e.main(["--models", V4, "--sides", "ref", "--parallel", "1", "--out", str(out), "--results", str(res),
                  "--v4-checkpoints", str(ckpt)])
    assert json.loads((out / "summary.json").read_text())["checkpoints"][V4]["cached"] is True


def test_cudagraph_mode_reaches_every_engine_and_only_when_asked():
    """--cudagraph-mode (the upstream defect's bisect, README "DeepSeek-V4"): every engine's
    compilation_config gets it beside the capture sizes; without it vLLM's default stays."""
    for extra, want in (((), None), (("--cudagraph-mode", "FULL_DECODE_ONLY"), "FULL_DECODE_ONLY")):
        args = run_e2e.parse_args(["--models", V4, "glm5-tiny", "--sides", "ref", "ours", *extra])
        jobs = run_e2e.select_jobs(args)
        assert {run_e2e.is_v4(j["model"]) for j in jobs} == {True, False}
        for job in jobs:
            cc = run_e2e.engine_kwargs(job)["compilation_config"]
            assert cc.get("cudagraph_mode") == want, job["name"]
            assert cc["cudagraph_capture_sizes"] == run_e2e.ENGINE["compilation_config"]["cudagraph_capture_sizes"]
    assert "cudagraph_mode" not in run_e2e.ENGINE["compilation_config"]  # the shared default untouched
    with pytest.raises(SystemExit):
        run_e2e.parse_args(["--models", V4, "--cudagraph-mode", "NONE"])
