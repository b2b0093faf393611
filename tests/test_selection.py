"""The selection matrix: issue 11's policy "fill the holes, never override upstream".

CPU only.  smla.selection imports the real trees in child interpreters (one
per tree, run concurrently) with a mocked CUDA platform / capability and
stand-ins for compiled modules (tools/smla/_selection_standins.py names them).

Axes: capability (selection.CAPABILITIES) x model dtype x KV-cache dtype
(auto, bfloat16, float16, fp8, fp8_e4m3, fp8_ds_mla) x heads per GPU (8, 16,
64, 128) for the GLM-5 and DeepSeek-V3.2 geometries, plus a few extra cells
(index_topk other than 2048 on sm12x, a pre-Ampere capability).

The pristine side is the work tree's own base (tag smla-base, exported by
smla.explain.pristine_tree), so nothing here names a vLLM version or an
upstream pick: every expectation is pristine's answer plus the policy:

  P1  pristine picks X              -> patched picks X (and the same KV-cache
                                       format after selection)
  P2  pristine picks nothing, and our kernel can run the cell
                                    -> patched picks TRITON_MLA_SPARSE
  P3  pristine picks nothing, and our kernel cannot run it
                                    -> patched refuses with vLLM's "No valid
                                       attention backend" error, which carries
                                       TRITON_MLA_SPARSE's own reasons
  P4  --attention-backend TRITON_MLA_SPARSE validates and is selected
      wherever our kernel can run; elsewhere it is refused with reasons.

DeepSeek-V4 picks its kernels itself (nvidia/model.py::_select_dsv4_attn_cls, and with the
series nvidia/portable.py and ops.cutedsl_supported), asked per capability with every value of
the series' switch (0.26.0: VLLM_DSV4_PORTABLE auto/1/0; 0.33.0: KernelConfig.deepseek_v4_kernels
auto/portable/upstream), with and without FlashInfer's sm120 kernel and vLLM's FlashMLA build:

  V1  auto: pristine's class where its kernel is there (its backend supports the capability,
      and FlashMLA is built / FlashInfer has its sm120 kernel), else DeepseekV4TritonAttention;
      mHC and o_proj keep TileLang/DeepGEMM from sm90 (they are installed), the portable ones
      below; the CuTe DSL compressor from sm89
  V2  portable (=1): the Triton class and the portable mHC, o_proj and compressor everywhere
  V3  upstream (=0): pristine's class everywhere, upstream's mHC and o_proj (0.33.0: and the
      CuTe DSL wherever cutlass is, upstream's own choice)
  V4  --attention-backend TRITON_MLA_SPARSE: 0.33.0 takes it as the Triton class everywhere;
      0.26.0 names the Triton class where it is picked anyway (or forced by =1), elsewhere the
      tree refuses and points to VLLM_DSV4_PORTABLE

"Our kernel can run" (ours_can_run) is the kernel's contract, not an
observation: compute capability >= 8.0, and either a 16-bit KV cache in the
model dtype (kv "auto", or the model dtype named explicitly) or an fp8 cache
(fp8, fp8_e4m3, fp8_ds_mla), which our backend always stores as fp8_ds_mla
(docs/fp8-kv.md).
"""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

import lineproofs
import smla.selection as S
from conftest import current_line
from smla import explain

OURS = "TRITON_MLA_SPARSE"
FP8_KV = ("fp8", "fp8_e4m3", "fp8_ds_mla")

# Extra cells beyond the matrix: an indexer top-k other than 2048 (a config
# variant of each preset), and a GPU below Ampere.
TOPK_1024 = {p: json.dumps({**S.preset_config(p), "index_topk": 1024}) for p in S.PRESETS}
EXTRA = (
    [S.Cell(f"{p}+topk1024", cc, d, kv_cache_dtype=kv, heads=64, config=TOPK_1024[p])
     for p in S.PRESETS for cc in ("9.0", "10.0", "12.0", "12.1") for d in S.DTYPES
     for kv in ("auto", "fp8")]
    + [S.Cell(p, "7.5", "float16", heads=h) for p in S.PRESETS for h in (16, 128)]
)


def ours_can_run(cell: S.Cell) -> bool:
    major, minor = (int(x) for x in cell.capability.split("."))
    if (major, minor) < (8, 0):
        return False
    return cell.kv_cache_dtype in ("auto", cell.dtype) or cell.kv_cache_dtype in FP8_KV


def _key(cell_or_result) -> tuple:
    cell = cell_or_result if isinstance(cell_or_result, S.Cell) else S.Cell.of(cell_or_result)
    return cell.key()


AUTO_CELLS = S.matrix_cells() + EXTRA
EXPLICIT_CELLS = S.matrix_cells(backend=OURS) + [
    S.Cell(c.preset, c.capability, c.dtype, c.kv_cache_dtype, heads=c.heads, backend=OURS, config=c.config)
    for c in EXTRA]
DSV4 = "deepseek-v4"
DSV4_CELLS = explain.matrix_cells(DSV4)
DSV4_EXPLICIT_CELLS = explain.matrix_cells(DSV4, backend=OURS)
# The DSV4 cells ask the series' switch with each of its values: VLLM_DSV4_PORTABLE (auto, 1, 0) on
# the 0.26.0 line, KernelConfig.deepseek_v4_kernels (auto, portable, upstream) on the 0.33.0 line.
# V4_KEY: its key in a case; V4_VALUES: auto, the portable value, the upstream value.
V4_BY_ENV = lineproofs.v4_by_env()
if V4_BY_ENV:
    V4_KEY, V4_VALUES, V4_LABEL = "VLLM_DSV4_PORTABLE", ["auto", "1", "0"], "VLLM_DSV4_PORTABLE={}"
else:
    V4_KEY, V4_VALUES, V4_LABEL = "deepseek_v4_kernels", ["auto", "portable", "upstream"], "deepseek_v4_kernels={}"
V4_PORTABLE, V4_UPSTREAM = V4_VALUES[1], V4_VALUES[2]


@pytest.fixture(scope="module")
def trees(vllm_tree):
    """{"patched": {key: result}, "pristine": {key: result}}.

    One child interpreter per tree, both at once.  The pristine one answers
    the cells twice, the second time in reverse order: a selection cached
    across cells (vLLM caches a lot with functools) would show up as a
    difference between the two passes."""
    pristine_tree = explain.pristine_tree(vllm_tree)
    # DeepSeek-V4's cells last: its query imports the V4 model code, after every MLA answer
    patched, pristine = S.run_selections(
        [(vllm_tree, AUTO_CELLS + EXPLICIT_CELLS + DSV4_CELLS + DSV4_EXPLICIT_CELLS),
         (pristine_tree, AUTO_CELLS + AUTO_CELLS[::-1] + DSV4_CELLS)])
    n, m = len(AUTO_CELLS), len(AUTO_CELLS) + len(EXPLICIT_CELLS)
    first, second = pristine[:n], pristine[n:2 * n][::-1]
    return {"patched": {_key(r): r for r in patched[:m]},
            "pristine": {_key(r): r for r in first},
            "pristine_second_pass": {_key(r): r for r in second},
            "dsv4_patched": {_key(r): r for r in patched[m:]},
            "dsv4_pristine": {_key(r): r for r in pristine[2 * n:]}}


def _ids(cells):
    return [f"{c.preset}-{c.capability}-{c.dtype}-kv_{c.kv_cache_dtype}-h{c.heads}" for c in cells]


def test_every_cell_answered(trees):
    for side in ("patched", "pristine"):
        for r in trees[side].values():
            assert "input_error" not in r and not r.get("not_mla"), r
            assert r["model"]["use_sparse"] and r["model"]["head_size"] == 576
            assert r["priority"], r
    assert len(trees["pristine"]) == len(AUTO_CELLS)
    assert len(trees["patched"]) == len(AUTO_CELLS) + len(EXPLICIT_CELLS)


def test_answers_do_not_depend_on_cell_order(trees):
    for key, r in trees["pristine"].items():
        again = trees["pristine_second_pass"][key]
        for field in ("selected", "error", "priority", "kv_cache_dtype_used"):
            assert r.get(field) == again.get(field), (key, field)


def test_heads_and_kv_dtype_reach_vllm(trees):
    """The cell's heads per GPU and KV-cache dtype are what vLLM's selector
    saw (AttentionSelectorConfig / num_heads), for every cell."""
    for key, r in trees["pristine"].items():
        assert r["heads_per_gpu"] == r["heads"]
        assert r["selector_config"]["kv_cache_dtype"] == r["kv_cache_dtype"]
        assert r["selector_config"]["dtype"] == f"torch.{r['dtype']}"


@pytest.mark.parametrize("cell", AUTO_CELLS, ids=_ids(AUTO_CELLS))
def test_policy(trees, cell):
    pri = trees["pristine"][_key(cell)]
    pat = trees["patched"][_key(cell)]
    # upstream's list is untouched: ours is only added
    pristine_order = [p["backend"] for p in pri["priority"]]
    patched_order = [p["backend"] for p in pat["priority"]]
    assert OURS not in pristine_order
    assert [b for b in patched_order if b != OURS] == pristine_order
    assert patched_order.count(OURS) == 1
    for a, b in zip(pri["priority"], [p for p in pat["priority"] if p["backend"] != OURS]):
        assert a == b  # same verdicts and reasons for every upstream backend
    ours = next(p for p in pat["priority"] if p["backend"] == OURS)

    if pri["selected"] is not None:  # P1
        assert pat["selected"] == pri["selected"]
        assert pat["kv_cache_dtype_used"] == pri["kv_cache_dtype_used"]
        assert pat["error"] is None
    elif ours_can_run(cell):  # P2
        assert pat["selected"] == OURS, pat["error"]
        assert ours["valid"] and ours["reasons"] == []
        stored = "fp8_ds_mla" if cell.kv_cache_dtype in FP8_KV else cell.kv_cache_dtype
        assert pat["kv_cache_dtype_used"] == stored
    else:  # P3
        assert pat["selected"] is None
        assert not ours["valid"] and ours["reasons"]
        assert pat["error"].startswith("No valid attention backend found")
        assert f"{OURS}: [{', '.join(ours['reasons'])}]" in pat["error"]


@pytest.mark.parametrize("cell", EXPLICIT_CELLS, ids=_ids(EXPLICIT_CELLS))
def test_explicit_backend(trees, cell):  # P4
    r = trees["patched"][_key(cell)]
    if ours_can_run(cell):
        assert r["requested"] == {"backend": OURS, "valid": True, "reasons": []}
        assert r["selected"] == OURS and r["error"] is None
    else:
        assert r["requested"]["backend"] == OURS
        assert not r["requested"]["valid"] and r["requested"]["reasons"]
        assert r["selected"] is None
        assert OURS in r["error"] and "not valid" in r["error"]


def test_import_vllm_tree_in_process(vllm_tree):
    """import_vllm_tree (what the backend tests use) in a fresh interpreter:
    vLLM comes from the tree, the platform is CUDA with the given capability,
    and every stand-in it reports is one the worker documents."""
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from smla.selection import import_vllm_tree\n"
        "used = import_vllm_tree(sys.argv[1], capability='12.0')\n"
        "import vllm, vllm.platforms.cuda as cuda\n"
        "from vllm.platforms import current_platform as p\n"
        "print(json.dumps({'used': used, 'file': vllm.__file__,\n"
        "  'cuda': isinstance(p, cuda.CudaPlatformBase), 'cap': p.get_device_capability().as_version_str()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(vllm_tree)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["file"].startswith(str(vllm_tree.resolve()))
    assert data["cuda"] and data["cap"] == "12.0"
    from smla import _selection_worker as W
    for item in data["used"]:
        name = item.split(" (")[0]
        assert (name in W.COMPILED or name in W.FLASHINFER or name == "vllm.vllm_flash_attn"
                or item.startswith(("no CUDA device", "CUDA platform"))), item


# --------------------------------------------------------------------------- the README's table

KV_ARROW = "→"


def _heads(hs: list[int]) -> str:
    return f"≤{hs[-1]}" if hs == S.HEADS[:len(hs)] and len(hs) > 1 else ",".join(str(h) for h in hs)


def selection_table(trees, preset: str) -> list[str]:
    """The README's table for `preset`: a row per model dtype and group of capabilities that answer
    alike, a column per KV-cache dtype; bold where pristine has no backend; the heads where the
    pick depends on them; "(→X)" where vLLM then stores the cache as X."""
    rows: dict[tuple[str, str], tuple[str, ...]] = {}
    for cc in S.CAPABILITIES:
        for dtype in S.DTYPES:
            cells = []
            for kv in S.KV_CACHE_DTYPES:
                picks: dict[str, list[int]] = {}
                for h in S.HEADS:
                    key = S.Cell(preset, cc, dtype, kv_cache_dtype=kv, heads=h).key()
                    pat, pri = trees["patched"][key], trees["pristine"][key]
                    text = "none"
                    if pat["selected"]:
                        text = pat["selected"] if pri["selected"] else f"**{pat['selected']}**"
                        used = pat.get("kv_cache_dtype_used")
                        if used and used != kv:
                            text += f" ({KV_ARROW}{used})"
                    picks.setdefault(text, []).append(h)
                cells.append(next(iter(picks)) if len(picks) == 1 else
                             " / ".join(f"{t} ({_heads(hs)} heads)" for t, hs in picks.items()))
            rows[(cc, dtype)] = tuple(cells)
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (cc, dtype), cells in rows.items():
        groups.setdefault((dtype, cells), []).append(cc)
    order = sorted(groups.items(), key=lambda g: (S.CAPABILITIES.index(g[1][0]), S.DTYPES.index(g[0][0])))
    out = ["| capability | model | " + " | ".join(f"kv `{kv}`" for kv in S.KV_CACHE_DTYPES) + " |",
           "|---|---|" + "---|" * len(S.KV_CACHE_DTYPES)]
    out += [f"| {', '.join(ccs)} | {dtype} | " + " | ".join(cells) + " |" for (dtype, cells), ccs in order]
    return out


def test_docs_selection_table(trees, update_docs):
    """docs/proof.md's selection table of the line under test is what vLLM's own selector answers
    (GLM-5 and DeepSeek-V3.2 alike)."""
    import doctext
    from gitfixtures import REPO_ROOT

    tables = {p: selection_table(trees, p) for p in S.PRESETS}
    first = next(iter(tables.values()))
    assert all(t == first for t in tables.values()), "docs/proof.md says both presets give one table"
    doc, name = REPO_ROOT / "docs" / "proof.md", f"selection table {current_line()}"
    doctext.check_or_update(doc, f"the {name}", doctext.section(doc, name), first,
                            update_docs, lambda: doctext.write_section(doc, name, first))


# --------------------------------------------------------------------------- DeepSeek-V4

TRITON_V4 = "DeepseekV4TritonAttention"
# What each upstream class needs besides a capability its backend supports (the inputs asked).
V4_NEEDS = {"DeepseekV4FlashMLAAttention": "flashmla", "DeepseekV4FlashInferSM120Attention": "flashinfer_sm120"}


def _v4(trees, side, cell):
    r = trees[f"dsv4_{side}"][_key(cell)]
    assert "input_error" not in r, r.get("input_error")
    return r


def _v4_switch(r, c):
    """The case's value of the series' switch (None on a tree without it)."""
    return c[r["dsv4"]["switch"] or "switch"]


def _v4_case(r, env, flashinfer_sm120, flashmla):
    return next(c for c in r["dsv4"]["cases"] if (_v4_switch(r, c), c["flashinfer_sm120"], c["flashmla"])
                == (env, flashinfer_sm120, flashmla))


def _v4_ids(cells):
    return [f"{c.capability}" + (f"-{c.backend}" if c.backend else "") for c in cells]


def test_dsv4_every_capability_answered(trees):
    """Both trees answer DeepSeek-V4 through its own functions, each input asked both ways where
    the tree reads it; the pristine tree has no switch and none of the series' route."""
    assert [c.capability for c in DSV4_CELLS] == S.CAPABILITIES
    for cell in DSV4_CELLS:
        pat, pri = _v4(trees, "patched", cell), _v4(trees, "pristine", cell)
        for r in (pat, pri):
            assert r["model"]["model_type"] == "deepseek_v4" and r["model"]["head_size"] == 512
            assert "selected" not in r and "priority" not in r  # not vLLM's backend selector
            assert r["dsv4"]["selector"].endswith("nvidia.model._select_dsv4_attn_cls")
        assert pat["dsv4"]["series_route"] and not pri["dsv4"]["series_route"]
        assert pat["dsv4"]["switch"] == V4_KEY and pri["dsv4"]["switch"] is None
        inputs = dict(pat["dsv4"]["inputs"])
        assert inputs.pop(V4_KEY)[0] == "auto" and set(pat["dsv4"]["inputs"][V4_KEY]) == set(V4_VALUES)
        assert inputs == {"flashinfer_sm120": [True, False], "flashmla": [True, False]}
        assert pri["dsv4"]["inputs"] == {"switch": [None], "flashinfer_sm120": [None],
                                         "flashmla": [True, False]}
        assert len(pat["dsv4"]["cases"]) == 12 and len(pri["dsv4"]["cases"]) == 2
        for c in pri["dsv4"]["cases"]:
            assert c["attention"]["class"] != TRITON_V4 and c["attention"]["reason"] is None
            assert c["mhc"] is None and c["o_proj"] is None and c["cutedsl"] is None
        for c in pat["dsv4"]["cases"]:
            assert c["attention"] and c["error"] is None and c["attention"]["reason"]
            assert c["attention"]["fp8_ds_mla_layout"]


def _upstream_runs(pristine_case, case) -> bool:
    """Whether pristine's class has its kernel on this GPU with this case's inputs."""
    a = pristine_case["attention"]
    need = V4_NEEDS.get(a["class"])
    return a["backend_supports_capability"] and (need is None or case[need])


@pytest.mark.parametrize("cell", DSV4_CELLS, ids=_v4_ids(DSV4_CELLS))
def test_dsv4_policy(trees, cell):
    pat, pri = _v4(trees, "patched", cell), _v4(trees, "pristine", cell)
    major_minor = tuple(int(x) for x in cell.capability.split("."))
    for c in pat["dsv4"]["cases"]:
        upstream = _v4_case(pri, None, None, c["flashmla"])
        got, theirs = c["attention"]["class"], upstream["attention"]["class"]
        portable_mhc = set(c["mhc"]["kernels"].values()) <= {"torch", "triton"}
        value = c[V4_KEY]
        if value == V4_PORTABLE:  # V2
            assert got == TRITON_V4
            assert portable_mhc and c["o_proj"]["path"] == "bf16" and c["cutedsl"] is False
            continue
        if value == V4_UPSTREAM:  # V3
            assert got == theirs
            assert set(c["mhc"]["kernels"].values()) == {"tilelang"} and c["o_proj"]["path"] == "deep_gemm"
            # 0.33.0's "upstream": the CuTe DSL ops wherever cutlass is (upstream's own choice); 0.26.0's
            # VLLM_DSV4_PORTABLE=0 leaves the CuTe DSL to the default's arch check
            assert c["cutedsl"] is (True if not V4_BY_ENV else major_minor >= (8, 9))
            continue
        # V1 (auto)
        assert got == (theirs if _upstream_runs(upstream, c) else TRITON_V4), c
        assert portable_mhc == (major_minor < (9, 0)), c["mhc"]
        assert c["o_proj"]["path"] == ("bf16" if major_minor < (9, 0) else "deep_gemm"), c["o_proj"]
        assert c["cutedsl"] is (major_minor >= (8, 9))


@pytest.mark.parametrize("cell", DSV4_EXPLICIT_CELLS, ids=_v4_ids(DSV4_EXPLICIT_CELLS))
def test_dsv4_explicit_triton(trees, cell):  # V4
    """--attention-backend TRITON_MLA_SPARSE: 0.33.0 takes it as V4's Triton class on every GPU (as
    FLASHMLA_SPARSE is FlashMLA's); 0.26.0 takes it where the Triton class is picked anyway and
    refuses it elsewhere, naming VLLM_DSV4_PORTABLE."""
    r = _v4(trees, "patched", cell)
    auto = _v4(trees, "patched", dataclasses.replace(cell, backend=None))
    for c in r["dsv4"]["cases"]:
        env = c[V4_KEY]
        picked = _v4_case(auto, env, c["flashinfer_sm120"], c["flashmla"])["attention"]["class"]
        if picked == TRITON_V4 or not V4_BY_ENV:
            assert c["attention"]["class"] == TRITON_V4 and c["error"] is None
        else:
            assert c["attention"] is None and f"VLLM_DSV4_PORTABLE={'0' if env == '0' else '1'}" in c["error"]


def dsv4_selection_table(trees) -> list[str]:
    """The README's DeepSeek-V4 table: a row per capability; per value of the series' switch the
    attention class (bold where it is not pristine's) and the mHC, o_proj and compressor route;
    pristine's class; and what proves the row beyond selection."""
    def att(r, cases, pristine_classes):
        def show(c):
            pick = explain.dsv4_short_pick(c, r["capability"])
            return pick if c["attention"]["class"] in pristine_classes else f"**{pick}**"
        return " / ".join(f"{v} ({', '.join(labels)})" if labels else v
                          for labels, v in explain.dsv4_variants(cases, show))

    out = ["| capability | " + " | ".join(f"`{V4_LABEL.format(e)}`" for e in V4_VALUES)
           + " | pristine | proven at |", "|---|" + "---|" * (len(V4_VALUES) + 2)]
    for cell in DSV4_CELLS:
        pat, pri = _v4(trees, "patched", cell), _v4(trees, "pristine", cell)
        pristine_classes = {c["attention"]["class"] for c in pri["dsv4"]["cases"]}
        cells = []
        groups = dict(explain.dsv4_groups(pat))
        for env, cases in ((v, groups[v]) for v in V4_VALUES):
            route = " / ".join(f"{v} ({', '.join(labels)})" if labels else v
                               for labels, v in explain.dsv4_variants(cases, explain.dsv4_short_route))
            cells.append(f"{att(pat, cases, pristine_classes)}; {route}")
        (_, pri_cases), = explain.dsv4_groups(pri)
        cells.append(att(pri, pri_cases, pristine_classes))
        triton = any(c["attention"]["class"] == TRITON_V4 for c in pat["dsv4"]["cases"])
        # the V4 kernel tests and the engine runs were on an H200 (tests/gpu/results/v4/,
        # tests/e2e/results/2026-12-01-v4-*); every arch compiles the kernels
        # (tests/test_kernel_compile_dsv4.py, tests/test_kernel_compile_v4_ops.py). The kernels
        # take one of two code paths by capability (below / from sm89: software or GPU e4m3,
        # indexer without / with fp8 tensor cores); the H200 ran both (e2e runs 10-11: the
        # sm80/86 one, tests/e2e/sm80_paths.py)
        if not triton:
            proof = "selection only"
        elif not V4_BY_ENV:  # 0.33.0: no GPU ran this line (its engine needs torch 2.14)
            proof = ("selection; kernels compile-only and under the interpreter (Triton 3.8); the same "
                     "kernel files ran on the H200 in the 0.26.0 line")
        elif cell.capability == "9.0":
            proof = ("selection; H200: Triton attention and e4m3 kernel tests, the portable path "
                     "through `vllm.LLM` (`=1`)")
        elif cell.capability in ("8.0", "8.6"):
            proof = ("selection; kernels compile-only; H200 with the sm80/86 code paths forced: kernel "
                     "tests, the portable path through `vllm.LLM`")
        else:
            proof = "selection; kernels compile-only; the Triton kernels' sm89+ code paths ran on the H200"
        cells.append(proof)
        out.append(f"| {cell.capability} | " + " | ".join(cells) + " |")
    return out


def test_docs_dsv4_selection_table(trees, update_docs):
    """docs/proof.md's DeepSeek-V4 table of the line under test is what both trees' own functions answer."""
    import doctext
    from gitfixtures import REPO_ROOT

    table = dsv4_selection_table(trees)
    doc, name = REPO_ROOT / "docs" / "proof.md", f"dsv4 selection table {current_line()}"
    doctext.check_or_update(doc, f"the DeepSeek-V4 {name}", doctext.section(doc, name),
                            table, update_docs, lambda: doctext.write_section(doc, name, table))


# ------------------------------------------------------------------ the line's own selection proofs

# tests/lines/<line>/<group>/<file>: selection checks of code only that line has, and the least number
# of tests each must pass (a proof whose tests skip fails here).
LINE_PROOFS = {
    "0.33.0": [("attention", "test_selection_033.py", 2022),  # the backend per cell, with GLM-5.3-Flash (NoPE)
               ("indexer", "test_selection.py", 13),          # indexer kernels, decode top-k per capability
               ("indexer", "test_vllm_selection_tests.py", 12),  # the tree's own indexer-selection tests
               ("indexer", "test_kpool_vllm_selection_tests.py", 10),  # GLM-5.3-Flash's pooled indexer layer
               ("v4", "test_v4_selection_pristine_vs_patched.py", 49)],  # V4 class per KernelConfig option
}


@pytest.mark.parametrize("case", lineproofs.cases(LINE_PROOFS, "its selection is all in the tests above"))
def test_line_selection_proof(vllm_tree, case):
    """0.33.0 chooses the DSA indexer's kernels by arch through its indexer API, and DeepSeek-V4's
    kernels by KernelConfig.deepseek_v4_kernels (the 0.26.0 line: VLLM_DSV4_PORTABLE, which the DSV4
    cells above ask): the line's own proofs check those, pristine vs patched, and vLLM 0.33.0's backend
    selector cell by cell, GLM-5.3-Flash's NoPE head 512 included (smla explain has no such preset)."""
    lineproofs.check(case, vllm_tree, pristine=True)
