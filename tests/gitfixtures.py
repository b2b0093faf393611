"""What the toolkit's tests build: real temporary git repositories, projects, sdists, the rebase
world and a local package index. tests/conftest.py hands most of it out as fixtures; the builders
stay importable for tests that need a variant (other files, another Subject).
"""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading
from pathlib import Path

from smla import export as export_mod
from smla import proc, source
from smla.pin import Pin
from smla.pin import load as load_pin

REPO_ROOT = Path(__file__).resolve().parents[1]  # the toolkit checkout these tests belong to
quiet = dict(echo=lambda *_: None)  # for library calls that would print progress

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


# --- a local package index (PEP 691 JSON) over HTTP on 127.0.0.1 ---------------------------


class IndexServer:
    """A tiny HTTP server: `routes[path] = (body, extra)`; extra may be {"redirect": url},
    {"auth": "Basic ..."} (required Authorization), {"truncate": True} (send half the body,
    then drop the connection) or {"wait": threading.Event} (send the body once it is set).
    Records every request's path and headers. tests/conftest.py's `index` fixture is the one
    instance of a session; `reset` empties it between tests."""

    def __init__(self):
        self.routes: dict = {}
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests.append((self.path, dict(self.headers)))
                body, extra = outer.routes.get(self.path, (None, None))
                extra = extra or {}
                if "redirect" in extra:
                    self.send_response(302)
                    self.send_header("Location", extra["redirect"])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if "auth" in extra and self.headers.get("Authorization") != extra["auth"]:
                    self.send_error(401)
                    return
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if "wait" in extra:
                    extra["wait"].wait(60)
                if extra.get("truncate"):
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        # A short poll interval: shutdown() waits for the next poll.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def reset(self) -> None:
        """No routes, no recorded requests."""
        self.routes.clear()
        self.requests.clear()

    def publish(self, project: str, files: list[tuple[str, bytes]], *, url_for=None, extra=None) -> None:
        """List `files` (name, bytes) under /simple/<project>/ and serve them at /files/<name>."""
        entries = []
        for name, data in files:
            sha = hashlib.sha256(data).hexdigest()
            url = url_for(name) if url_for else f"/files/{name}"
            entries.append({"filename": name, "url": url, "hashes": {"sha256": sha}})
            self.routes[f"/files/{name}"] = (data, extra)
        self.routes[f"/simple/{project}/"] = (json.dumps({"files": entries}).encode(), extra)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the rebase world (tests/test_rebase.py, tests/test_nightly_workflow.py) -------------------

LINES = [f"line {i}" for i in range(1, 41)]


def write_lines(repo: Path, name: str, lines: list[str]) -> None:
    (repo / name).write_text("\n".join(lines) + "\n")


def _commit(repo: Path, msg: str) -> str:
    proc.git(repo, "add", "--all", "--", ".")
    proc.git(repo, "commit", "-q", "-m", msg)
    return proc.git_out(repo, "rev-parse", "HEAD")


def edit_lines(lines: list[str], **changes: str) -> list[str]:
    """`lines` with line N replaced for each `lN="text"`."""
    out = list(lines)
    for key, value in changes.items():
        out[int(key[1:]) - 1] = value
    return out


PIN_TEXT = """# test pin
repo = {repo}
commit = {commit}
version = 0.0.1
sdist = vllm-0.0.1.tar.gz
sdist_sha256 = {sha}
"""


def make_rebase_world(tmp_path: Path) -> dict:
    """For the rebase tests: an upstream repo (C0; C1: each patch in another outcome class; C2: C1 plus
    a conflict with patch e), a toolkit root whose pin is C0 and whose series has one patch per file
    a..e, exported from its patched tree root/work/vllm."""
    up = tmp_path / "upstream"
    up.mkdir()
    proc.git(up, "init", "-q")
    for name in "abcde":
        write_lines(up, f"{name}.py", LINES)
    c0 = _commit(up, "C0")

    root = tmp_path / "root"
    root.mkdir()
    (root / "vllm-pin.txt").write_text(PIN_TEXT.format(repo=up, commit=c0, sha="0" * 64))
    tree = root / "work" / "vllm"

    source.fetch(load_pin(root / "vllm-pin.txt"), tree, str(up), **quiet)
    # The series: one patch per file.
    write_lines(tree, "a.py", edit_lines(LINES, l5="A patched"))
    _commit(tree, "Patch a: unchanged")
    write_lines(tree, "b.py", edit_lines(LINES, l20="B patched"))
    _commit(tree, "Patch b: offsets")
    write_lines(tree, "c.py", edit_lines(LINES, l20="C patched"))
    _commit(tree, "Patch c: merged")
    write_lines(tree, "d.py", edit_lines(LINES, l10="D patched"))
    _commit(tree, "Patch d: upstream")
    write_lines(tree, "e.py", edit_lines(LINES, l30="E patched"))
    _commit(tree, "Patch e: conflicts")
    export_mod.export(tree, root / "patches")

    # C1: b gets lines on top (offsets), c changes a context line (3-way),
    # d takes the patch's change (upstream); a and e untouched.
    write_lines(up, "b.py", ["new 1", "new 2", "new 3", *LINES])
    write_lines(up, "c.py", edit_lines(LINES, l18="c upstream"))
    write_lines(up, "d.py", edit_lines(LINES, l10="D patched"))
    c1 = _commit(up, "C1")
    write_lines(up, "e.py", edit_lines(LINES, l30="E upstream"))
    c2 = _commit(up, "C2")
    return {"up": up, "root": root, "tree": tree, "c0": c0, "c1": c1, "c2": c2}


SERIES_SUBJECTS = ("Add the kernel module", "Register the backend", "Prefer the backend on CUDA")


def series_project(tmp: Path, *, kernel_subject: str = SERIES_SUBJECTS[0]) -> tuple[Path, Path, Pin]:
    """A project whose patches/ holds a 3-patch series exported from a real tree
    (tmp/authoring), and a fresh work tree at the base (tmp/work/vllm, not applied). The fixture of
    the same name (tests/conftest.py) copies one built per session."""
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
    export_mod.export(authoring, root / "patches")
    tree = tmp / "work" / "vllm"
    source.fetch(pin, tree, "git", **quiet)
    return root, tree, pin


# --- stand-in programs --------------------------------------------------------------------------


def python_script(path: Path, code: str) -> Path:
    """An executable `path` that runs `code` with this Python: a /bin/sh wrapper (quoted) and
    `path`.py, since a `#!` line cannot hold an interpreter path with spaces in it."""
    import shlex
    import sys

    body = path.with_name(path.name + ".py")
    body.write_text(code)
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(body))} "$@"\n')
    path.chmod(0o755)
    return path
