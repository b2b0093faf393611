"""The one place where the toolkit runs other programs, git included.

Every subprocess goes through `run` (argument lists only, never a shell),
which logs the command line before running it. `git` is `run` with:
- a scrubbed environment: every inherited GIT_* variable is dropped except
  a few that only tune transport or tracing (GIT_SSH_COMMAND, GIT_TRACE...),
  so a GIT_DIR / GIT_WORK_TREE / GIT_INDEX_FILE / GIT_CONFIG_* set by a hook
  or the user's shell never redirects smla to another repository;
- no system or global git config, a fixed identity and neutral options, so
  results do not depend on ~/.gitconfig.
`scratch_worktree` is the one way to get a throw-away checkout of a tree's
commit (apply, rebase and build-wheel use it); `sweep_scratch` removes the
ones a killed run (SIGKILL, a second Ctrl-C) could not remove itself.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from smla import nospace
from smla.errors import CommandError

log = logging.getLogger("smla.proc")

# A fixed identity and dates make base commits and applied commits reproducible.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "smla",
    "GIT_AUTHOR_EMAIL": "smla@localhost",
    "GIT_COMMITTER_NAME": "smla",
    "GIT_COMMITTER_EMAIL": "smla@localhost",
}
# Options that make git output independent of the user's configuration.
GIT_NEUTRAL_CONFIG = (
    "-c", "core.abbrev=12",
    "-c", "commit.gpgsign=false",
    "-c", "tag.gpgsign=false",
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.renames=true",
    "-c", "core.autocrlf=false",
    "-c", "core.safecrlf=false",
    "-c", "advice.detachedHead=false",
    "-c", "init.defaultBranch=smla",
    "-c", "gc.auto=0",
)
# Inherited GIT_* variables that may pass: transport and tracing only. Everything
# else (GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE, GIT_OBJECT_DIRECTORY, GIT_CONFIG_*,
# GIT_NAMESPACE, GIT_CEILING_DIRECTORIES, ...) could point git elsewhere.
GIT_ENV_KEEP = frozenset({
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_ASKPASS", "GIT_PROXY_COMMAND",
    "GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_HTTP_LOW_SPEED_LIMIT", "GIT_HTTP_LOW_SPEED_TIME",
    "GIT_TRACE", "GIT_TRACE2", "GIT_TRACE2_EVENT", "GIT_TRACE_PACKET", "GIT_CURL_VERBOSE",
})


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every git command gets: os.environ without redirecting GIT_*
    variables, plus the toolkit's identity and config isolation, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in GIT_ENV_KEEP}
    env.update(GIT_IDENTITY)
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
    if extra:
        env.update(extra)
    return env


# How a child stopped by SIGINT exits: killed by it, or 128 + 2 from its own handler.
INTERRUPTED_EXITS = (-signal.SIGINT, 128 + signal.SIGINT)


def run(
    argv: Sequence[str | os.PathLike],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    input: str | None = None,
    replace_env: bool = False,
) -> subprocess.CompletedProcess:
    """Run `argv` (no shell), capture text output, log the command line.

    `env` is added to os.environ (or used as is with replace_env=True).
    With check=True a non-zero exit raises CommandError naming the command and
    its stderr; callers that interpret failures pass check=False.
    """
    args = [os.fspath(a) for a in argv]
    log.info("$ %s%s", shlex.join(args), f"   (in {cwd})" if cwd else "")
    full_env = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            args,
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="surrogateescape",
            check=False,
            timeout=timeout,
            input=input,
        )
    except FileNotFoundError as exc:
        raise CommandError(f"program not found: {args[0]}", hint=f"install {args[0]}") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"timed out after {timeout:.0f}s: {shlex.join(args)}") from exc
    if proc.returncode in INTERRUPTED_EXITS:
        # The child died of Ctrl-C, which reaches the whole foreground group: this process takes
        # it too, once whether or not its own SIGINT has arrived yet (while signals_held blocks
        # it, when the block ends), so the command stops as on Ctrl-C, not as a failed command.
        signal.raise_signal(signal.SIGINT)
    if proc.returncode != 0:
        log.debug("exit %d; stderr: %s", proc.returncode, proc.stderr.strip())
        if check:
            full = nospace.from_output(Path(args[0]).name, proc.stderr + proc.stdout, Path(cwd or "."))
            if full is not None:  # a full disk (git: thousands of `unable to write file` lines)
                raise full
            raise CommandError(
                f"command failed (exit {proc.returncode}): {shlex.join(args)}\n"
                f"{_tail(proc.stderr.strip() or proc.stdout.strip())}"
            )
    return proc


MAX_ERROR_LINES = 20


def _tail(text: str) -> str:
    """The last MAX_ERROR_LINES lines of a command's output (-vv logs all of it)."""
    lines = text.splitlines()
    if len(lines) <= MAX_ERROR_LINES:
        return text
    return "\n".join([f"[{len(lines) - MAX_ERROR_LINES} earlier lines left out; -vv shows them]",
                      *lines[-MAX_ERROR_LINES:]])


def git(
    cwd: Path | str,
    *args: str | os.PathLike,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run `git <args>` in `cwd` (through `run`, with `git_env`).

    `--` must separate user-supplied paths or revisions from options; callers
    never pass user strings in option position.
    """
    argv = ["git", *GIT_NEUTRAL_CONFIG, *(os.fspath(a) for a in args)]
    return run(argv, cwd=cwd, env=git_env(env), check=check, timeout=timeout, input=input, replace_env=True)


def git_out(cwd: Path | str, *args: str | os.PathLike) -> str:
    """`git <args>` stdout, stripped."""
    return git(cwd, *args).stdout.strip()


SCRATCH_PREFIX = ".smla-"  # every scratch worktree's directory name starts with it
# <tree>/.git/<SCRATCH_RECORDS>/<name>: one per scratch worktree, written before it is made and
# removed after it is gone, so a run killed at any moment (even with the checkout half deleted and
# no .git left in it) leaves a record naming what the next run's sweep removes.
SCRATCH_RECORDS = "smla-scratch"
TMP_DIR = "smla-tmp"  # <git common dir>/smla-tmp: temporary indexes and patch files (see `git_tmpdir`)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then arrive as usual. The programs run meanwhile
    inherit the blocked mask, so a Ctrl-C to the whole process group cannot cut a clean-up short."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, ValueError, OSError):  # no POSIX signal masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def scratch_worktree(tree: Path, rev: str, *, prefix: str, parent: Path | None = None,
                     checkout: bool = True) -> Iterator[Path]:
    """A detached `git worktree` of `tree` at `rev` in a fresh directory (beside
    the tree unless `parent`), removed with its administrative files afterwards,
    also when the `worktree add` itself is interrupted (Ctrl-C, SIGTERM), and
    without letting a Ctrl-C during the removal cut it short."""
    assert prefix.startswith(SCRATCH_PREFIX), prefix
    base = parent or tree.parent
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    record = tree / ".git" / SCRATCH_RECORDS / scratch.name
    try:
        record.parent.mkdir(exist_ok=True)
        record.write_text(f"{scratch.absolute()}\n")
        scratch.rmdir()
        git(tree, "worktree", "add", "-q", "--detach", *(() if checkout else ("--no-checkout",)), scratch, rev)
        yield scratch
    finally:
        with signals_held():
            _remove_scratch(tree, scratch)


def _remove_scratch(tree: Path, scratch: Path) -> None:
    # Twice --force: a worktree whose `add` was interrupted is still locked ("initializing").
    git(tree, "worktree", "remove", "--force", "--force", scratch, check=False)
    shutil.rmtree(scratch, ignore_errors=True)
    git(tree, "worktree", "prune", check=False)
    if not scratch.exists():
        (tree / ".git" / SCRATCH_RECORDS / scratch.name).unlink(missing_ok=True)


def sweep_scratch(tree: Path) -> list[Path]:
    """Remove the scratch worktrees of `tree` that an earlier, killed run left behind; return them.

    Call only while holding the tree's lock (smla.lock): every scratch worktree is made under it,
    so any that exists then is stale. Only directories named SCRATCH_PREFIX* that git lists as
    worktrees of `tree`, whose `.git` file points into `tree`'s repository, or that a record in
    <tree>/.git/smla-scratch names (made by smla, whatever is left of them) are touched. Temporary
    files of runs that are gone (`git_tmpdir`) go too."""
    if not (tree / ".git").is_dir():
        return []
    gitdir = (tree / ".git").resolve()
    found: set[Path] = set()
    listed = git(tree, "worktree", "list", "--porcelain", check=False).stdout
    for line in listed.splitlines():
        if line.startswith("worktree "):
            p = Path(line[len("worktree "):])
            if p.name.startswith(SCRATCH_PREFIX) and p.resolve() != tree.resolve():
                found.add(p)
    for p in tree.parent.glob(f"{SCRATCH_PREFIX}*"):
        dotgit = p / ".git"
        try:
            text = dotgit.read_text() if dotgit.is_file() else ""
        except OSError:
            continue
        if text.startswith("gitdir: ") and Path(text[len("gitdir: "):].strip()).resolve().is_relative_to(gitdir):
            found.add(p)
    records = gitdir / SCRATCH_RECORDS
    for rec in sorted(records.iterdir()) if records.is_dir() else ():
        try:
            p = Path(rec.read_text().strip())
        except OSError:
            continue
        if p.name == rec.name and p.name.startswith(SCRATCH_PREFIX) and p.exists():
            found.add(p)
        elif not p.exists():
            rec.unlink(missing_ok=True)
    for p in sorted(found):
        log.warning("removing %s, a scratch worktree an interrupted smla run left behind", p)
        with signals_held():
            _remove_scratch(tree, p)
    git(tree, "worktree", "prune", check=False)
    _sweep_tmp(gitdir / TMP_DIR)
    return sorted(found)


@contextlib.contextmanager
def git_tmpdir(repo: Path) -> Iterator[Path]:
    """A temporary directory inside `repo`'s git directory (a temporary index, patch files), not in
    the system's /tmp: what a killed run leaves there is swept by the next run (`sweep_scratch`) and
    goes with the tree. Named after this process, so a sweep removes only those of dead runs."""
    common = Path(git_out(repo, "rev-parse", "--git-common-dir"))
    base = (common if common.is_absolute() else Path(repo) / common) / TMP_DIR
    base.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{os.getpid()}-", dir=base) as tmp:
        yield Path(tmp)


def _sweep_tmp(base: Path) -> None:
    for p in base.glob("*-*") if base.is_dir() else ():
        pid = p.name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
