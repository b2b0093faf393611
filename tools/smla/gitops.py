"""Git operations more than one command needs, in one place.

- `scratch_worktree`: a detached `git worktree` in a temporary directory
  beside the tree, always removed again (apply, rebase, build-wheel
  --from-source work in one so the user's tree never sees half a result);
- `fetch_commit`: one commit from a URL or local mirror: shallow first, the
  whole history when the server refuses a shallow fetch of a bare id;
- `is_local_repo`: is a `--source` argument a local git checkout or mirror;
- `apply_errors`: the hunks `git apply` reports as failing, described with
  the patch's own hunk headers.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from smla import proc
from smla.errors import CommandError, FetchError

_UNREACHABLE = ("Could not resolve host", "unable to access", "Connection refused", "timed out",
                "does not appear to be a git repository", "Could not read from remote")


@contextmanager
def scratch_worktree(tree: Path, commit: str, *, checkout: bool = True, prefix: str = ".smla-scratch-") -> Iterator[Path]:
    """A detached worktree of `tree` at `commit`, beside the tree; removed (and pruned) on exit."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=tree.parent))
    scratch.rmdir()  # `git worktree add` wants to create it
    proc.git(tree, "worktree", "add", "-q", *(() if checkout else ("--no-checkout",)), "--detach", scratch, commit)
    try:
        yield scratch
    finally:
        proc.git(tree, "worktree", "remove", "--force", scratch, check=False)
        shutil.rmtree(scratch, ignore_errors=True)
        proc.git(tree, "worktree", "prune", check=False)


def unreachable(stderr: str) -> bool:
    """True when git's stderr says the remote could not be reached at all."""
    return any(m in stderr for m in _UNREACHABLE)


def has_commit(repo: Path, commit: str) -> bool:
    return proc.git(repo, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0


def fetch_commit(repo: Path, url: str, commit: str) -> None:
    """Make `commit` (40 hex) present in `repo`, fetched from `url` (a remote or a local mirror).

    Shallow first; when the server refuses a shallow fetch of a bare id, the
    whole history of its branches. FetchError when unreachable or not there.
    """
    if has_commit(repo, commit):
        return
    try:
        shallow = proc.git(repo, "fetch", "-q", "--depth", "1", "--", url, commit, check=False, timeout=1800)
        if shallow.returncode != 0:
            err = shallow.stderr.strip()
            if unreachable(err):
                raise FetchError(err.splitlines()[-1] if err else "git fetch failed")
            full = proc.git(repo, "fetch", "-q", "--", url, "+refs/heads/*:refs/remotes/upstream/*",
                            check=False, timeout=7200)
            if full.returncode != 0:
                last = (full.stderr or shallow.stderr).strip().splitlines()[-1:]
                raise FetchError(f"cannot fetch {commit} from {url}: {last[0] if last else 'git fetch failed'}")
    except CommandError as exc:  # timeouts
        raise FetchError(f"git fetch from {url} failed: {exc.message}") from exc
    if not has_commit(repo, commit):
        raise FetchError(f"commit {commit} is not in {url}", hint="check the commit id and the repository")


def is_local_repo(spec: str | Path) -> bool:
    """A local git checkout (with .git) or a bare repository / mirror."""
    p = Path(spec).expanduser()
    return p.is_dir() and ((p / ".git").exists() or ((p / "HEAD").is_file() and (p / "objects").is_dir()))


_PATCH_FAILED = re.compile(r"error: patch failed: (.+):(\d+)")
_FILE_ERROR = re.compile(r"error: (\S+): (does not exist in index|No such file or directory"
                         r"|already exists in working directory)")


def apply_errors(patch, stderr: str) -> list[str]:
    """Every failing hunk in `git apply` stderr, in order, described with the patch's hunk headers.

    `patch` is a series.Patch (for `hunk_at`); file-level errors (missing or
    already existing files) are listed as `path: reason`.
    """
    found: list[str] = []
    for m in _PATCH_FAILED.finditer(stderr):
        hunk = patch.hunk_at(m.group(1), int(m.group(2)))
        desc = hunk.describe() if hunk else f"{m.group(1)} at line {m.group(2)}"
        if desc not in found:
            found.append(desc)
    for m in _FILE_ERROR.finditer(stderr):
        desc = f"{m.group(1)}: {m.group(2)}"
        if desc not in found:
            found.append(desc)
    return found
