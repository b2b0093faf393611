"""The one exception hierarchy of the toolkit.

Every error carries an exit code and, where it helps, the next command to run.
The CLI catches `SmlaError` once and prints `error: <message>` plus a `hint:`.
"""
from __future__ import annotations

import os
import shlex


class SmlaError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict:
        """What `--json` prints for this error."""
        return {"error": {"kind": type(self).__name__, "message": self.message, "hint": self.hint,
                          "exit_code": self.exit_code}}


def cmd(*argv: str | os.PathLike) -> str:
    """A shell command for a hint, quoted so it can be pasted: `git -C '/my tree' log`."""
    return "`" + shlex.join(os.fspath(a) for a in argv) + "`"


class UsageError(SmlaError):
    """Bad input from the user (arguments, config files)."""

    exit_code = 2


class PinError(SmlaError):
    """vllm-pin.txt is missing or invalid."""

    exit_code = 3


class FetchError(SmlaError):
    """The vLLM source could not be fetched or unpacked."""

    exit_code = 4


class ChecksumError(FetchError):
    """A download does not match its pinned sha256."""

    exit_code = 5


class SeriesError(SmlaError):
    """patches/ or a patch file is malformed or unsafe."""

    exit_code = 6


class TreeStateError(SmlaError):
    """The work tree is in a state the command refuses (dirty, wrong base, missing)."""

    exit_code = 7


class ApplyError(SmlaError):
    """A patch does not apply to the tree."""

    exit_code = 8


class ExportError(SmlaError):
    """Patches could not be exported."""

    exit_code = 9


class WheelError(SmlaError):
    """The patched wheel could not be built."""

    exit_code = 10


class RebaseConflict(SmlaError):
    """A rebase stopped on a conflict; the tree is left for the user to resolve."""

    exit_code = 11


class CommandError(SmlaError):
    """An external command failed unexpectedly."""

    exit_code = 12


class TestsFailed(SmlaError):
    """The command itself worked, but the test suite it ran failed."""

    __test__ = False  # not a pytest test class
    exit_code = 13


class LockError(SmlaError):
    """Another smla run holds the work tree's lock."""

    exit_code = 14


class NotInSync(TreeStateError):
    """`status --check`: the tree and patches/ disagree (exit code of TreeStateError)."""
