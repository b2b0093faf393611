"""vLLM's sources: a git work tree of vLLM at the pinned commit (what `smla fetch`, smla.fetch, makes).

Sources:
- git: fetch only the pinned commit from the pin's repo (shallow when the
  server allows it, a full fetch otherwise);
- sdist: the PyPI sdist of the pinned release, sha256-verified, unpacked and
  committed as the base of a fresh repository;
- PATH: a local git checkout or mirror (fetched from like a remote), or a
  local sdist file.
`auto` tries git and falls back to the sdist with a one-line notice.

The tree is built in a temporary directory beside its final place and
renamed into place only when complete, so a failed fetch leaves nothing
half-made. The base commit is tagged BASE_TAG and the work branch is BRANCH;
the tree's git config records which upstream commit and release it holds.
"""
from __future__ import annotations

import logging
import os
import platform
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from smla import cache, ids, lock, nospace, proc, treestate
from smla.errors import (ChecksumError, CommandError, FetchError, FilesystemError, TreeStateError, UsageError,
                         cmd)
from smla.fsutil import sha256_file, umask
from smla.pin import Pin
from smla.treeinfo import BASE_TAG, BRANCH, TreeInfo, lost_base_tag, read_tree_info, rebase_in_progress

log = logging.getLogger("smla.source")

# Fixed dates make a base commit made from an sdist identical on every machine.
FIXED_DATE = "2000-01-01T00:00:00+0000"
FIXED_DATE_ENV = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}


def fetch(pin: Pin, tree: Path, source: str = "auto", *, force: bool = False, echo=print,
          guard: Callable[[Path], None] | None = None) -> TreeInfo:
    """Ensure `tree` is a work tree at `pin`. Returns its TreeInfo.

    Holds the tree's lock (smla.lock) throughout. An existing tree is never
    replaced without `force`; with `force`, `guard(tree)` (e.g.
    treestate.check_replaceable) must not raise, and everything is checked
    again after the temporary tree is filled, right before the swap.
    """
    with lock.hold(tree):
        return _fetch_locked(pin, tree, source, force=force, echo=echo, guard=guard)


def _fetch_locked(pin: Pin, tree: Path, source: str, *, force: bool, echo, guard) -> TreeInfo:
    info = _check_target(pin, tree, force, guard)
    if info is not None and not force:
        echo(f"work tree {tree} is already at vLLM {pin.version} ({pin.short}); nothing to fetch")
        return info

    sweep_leftovers(tree)
    tree.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tree.name}.", suffix=".fetching", dir=tree.parent))
    old = None
    try:
        kind = _fill(pin, tmp, source, echo)
        proc.git(tmp, "config", "smla.upstream", pin.commit)
        proc.git(tmp, "config", "smla.version", pin.version)
        proc.git(tmp, "config", "smla.source", kind)
        treestate.record_empty(tmp)
        # Filling takes minutes: look again before touching what is at `tree` now.
        again = _check_target(pin, tree, force, guard)
        if again is not None and not force:
            raise TreeStateError(f"{tree} was fetched by something else meanwhile; left it as it is")
        if tree.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{tree.name}.", suffix=".replaced", dir=tree.parent))
            old.rmdir()
            tree.rename(old)
        tmp.rename(tree)
        os.chmod(tree, 0o777 & ~umask())  # mkdtemp made it 0700
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    info = read_tree_info(tree)
    assert info is not None
    echo(f"fetched vLLM {pin.version} ({pin.short}) from {kind} into {tree}")
    return info


def sweep_leftovers(tree: Path) -> None:
    """Remove what a killed run left beside `tree`: scratch worktrees (proc.sweep_scratch) and
    half-filled or replaced trees of a fetch. Only while holding the tree's lock."""
    if (tree / ".git").is_dir():
        proc.sweep_scratch(tree)
    for pattern in (f".{tree.name}.*.fetching", f".{tree.name}.*.replaced"):
        for p in tree.parent.glob(pattern):
            log.warning("removing %s, left behind by an interrupted fetch", p)
            shutil.rmtree(p, ignore_errors=True)


def _check_target(pin: Pin, tree: Path, force: bool, guard) -> TreeInfo | None:
    """What is at `tree` and whether fetch may proceed; the tree's info when it is an smla tree at
    the pin (and not forced) or when force may replace it; None when nothing (or an empty dir) is there."""
    if tree.exists() and not tree.is_dir():
        raise TreeStateError(f"{tree} is a file, where the work tree's directory belongs",
                             hint=f"move that file away ({cmd('mv', tree, f'{tree}.old')}), or pass another --tree")
    if rebase_in_progress(tree):
        raise TreeStateError(
            f"a `smla rebase` is stopped in {tree}",
            hint=f"finish it with {cmd('smla', 'rebase', '--continue')} or undo it with "
                 f"{cmd('smla', 'rebase', '--abort')}",
        )
    info = read_tree_info(tree)
    if info is not None and not force:
        return treestate.require_at_pin(pin, tree, "fetch the pinned vLLM into it")
    lost = lost_base_tag(tree) if info is None else None
    if lost is not None and not (force and guard is None):  # --force --discard replaces it
        raise lost
    if tree.exists() and info is None and lost is None and any(tree.iterdir()):
        raise TreeStateError(
            f"{tree} exists and is not an smla work tree; refusing to touch it",
            hint="choose another --tree, or remove that directory yourself",
        )
    if info is not None and guard is not None:
        guard(tree)
    return info


def _fill(pin: Pin, repo: Path, source: str, echo) -> str:
    """Populate the empty dir `repo`; return the source kind used."""
    if not pin.commit_is_full and source in ("auto", "git"):  # git cannot fetch an abbreviated id
        if source == "git":
            raise FetchError(
                f"the pin records only the abbreviated commit {pin.commit} (commit_kind = abbreviated): "
                "a git fetch needs the full 40-hex id",
                hint=f"use `--source sdist` (its sha256 identifies the source), or complete the pin with "
                     f"`smla rebase --onto {pin.version} --upstream-commit <40-hex>`",
            )
        echo(f"the pin records only the abbreviated commit {pin.commit}; using the PyPI sdist {pin.sdist}")
        source = "sdist"
    if source == "git":
        _from_git(pin.repo, pin.commit, repo)
        return "git"
    if source == "sdist":
        _from_sdist(pin, sdist_path(pin), repo)
        return "sdist"
    if source == "auto":
        try:
            _from_git(pin.repo, pin.commit, repo)
            return "git"
        except FetchError as exc:
            if not pin.has_sdist:
                raise FetchError(
                    f"{exc.message.splitlines()[0]}; and the pin names no sdist to fall back to",
                    hint="use `--source PATH` with a local vLLM checkout or mirror",
                ) from exc
            echo(f"git remote unreachable ({exc.message.splitlines()[0]}); using the PyPI sdist {pin.sdist}")
            shutil.rmtree(repo / ".git", ignore_errors=True)
            _from_sdist(pin, sdist_path(pin), repo)
            return "sdist"
    path = Path(source).expanduser()
    if is_local_repo(source):
        _from_git(str(path.resolve()), pin.commit, repo)
        return "git"
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        _from_sdist(pin, path, repo, verify=True)
        return "sdist"
    raise UsageError(
        f"--source {source!r}: not 'git', 'sdist', 'auto', a git checkout/mirror or an sdist file"
        + ("" if path.exists() else " (no such path)"),
        hint="give --source auto|git|sdist, the path of a local vLLM checkout or mirror, or of a "
             f"vllm-{pin.version}.tar.gz",
    )


def sdist_path(pin: Pin) -> Path:
    """The verified cached sdist of the pinned release (downloaded when missing).

    Verified against the pin: a cached file matching `sdist_sha256` is used
    without any network. Otherwise the package index's sha256 for the file is
    compared with the pin's first; when they differ the pin is refused (the
    cached file, if any, is kept) with a hint naming the pin's line."""
    if not pin.has_sdist:
        raise FetchError(
            f"the pinned commit {pin.short} is not a release: no sdist holds it (sdist = none)",
            hint=f"fetch it with git: {cmd('smla', 'fetch', '--source', 'git')}, or --source PATH of a mirror",
        )
    dest = cache.downloads_dir() / pin.sdist
    if dest.is_file() and sha256_file(dest) == pin.sdist_sha256:
        return dest
    url, index_sha = cache.pypi_file("vllm", pin.sdist)
    line = pin.where("sdist_sha256")
    if index_sha and index_sha != pin.sdist_sha256:
        cached = dest.is_file() and sha256_file(dest) == index_sha
        raise ChecksumError(
            f"{pin.sdist}: the pin's sdist_sha256 ({line}) is {pin.sdist_sha256}, but the package index "
            f"lists {index_sha}" + (f"; the cached {dest} matches the index and is kept" if cached else ""),
            hint=f"check `sdist_sha256` at {line} (`git diff -- {pin.origin or 'vllm-pin.txt'}` shows local edits); if the "
                 f"index is right, set it to {index_sha}",
        )
    return cache.fetch(url, dest, pin.sdist_sha256, what=pin.sdist,
                       mismatch_hint=f"the download was corrupted, or `sdist_sha256` at {line} is wrong; "
                                     "run the command again, and compare the pin with the package index")


def is_local_repo(spec: str | Path) -> bool:
    """True when `spec` is a local git checkout or bare repository/mirror (the one test for it)."""
    p = Path(spec).expanduser()
    return p.is_dir() and ((p / ".git").exists() or ((p / "HEAD").is_file() and (p / "objects").is_dir()))


def fetch_commit(repo: Path, url: str, commit: str, *, unreachable_is_fatal: bool = False) -> None:
    """Bring `commit` from `url` into `repo`: only that commit (shallow) when the server allows it,
    else every branch. Raises FetchError when it cannot, or when `url` has no such commit.
    (The one shallow-then-full fetch: fetch and rebase use it.)"""
    if proc.git(repo, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0:
        return
    try:
        shallow = proc.git(repo, "fetch", "-q", "--depth", "1", "--", url, commit, check=False, timeout=1800)
        if shallow.returncode != 0:
            if unreachable_is_fatal and _unreachable(shallow.stderr):
                raise FetchError(shallow.stderr.strip().splitlines()[-1] if shallow.stderr.strip() else "git fetch failed")
            log.info("shallow fetch of %s refused; fetching the whole history", commit)
            proc.git(repo, "fetch", "-q", "--", url, "+refs/heads/*:refs/remotes/upstream/*", timeout=7200)
    except CommandError as exc:
        raise FetchError(f"git fetch from {url} failed: {exc.message}") from exc
    if proc.git(repo, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
        raise FetchError(f"commit {commit} is not in {url}", hint="check the pin's commit and repo")


def _from_git(url: str, commit: str, repo: Path) -> None:
    proc.git(repo, "init", "-q")
    fetch_commit(repo, url, commit, unreachable_is_fatal=True)
    proc.git(repo, "checkout", "-q", "-B", BRANCH, commit)
    proc.git(repo, "tag", BASE_TAG, commit)


def _unreachable(stderr: str) -> bool:
    markers = ("Could not resolve host", "unable to access", "Connection refused", "timed out",
               "does not appear to be a git repository", "Could not read from remote")
    return any(m in stderr for m in markers)


def unpack_sdist(archive: Path, dest: Path) -> None:
    """Unpack an sdist's single top directory into `dest` (safe 'data' filter)."""
    if not hasattr(tarfile, "data_filter"):  # Python < 3.10.12 / 3.11.4: no safe extraction filter
        raise FetchError(
            f"this Python ({platform.python_version()}) cannot unpack archives safely (tarfile has no "
            "'data' filter)",
            hint="use Python 3.10.12+, 3.11.4+ or 3.12+",
        )
    # The archive was verified (its sha256) before it got here: a failure is not the archive's fault
    # unless tarfile cannot read it, so no hint ever says to delete it.
    try:
        with tempfile.TemporaryDirectory(dir=dest.parent) as scratch:
            try:
                with tarfile.open(archive) as tf:
                    tf.extractall(scratch, filter="data")
            except tarfile.TarError as exc:
                raise FetchError(f"cannot read {archive}: {exc}",
                                 hint="the file matches its pinned sha256, so it is as published: check that "
                                      "it is the sdist of the pinned vLLM, and this Python's tarfile") from exc
            tops = list(Path(scratch).iterdir())
            if len(tops) != 1 or not tops[0].is_dir():
                raise FetchError(f"{archive.name}: expected one top-level directory in the sdist")
            for item in tops[0].iterdir():
                shutil.move(str(item), dest / item.name)
    except OSError as exc:
        what = f"unpacking {archive.name} (the archive itself is fine)"
        full = nospace.from_oserror(exc, dest.parent, what)
        if full is not None:
            raise full from exc
        raise FilesystemError(f"cannot write {exc.filename or dest}: {exc.strerror or exc}, {what}") from exc


def commit_snapshot(repo: Path, message: str) -> str:
    """Commit every file of `repo` (ignored ones too) with fixed dates; return the id."""
    proc.git(repo, "add", "--all", "--force", "--", ".")
    proc.git(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", message, env=FIXED_DATE_ENV)
    return proc.git_out(repo, "rev-parse", "HEAD")


def sdist_commit(archive: Path) -> str | None:
    """The (abbreviated) commit id a vLLM sdist records in vllm/_version.py, if any."""
    try:
        with tarfile.open(archive) as tf:
            for member in tf:
                parts = member.name.split("/")
                if len(parts) == 3 and parts[1:] == ["vllm", "_version.py"] and member.isfile():
                    fh = tf.extractfile(member)
                    return ids.recorded_commit(fh.read().decode("utf-8", "replace")) if fh else None
    except (tarfile.TarError, OSError) as exc:
        raise FetchError(f"cannot read {archive}: {exc}") from exc
    return None


def _from_sdist(pin: Pin, archive: Path, repo: Path, *, verify: bool = False) -> None:
    if not pin.has_sdist:
        sdist_path(pin)  # raises: a no-sdist pin is never filled from an archive
    if verify:
        got = sha256_file(archive)
        if got != pin.sdist_sha256:
            raise ChecksumError(f"{archive}: sha256 {got} does not match the pin's {pin.sdist_sha256} "
                                f"({pin.where('sdist_sha256')})",
                                hint=f"pass the sdist of vLLM {pin.version} ({pin.sdist}), or check "
                                     f"`sdist_sha256` at {pin.where('sdist_sha256')}")
    recorded = sdist_commit(archive)
    if recorded and not ids.same_commit(pin.commit, recorded):
        raise FetchError(
            f"{archive.name} holds vLLM commit {recorded}, but the pin is {pin.short}",
            hint="the pin's sdist does not match its commit; fix vllm-pin.txt or fetch with --source git",
        )
    unpack_sdist(archive, repo)
    proc.git(repo, "init", "-q")
    commit_snapshot(repo, f"vLLM {pin.version} (sdist {pin.sdist})\n\nUpstream-Commit: {pin.commit}\n")
    proc.git(repo, "tag", BASE_TAG)
