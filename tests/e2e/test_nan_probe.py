"""CPU tests of the DeepSeek-V4 NaN probe (nan_probe.py, SMLA_E2E_NAN_CHECK=1) and of where
compare.py reports NaN prompt logprobs. Stand-in attention classes with the probed methods'
signatures; the batch layout the probe reads from vLLM's forward context is given directly."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402
import e2e_plugin  # noqa: E402
import nan_probe  # noqa: E402

NAN = float("nan")


def _classes(unwritten_rows=(), nan_rows=()):
    """Stand-ins for DeepseekV4FlashMLAAttention (its forward_mqa leaves `unwritten_rows`
    as they were and writes NaN into `nan_rows`) and DeepseekV4TritonAttention."""

    class DeepseekV4FlashMLAAttention:
        prefix, compress_ratio = "model.layers.0.attn", 1
        calls = 0

        def forward_mqa(self, q, kv, positions, output):
            type(self).calls += 1
            for r in range(q.shape[0]):
                if r not in unwritten_rows:
                    output[r] = q[r]
            for r in nan_rows:
                output[r] = NAN

        def _sparse_prefill(self, q, kv, indices, topk_length, out):
            out.zero_()

        def _o_proj(self, o, positions):
            return torch.nan_to_num(o).sum(-1)

    class DeepseekV4TritonAttention(DeepseekV4FlashMLAAttention):
        def forward_mqa(self, q, kv, positions, output):
            super().forward_mqa(q, kv, positions, output)

        def _sparse_prefill(self, q, kv, indices, topk_length, out):
            out.fill_(NAN)

    return types.SimpleNamespace(DeepseekV4FlashMLAAttention=DeepseekV4FlashMLAAttention,
                                 DeepseekV4TritonAttention=DeepseekV4TritonAttention)


@pytest.fixture
def probe(monkeypatch, capsys):
    """Records of the probe (parsed SMLA_NANCHECK lines) after each call; 3 real tokens of 4."""
    monkeypatch.setattr(nan_probe, "_lines", 0)
    monkeypatch.setattr(nan_probe, "_layout", lambda layer: {"query_start_loc": [0, 3]})

    def records():
        err = capsys.readouterr().err
        return [json.loads(line.split("SMLA_NANCHECK ", 1)[1])
                for line in err.splitlines() if line.startswith("SMLA_NANCHECK ")]
    return records


def test_patch_wraps_each_method_once_and_not_the_subclass_forward_mqa():
    mod = _classes()
    nan_probe.patch_module(mod)
    nan_probe.patch_module(mod)  # idempotent
    base, sub = mod.DeepseekV4FlashMLAAttention, mod.DeepseekV4TritonAttention
    for name in ("forward_mqa", "_sparse_prefill", "_o_proj"):
        assert getattr(base.__dict__[name], "_smla_nan_probe", False), name
        assert not hasattr(base.__dict__[name].__wrapped__, "_smla_nan_probe"), name
    assert getattr(sub.__dict__["_sparse_prefill"], "_smla_nan_probe", False)
    # the Triton class's forward_mqa ends in the wrapped base one: checked once, not twice
    assert not getattr(sub.__dict__["forward_mqa"], "_smla_nan_probe", False)


def test_nan_output_rows_are_reported_and_rerun_into_a_zeroed_buffer(probe):
    mod = _classes(nan_rows=(1,))
    nan_probe.patch_module(mod)
    layer = mod.DeepseekV4FlashMLAAttention()
    q = torch.randn(4, 2, 8)
    out = torch.empty_like(q)
    layer.forward_mqa(q, q, torch.tensor([7, 8, 9, 10]), out)
    (rec,) = probe()
    assert rec["check"] == "attn_out" and rec["rows"] == [1] and rec["positions"] == [8]
    assert rec["tokens"] == 3
    # computed NaN: the rerun gives NaN again and the row is written
    assert rec["rerun_bad_rows"] == [1] and rec["rerun_zero_rows"] == []
    assert "rerun_error" not in rec
    assert type(layer).calls == 2


def test_unwritten_rows_show_as_zero_rows_of_the_rerun(probe):
    mod = _classes(unwritten_rows=(0,))
    nan_probe.patch_module(mod)
    layer = mod.DeepseekV4TritonAttention()
    q = torch.randn(4, 2, 8)
    out = torch.full_like(q, NAN)
    layer.forward_mqa(q, q, torch.arange(4), out)
    recs = probe()
    assert [r["check"] for r in recs] == ["attn_out"]
    assert recs[0]["rerun_zero_rows"] == [0] and recs[0]["rerun_bad_rows"] == []


def test_padding_rows_past_the_real_tokens_are_not_reported(probe):
    mod = _classes(nan_rows=(3,))
    nan_probe.patch_module(mod)
    q = torch.randn(4, 2, 8)
    mod.DeepseekV4FlashMLAAttention().forward_mqa(q, q, torch.arange(4), torch.empty_like(q))
    assert probe() == []


def test_prefill_reads_of_bad_workspace_rows_and_bad_prefill_output(probe):
    mod = _classes()
    nan_probe.patch_module(mod)
    layer = mod.DeepseekV4TritonAttention()
    kv = torch.randn(10, 1, 8)
    kv[5] = NAN
    idx = torch.tensor([[[1, 5, -1]], [[2, 3, 5]]])  # row 1 reads 5 only past its length 2
    q = torch.randn(2, 2, 8)
    layer._sparse_prefill(q=q, kv=kv, indices=idx, topk_length=torch.tensor([3, 2]),
                          out=torch.empty_like(q))
    reads, out = probe()
    assert reads["check"] == "prefill_reads_bad_kv" and reads["rows"] == [0]
    assert reads["first_row_bad_kv_rows"] == [5] and reads["first_row_slots"] == [1]
    assert out["check"] == "prefill_out" and out["rows"] == [0, 1]


def test_o_proj_reports_bad_input_rows_even_when_its_result_is_finite(probe):
    mod = _classes()
    nan_probe.patch_module(mod)
    o = torch.randn(4, 2, 8)
    o[2] = NAN
    mod.DeepseekV4FlashMLAAttention()._o_proj(o, torch.arange(4))
    (rec,) = probe()
    assert rec["check"] == "o_proj" and rec["n_bad"] == 0 and rec["o_bad_rows"] == [2]


def test_the_plugin_installs_the_probe_only_when_asked(monkeypatch):
    name = nan_probe.MODULES[0]
    monkeypatch.delitem(sys.modules, name, raising=False)
    before = list(sys.meta_path)
    try:
        assert e2e_plugin.install_nan_probe({}) is None
        assert sys.meta_path == before
        assert e2e_plugin.install_nan_probe({nan_probe.NAN_CHECK_ENV: "1"}) == "installed"
        hooked = {f.name for f in sys.meta_path if isinstance(f, e2e_plugin._PatchAfterImport)}
        assert set(nan_probe.MODULES) <= hooked
        # an already imported module is patched at once
        mod = _classes()
        mod.__name__ = name
        monkeypatch.setitem(sys.modules, name, mod)
        e2e_plugin.install_nan_probe({nan_probe.NAN_CHECK_ENV: "1"})
        assert getattr(mod.DeepseekV4FlashMLAAttention.__dict__["_o_proj"], "_smla_nan_probe")
    finally:
        sys.meta_path[:] = before


def test_compare_says_where_the_nan_prompt_logprobs_are():
    lens = np.array([3, 4, 2])
    n = int((lens - 1).sum())
    ref = {"prompt_lens": lens, "prompt_lp": np.zeros(n, np.float32),
           "prompt_top1": np.zeros(n, np.int32), "gen_ids": np.zeros((3, 2), np.int32),
           "gen_lp": np.zeros((3, 2, 2), np.float32), "gen_top": np.zeros((3, 2, 2), np.int32)}
    oth = dict(ref, prompt_lp=ref["prompt_lp"].copy())
    oth["prompt_lp"][[1, 2, 5]] = np.nan  # prompt 0 token 2, prompt 1 token 1, prompt 2 token 1
    tf = compare.compare_pair(ref, oth)["teacher_forced"]
    assert tf["nan"] == 3
    assert tf["nan_at"] == [[0, 2], [1, 1], [2, 1]]
    assert "nan_at" not in compare.compare_pair(ref, ref)["teacher_forced"]
