"""Selection with an fp8 KV cache (issue 14): the fp8 cells of the matrix.

Same harness as tests/test_selection.py (smla.selection: the real trees in
child interpreters with a mocked CUDA capability; pristine = tag smla-base),
restricted to the fp8 cache dtypes, with TRITON_MLA_SPARSE's fp8 contract:
it runs every fp8 cell (fp8, fp8_e4m3, fp8_ds_mla; fp16 or bf16 model;
capability >= 8.0) and stores all three as the 656-byte fp8_ds_mla layout.

  F1  pristine picks X              -> patched picks X with the same cache
                                       format after selection
  F2  pristine picks nothing        -> patched picks TRITON_MLA_SPARSE, cache
                                       format fp8_ds_mla
  F3  --attention-backend TRITON_MLA_SPARSE -> valid and selected, cache
                                       format fp8_ds_mla
  F4  fp8_e5m2 is refused by TRITON_MLA_SPARSE with its own reason
"""
from __future__ import annotations

import json

import pytest

import smla.selection as S
from smla import explain

OURS = "TRITON_MLA_SPARSE"
FP8_KV = ["fp8", "fp8_e4m3", "fp8_ds_mla"]
TOPK_1024 = {p: json.dumps({**S.preset_config(p), "index_topk": 1024}) for p in S.PRESETS}

AUTO = S.matrix_cells(kv_cache_dtypes=FP8_KV) + [
    S.Cell(f"{p}+topk1024", cc, d, kv_cache_dtype=kv, heads=64, config=TOPK_1024[p])
    for p in S.PRESETS for cc in S.CAPABILITIES for d in S.DTYPES for kv in FP8_KV]
EXPLICIT = [S.Cell(c.preset, c.capability, c.dtype, c.kv_cache_dtype, heads=c.heads,
                   backend=OURS, config=c.config) for c in AUTO]
E5M2 = [S.Cell(p, cc, "bfloat16", "fp8_e5m2", heads=16, backend=OURS)
        for p in S.PRESETS for cc in ("8.0", "9.0", "12.0")]


def _ids(cells):
    return [f"{c.preset}-{c.capability}-{c.dtype}-kv_{c.kv_cache_dtype}-h{c.heads}" for c in cells]


@pytest.fixture(scope="module")
def results(vllm_tree):
    patched, pristine = S.run_selections(
        [(vllm_tree, AUTO + EXPLICIT + E5M2), (explain.pristine_tree(vllm_tree), AUTO)])
    return ({r_key(r): r for r in patched}, {r_key(r): r for r in pristine})


def r_key(r):
    return S.Cell.of(r).key() if isinstance(r, dict) else r.key()


@pytest.mark.parametrize("cell", AUTO, ids=_ids(AUTO))
def test_fp8_policy(results, cell):
    patched, pristine = results
    pat, pri = patched[cell.key()], pristine[cell.key()]
    assert "input_error" not in pat and "input_error" not in pri, (pat, pri)
    ours = next(p for p in pat["priority"] if p["backend"] == OURS)
    assert ours["valid"] and ours["reasons"] == [], ours  # our kernel reads every fp8 cell
    if pri["selected"] is not None:  # F1
        assert pat["selected"] == pri["selected"]
        assert pat["kv_cache_dtype_used"] == pri["kv_cache_dtype_used"]
    else:  # F2
        assert pat["selected"] == OURS, pat["error"]
        assert pat["error"] is None
        assert pat["kv_cache_dtype_used"] == "fp8_ds_mla"


@pytest.mark.parametrize("cell", EXPLICIT, ids=_ids(EXPLICIT))
def test_fp8_explicit_backend(results, cell):  # F3
    r = results[0][cell.key()]
    assert r["requested"] == {"backend": OURS, "valid": True, "reasons": []}, r["requested"]
    assert r["selected"] == OURS and r["error"] is None
    assert r["kv_cache_dtype_used"] == "fp8_ds_mla"


@pytest.mark.parametrize("cell", E5M2, ids=_ids(E5M2))
def test_fp8_e5m2_refused(results, cell):  # F4
    r = results[0][cell.key()]
    if "input_error" in r:  # the tree refused the dtype before selection: also a refusal
        return
    assert r["selected"] is None
    assert not r["requested"]["valid"]
    assert any("fp8_e5m2" in why for why in r["requested"]["reasons"]), r["requested"]
