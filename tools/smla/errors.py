"""The one exception hierarchy of the toolkit.

Every error carries an exit code and the next command to run (`hint`): the
raiser's own, else its class's `default_hint`. The CLI catches errors once, at
its edge (smla.cli): an `SmlaError` prints `error: <message>` plus `hint:` (or
one JSON object under --json) and exits with its code; click's usage errors,
Ctrl-C / SIGTERM and unexpected OS errors are turned into `UsageError`,
`Interrupted` and `FilesystemError` there first.
"""
from __future__ import annotations

import os
import shlex


class SmlaError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 1
    reported = False  # True when the command's --json output already carries this error's data
    default_hint: str | None = "run the command again with -v to see every step it takes"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else type(self).default_hint

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
    default_hint = "`smla --help` lists the commands; `smla <command> --help` their options"


class PinError(SmlaError):
    """vllm-pin.txt is missing or invalid."""

    exit_code = 3
    default_hint = ("fix the pin file named above (its header lists the keys), or restore the committed one: "
                    "`git checkout -- <that file>` in the toolkit checkout")


class FetchError(SmlaError):
    """The vLLM source could not be fetched or unpacked."""

    exit_code = 4
    default_hint = "check network access (or SMLA_INDEX_URL), or give a local source: `smla fetch --source PATH` (a vLLM checkout, mirror or sdist)"


class ChecksumError(FetchError):
    """A download does not match its pinned sha256."""

    exit_code = 5
    default_hint = "the download was corrupted or vllm-pin.txt's sdist_sha256 is wrong: compare it with the package index"


class SeriesError(SmlaError):
    """patches/ or a patch file is malformed or unsafe."""

    exit_code = 6
    default_hint = ("fix the file named above, or restore the committed one: `git checkout -- <that file>` in the "
                    "toolkit checkout (not the whole patches/: it would undo your other edits)")


class LinesDiverge(SeriesError):
    """A file the series adds differs between two release lines without an entry in lines/DIVERGENCE
    (or an entry there is stale): exit code of SeriesError."""

    default_hint = "`smla lines --diff` shows the differences"


class TreeStateError(SmlaError):
    """The work tree is in a state the command refuses (dirty, wrong base, missing)."""

    exit_code = 7
    default_hint = "`smla status` shows where the work tree stands and what to run next"


class ApplyError(SmlaError):
    """A patch does not apply to the tree."""

    exit_code = 8
    default_hint = "`smla status` shows where the work tree stands and what to run next"


class ExportError(SmlaError):
    """Patches could not be exported."""

    exit_code = 9
    default_hint = "`smla status` shows where the work tree stands and what to run next"


class WheelError(SmlaError):
    """The patched wheel could not be built."""

    exit_code = 10
    default_hint = "see docs/build-wheel.md"


class RebaseConflict(SmlaError):
    """A rebase stopped on a conflict; the tree is left for the user to resolve."""

    exit_code = 11
    default_hint = "resolve the conflict, then `smla rebase --continue`, or undo it with `smla rebase --abort`"


class CommandError(SmlaError):
    """An external command failed unexpectedly."""

    exit_code = 12


class TestsFailed(SmlaError):
    """The command itself worked, but the test suite it ran failed."""

    __test__ = False  # not a pytest test class
    exit_code = 13


class RebaseBroken(TestsFailed):
    """`smla rebase` replayed the series, but the result is semantically broken: a module the series
    adds or changes no longer imports against the new base, the new tree's selector does not pick the
    series' backend where the series promises it, or the line's CPU tests fail (exit 13, as TestsFailed)."""

    default_hint = "the rebase report names each broken patch and what failed: fix the series in the tree, then `smla export`"


class LockError(SmlaError):
    """Another smla run holds the work tree's lock."""

    exit_code = 14
    default_hint = "wait for the other smla run to finish and run the command again"


class NotInSync(TreeStateError):
    """`status --check`: the tree and patches/ disagree (exit code of TreeStateError)."""


class FilesystemError(SmlaError):
    """A file or directory could not be read or written (an unwritable cache, a full disk)."""

    exit_code = 15
    default_hint = "check the permissions and free space of the path named above"


class Interrupted(SmlaError):
    """Ctrl-C (SIGINT) or SIGTERM: the command stopped, its scratch files are removed."""

    exit_code = 130
    default_hint = ("run the command again: apply and fetch change the work tree only when complete, "
                    "and the next run removes whatever a killed run left behind")
