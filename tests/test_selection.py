"""Attention-backend selection for DSA sparse MLA, through vLLM's own selector.

CPU only.  Uses tools/smla/selection.py, which imports the real vLLM tree in a
subprocess with stand-ins for compiled modules and a mocked CUDA platform /
device capability (see its docstring for the full list).  One subprocess per
tree answers the whole matrix.
"""
from __future__ import annotations

import pytest

import smla.selection as H
from smla import explain

NEW = "TRITON_MLA_SPARSE"
MATRIX = [(p, c, d) for p in H.PRESETS for c in H.CAPABILITIES for d in H.DTYPES]


def expected_pick(cap: str, dtype: str) -> str:
    if cap in ("9.0", "10.0") and dtype == "bfloat16":
        return "FLASHMLA_SPARSE"
    return NEW


def _key(r):
    return H.Cell(**{k: r[k] for k in (
        "preset", "capability", "dtype", "kv_cache_dtype", "block_size",
        "backend")}).key()


@pytest.fixture(scope="module")
def selections(vllm_tree):
    """(patched, pristine) results; both trees are answered concurrently.

    The pristine tree is vLLM at tag smla-base, exported with `git archive`
    from the work tree's own repository (cached: smla.explain.pristine_tree)."""
    dest = explain.pristine_tree(vllm_tree)
    patched_cells = (
        H.matrix_cells()
        + H.matrix_cells(backend=NEW)
        + [H.Cell(p, c, "bfloat16", kv_cache_dtype="fp8", backend=NEW)
           for p in H.PRESETS for c in ("8.6", "12.0")]
        + [H.Cell("glm-5", "12.0", "float16", kv_cache_dtype="bfloat16",
                  backend=NEW)]
    )
    patched, pristine = H.run_selections(
        [(vllm_tree, patched_cells), (dest, H.matrix_cells())])
    return ({_key(r): r for r in patched},
            {(r["preset"], r["capability"], r["dtype"]): r for r in pristine})


@pytest.fixture(scope="module")
def patched(selections):
    return selections[0]


@pytest.fixture(scope="module")
def pristine(selections):
    return selections[1]


def _cell(preset, cap, dtype, backend=None, kv="auto"):
    return H.Cell(preset, cap, dtype, kv_cache_dtype=kv, backend=backend).key()


def _table_rows(table: str) -> dict[tuple[str, str, str], tuple[str, str, str]]:
    """format_table output -> {(preset, cc, dtype): (kv_cache, requested, selected)}."""
    lines = table.splitlines()
    assert lines[0].split() == ["preset", "cc", "dtype", "kv_cache", "requested", "selected"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    rows = {}
    for line in lines[2:]:
        preset, cc, dtype, kv, req, sel = line.split(maxsplit=5)
        assert (preset, cc, dtype) not in rows, line
        rows[(preset, cc, dtype)] = (kv, req, sel)
    return rows


def test_format_table(patched, pristine):
    """The CLI table (tools/smla/selection.py) has one row per matrix cell: the
    patched tree picks FLASHMLA_SPARSE on sm90/sm100 bf16 and
    TRITON_MLA_SPARSE elsewhere; the pristine tree errors on the other 12."""
    auto = [r for r in patched.values()
            if r["backend"] is None and r["kv_cache_dtype"] == "auto"]
    table = H.format_table(auto)
    print("\npatched:\n" + table)
    rows = _table_rows(table)
    assert sorted(rows) == sorted(MATRIX)
    for (preset, cap, dtype), (kv, req, sel) in rows.items():
        assert (kv, req, sel) == ("auto", "auto", expected_pick(cap, dtype))

    table = H.format_table(list(pristine.values()))
    print("\npristine:\n" + table)
    rows = _table_rows(table)
    assert sorted(rows) == sorted(MATRIX)
    for (preset, cap, dtype), (kv, req, sel) in rows.items():
        assert (kv, req) == ("auto", "auto")
        if expected_pick(cap, dtype) == "FLASHMLA_SPARSE":
            assert sel == "FLASHMLA_SPARSE"
        else:
            assert sel == "ERROR: No valid attention backend found for cuda", sel
    assert NEW not in table


@pytest.mark.parametrize("preset,cap,dtype", MATRIX)
def test_patched_auto_selection(patched, preset, cap, dtype):
    r = patched[_cell(preset, cap, dtype)]
    assert r["error"] is None, r["error"]
    assert r["selected"] == expected_pick(cap, dtype)
    ours = {p["backend"]: p for p in r["priority"]}[NEW]
    assert ours["valid"], ours["reasons"]
    names = [p["backend"] for p in r["priority"]]
    assert names.index(NEW) == names.index("FLASHMLA_SPARSE") + 1


@pytest.mark.parametrize("preset,cap,dtype", MATRIX)
def test_patched_explicit_backend_validates(patched, preset, cap, dtype):
    r = patched[_cell(preset, cap, dtype, backend=NEW)]
    assert r["requested"] == {"backend": NEW, "valid": True, "reasons": []}
    assert r["selected"] == NEW and r["error"] is None


@pytest.mark.parametrize("preset", list(H.PRESETS))
@pytest.mark.parametrize("cap", ["8.6", "12.0"])
def test_fp8_kv_cache_refused_with_reason(patched, preset, cap):
    r = patched[_cell(preset, cap, "bfloat16", backend=NEW, kv="fp8")]
    reasons = r["requested"]["reasons"]
    assert "kv_cache_dtype not supported" in reasons
    assert any("fp8 KV cache not supported by TRITON_MLA_SPARSE" in x
               for x in reasons)
    assert r["selected"] is None
    assert f"Selected backend AttentionBackendEnum.{NEW} is not valid" in r["error"]


def test_bf16_cache_with_fp16_model_refused(patched):
    r = patched[_cell("glm-5", "12.0", "float16", backend=NEW, kv="bfloat16")]
    assert not r["requested"]["valid"]
    assert any("needs model dtype bfloat16" in x for x in r["requested"]["reasons"])


@pytest.mark.parametrize("preset,cap,dtype", MATRIX)
def test_pristine_seed_behaviour(pristine, preset, cap, dtype):
    r = pristine[(preset, cap, dtype)]
    assert NEW not in [p["backend"] for p in r["priority"]]
    if expected_pick(cap, dtype) == "FLASHMLA_SPARSE":
        assert r["selected"] == "FLASHMLA_SPARSE"
        return
    assert r["selected"] is None
    assert r["error"].startswith("No valid attention backend found for cuda with ")
    assert "TRITON_MLA: [sparse not supported]" in r["error"]
    if cap.split(".")[0] not in ("9", "10"):
        assert "FLASHMLA_SPARSE: [" in r["error"]
        assert "compute capability not supported" in (
            {p["backend"]: p for p in r["priority"]}["FLASHMLA_SPARSE"]["reasons"])


def test_pristine_12_0_exact_reasons(pristine):
    for dtype in H.DTYPES:
        r = pristine[("glm-5", "12.0", dtype)]
        reasons = {p["backend"]: p["reasons"] for p in r["priority"]}
        assert reasons["TRITON_MLA"] == ["sparse not supported"]
        want = (["compute capability not supported"] if dtype == "bfloat16"
                else ["dtype not supported", "compute capability not supported"])
        assert reasons["FLASHMLA_SPARSE"] == want
        assert all(not p["valid"] for p in r["priority"])


def test_pristine_fails_12_of_14(pristine):
    for preset in H.PRESETS:
        failing = [(c, d) for c in H.CAPABILITIES for d in H.DTYPES
                   if pristine[(preset, c, d)]["selected"] is None]
        assert len(failing) == 12, failing
