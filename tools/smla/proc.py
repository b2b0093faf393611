"""The one place where the toolkit runs other programs.

Every git call and every subprocess goes through `run` (argument lists only,
never a shell), which logs the command line before running it. Git also
gets a fixed identity and neutral config so results do not depend on the
user's ~/.gitconfig.
"""
from __future__ import annotations

import logging
import os
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import git as gitpython

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


def run(
    argv: Sequence[str | os.PathLike],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run `argv` (no shell), capture text output, log the command line.

    With check=True a non-zero exit raises CommandError naming the command and
    its stderr; callers that interpret failures pass check=False.
    """
    args = [os.fspath(a) for a in argv]
    log.info("$ %s%s", shlex.join(args), f"   (in {cwd})" if cwd else "")
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(
            args,
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            input=input,
        )
    except FileNotFoundError as exc:
        raise CommandError(f"program not found: {args[0]}") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"timed out after {timeout:.0f}s: {shlex.join(args)}") from exc
    if proc.returncode != 0:
        log.debug("exit %d; stderr: %s", proc.returncode, proc.stderr.strip())
        if check:
            raise CommandError(
                f"command failed (exit {proc.returncode}): {shlex.join(args)}\n"
                f"{proc.stderr.strip() or proc.stdout.strip()}"
            )
    return proc


def git(
    cwd: Path | str,
    *args: str | os.PathLike,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run `git <args>` in `cwd` through GitPython, logged like `run`.

    The toolkit's identity and neutral config are always set. `--` must
    separate user-supplied paths or revisions from options; callers never
    pass user strings in option position.
    """
    argv = ["git", *GIT_NEUTRAL_CONFIG, *(os.fspath(a) for a in args)]
    log.info("$ git %s   (in %s)", shlex.join(argv[1 + len(GIT_NEUTRAL_CONFIG):]), cwd)
    # No system or global config: user settings (format.*, diff.*) never leak in.
    full_env = {**GIT_IDENTITY, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": os.devnull}
    if env:
        full_env.update(env)
    istream = None
    if input is not None:
        istream = tempfile.TemporaryFile()
        istream.write(input.encode())
        istream.seek(0)
    try:
        status, out, err = gitpython.Git(os.fspath(cwd)).execute(
            argv,
            with_extended_output=True,
            with_exceptions=False,
            strip_newline_in_stdout=False,
            env=full_env,
            kill_after_timeout=timeout,
            istream=istream,
        )
    except gitpython.exc.GitCommandNotFound as exc:
        raise CommandError("program not found: git", hint="install git") from exc
    finally:
        if istream is not None:
            istream.close()
    status = status or 0
    if status != 0:
        log.debug("exit %d; stderr: %s", status, err.strip())
        if check:
            raise CommandError(
                f"command failed (exit {status}): {shlex.join(argv)}\n"
                f"{err.strip() or out.strip()}"
            )
    return subprocess.CompletedProcess(argv, status, out, err)


def git_out(cwd: Path | str, *args: str | os.PathLike) -> str:
    """`git <args>` stdout, stripped."""
    return git(cwd, *args).stdout.strip()
