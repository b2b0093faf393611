"""Which indexer path each compute capability takes on the 0.33.0 line, with
the capability mocked (vLLM's CudaPlatform, the harness's set_capability):

- the indexer logits kernels (select_sparse_indexer_logits, "auto"), with
  DeepGEMM importable (vLLM's wheel vendors it) and without;
- what SparseAttnIndexer.__init__ keeps (its logits_backend) or refuses;
- the metadata builder's DeepGEMM schedule calls, each under the builder's
  schedules_deep_gemm (logits kernels "deepgemm" and DeepGEMM installed);
- the fused deepseek_v32 kernels' fp8 encode (fp8_e4m3_hw of a CUDA device);
- the generic Indexer's fused query RoPE+quant condition (deepseek_v2);
- the decode top-k "auto" resolution (get_indexer_topk), 8 and 128 rows.
"""
from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pytest
import torch

import _selection_standins as standins
import vllm.model_executor.layers.sparse_attn_indexer as sai
import vllm.v1.attention.ops.triton_fp8_e4m3 as e4m3
from conftest import TREE
from vllm.model_executor.layers import indexer_topk
from vllm.platforms import current_platform
from vllm.utils import deep_gemm
from vllm.v1.attention.backends.mla import indexer as idx

CAPS = ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]

EXPECTED = {
    #        logits(DG)   logits(no DG) fp8 encode  fused idx q  topk 8 rows    topk 128
    "8.0": ("triton", "triton", "software", False, "persistent", "persistent"),
    "8.6": ("triton", "triton", "software", False, "persistent", "persistent"),
    "8.9": ("triton", "triton", "hardware", True, "persistent", "persistent"),
    "9.0": ("deepgemm", "triton", "hardware", True, "cooperative", "persistent"),
    "10.0": ("deepgemm", "deepgemm", "hardware", True, "cooperative", "persistent"),
    "12.0": ("deepgemm", "triton", "hardware", True, "persistent", "persistent"),
}


def clear_caches():
    idx.select_sparse_indexer_logits.cache_clear()
    deep_gemm.mqa_logits_use_mx_scales.cache_clear()
    e4m3._cuda_capability.cache_clear()
    indexer_topk.get_indexer_topk.cache_clear()


@pytest.fixture
def capability(monkeypatch):
    def set_cap(text: str, has_deep_gemm: bool) -> None:
        standins.set_capability(text)
        major, minor = (int(x) for x in text.split("."))
        props = types.SimpleNamespace(major=major, minor=minor,
                                      multi_processor_count=132)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
        monkeypatch.setattr(idx, "has_deep_gemm", lambda: has_deep_gemm)
        monkeypatch.setattr(sai, "has_deep_gemm", lambda: has_deep_gemm)
        clear_caches()

    yield set_cap
    standins.set_capability("8.0")
    clear_caches()


def make_indexer(monkeypatch, logits_backend="auto"):
    """SparseAttnIndexer.__init__ with a minimal config (no JIT warm-up)."""
    cfg = types.SimpleNamespace(
        kernel_config=types.SimpleNamespace(
            sparse_indexer_topk_backend="auto",
            sparse_indexer_logits_backend=logits_backend,
            enable_jit_warmup=False),
        parallel_config=types.SimpleNamespace(
            decode_context_parallel_size=1, prefill_context_parallel_size=1,
            pcp_shard_decode_requests=False, cp_kv_cache_interleave_size=1))
    monkeypatch.setattr(sai, "get_current_vllm_config", lambda: cfg)
    monkeypatch.setattr(sai.CustomOp, "__init__", lambda self, *a, **k: None)
    return sai.SparseAttnIndexer(None, 128, "ue8m0", 2048, 128, 4096, 4096,
                                 torch.empty(1, 2048, dtype=torch.int32))


def fused_indexer_q_condition() -> str:
    """The source of deepseek_v2's Indexer.use_fused_indexer_q expression."""
    src = (TREE / "vllm/model_executor/models/deepseek_v2.py").read_text()
    for node in ast.walk(ast.parse(src)):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "use_fused_indexer_q"):
            return ast.unparse(node.value)
    raise AssertionError("use_fused_indexer_q not found")


def paths(cap: str, capability, monkeypatch) -> dict:
    capability(cap, True)
    with_dg = idx.select_sparse_indexer_logits("auto")
    layer = make_indexer(monkeypatch)
    capability(cap, False)
    without = idx.select_sparse_indexer_logits("auto")
    hw = e4m3.fp8_e4m3_hw(torch.device("cuda", 0))
    cond = fused_indexer_q_condition()
    assert "current_platform.has_device_capability(89)" in cond
    fused_q = current_platform.is_cuda() and current_platform.has_device_capability(89)
    topk = indexer_topk.SparseIndexerTopk("auto")
    logits = torch.empty(8, 4096)
    return dict(
        cap=cap, logits_with_deepgemm=with_dg, logits_without_deepgemm=without,
        indexer_layer=layer.logits_backend,
        fp8_encode="hardware" if hw else "software", fused_indexer_q=fused_q,
        topk_auto_8_rows=topk.resolve_backend(logits, 2048, 8),
        topk_auto_128_rows=topk.resolve_backend(torch.empty(128, 4096), 2048, 128))


@pytest.mark.parametrize("cap", CAPS)
def test_paths_per_capability(cap, capability, monkeypatch, capsys):
    got = paths(cap, capability, monkeypatch)
    with capsys.disabled():
        print("\n" + json.dumps(got))
    exp = EXPECTED[cap]
    assert got["logits_with_deepgemm"][0] == exp[0]
    assert got["logits_without_deepgemm"][0] == exp[1]
    assert got["indexer_layer"] == exp[0]
    assert got["fp8_encode"] == exp[2]
    assert got["fused_indexer_q"] == exp[3]
    assert got["topk_auto_8_rows"] == exp[4]
    assert got["topk_auto_128_rows"] == exp[5]


@pytest.mark.parametrize("cap", ["8.0", "8.6", "8.9"])
def test_no_deepgemm_no_longer_stops_the_layer_below_sm90(cap, capability, monkeypatch):
    capability(cap, False)
    assert make_indexer(monkeypatch).logits_backend == "triton"


def test_forced_triton_on_sm100_is_refused(capability, monkeypatch):
    capability("10.0", True)
    with pytest.raises(ValueError, match="MX scales|fp32 scales"):
        make_indexer(monkeypatch, "triton")


def test_forced_triton_on_sm90(capability, monkeypatch):
    capability("9.0", True)
    assert make_indexer(monkeypatch, "triton").logits_backend == "triton"


def test_indexer_layer_import_does_not_load_triton_kernels():
    """The Triton module is imported on the Triton path only (issue 33)."""
    src = (TREE / "vllm/model_executor/layers/sparse_attn_indexer.py").read_text()
    top = [n for n in ast.parse(src).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [ast.unparse(n) for n in top]
    assert not any("triton_dsa_indexer" in n for n in names), names
    assert Path(TREE / "vllm/v1/attention/ops/triton_dsa_indexer.py").is_file()


def test_builder_schedules_deepgemm_only_on_the_deepgemm_path():
    src = (TREE / "vllm/v1/attention/backends/mla/indexer.py").read_text()
    tree = ast.parse(src)
    guarded = calls = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "self.schedules_deep_gemm":
            guarded += sum(isinstance(c, ast.Call) and ast.unparse(c.func)
                           == "get_paged_mqa_logits_metadata" for c in ast.walk(node))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "get_paged_mqa_logits_metadata":
            calls += 1
    assert calls == guarded == 2
    assert ("self.schedules_deep_gemm = logits_kernels == 'deepgemm' and has_deep_gemm()"
            in ast.unparse(tree))
