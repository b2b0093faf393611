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

"Our kernel can run" (ours_can_run) is the kernel's contract, not an
observation: compute capability >= 8.0, and either a 16-bit KV cache in the
model dtype (kv "auto", or the model dtype named explicitly) or an fp8 cache
(fp8, fp8_e4m3, fp8_ds_mla), which our backend always stores as fp8_ds_mla
(docs/fp8-kv.md).
"""
from __future__ import annotations

import json
import os

import pytest

import smla.selection as S
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


@pytest.fixture(scope="module")
def trees(vllm_tree):
    """{"patched": {key: result}, "pristine": {key: result}}.

    One child interpreter per tree, both at once.  The pristine one answers
    the cells twice, the second time in reverse order: a selection cached
    across cells (vLLM caches a lot with functools) would show up as a
    difference between the two passes."""
    pristine_tree = explain.pristine_tree(vllm_tree)
    patched, pristine = S.run_selections(
        [(vllm_tree, AUTO_CELLS + EXPLICIT_CELLS),
         (pristine_tree, AUTO_CELLS + AUTO_CELLS[::-1])])
    n = len(AUTO_CELLS)
    first, second = pristine[:n], pristine[n:][::-1]
    return {"patched": {_key(r): r for r in patched},
            "pristine": {_key(r): r for r in first},
            "pristine_second_pass": {_key(r): r for r in second}}


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


def test_readme_selection_table(trees, update_docs):
    """README.md's selection table is what vLLM's own selector answers (GLM-5 and DeepSeek-V3.2 alike)."""
    import doctext
    from gitfixtures import REPO_ROOT

    tables = {p: selection_table(trees, p) for p in S.PRESETS}
    first = next(iter(tables.values()))
    assert all(t == first for t in tables.values()), "the README says both presets give one table"
    readme = REPO_ROOT / "README.md"
    doctext.check_or_update(readme, "the selection table", doctext.section(readme, "selection table"), first,
                            update_docs, lambda: doctext.write_section(readme, "selection table", first))
