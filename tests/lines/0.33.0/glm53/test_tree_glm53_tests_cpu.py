"""The tree's vLLM-style GLM-5.3-Flash tests this series adds, run on the CPU in a pytest child:
tests/models/glm5next/test_mhc_portable.py (the mHC op choice per platform/capability/TileLang,
and three decoder layers on the torch mHC ops against float64).

Stand-ins (torchvision_standin.py, loaded first with -p): torchvision, which vllm.models.glm5next
reaches through the multimodal model (glm4_1v -> transformers' Glm4v image processor) and the CPU
suite does not install, is an empty stub package; nothing of it runs here."""
import os
import subprocess
import sys
from pathlib import Path

from conftest import TREE

HERE = Path(__file__).resolve().parent


def test_tree_mhc_portable():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(TREE)])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--noconftest", "-p", "torchvision_standin", "-c", os.devnull, "--rootdir", str(TREE),
                        "tests/models/glm5next/test_mhc_portable.py"],
                       cwd=TREE, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "9 passed" in out, out[-4000:]
