"""The Triton 3.8 route to the lent H200 on the CPU (tests/gpu/t38_bundle.py, tests/gpu/t38-run.sh):
the reduced wheel, and the device calls in dry-run form (SMLA_T38_DRY=1: staging, assembly and the
checks; no install, tests or benchmark) over a copy of the scripts, as consecutive calls would."""
from __future__ import annotations

import base64
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import t38_bundle  # noqa: E402

WHEEL = "triton-3.8.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"


def _fake_triton(path: Path) -> None:
    members = {
        "triton/__init__.py": b"__version__ = '3.8.0'\n",
        "triton/_C/libtriton.so": os.urandom(2_500_000),  # incompressible: three 1 MiB pieces
        "triton/backends/nvidia/bin/ptxas": b"ptxas",
        "triton/backends/nvidia/bin/ptxas-blackwell": b"sm100 ptxas",
        "triton/backends/nvidia/lib/cupti/libcupti.so": b"cupti",
        "triton/_C/libproton.so": b"proton",
    }
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
        for n, d in members.items()) + "triton-3.8.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
        z.writestr("triton-3.8.0.dist-info/RECORD", record)


def test_bundle_drops_only_what_sm90_never_loads_and_the_device_calls_reassemble_it(tmp_path):
    src = tmp_path / WHEEL
    _fake_triton(src)
    out = tmp_path / "bundle"
    assert t38_bundle.main(["--out", str(out), "--wheel", str(src), "--piece-mib", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["pieces"]) == 3
    with zipfile.ZipFile(out / "build" / WHEEL) as z:
        names = set(z.namelist())
    assert {"triton/__init__.py", "triton/_C/libtriton.so", "triton/backends/nvidia/bin/ptxas"} <= names
    assert not names & {"triton/backends/nvidia/bin/ptxas-blackwell", "triton/_C/libproton.so",
                        "triton/backends/nvidia/lib/cupti/libcupti.so"}

    # the device's copy of the repo: the scripts, and what each call carries under .t38 / .gpu-port
    dev = tmp_path / "dev"
    for rel in ("tests/e2e/device_pieces.py", "tests/gpu/device-run.sh", "tests/gpu/t38-run.sh"):
        (dev / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, dev / rel)
    env = dict(os.environ, OUT=str(tmp_path / "out"), SMLA_T38_STORE=str(tmp_path / "store"),
               SMLA_T38_PORT=str(tmp_path / "port"), SMLA_T38_DRY="1")

    def call(phase: str, piece: int | None, so: bytes | None = None, kern: bool = False):
        shutil.rmtree(dev / ".t38", ignore_errors=True)
        shutil.rmtree(dev / ".gpu-port", ignore_errors=True)
        if piece is not None:
            (dev / ".t38").mkdir()
            shutil.copy(out / "manifest.json", dev / ".t38")
            rel = manifest["pieces"][piece - 1]["path"]
            (dev / ".t38" / rel).parent.mkdir(parents=True)
            shutil.copy(out / rel, dev / ".t38" / rel)
        if so is not None:
            d = dev / ".gpu-port" / "so"
            d.mkdir(parents=True)
            (d / "_C_stable_libtorch.abi3.so.xz").write_bytes(lzma.compress(so))
            (d / "SHA256SUMS").write_text(hashlib.sha256(b"the ops").hexdigest() + "  _C_stable_libtorch.abi3.so\n")
        if kern:
            for k in ("kern", "kpool"):
                (dev / ".gpu-port" / k / "vllm").mkdir(parents=True)
                (dev / ".gpu-port" / k / "vllm" / "__init__.py").write_text("")
        return subprocess.run(["bash", "tests/gpu/device-run.sh", phase],
                              cwd=dev, env=env, capture_output=True, text=True)

    r = call("t38-stage", 1)
    assert r.returncode == 0 and "1/3 pieces; missing [2, 3]" in r.stdout, r.stdout + r.stderr
    r = call("t38", 3, kern=True)  # piece 2 never carried: stops before installing anything
    assert r.returncode == 20 and "[2]" in r.stderr, r.stdout + r.stderr
    r = call("t38-stage", None, so=b"not the ops")  # damaged compiled ops: refused, not kept
    assert r.returncode == 21 and not (tmp_path / "port" / "_C_stable_libtorch.abi3.so").exists()
    r = call("t38-stage", 2, so=b"the ops")
    assert r.returncode == 0 and "3/3" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "port" / "_C_stable_libtorch.abi3.so").read_bytes() == b"the ops"
    r = call("t38", 3, kern=True)
    assert r.returncode == 0 and "dry run" in r.stdout, r.stdout + r.stderr
    assert "_C_stable_libtorch.abi3.so" in r.stdout  # the ops of an earlier call are still there
    assert (tmp_path / "store" / "payload" / WHEEL).read_bytes() == (out / "build" / WHEEL).read_bytes()
