"""Real temporary git repos and projects for the toolkit's unit tests."""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from smla import proc
from smla.pin import Pin

FILES = {
    "vllm/__init__.py": "__version__ = '9.9.9'\n",
    "vllm/platforms/cuda.py": "".join(f"line {i}\n" for i in range(1, 41)),
    "vllm/registry.py": "A = 1\nB = 2\nC = 3\n",
    "README.md": "upstream\n",
}


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def make_upstream(tmp: Path, files: dict[str, str] = FILES) -> tuple[Path, str]:
    """A git repo standing in for vLLM upstream; returns (path, commit id)."""
    repo = tmp / "upstream"
    repo.mkdir()
    proc.git(repo, "init", "-q")
    write_files(repo, files)
    proc.git(repo, "add", "-A")
    proc.git(repo, "commit", "-q", "-m", "upstream release")
    return repo, proc.git_out(repo, "rev-parse", "HEAD")


def make_sdist(tmp: Path, files: dict[str, str] = FILES, version: str = "9.9.9") -> tuple[Path, str]:
    """A vllm-<version>.tar.gz with one top directory; returns (path, sha256)."""
    path = tmp / f"vllm-{version}.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size = len(data)
            info.mtime = 0
            tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path, hashlib.sha256(buf.getvalue()).hexdigest()


def make_project(tmp: Path, repo: str, commit: str, sdist_sha: str = "0" * 64, version: str = "9.9.9") -> Path:
    """A toolkit root: vllm-pin.txt and an empty patches/ dir."""
    root = tmp / "project"
    (root / "patches").mkdir(parents=True)
    (root / "vllm-pin.txt").write_text(
        "# test pin\n"
        f"repo = {repo}\ncommit = {commit}\nversion = {version}\n"
        f"sdist = vllm-{version}.tar.gz\nsdist_sha256 = {sdist_sha}\n"
    )
    (root / "patches" / "series").write_text("")
    return root


def pin_for(repo: Path | str, commit: str, sdist_sha: str = "0" * 64) -> Pin:
    return Pin(repo=str(repo), commit=commit, version="9.9.9", sdist="vllm-9.9.9.tar.gz", sdist_sha256=sdist_sha)


def commit_change(tree: Path, files: dict[str, str], subject: str, body: str = "Why: a test.",
                  delete: tuple[str, ...] = ()) -> str:
    write_files(tree, files)
    for rel in delete:
        (tree / rel).unlink()
    proc.git(tree, "add", "-A")
    proc.git(tree, "commit", "-q", "-m", f"{subject}\n\n{body}")
    return proc.git_out(tree, "rev-parse", "HEAD")


SERIES_SUBJECTS = ("Add the kernel module", "Register the backend", "Prefer the backend on CUDA")


def series_project(tmp: Path, *, kernel_subject: str = SERIES_SUBJECTS[0]) -> tuple[Path, Path, Pin]:
    """A project whose patches/ holds a 3-patch series exported from a real tree
    (tmp/authoring), and a fresh work tree at the base (tmp/work/vllm, not applied)."""
    from smla import export, source

    quiet = dict(echo=lambda *_: None)
    upstream, commit = make_upstream(tmp)
    root = make_project(tmp, str(upstream), commit)
    authoring = tmp / "authoring"
    pin = pin_for(upstream, commit)
    source.fetch(pin, authoring, "git", **quiet)
    cuda = (authoring / "vllm/platforms/cuda.py").read_text()
    commit_change(authoring, {"vllm/ops/kernel.py": "def k():\n    return 1\n"}, kernel_subject,
                  "Why: the backend needs a kernel.")
    commit_change(authoring, {"vllm/registry.py": "A = 1\nB = 2\nSPARSE = 9\nC = 3\n"}, SERIES_SUBJECTS[1])
    commit_change(authoring, {"vllm/platforms/cuda.py": cuda.replace("line 20\n", "line 20\nSPARSE\n")},
                  SERIES_SUBJECTS[2])
    export.export(authoring, root / "patches")
    tree = tmp / "work" / "vllm"
    source.fetch(pin, tree, "git", **quiet)
    return root, tree, pin
