"""Commit "[Model] DeepSeek-V4: select the Triton attention where no upstream kernel runs":
the attention class of pristine vLLM 0.33.0 (<tree>, branch v033 = 0.33.0 + the
e4m3 helpers) and of the clone, per capability 8.0-12.1 (mocked), FlashInfer's sm120 kernel
present/absent, KernelConfig.deepseek_v4_kernels auto/upstream/portable, no backend and explicit
backends (selection_table.py in a subprocess per tree). SMLA_SELECTION_TABLE_OUT=PATH keeps
both tables as JSON there (the source tree stays as it was)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TREE

HERE = Path(__file__).parent
PRISTINE = Path(os.environ["VLLM_PRISTINE_TREE"])
FLASHMLA, SM120, TRITON = (
    "DeepseekV4FlashMLAAttention",
    "DeepseekV4FlashInferSM120Attention",
    "DeepseekV4TritonAttention",
)


def table(tree):
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{HERE}")
    proc = subprocess.run([sys.executable, str(HERE / "selection_table.py")], env=env,
                          capture_output=True, text=True, timeout=900, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tables():
    got = {"pristine": table(PRISTINE), "patched": table(TREE)}
    if os.environ.get("SMLA_SELECTION_TABLE_OUT"):
        Path(os.environ["SMLA_SELECTION_TABLE_OUT"]).write_text(json.dumps(got, indent=1))
    return got


def pick(rows, **kw):
    (row,) = [r for r in rows if all(r[k] == v for k, v in kw.items())]
    return row["cls"]


CAPS = ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "12.1"]


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("fi", [True, False])
def test_pristine_has_no_path_below_sm90(tables, cap, fi):
    """Pristine 0.33.0: FlashMLA (kernels for sm90/sm100 only) everywhere but SM12, and
    FlashInfer's SM120 class on SM12 whether or not FlashInfer has the kernel."""
    got = pick(tables["pristine"], cap=cap, flashinfer_sm120=fi, backend=None)
    assert got == (SM120 if cap.startswith("12") else FLASHMLA)


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("fi", [True, False])
def test_patched_fills_the_holes_only(tables, cap, fi):
    rows = tables["patched"]
    auto = pick(rows, cap=cap, flashinfer_sm120=fi, option="auto", backend=None)
    if cap in ("9.0", "10.0"):
        assert auto == FLASHMLA  # upstream's kernel runs: unchanged
    elif cap.startswith("12"):
        assert auto == (SM120 if fi else TRITON)
    else:
        assert auto == TRITON  # sm80/86/89: the hole
    pristine = pick(tables["pristine"], cap=cap, flashinfer_sm120=fi, backend=None)
    assert pick(rows, cap=cap, flashinfer_sm120=fi, option="upstream", backend=None) == (
        pristine
    )
    assert pick(rows, cap=cap, flashinfer_sm120=fi, option="portable", backend=None) == (
        TRITON
    )


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("option", ["auto", "upstream", "portable"])
def test_explicit_backend_wins(tables, cap, option):
    rows = tables["patched"]
    for fi in (True, False):
        assert pick(rows, cap=cap, flashinfer_sm120=fi, option=option,
                    backend="TRITON_MLA_SPARSE_DSV4") == TRITON
        assert pick(rows, cap=cap, flashinfer_sm120=fi, option=option,
                    backend="FLASHMLA_SPARSE_DSV4") == FLASHMLA
