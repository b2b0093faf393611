"""CPU tests of the DeepSeek-V4 NaN probe (nan_probe.py, SMLA_E2E_NAN_CHECK=1) and of where
compare.py reports NaN prompt logprobs. Stand-in attention classes with the probed methods'
signatures; the batch layout the probe reads from vLLM's forward context is given directly."""
from __future__ import annotations

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
import log_records  # noqa: E402
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

    def records(installed=False):
        """The findings since the last call (with installed=True: the "installed" records too)."""
        recs = log_records.parse(nan_probe.PREFIX, capsys.readouterr().err)
        return [r for r in recs if installed or r["check"] != "installed"]
    return records


def test_patch_wraps_each_method_once_and_not_the_subclass_forward_mqa(probe):
    mod = _classes()
    nan_probe.patch_module(mod)
    nan_probe.patch_module(mod)  # idempotent
    (rec,) = probe(installed=True)  # one record of what was wrapped, not one per call
    assert rec["check"] == "installed" and rec["wrapped"] == [
        "DeepseekV4FlashMLAAttention.forward_mqa", "DeepseekV4FlashMLAAttention._sparse_prefill",
        "DeepseekV4FlashMLAAttention._o_proj", "DeepseekV4TritonAttention._sparse_prefill"]
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


BS = 4  # tokens per SWA block of the stand-in cache


def _swa_layer(n_blocks=6, block_table=((1, 2), (3, 4))):
    """A stand-in DeepseekV4Attention over an fp8_ds_mla SWA cache (BS tokens per block, block
    stride past the block's bytes as in vLLM's packed layout) whose insert writes finite rows,
    or an e4m3 NaN code for the positions in `nan_positions`."""
    block_bytes = BS * (nan_probe.TOKEN_BYTES + nan_probe.SCALE_BYTES)
    backing = torch.zeros(n_blocks, block_bytes + 64, dtype=torch.uint8)
    cache = backing[:, :block_bytes]
    md = types.SimpleNamespace(block_size=BS, block_table=torch.tensor(block_table, dtype=torch.int32))

    def write(slot, bad):
        b, o = divmod(slot, BS)
        cache[b, o * nan_probe.TOKEN_BYTES:(o + 1) * nan_probe.TOKEN_BYTES] = 0x7F if bad else 0
        s0 = BS * nan_probe.TOKEN_BYTES + o * nan_probe.SCALE_BYTES
        cache[b, s0:s0 + nan_probe.SCALE_BYTES] = 127

    class DeepseekV4Attention:
        prefix = "model.layers.0.attn"
        swa_cache_layer = types.SimpleNamespace(prefix="swa0", kv_cache=cache)
        nan_positions: tuple = ()

        def _fused_qnorm_rope_kv_insert(self, q, kv, positions, attn_metadata):
            sm = attn_metadata["swa0"].slot_mapping
            for s, p in zip(sm.tolist(), positions.tolist()):
                if s >= 0:
                    write(s, p in self.nan_positions)
            return q

    nan_probe.patch_module(types.SimpleNamespace(DeepseekV4Attention=DeepseekV4Attention))
    return DeepseekV4Attention(), md, write


def _insert(layer, md, slots, positions, qsl):
    md.slot_mapping = torch.tensor(slots)
    md.query_start_loc_cpu = torch.tensor(qsl)
    q = torch.zeros(len(positions) + 2, 1)  # padded like a graph step
    layer._fused_qnorm_rope_kv_insert(q, q, torch.tensor(positions + [0, 0]), {"swa0": md})


@pytest.fixture
def swa_probe(probe, monkeypatch):
    for name, value in (("_calls", {}), ("_writes", {}), ("_replayed", {}), ("_ring", {}),
                        ("_went_bad_lines", 0), ("_replayed_insert_lines", 0)):
        monkeypatch.setattr(nan_probe, name, value)
    mode = {"now": "NONE"}
    monkeypatch.setattr(nan_probe, "_runtime_mode", lambda: mode["now"])
    monkeypatch.setattr(nan_probe, "_swa_block_size", lambda layer: BS)
    return probe, mode


def test_the_swa_cache_decode_reads_e4m3_nan_codes_and_scales_through_the_block_stride():
    layer, md, write = _swa_layer()
    cache = layer.swa_cache_layer.kv_cache
    for slot in (4, 5, 23):
        write(slot, bad=slot == 5)
    s0 = BS * nan_probe.TOKEN_BYTES + 3 * nan_probe.SCALE_BYTES  # slot 23 = block 5, offset 3
    assert nan_probe._finite_slots(cache, torch.tensor([4, 5, 23]), BS).tolist() == [True, False, True]
    cache[5, s0] = 0xFF  # scale 2^128 times a zero: NaN
    assert nan_probe._finite_slots(cache, torch.tensor([23]), BS).tolist() == [False]


def test_the_insert_probe_logs_slots_and_checks_them_against_the_block_table(swa_probe):
    probe, mode = swa_probe
    layer, md, _ = _swa_layer()
    # request 0: positions 0..2 in block 1; request 1: position 5 in block 4 (row 1, block 1)
    _insert(layer, md, [4, 5, 6, 17], [0, 1, 2, 5], [0, 3, 4])
    assert probe() == []
    assert nan_probe._writes[layer.prefix][17] == (1, 5, "NONE", 6)
    _insert(layer, md, [4, 5, 9, -1], [0, 1, 2, 3], [0, 3, 4])  # 9 is not block 1's slot 2
    (rec,) = probe()
    assert rec["check"] == "slot_mapping_not_block_table" and rec["rows"] == [2]
    assert rec["slot_mapping"] == [9] and rec["block_table_slots"] == [6] and rec["call"] == 2
    layer.nan_positions = (1,)
    _insert(layer, md, [4, 5], [0, 1], [0, 2])
    (rec,) = probe()
    assert rec["check"] == "insert_wrote_bad" and rec["slots"] == [5] and rec["positions"] == [1]


def test_rows_a_replayed_step_wrote_are_reread_at_the_next_insert(swa_probe):
    probe, mode = swa_probe
    layer, md, write = _swa_layer()
    mode["now"] = "PIECEWISE"
    _insert(layer, md, [4, 5, 6], [0, 1, 2], [0, 3])
    (rec,) = probe()  # a replayed step's insert: each request's first position, slot, block
    assert rec["check"] == "replayed_insert" and rec["requests"] == [[0, 0, 4, 1]]
    write(5, bad=True)  # something else overwrites a row between the two steps
    mode["now"] = "NONE"
    _insert(layer, md, [7], [3], [0, 1])
    (rec,) = probe()
    assert rec["check"] == "replayed_rows_went_bad" and rec["written_at_call"] == 1
    assert rec["slots"] == [5] and rec["positions"] == [1]
    # history of a bad decode's window: finite now?, and the insert that last wrote each slot
    assert nan_probe._swa_history(layer, [4, 5, 8]) == [
        [4, True, (1, 0, "PIECEWISE", 5)],
        [5, False, (1, 1, "PIECEWISE", 5)],
        [8, True, None]]
    _insert(layer, md, [8], [4], [0, 1])  # an eager step's rows are not re-read
    assert probe() == []
    assert nan_probe._ring[layer.prefix] == [
        [1, "PIECEWISE", 3, 5, [[0, 0, 4, 1]]], [2, "NONE", 1, 3, [[0, 3, 7, 1]]],
        [3, "NONE", 1, 3, [[0, 4, 8, 1]]]]


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


def _engine_arrays() -> dict:
    """An engine's arrays.npz for 3 prompts (3, 4, 2 tokens: 6 scored) and 2 greedy tokens
    each, all zero."""
    lens = np.array([3, 4, 2])
    n = int((lens - 1).sum())
    return {"prompt_lens": lens, "prompt_lp": np.zeros(n, np.float32),
            "prompt_top1": np.zeros(n, np.int32), "gen_ids": np.zeros((3, 2), np.int32),
            "gen_lp": np.zeros((3, 2, 2), np.float32), "gen_top": np.zeros((3, 2, 2), np.int32)}


def test_compare_says_where_the_nan_prompt_logprobs_are():
    ref = _engine_arrays()
    n = ref["prompt_lp"].size
    oth = dict(ref, prompt_lp=ref["prompt_lp"].copy())
    oth["prompt_lp"][[1, 2, 5]] = np.nan  # prompt 0 token 2, prompt 1 token 1, prompt 2 token 1
    tf = compare.compare_pair(ref, oth)["teacher_forced"]
    assert tf["nan"] == 3
    assert tf["nan_at"] == [[0, 2], [1, 1], [2, 1]]
    assert "nan_at" not in compare.compare_pair(ref, ref)["teacher_forced"]


def test_compare_leaves_non_finite_out_of_the_statistics_on_either_side():
    ref = _engine_arrays()
    n = ref["prompt_lp"].size
    oth = dict(ref, prompt_lp=np.full(n, -0.5, np.float32))
    oth["prompt_lp"][4] = -2.0  # prompt 1 token 3: the largest difference
    bad_ref = dict(ref, prompt_lp=ref["prompt_lp"].copy())
    bad_ref["prompt_lp"][[0, 5]] = np.nan  # prompt 0 token 1, prompt 2 token 1
    tf = compare.compare_pair(bad_ref, oth)["teacher_forced"]
    assert tf["nan"] == 0 and "nan_at" not in tf  # the compared side is not blamed
    assert tf["ref_nan"] == 2 and tf["ref_nan_at"] == [[0, 1], [2, 1]]
    assert tf["all"]["n"] == n - 2 and np.isfinite(tf["all"]["mean"])
    assert tf["all"]["max"] == 2.0
    assert tf["worst"][0] == [1, 3, 2.0] and len(tf["worst"]) == n - 2
    assert compare.check_bounds({"teacher_forced": tf, "greedy": compare.compare_pair(ref, oth)["greedy"]},
                                {k: 10.0 for k in compare.STATS}) == []
    # the side with the NaN is still broken by it, and its statistics stay finite too
    back = compare.compare_pair(oth, bad_ref)["teacher_forced"]
    assert back["nan"] == 2 and np.isfinite(back["all"]["mean"])
    assert "ref_nan" not in back


def test_report_lists_worst_positions_and_non_finite_sides():
    tf = {"all": {"mean": 0.1, "p99": 0.2, "max": 2.0}, "sparse": {}, "top1_agree": 1.0, "nan": 1,
          "nan_at": [[0, 5]], "ref_nan": 2, "ref_nan_at": [[1, 1], [1, 2]], "worst": [[1, 3, 2.0]]}
    g = {"decode_top1_lp_diff": {"mean": 0.0, "p99": 0.0}, "identical_rows": 1, "rows": 1,
         "matched_total": 2, "tokens_total": 2, "divergence_margin_max": 0.0}
    s = {"command": "c", "engines": {}, "failures": [], "exit_code": 1,
         "comparisons": [{"name": "a", "ref": "r", "teacher_forced": tf, "greedy": g, "broken": ["x"]}]}
    text = compare.write_report(s)
    assert "- a vs r: [1, 3] 2; non-finite here: 1 at [[0, 5]]; non-finite in the reference: 2 at [[1, 1], [1, 2]]" in text


def test_compute_logits_reports_where_non_finite_hidden_or_logits_first_appear(probe):
    class DeepseekV4ForCausalLM:
        def compute_logits(self, hidden_states):
            return hidden_states * 2.0

    mod = types.SimpleNamespace(DeepseekV4ForCausalLM=DeepseekV4ForCausalLM)
    nan_probe.patch_module(mod)
    (rec,) = probe(installed=True)
    assert rec["wrapped"] == ["DeepseekV4ForCausalLM.compute_logits"]
    model = DeepseekV4ForCausalLM()
    h = torch.ones(5, 4)
    h[0, 0] = -3.0
    assert torch.equal(model.compute_logits(h), h * 2.0)
    assert probe() == []  # all finite: silent
    h[2, 1] = NAN
    model.compute_logits(h)
    (rec,) = probe()
    assert rec["check"] == "logits" and rec["hidden_bad_rows"] == [2] and rec["logits_bad_rows"] == [2]
    assert rec["rows"] == 5 and rec["hidden_absmax"] == 3.0 and rec["logits_absmax"] == 6.0
