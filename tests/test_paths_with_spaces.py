"""The toolkit's tests in a checkout (and so a .venv) whose path holds spaces: the tests that write
stand-in programs must quote the interpreter's path (a `#!` line cannot hold one with spaces).

Runs those tests again, in a child pytest, through a path with spaces leading to this .venv.
Marked slow: a second pytest process (make test runs it)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gitfixtures import REPO_ROOT

pytestmark = pytest.mark.slow

STAND_INS = [
    "tests/test_wheel.py::test_build_from_source_with_stand_in_python",
    "tests/test_wheel.py::test_from_source_needs_cuda_torch",
    "tests/test_nightly_workflow.py::test_clean_night_opens_a_ready_pr",
]


def test_stand_in_programs_work_from_a_path_with_spaces(tmp_path):
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running inside a virtual environment (make creates .venv)")
    spaced = tmp_path / "my checkout" / "venv"
    spaced.parent.mkdir()
    spaced.symlink_to(Path(sys.prefix), target_is_directory=True)
    python = spaced / "bin" / "python"
    seen = subprocess.run([str(python), "-c", "import sys, smla; print(sys.executable)"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert " " in seen, seen
    res = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *STAND_INS],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    # old code: `#!/…/my checkout/venv/bin/python` ran "/…/my" (exec format or not found errors)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert f"{len(STAND_INS)} passed" in res.stdout
