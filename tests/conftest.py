"""Shared fixtures, markers and lanes of the test suite (tests/gitfixtures.py builds the worlds).

Lanes: `make test` runs every test but the GPU ones; `make test-fast` also leaves out the tests
marked `slow`. A test is marked here, by what it uses, so no test file has to say it:
  gpu    needs a CUDA GPU (tests/gpu; skipped without one, run by `make test-gpu`)
  slow   needs the real vLLM source: the patched work tree `make patch` makes (the `vllm_tree`
         fixture: selection, explain, the kernels under Triton's interpreter, the backend smoke
         tests), the pinned sdist (SLOW_MODULES: integration; tests/test_docs.py's session
         transcripts carry the mark themselves), Triton's compiler (the compile matrix and the V4
         attention and ops' compile checks) or long CPU work (marked where they are: the V4 tiny
         checkpoint's tensors, the e2e runner spawning engines, the serving report's plot)
What `make test-fast` keeps runs on temporary git repositories and one local package index.

Lines: the checkout keeps one series per vLLM release (lines/<release>/). A test that reads a
line's vLLM tree, sdist or series is marked `line` (the `vllm_tree` fixture, LINE_MODULES): `make
test` runs the whole suite on the newest line and the `line` tests again on each older line, with
SMLA_LINE naming it. Every other test is a toolkit test: it runs once, on temporary repositories,
with SMLA_LINE, SMLA_TREE and SMLA_ROOT removed from its environment (its projects are its own).

Fixtures:
  vllm_tree       the patched vLLM work tree of the line under test (`make patch`; $SMLA_LINE
                  picks the line, default the newest; SMLA_TREE overrides the tree)
  series_project  (root, tree, pin): a toolkit root whose patches/ holds a 3-patch series, and a
                  fresh work tree at its base (not applied)
  rebase_world    the rebase tests' upstream (C0; C1 clean; C2 conflicting), root and patched tree
  index           the local package index: one server for the session, empty for each test, with
                  SMLA_INDEX_URL pointing at it and SMLA_CACHE_DIR at the test's own cache
  update_docs     True under `--update-docs`: the docs tests rewrite the docs from real output
                  instead of comparing them (`make docs`)
The two worlds are built once per session and copied for each test (building them is most of a
toolkit test's time). This file imports the toolkit (gitfixtures, smla) only inside fixtures or
guarded: the GPU machine runs tests/gpu with it, without the toolkit installed.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]  # as gitfixtures.REPO_ROOT

# Triton's compile cache (hundreds of MB for the kernel tests) goes under the toolkit's cache
# (<cache>/triton), not ~/.triton, unless the user chose a place with TRITON_CACHE_DIR.
if os.environ.get("TRITON_CACHE_DIR"):
    os.environ["SMLA_TEST_USER_TRITON_CACHE"] = "1"
else:
    try:
        from smla.cache import cache_dir
    except ImportError:  # the GPU machine runs tests/gpu without the toolkit installed
        cache_dir = None
    if cache_dir is not None:
        os.environ["TRITON_CACHE_DIR"] = str(cache_dir() / "triton")

# A line's own proofs (tests/lines/<release>/<group>/) run in child processes, through
# tests/lineproofs.py, never in this one: they import vLLM with stand-ins.
collect_ignore = ["lines"]

# Modules whose every test reads the real vLLM source without the `vllm_tree` fixture.
SLOW_MODULES = {"test_integration.py", "test_kernel_compile.py", "test_kernel_compile_matrix.py",
                "test_kernel_compile_v4_ops.py", "test_kernel_compile_dsv4.py",
                "test_rebase_real.py", "test_wheel_real.py"}
# Modules whose every test reads one line (its tree, sdist, series or wheel): run on each line.
LINE_MODULES = SLOW_MODULES
# The line and tree the `line` tests read, as the run was started (toolkit tests get them removed).
_LINE_ENV = {k: os.environ.get(k) for k in ("SMLA_LINE", "SMLA_TREE", "SMLA_ROOT")}


def current_line() -> str:
    """The release line under test: $SMLA_LINE, else the newest line of this checkout."""
    if _LINE_ENV["SMLA_LINE"]:
        return _LINE_ENV["SMLA_LINE"]
    lines = sorted((p.parent.name for p in (REPO_ROOT / "lines").glob("*/vllm-pin.txt")),
                   key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))
    return lines[-1]


def line_dir() -> Path:
    """lines/<release>/ of the line under test (its pin and patches/)."""
    return REPO_ROOT / "lines" / current_line()


def default_tree() -> Path:
    """The patched work tree the tests read: $SMLA_TREE, else <root>/work/<line>/vllm."""
    return Path(_LINE_ENV["SMLA_TREE"] or REPO_ROOT / "work" / current_line() / "vllm")


def pytest_addoption(parser):
    parser.addoption("--update-docs", action="store_true",
                     help="rewrite the docs' transcripts and generated tables from real output (make docs)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (make test-gpu)")
    config.addinivalue_line("markers", "slow: needs the real vLLM source or Triton's compiler, or "
                                       "long CPU work (make test runs it, make test-fast does not)")
    config.addinivalue_line("markers", "line: reads one release line's tree, sdist or series (make test "
                                       "runs it on every line, SMLA_LINE naming it)")


# The e2e harness drives the engine of one line: vLLM 0.26.0, the only line whose engine runs on the
# lent GPU image (0.33.0's needs torch 2.14). Its CPU checks that read a vLLM tree (checkpoints through
# vLLM's classes, the runner internals its guards rely on, the TP shard layout) run on that line.
E2E_ENGINE_LINE = "0.26.0"


def pytest_collection_modifyitems(config, items):
    line = current_line() if (REPO_ROOT / "lines").is_dir() else E2E_ENGINE_LINE
    e2e_skip = pytest.mark.skip(reason=f"line {line}: the e2e harness drives the {E2E_ENGINE_LINE} engine "
                                       f"(its checks run on that line; {line}'s engine has not run here)")
    for item in items:
        if (line != E2E_ENGINE_LINE and "vllm_tree" in item.fixturenames
                and item.path.parent.name == "e2e"):
            item.add_marker(e2e_skip)
        if "vllm_tree" in item.fixturenames or item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if "vllm_tree" in item.fixturenames or item.path.name in LINE_MODULES:
            item.add_marker(pytest.mark.line)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU tests
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="no CUDA device (GPU tests run with make test-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _line_env(request, monkeypatch):
    """Toolkit tests build their own projects: no line, tree or root of the run leaks into them."""
    if request.node.get_closest_marker("line") is None:
        for k in _LINE_ENV:
            monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="session")
def vllm_tree() -> Path:
    tree = default_tree()
    if not (tree / "vllm" / "__init__.py").is_file():
        pytest.fail(f"no vLLM work tree at {tree}: run `make patch` first")
    return tree


@pytest.fixture(scope="session")
def update_docs(request) -> bool:
    return bool(request.config.getoption("--update-docs"))


# ------------------------------------------------------------------ the worlds, built once


def _copy_world(template: Path, dest: Path, pin_files: list[Path]) -> None:
    """Copy a world built under `template` into `dest`: the pin files' paths follow it, and every
    git repository re-reads its files' stat data (copied files have new inodes and ctimes)."""
    from smla import proc

    shutil.copytree(template, dest, symlinks=True, dirs_exist_ok=True)
    for rel in pin_files:
        pin = dest / rel
        pin.write_text(pin.read_text().replace(str(template), str(dest)))
    for dotgit in dest.rglob(".git"):
        proc.git(dotgit.parent, "update-index", "-q", "--refresh", check=False)


@pytest.fixture(scope="session")
def _series_template(tmp_path_factory) -> Path:
    import gitfixtures

    template = tmp_path_factory.mktemp("series-template")
    gitfixtures.series_project(template)
    return template


@pytest.fixture
def series_project(_series_template, tmp_path):
    """(root, tree, pin) as gitfixtures.series_project(tmp_path) gives them."""
    import gitfixtures

    _copy_world(_series_template, tmp_path, [Path("project/lines/9.9.9/vllm-pin.txt")])
    root = tmp_path / "project"
    pin = gitfixtures.load_pin(gitfixtures.pin_file(root))
    return root, tmp_path / "work" / "vllm", gitfixtures.pin_for(pin.repo, pin.commit)


@pytest.fixture(scope="session")
def _rebase_template(tmp_path_factory) -> Path:
    import gitfixtures

    template = tmp_path_factory.mktemp("rebase-template")
    world = gitfixtures.make_rebase_world(template)
    (template / "ids.txt").write_text(" ".join(world[k] for k in ("c0", "c1", "c2")))
    return template


@pytest.fixture
def rebase_world(_rebase_template, tmp_path, monkeypatch) -> dict:
    """gitfixtures.make_rebase_world(tmp_path), with SMLA_CACHE_DIR under tmp_path."""
    monkeypatch.setenv("SMLA_CACHE_DIR", str(tmp_path / "cache"))
    _copy_world(_rebase_template, tmp_path, [Path("root/lines/0.0.1/vllm-pin.txt")])
    c0, c1, c2 = (tmp_path / "ids.txt").read_text().split()
    (tmp_path / "ids.txt").unlink()
    root = tmp_path / "root"
    return {"up": tmp_path / "upstream", "root": root, "tree": root / "work" / "0.0.1" / "vllm",
            "line": root / "lines" / "0.0.1", "pin": root / "lines" / "0.0.1" / "vllm-pin.txt",
            "patches": root / "lines" / "0.0.1" / "patches", "c0": c0, "c1": c1, "c2": c2}


# ------------------------------------------------------------------ the local package index


@pytest.fixture(scope="session")
def _index_server():
    import gitfixtures

    server = gitfixtures.IndexServer()
    yield server
    server.close()


@pytest.fixture
def index(_index_server, monkeypatch, tmp_path):
    """The local package index, empty, at SMLA_INDEX_URL; downloads cached under tmp_path/cache."""
    _index_server.reset()
    monkeypatch.setenv("SMLA_INDEX_URL", _index_server.base + "/simple")
    monkeypatch.setenv("SMLA_CACHE_DIR", str(tmp_path / "cache"))
    yield _index_server
    _index_server.reset()


def _untracked() -> set[str] | None:
    """The checkout's untracked, not ignored files (None where it is no git checkout, e.g.
    the GPU machine's copy)."""
    import subprocess

    try:
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "--others",
                               "--exclude-standard"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(proc.stdout.splitlines()) if proc.returncode == 0 else None


def pytest_sessionstart(session):
    session.config.stash[_UNTRACKED] = _untracked()


def pytest_sessionfinish(session, exitstatus):
    """A test writes into tmp_path, never into the checkout: new untracked files fail the run."""
    before = session.config.stash.get(_UNTRACKED, None)
    after = _untracked() if before is not None else None
    new = sorted(after - before) if after is not None else []
    if new:
        print(f"\nERROR: the tests left new files in the checkout: {', '.join(new)} "
              "(a test writes into tmp_path)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_UNTRACKED = pytest.StashKey[set]()
