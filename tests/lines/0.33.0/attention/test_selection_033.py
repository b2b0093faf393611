"""vLLM 0.33.0's own backend selector, pristine (branch v033) vs patched (the port-attn series), cell
by cell: capability {8.0, 8.6, 8.9, 9.0, 10.0, 12.0, 12.1} x model dtype {fp16, bf16} x KV cache
dtype {auto, bfloat16, float16, fp8, fp8_e4m3, fp8_ds_mla} x heads x index_topk {2048, 1024}:
head size 576 for the DeepSeek-V3.2 and GLM-5 geometries (heads 8, 16, 64, 128), head size 512
for GLM-5.3-Flash's NoPE geometry (qk_rope_head_dim 0; heads 8, 16, 32, 64): 2016 cells per tree.

Each tree is asked in its own interpreter (selection_worker_033.py beside this file: stand-ins
and the mocked capability are described there).  The hole-filling policy, asserted per cell:
  H1  pristine picks X               -> patched picks X, with the same cache format
  H2  pristine picks nothing         -> patched picks TRITON_MLA_SPARSE (fp8 / fp8_e4m3 stored as
                                        fp8_ds_mla), except
  H3  a 16-bit cache of the other type than the model (fp16 + bfloat16, bf16 + float16), which
      TRITON_MLA_SPARSE refuses with its reason (vLLM's 16-bit cache writers copy the model
      dtype's bits), so patched picks nothing there either
  H4  sm80/86/89: TRITON_MLA_SPARSE in every cell but the H3 ones; sm12x: exactly the cells
      FLASHINFER_MLA_SPARSE_SM120 refuses (fp16 model, 16-bit cache, index_topk != 2048) but H3
      (for NoPE as for head 576)

Run (CPU only):
  SMLA_033_TREE=<tree> SMLA_033_PRISTINE=<tree> \
  SMLA_STANDINS=tools/smla/_selection_standins.py \
  .venv-0.33.0/bin/python -m pytest -q test_selection_033.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "selection_worker_033.py"
OURS = "TRITON_MLA_SPARSE"
KEY = ("preset", "capability", "dtype", "kv_cache_dtype", "heads", "index_topk")
MISMATCH = {("float16", "bfloat16"), ("bfloat16", "float16")}


def _run(tree: str) -> dict:
    standins = os.environ.get("SMLA_STANDINS",
                              str(Path(__file__).resolve().parents[4] / "tools/smla/_selection_standins.py"))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(WORKER), tree, standins], capture_output=True,
                          text=True, timeout=900, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.split("@@SELECTION@@\n", 1)[1].splitlines()
    rows = [json.loads(x) for x in lines if x.startswith('{"capability"')]
    return {tuple(r[k] for k in KEY): r for r in rows}


@pytest.fixture(scope="module")
def results():
    patched = os.environ.get("SMLA_033_TREE")
    pristine = os.environ.get("SMLA_033_PRISTINE")
    if not (patched and pristine):
        pytest.skip("set SMLA_033_TREE and SMLA_033_PRISTINE")
    return _run(pristine), _run(patched)


def policy_violations(pri: dict, pat: dict) -> list[str]:
    """What is wrong with one cell's patched answer, given the pristine one (empty: OK)."""
    bad = []
    cc, dtype, kv, topk = pri["capability"], pri["dtype"], pri["kv_cache_dtype"], pri["index_topk"]
    mismatch = (dtype, kv) in MISMATCH
    if pri["selected"] is not None:  # H1
        if pat["selected"] != pri["selected"]:
            bad.append(f"H1: patched picks {pat['selected']} where pristine picks {pri['selected']}")
        if pat["kv_cache_dtype_used"] != pri["kv_cache_dtype_used"]:
            bad.append(f"H1: cache format {pat['kv_cache_dtype_used']} != {pri['kv_cache_dtype_used']}")
        return bad
    if mismatch:  # H3
        if pat["selected"] is not None:
            bad.append(f"H3: patched picks {pat['selected']} for a {dtype} model + {kv} cache")
        elif "needs a 16-bit cache in the model dtype" not in (pat["error"] or ""):
            bad.append("H3: TRITON_MLA_SPARSE's reason missing from the error")
        return bad
    if pat["selected"] != OURS:  # H2
        bad.append(f"H2: hole not filled: {pat['selected']} / {(pat['error'] or '')[-300:]}")
        return bad
    want_kv = "fp8_ds_mla" if kv in ("fp8", "fp8_e4m3") else kv
    if pat["kv_cache_dtype_used"] != want_kv:
        bad.append(f"H2: cache format {pat['kv_cache_dtype_used']}, want {want_kv}")
    # H4: the holes are where they should be
    major = cc.split(".")[0]
    if major == "12":
        sm120_refuses = dtype == "float16" or kv in ("bfloat16", "float16") or topk != 2048
        if not sm120_refuses:
            bad.append("H4: sm12x hole where FLASHINFER_MLA_SPARSE_SM120 should run")
    return bad


def _ids():
    from selection_worker_033 import cells  # noqa: PLC0415

    return [tuple(c[k] for k in KEY) for c in cells()]


sys.path.insert(0, str(HERE))
CELLS = _ids()


@pytest.mark.parametrize("key", CELLS, ids=["-".join(map(str, k)) for k in CELLS])
def test_hole_filling_policy(results, key):
    pristine, patched = results
    assert policy_violations(pristine[key], patched[key]) == []


@pytest.mark.parametrize("cc", ["8.0", "8.6", "8.9"])
def test_sm8x_every_cell_but_mismatched_16bit(results, cc):
    _, patched = results
    cells = [r for k, r in patched.items() if k[1] == cc]
    assert len(cells) == 288
    for r in cells:
        want = None if (r["dtype"], r["kv_cache_dtype"]) in MISMATCH else OURS
        assert r["selected"] == want, r


def test_ours_never_before_upstream(results):
    """Counted over the whole matrix: the patched tree changes no pristine pick."""
    pristine, patched = results
    changed = [k for k in pristine if pristine[k]["selected"] is not None
               and patched[k]["selected"] != pristine[k]["selected"]]
    assert changed == []
    filled = sum(1 for k in pristine if pristine[k]["selected"] is None
                 and patched[k]["selected"] == OURS)
    assert filled > 0


NOPE = "glm-5.3-flash"


def test_nope_holes_exist_and_are_filled(results):
    """GLM-5.3-Flash (head 512, NoPE): pristine 0.33.0 has no backend on sm80/86/89 for any cell
    and none on sm12x for an fp16 model or a 16-bit cache; patched fills exactly those (H3 aside)
    and keeps upstream's NoPE picks on sm90 (FlashMLA / FlashInfer SM90 / FA3), sm100 (FlashInfer)
    and sm12x (FlashInfer SM120)."""
    pristine, patched = results
    nope = [k for k in pristine if k[0] == NOPE]
    assert len(nope) == 672
    for k in nope:
        pri, pat = pristine[k], patched[k]
        cc, dtype, kv = k[1], k[2], k[3]
        if cc in ("8.0", "8.6", "8.9"):
            assert pri["selected"] is None, pri
        if cc.startswith("12.") and (dtype == "float16" or kv in ("bfloat16", "float16")):
            assert pri["selected"] is None, pri
        if pri["selected"] is not None:
            assert pat["selected"] == pri["selected"], (pri, pat)
        elif (dtype, kv) not in MISMATCH:
            assert pat["selected"] == OURS, (pri, pat)
    upstream = {pristine[k]["selected"] for k in nope} - {None}
    assert upstream == {"FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90", "FLASH_ATTN_MLA_SPARSE",
                        "FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120"}, upstream


def test_policy_check_can_fail():
    """The checker flags ours in front of an upstream backend, an unfilled hole, a wrong cache
    format, a filled mismatched cell and an sm12x cell SM120 runs."""
    base = dict(capability="8.6", dtype="bfloat16", kv_cache_dtype="fp8", index_topk=2048,
                heads=64, preset="glm-5", error=None)
    up = dict(base, capability="9.0", selected="FLASHMLA_SPARSE", kv_cache_dtype_used="fp8_ds_mla")
    assert policy_violations(up, dict(up, selected=OURS))
    hole = dict(base, selected=None, kv_cache_dtype_used=None, error="No valid")
    assert policy_violations(hole, dict(hole, selected=None))
    assert policy_violations(hole, dict(hole, selected=OURS, kv_cache_dtype_used="fp8"))
    assert policy_violations(hole, dict(hole, selected=OURS, kv_cache_dtype_used="fp8_ds_mla")) == []
    mm = dict(hole, dtype="float16", kv_cache_dtype="bfloat16")
    assert policy_violations(mm, dict(mm, selected=OURS, kv_cache_dtype_used="bfloat16"))
    sm12 = dict(hole, capability="12.0")
    assert policy_violations(sm12, dict(sm12, selected=OURS, kv_cache_dtype_used="fp8_ds_mla"))
