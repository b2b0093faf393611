"""CPU (Triton interpreter) smoke test of the TRITON_MLA_SPARSE backend.

Runs tests/backend_interpret_smoke.py in a subprocess (TRITON_INTERPRET must be
set before triton is imported, and the vLLM stand-ins must not leak into this
pytest process).  Relies on stand-ins: see that script's docstring.
"""
import os
import re
import subprocess
import sys
from pathlib import Path


def test_backend_forward_interpreted_with_stand_ins(vllm_tree):
    script = Path(__file__).resolve().parent / "backend_interpret_smoke.py"
    env = dict(os.environ, TRITON_INTERPRET="1", VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, str(script), str(vllm_tree)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = re.search(r"rel_err (\S+)", proc.stdout)
    assert m, proc.stdout[-2000:]
    assert float(m.group(1)) < 1e-5
