"""CPU tests of the 4-bit checkpoints (models/dsa-4bit) and the IndexCache model (glm52-tiny) in
the e2e harness: the packing against vLLM 0.26.0's own pack helpers and AWQ conversion, the
quantisation, vLLM's config / quant classes and loader accepting the checkpoints
(cpu_load_check.py, slow), the probe's checks (quant_probe.py) and the engines run_e2e makes.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import quant_probe  # noqa: E402
import run_e2e  # noqa: E402

GEN_DIR = HERE / "models" / "dsa-4bit"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


gen = _load("dsa4bit_make_checkpoint", GEN_DIR / "make_checkpoint.py")

VLLM_PACKING = r"""
import importlib.util, sys, torch
try:
    import compressed_tensors  # noqa: F401  (vLLM's MoE oracle imports it; the toolkit lacks it)
except ImportError:
    spec = importlib.util.spec_from_file_location("v4check", sys.argv[3])
    v4check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(v4check)
    v4check._stub_packages({"compressed_tensors"})
from vllm.model_executor.layers.quantization.utils.quant_utils import awq_pack, gptq_pack, pack_cols
from vllm.model_executor.layers.quantization.auto_awq import _convert_awq_to_standard_format
import vllm.model_executor.parameter as P
P.get_tensor_model_parallel_rank = lambda: 0  # one rank, no process group here
P.get_tensor_model_parallel_world_size = lambda: 1
d = torch.load(sys.argv[1])
q, z = d["q"], d["z"]
k, n = q.shape
out = {"awq_qweight": awq_pack(q, 4, k, n), "awq_qzeros": awq_pack(z, 4, z.shape[0], n),
       "gptq_qweight": gptq_pack(q, 4, k, n), "gptq_qzeros": pack_cols(z, 4, z.shape[0], n)}
layer = torch.nn.Module()
layer.qweight = torch.nn.Parameter(d["our_awq_qweight"], requires_grad=False)
layer.qzeros = torch.nn.Parameter(d["our_awq_qzeros"], requires_grad=False)
_convert_awq_to_standard_format(layer, "qweight", "qzeros", 4)
out["converted_qweight"] = layer.qweight.data
out["converted_qzeros"] = layer.qzeros.data
torch.save(out, sys.argv[2])
"""


def _vllm(vllm_tree: Path, script: str, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(vllm_tree), VLLM_USE_FLASHINFER_SAMPLER="0")
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_packing_is_vllms_and_awq_converts_to_vllms_standard_layout(vllm_tree, tmp_path):
    """Our AWQ / GPTQ packing equals vLLM 0.26.0's awq_pack / gptq_pack / pack_cols, and vLLM's
    _convert_awq_to_standard_format (what its AWQ Marlin path runs first) turns our AWQ tensors
    into the standard layout: qweight packed along K, qzeros transposed and packed along N."""
    g = torch.Generator().manual_seed(5)
    k, n = 256, 64
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
    z = torch.randint(0, 16, (k // 128, n), generator=g, dtype=torch.int32)
    ours = {"our_awq_qweight": gen.pack_along_cols(q, gen.AWQ_ORDER),
            "our_awq_qzeros": gen.pack_along_cols(z, gen.AWQ_ORDER)}
    torch.save({"q": q, "z": z, **ours}, tmp_path / "in.pt")
    _vllm(vllm_tree, VLLM_PACKING, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"),
          str(HERE / "models" / "deepseek-v4-tiny" / "cpu_load_check.py"))
    v = torch.load(tmp_path / "out.pt")
    assert torch.equal(ours["our_awq_qweight"], v["awq_qweight"].to(torch.int32))
    assert torch.equal(ours["our_awq_qzeros"], v["awq_qzeros"].to(torch.int32))
    assert torch.equal(gen.pack_along_rows(q), v["gptq_qweight"].to(torch.int32))
    assert torch.equal(gen.pack_along_cols(z), v["gptq_qzeros"].to(torch.int32))
    assert torch.equal(v["converted_qweight"], gen.pack_along_rows(q))
    assert torch.equal(v["converted_qzeros"], gen.pack_along_rows(z.t().contiguous()))


def test_nvfp4_is_nearest_on_the_e2m1_grid_with_e4m3_block_scales():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g) / 16
    t = gen.quantize_nvfp4(w)
    assert t["weight"].dtype == torch.uint8 and t["weight"].shape == (64, 128)
    assert t["weight_scale"].dtype == torch.float8_e4m3fn and t["weight_scale"].shape == (64, 16)
    eff = (t["weight_scale"].float() * t["weight_scale_2"]).repeat_interleave(16, dim=1)
    x = w / eff
    grid = torch.tensor(gen.E2M1)
    cand = torch.cat([grid, -grid])
    nearest = cand[(x.unsqueeze(-1) - cand).abs().argmin(dim=-1)]
    back = gen.dequantize(t, "nvfp4") / eff
    assert torch.allclose((back - x).abs(), (nearest - x).abs(), atol=1e-5)  # nearest grid point
    assert (t["weight"] & 0x0F).max() <= 15 and float(t["weight_scale_2"]) > 0


@pytest.mark.parametrize("fmt", ("awq", "gptq", "ct"))
def test_quantisation_is_round_to_nearest_of_the_seeded_weight(fmt):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(192, 512, generator=g) / 512 ** 0.5
    t = {"awq": gen.quantize_awq, "gptq": gen.quantize_gptq, "ct": gen.quantize_ct}[fmt](w)
    back = gen.dequantize(t, fmt)
    if fmt == "ct":  # [N, K/128]
        step = t["weight_scale"].float().repeat_interleave(gen.GROUP, dim=1)
        assert t["weight_shape"].tolist() == [192, 512]
    else:  # [K/128, N]
        step = t["scales"].float().repeat_interleave(gen.GROUP, dim=0).t()
    err = (back - w).abs()
    assert back.shape == w.shape
    ok = err <= step / 2 + 1e-6
    if fmt in ("gptq", "ct"):  # the symmetric grid (scale 2 amax / 15, codes -8..7) clips +amax to 7 steps
        ok |= (back >= 7 * step - 1e-6) & (err <= step + 1e-6)
    assert bool(ok.all()), "not round to nearest within a group's step"
    assert err.max() > 0  # a real 4-bit checkpoint: the weights do change
    if fmt == "gptq":
        assert torch.equal(t["g_idx"], (torch.arange(512) // 128).to(torch.int32))
        assert bool((gen.unpack_along_cols(t["qzeros"]) == 7).all())  # v1 format: zero 8 stored as 7


def test_stored_tensors_are_the_specs_and_4bit_covers_every_mlp():
    cfg = json.loads((HERE / "models" / "glm5-tiny" / "config.json").read_text())
    for fmt in gen.FORMATS:
        st = gen.stored_tensors(cfg, fmt)
        q4 = [name for name, _, kind in gen.checkpoint_specs(cfg) if kind == "q4"]
        n_layers = cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
        dense = cfg["first_k_dense_replace"]
        assert len(q4) == 3 * dense + (n_layers - dense) * 3 * (cfg["n_routed_experts"] + 1)
        assert all(".mlp." in n for n in q4)
        assert not any("self_attn" in n for n, (_, dt) in st.items() if dt in (torch.int32, torch.uint8))
        packed = {"ct": ("weight_packed", "weight_scale"),
                  "nvfp4": ("weight", "weight_scale")}.get(fmt, ("qweight", "scales"))
        assert all(f"{n}.{packed[0]}" in st and f"{n}.{packed[1]}" in st for n in q4)
        assert (f"{q4[0]}.g_idx" in st) == (fmt == "gptq")


def test_values_are_seeded_per_tensor_name():
    a = gen.full_precision("model.layers.1.mlp.experts.3.up_proj", (256, 1024), "q4", gen.SEED)
    b = gen.full_precision("model.layers.1.mlp.experts.3.up_proj", (256, 1024), "q4", gen.SEED)
    c = gen.full_precision("model.layers.1.mlp.experts.4.up_proj", (256, 1024), "q4", gen.SEED)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.std().item() - 1024 ** -0.5) < 0.002


def _compressed_tensors_path(tmp_path: Path) -> str | None:
    """compressed-tensors and loguru, unpacked from the e2e bundle's wheels (pure Python; the
    toolkit does not install them): None when the bundle is not built here."""
    import zipfile

    deps = HERE.parent.parent / ".e2e" / "build" / "deps"
    wheels = [next(iter(sorted(deps.glob(f"{n}-*.whl"))), None) for n in ("compressed_tensors", "loguru")]
    if not all(wheels):
        return None
    site = tmp_path / "site"
    for w in wheels:
        zipfile.ZipFile(w).extractall(site)
    return str(site)


@pytest.mark.parametrize("base,fmt,dtype", [("deepseek-v32-tiny", "awq", "float16"),
                                            ("glm5-tiny", "awq", "bfloat16"),
                                            ("deepseek-v32-tiny", "gptq", "bfloat16"),
                                            ("glm5-tiny", "gptq", "float16"),
                                            ("glm5-tiny", "ct", "float16"),
                                            ("deepseek-v32-tiny", "nvfp4", "bfloat16")])
def test_vllm_accepts_and_loads_the_checkpoint(vllm_tree, tmp_path, base, fmt, dtype):
    """vLLM 0.26.0's config, quant classes and loader on the CPU (cpu_load_check.py): the
    format's Marlin methods for MLPs and experts, attention / indexer 16-bit, every parameter
    byte written, every checkpoint tensor read."""
    path = str(vllm_tree)
    if fmt == "ct":
        extra = _compressed_tensors_path(tmp_path)
        if extra is None:
            pytest.skip("compressed-tensors: no .e2e/build/deps wheels here (make e2e-bundle)")
        path += os.pathsep + extra
    out = tmp_path / f"{base}-{fmt}"
    gen.write_checkpoint(out, base, fmt)
    env = dict(os.environ, PYTHONPATH=path, VLLM_USE_FLASHINFER_SAMPLER="0")
    proc = subprocess.run([sys.executable, str(GEN_DIR / "cpu_load_check.py"), str(out), "--dtype", dtype],
                          env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok", "FAIL", "ALL"))]
    assert proc.returncode == 0 and lines[-1].startswith("ALL OK"), "\n".join(lines) + proc.stderr[-2000:]
    assert not any(ln.startswith("FAIL") for ln in lines)


def test_indexcache_rule_matches_vllm_0_26_for_glm52_tiny():
    cfg = json.loads((HERE / "models" / "glm52-tiny" / "config.json").read_text())
    assert (cfg["index_topk_freq"], cfg["index_skip_topk_offset"], cfg["num_nextn_predict_layers"]) == (4, 3, 1)
    skipped = [i for i in range(cfg["num_hidden_layers"]) if quant_probe.expected_skip(i, cfg)]
    assert skipped == [3, 4, 5]  # layers 0, 1, 2 and 6 run their own indexer
    assert not any(quant_probe.expected_skip(i, {"index_topk_freq": 1}) for i in range(8))


GLM52_LAYERS = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("v4check", sys.argv[2])
v4 = importlib.util.module_from_spec(spec); spec.loader.exec_module(v4)
v4._stand_ins()
sys.path.insert(0, sys.argv[3])
import quant_probe
from vllm.config import set_current_vllm_config
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.torch_utils import set_default_torch_dtype
from vllm.model_executor.model_loader.utils import initialize_model
import torch
cfg = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=8192, load_format="dummy",
                 speculative_config={"method": "mtp", "num_speculative_tokens": 1},
                 compilation_config={"mode": 0}, kv_cache_memory_bytes=1 << 30).create_engine_config()
with set_current_vllm_config(cfg), set_default_torch_dtype(torch.bfloat16):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{sys.argv[4]}")
    ensure_model_parallel_initialized(1, 1)
    target = initialize_model(vllm_config=cfg)
    draft = initialize_model(vllm_config=cfg, model_config=cfg.speculative_config.draft_model_config)
print("RESULT", json.dumps({"target": quant_probe.describe_indexer_layers(target),
                            "draft": quant_probe.describe_indexer_layers(draft)}))
"""


def test_vllm_builds_glm52_tiny_with_indexers_where_the_rule_says(vllm_tree):
    """vLLM 0.26.0's DeepseekV2MLAAttention on the CPU (the V4 check's stand-ins, load_format
    dummy): target layers 0, 1, 2, 6 build an indexer, 3, 4, 5 keep skip_topk; the MTP layer
    (7) has its own indexer."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(vllm_tree), VLLM_USE_FLASHINFER_SAMPLER="0")
    proc = subprocess.run([sys.executable, "-c", GLM52_LAYERS, str(HERE / "models" / "glm52-tiny"),
                           str(HERE / "models" / "deepseek-v4-tiny" / "cpu_load_check.py"), str(HERE), str(port)],
                          env=env, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    got = json.loads(line[len("RESULT "):])
    assert [(r["layer"], r["indexer"], r["skip_topk"]) for r in got["target"]] == [
        (0, True, False), (1, True, False), (2, True, False), (3, False, True), (4, False, True),
        (5, False, True), (6, True, False)]
    assert [(r["layer"], r["indexer"], r["skip_topk"]) for r in got["draft"]] == [(7, True, False)]


def _probe(mlp, experts, attention=("UnquantizedLinearMethod",), indexer=("UnquantizedLinearMethod",)):
    return {"quant": {"mlp": list(mlp), "experts": list(experts), "attention": list(attention),
                      "indexer": list(indexer)}}


def test_engine_fails_unless_mlps_and_experts_are_on_the_formats_methods():
    job = {"name": "x", "model": "glm5-tiny-gptq"}
    good = _probe(["AutoGPTQLinearMethod/MarlinLinearKernel"], ["AutoGPTQMoEMethod/MARLIN"])
    assert quant_probe.engine_failures(job, {"model_probe": [good], "drafter_probe": [good]}, None) == []
    bad = _probe(["AutoGPTQLinearMethod/MarlinLinearKernel", "UnquantizedLinearMethod"],
                 ["UnquantizedFusedMoEMethod"], attention=["AutoGPTQLinearMethod/MarlinLinearKernel"])
    fails = quant_probe.engine_failures(job, {"model_probe": [good], "drafter_probe": [bad]}, None)
    assert len(fails) == 3 and all("MTP drafter" in f for f in fails)
    awq = {"name": "y", "model": "deepseek-v32-tiny-awq"}
    assert quant_probe.engine_failures(awq, {"model_probe": [good], "drafter_probe": [good]}, None)


def test_indexcache_engine_fails_on_wrong_layers_or_an_indexer_call_in_a_skipped_layer():
    cfg = json.loads((HERE / "models" / "glm52-tiny" / "config.json").read_text())
    job = {"name": "g", "model": "glm52-tiny"}
    layers = [{"layer": i, "indexer": not quant_probe.expected_skip(i, cfg),
               "skip_topk": quant_probe.expected_skip(i, cfg)} for i in range(7)]
    calls = {f"model.layers.{i}.self_attn.indexer.k_cache": 5 for i in (0, 1, 2, 6)}
    meta = {"model_probe": [{"indexer_layers": layers}], "indexer_calls": [calls]}
    assert quant_probe.engine_failures(job, meta, cfg) == []
    wrong = [dict(r, skip_topk=False, indexer=True) if r["layer"] == 4 else r for r in layers]
    assert "layer 4" in quant_probe.engine_failures(job, dict(meta, model_probe=[{"indexer_layers": wrong}]), cfg)[0]
    extra = dict(calls, **{"model.layers.5.self_attn.indexer.k_cache": 1})
    fails = quant_probe.engine_failures(job, dict(meta, indexer_calls=[extra]), cfg)
    assert len(fails) == 1 and "layers.5" in fails[0]
    assert quant_probe.engine_failures(job, dict(meta, indexer_calls=[{}]), cfg) == [
        "g: no indexer op call recorded"]


def test_probe_reads_methods_kernels_and_indexer_layers_from_modules():
    class Kernel:
        pass

    lin_qm = type("AutoAWQMarlinLinearMethod", (), {})()
    lin_qm.kernel = Kernel()
    lin = SimpleNamespace(quant_method=lin_qm)
    moe_qm = type("AutoAWQMoEMethod", (), {})()
    moe_qm.wna16_moe_backend = SimpleNamespace(name="MARLIN")
    att = SimpleNamespace(quant_method=type("UnquantizedLinearMethod", (), {})())
    mla_own = SimpleNamespace(skip_topk=False, indexer=object(), is_sparse=True)
    mla_skip = SimpleNamespace(skip_topk=True, indexer=None, is_sparse=True)
    mods = [("model.layers.0.mlp.gate_up_proj", lin), ("model.layers.1.mlp.experts", SimpleNamespace(quant_method=moe_qm)),
            ("model.layers.1.self_attn.q_b_proj", att), ("model.layers.1.self_attn.indexer.wq_b", att),
            ("model.layers.0.self_attn.mla_attn", mla_own), ("model.layers.3.self_attn.mla_attn", mla_skip)]
    model = SimpleNamespace(named_modules=lambda: iter(mods))
    q = quant_probe.describe_quant(model)
    assert q == {"attention": ["UnquantizedLinearMethod"], "experts": ["AutoAWQMoEMethod/MARLIN"],
                 "indexer": ["UnquantizedLinearMethod"], "mlp": ["AutoAWQMarlinLinearMethod/Kernel"]}
    layers = quant_probe.describe_indexer_layers(model)
    assert [(r["layer"], r["indexer"], r["skip_topk"]) for r in layers] == [(0, True, False), (3, False, True)]


def test_run_e2e_makes_4bit_engines_from_generated_checkpoints(tmp_path):
    args = run_e2e.parse_args(["--models", "deepseek-v32-tiny-awq", "glm5-tiny-gptq", "glm52-tiny",
                               "--sides", "ref", "ours", "--v4-checkpoints", str(tmp_path)])
    jobs = run_e2e.select_jobs(args)
    names = {j["name"] for j in jobs}
    assert "tp1-deepseek-v32-tiny-awq-float16-ours" in names and "tp1-glm5-tiny-gptq-bfloat16-ref" in names
    for j in jobs:
        kw = run_e2e.engine_kwargs(j)
        if j["model"] in quant_probe.FOURBIT:
            assert kw["load_format"] == "auto" and kw["model"] == str(tmp_path / j["model"])
        else:
            assert kw["load_format"] == "e2e_dummy" and kw["model"].endswith("glm52-tiny")
    assert run_e2e.checkpoint_key("glm5-tiny-awq") != run_e2e.checkpoint_key("glm5-tiny-gptq")
    cmd = run_e2e.generator_command("glm5-tiny-gptq", tmp_path / "x", "py")
    assert cmd[-4:] == ["--base", "glm5-tiny", "--format", "gptq"]
    assert run_e2e.generator_command("deepseek-v4-tiny", tmp_path / "x", "py")[-1] == str(tmp_path / "x")


def test_siblings_are_the_same_base_in_other_formats():
    assert quant_probe.siblings("glm5-tiny-nvfp4") == ["glm5-tiny-awq", "glm5-tiny-gptq", "glm5-tiny-ct", "glm5-tiny"]
    assert "deepseek-v32-tiny-awq" in quant_probe.siblings("deepseek-v32-tiny")
    assert quant_probe.siblings("glm52-tiny") == []


def test_a_4bit_model_without_ref2_takes_its_siblings_calibration(tmp_path):
    """compare_all: glm5-tiny-nvfp4 has no ref2 in the run; its `ours` is bounded by 2 x the
    ref2-vs-ref spread of glm5-tiny-awq (named in bounds_from), not by the fixed bounds."""
    import numpy as np

    import compare

    jobs = []
    for model, sides in (("glm5-tiny-awq", ("ref", "ref2")), ("glm5-tiny-nvfp4", ("ref", "ours"))):
        for side in sides:
            jobs.append({"name": compare.engine_name(1, model, "bfloat16", side), "model": model,
                         "model_dir": str(tmp_path), "dtype": "bfloat16", "side": side, "tp": 1,
                         "backend": None, "env": {}, "kv_cache_dtype": "auto"})
    rng = np.random.default_rng(0)
    lens = np.array([3000, 50], np.int32)
    n = int((lens - 1).sum())
    base = rng.normal(-5, 1, n).astype(np.float32)
    for j in jobs:
        d = tmp_path / j["name"]
        d.mkdir()
        noise = {"ref": 0.0, "ref2": 0.02, "ours": 0.01}[j["side"]]
        np.savez(d / "arrays.npz", prompt_lp=base + noise, prompt_top1=np.zeros(n, np.int32),
                 gen_ids=np.zeros((2, 4), np.int32), gen_top=np.zeros((2, 4, 2), np.int32),
                 gen_lp=np.full((2, 4, 2), -1.0, np.float32), prompt_lens=lens)
        (d / "meta.json").write_text(json.dumps({"ok": True, "model_probe": [], "worker_cudagraphs": []}))
    bounds = json.loads((HERE / "bounds.json").read_text())
    s = compare.compare_all(jobs, tmp_path, bounds)
    ours = next(c for c in s["comparisons"] if c["name"].endswith("nvfp4-bfloat16-ours"))
    assert "glm5-tiny-awq-bfloat16-ref2" in ours["bounds_from"]


def test_engine_env_reaches_every_side():
    args = run_e2e.parse_args(["--models", "glm5-tiny-awq", "--sides", "ref", "ref2", "ours",
                               "--engine-env", "VLLM_DISABLED_KERNELS=MacheteLinearKernel"])
    jobs = run_e2e.select_jobs(args)
    assert {j["side"] for j in jobs} == {"ref", "ref2", "ours"}
    assert all(j["env"]["VLLM_DISABLED_KERNELS"] == "MacheteLinearKernel" for j in jobs)
    assert all("VLLM_DISABLED_KERNELS" not in j["env"] for j in run_e2e.select_jobs(
        run_e2e.parse_args(["--models", "glm5-tiny-awq"])))


def test_report_tables_name_kernels_and_indexer_layers_and_survive_failed_engines():
    good = {"model": "glm5-tiny-awq", "model_probe": [_probe(["AutoAWQMarlinLinearMethod/MarlinLinearKernel"],
                                                             ["AutoAWQMoEMethod/MARLIN"])]}
    failed = {"model": "glm5-tiny-gptq", "model_probe": None, "indexer_calls": None}
    glm52 = {"model": "glm52-tiny", "model_probe": [{"indexer_layers": [
        {"layer": 2, "indexer": True, "skip_topk": False}, {"layer": 3, "indexer": False, "skip_topk": True}]}],
        "indexer_calls": [{"model.layers.2.self_attn.indexer.k_cache": 9}]}
    lines = quant_probe.report_lines({"engines": {"a": good, "b": failed, "c": glm52, "d": {"model": "glm5-tiny"}}})
    text = "\n".join(lines)
    assert "| a | AutoAWQMarlinLinearMethod/MarlinLinearKernel | AutoAWQMoEMethod/MARLIN |" in text
    assert "| b | - | - | - | - |" in text
    assert "| c | 2 | 3 | 2: 9 |" in text
    assert "| d |" not in text
