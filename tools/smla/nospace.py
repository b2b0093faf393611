"""Telling a full disk from other failures, wherever the toolkit writes (unpacking an sdist, git
checking out thousands of files, a download), so the error says so and names the filesystem; and
(`describe`, for the CLI's edge) a file sitting where a directory belongs.

git's checkout reports a full disk as one `error: unable to write file <path>` line per file and
never names the cause; Python raises OSError with errno ENOSPC (or EDQUOT for a full quota).
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from smla.errors import FilesystemError, cmd
from smla.fsutil import file_in_the_way

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NAMED = ("No space left on device", "Disk quota exceeded")
_WRITE_FAILED = re.compile(r"unable to (?:write|create)(?: new)? file|short write|could not write", re.I)
# git's checkout: a file it could not create names the cause (`unable to create file X: Permission
# denied`); one it created but could not write does not (`unable to write file X`): a write that fails
# once the file exists is a full disk or quota (ENOSPC / EDQUOT) in practice.
_WRITE_NO_CAUSE = re.compile(r"unable to write file", re.I)
LOW_SPACE = 16 << 20  # below this much free space a failed write is taken for a full disk


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding `path` (its nearest existing parent); None if unknown."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def no_space(where: Path, what: str) -> FilesystemError:
    where = Path(where).absolute()
    return FilesystemError(
        f"no space left on the device holding {where}: {what}",
        hint=f"free space on that filesystem (`df -h '{where}'` shows it), then run the command again",
    )


def from_oserror(exc: OSError, where: Path, what: str) -> FilesystemError | None:
    """A FilesystemError naming the full disk when `exc` is ENOSPC/EDQUOT; else None."""
    if exc.errno in FULL_ERRNOS:
        return no_space(where, f"{what} ({os.strerror(exc.errno)})")
    return None


def from_output(program: str, text: str, where: Path) -> FilesystemError | None:
    """For a failed command's output: a FilesystemError when it could not write files (a full disk
    when it says so or the filesystem has under LOW_SPACE free); else None."""
    writes = [ln.strip() for ln in text.splitlines() if _WRITE_FAILED.search(ln)]
    named = any(m in text for m in _NAMED)
    if not writes and not named:
        return None
    count = f"{len(writes)} file(s) not written, e.g. `{writes[0]}`" if writes else "it said so"
    free = free_bytes(where)
    if named or (free is not None and free < LOW_SPACE):
        return no_space(where, f"{program} failed ({count})")
    if any(_WRITE_NO_CAUSE.search(w) for w in writes):  # git removed what it wrote: df shows room again
        now = f"; {free >> 20} MiB are free again now that git removed what it had written" if free is not None else ""
        return no_space(where, f"{program} failed ({count}{now}: the checkout needs more than that)")
    return FilesystemError(
        f"{program} could not write under {Path(where).absolute()} ({count})",
        hint=f"check the permissions and free space there (`df -h '{Path(where).absolute()}'`), then run "
             "the command again",
    )


def describe(exc: OSError) -> FilesystemError:
    """The FilesystemError the CLI's edge reports for an OSError nothing else caught."""
    where = Path(exc.filename) if exc.filename else Path(".")
    full = from_oserror(exc, where, f"writing {exc.filename or 'a file'}")
    if full is not None:
        return full
    blocker = file_in_the_way(where) if exc.filename and exc.errno in (errno.EEXIST, errno.ENOTDIR) else None
    if blocker is not None:  # e.g. a file named `work` where the work tree's directory goes
        return FilesystemError(f"{blocker} is a file, where a directory belongs ({exc.strerror}: {exc.filename})",
                               hint=f"move that file away ({cmd('mv', blocker, f'{blocker}.old')}), or pass another "
                                    "--tree / SMLA_CACHE_DIR")
    return FilesystemError(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
