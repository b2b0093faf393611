"""build-wheel on the real official vLLM wheel (500 MB) and the real patched tree.

Opt-in: runs only with SMLA_REAL_WHEEL=1 (`make test-wheel` sets it, after
`make patch`). Builds through the CLI, installs the result with
`pip install --no-deps --target`, and checks the version everywhere, that
every patched module is byte-identical to the patched tree, and that every
other file of the official wheel (all compiled `*.so` among them) is present
and unchanged.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from smla import wheel as wh
from smla.project import Project

from gitfixtures import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SMLA_REAL_WHEEL") != "1",
                       reason="real-wheel check is opt-in: SMLA_REAL_WHEEL=1 (make test-wheel)"),
]


def _b64sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def test_real_wheel(tmp_path):
    project = Project.discover(Path(os.environ.get("SMLA_ROOT", REPO_ROOT)))
    tree = Path(os.environ.get("SMLA_TREE", project.default_tree))
    if not (project.patches_dir / "series").is_file():
        pytest.skip("no patches/series yet")
    smla = [sys.executable, "-m", "smla.cli", "--root", str(project.root), "--tree", str(tree)]
    t0 = time.monotonic()
    res = subprocess.run([*smla, "build-wheel", "--json", "--out", str(tmp_path / "dist")],
                         capture_output=True, text=True, cwd=project.root)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    print(f"\nbuild-wheel: {elapsed:.1f}s, {r['size'] / 1e6:.1f} MB, {r['output']}")
    out, base = Path(r["output"]), Path(r["base_wheel"])
    version = r["version"]
    pin = project.pin()
    # the label names the pinned release, its upstream commit and the series
    assert version == f"{pin.version}+sparsemla.g{pin.commit[:9]}.{r['series_hash']}"
    base_tags = base.name[:-len(".whl")].split("-", 2)[2]  # e.g. cp38-abi3-manylinux_2_28_x86_64 for 0.26.0
    assert base.name == f"vllm-{pin.version}-{base_tags}.whl"
    assert out.name == f"vllm-{version}-{base_tags}.whl"
    platform_tag = base_tags.split("-", 2)[2]

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
         "--disable-pip-version-check", "--only-binary=:all:", "--platform", platform_tag,
         "--python-version", "3.12", "--implementation", "cp", "--target", str(site), str(out)],
        check=True, capture_output=True, text=True,
    )
    di = site / f"vllm-{version}.dist-info"
    assert f"\nVersion: {version}\n" in (di / "METADATA").read_text()
    code = "import importlib.metadata as m; print(m.version('vllm'))"
    got = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)},
                         check=True, capture_output=True, text=True).stdout.strip()
    assert got == version
    ns: dict = {}
    exec((site / "vllm" / "_version.py").read_text(), ns)
    assert ns["__version__"] == version
    with zipfile.ZipFile(base) as zf:  # the upstream commit id is kept as the official wheel has it
        official_ns: dict = {}
        exec(zf.read("vllm/_version.py").decode(), official_ns)
    assert ns["__commit_id__"] == official_ns["__commit_id__"]

    changed = set(r["replaced"]) | set(r["added"])
    for rel in changed:
        assert (site / rel).read_bytes() == (tree / rel).read_bytes(), rel
    for rel in r["removed"]:
        assert not (site / rel).exists(), rel

    with zipfile.ZipFile(base) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record).decode())))
        official_di = record.rsplit("/", 1)[0]
        official_meta = {n: zf.read(n) for n in ("entry_points.txt", "WHEEL", "top_level.txt")
                         for n in [f"{official_di}/{n}"]}
    compiled = 0
    official_so = sum(1 for path, digest, _ in rows if path.endswith(".so") and path not in changed)
    for path, digest, _size in rows:
        if not digest or path.startswith(official_di) or path in changed or path == wh.VERSION_FILE:
            continue
        if path in r["removed"]:
            continue
        assert (site / path).is_file(), f"{path} missing from the installed wheel"
        assert f"sha256={_b64sha(site / path)}" == digest, f"{path} differs from the official wheel"
        compiled += path.endswith(".so")
    # every compiled file of the official wheel is there, unchanged (0.16.0: 7 incl. vllm/_C.abi3.so;
    # 0.26.0: 16, the ops in vllm/_C_stable_libtorch.abi3.so, no vllm/_C.abi3.so)
    assert compiled == official_so > 0
    for name, data in official_meta.items():
        assert (di / name.rsplit("/", 1)[1]).read_bytes() == data
