"""One writer per work tree: an advisory lock every writing command takes.

`hold(tree)` takes an exclusive `flock` on `<parent>/.<name>.smla-lock`
(beside the tree, so it exists before the tree does and survives the tree
being replaced) and writes the holder's pid into it. A second process gets
LockError "another smla run holds the lock on <tree> (pid N)" at once; it
never waits. The file is removed on release; the kernel drops the lock when
the holder dies, however it dies, so a crashed run never blocks the next
one (a leftover file is simply locked again). Directories the lock had to
create for its file (a fresh clone's `work/`) are removed again on release
when the command left nothing in them (a refused first fetch leaves no empty
`work/`). Within one process the lock is re-entrant:
`smla patch` = fetch + apply, and rebase calls fetch/apply/export, all under
the one lock.

Used by source.fetch, apply, export and clean (library functions) and by the
CLI for every command that writes the tree (fetch, apply, patch, export,
rebase, build-wheel, clean).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from smla.errors import LockError

_held: dict[str, list[int]] = {}  # lock path -> [fd, depth]


def lock_path(tree: Path) -> Path:
    tree = Path(os.path.abspath(tree))
    return Path(os.path.realpath(tree.parent)) / f".{tree.name}.smla-lock"


def holder(tree: Path) -> str:
    """The pid written by the current holder ('?' when unknown)."""
    try:
        return lock_path(tree).read_text().strip() or "?"
    except OSError:
        return "?"


@contextlib.contextmanager
def hold(tree: Path) -> Iterator[None]:
    path = lock_path(tree)
    key = str(path)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, tree)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _held[key] = [fd, 1]
        yield
    finally:
        _held.pop(key, None)
        # Unlink while still holding the lock; _acquire re-checks the inode, so a
        # process that opened the old file before the unlink cannot win with it.
        with contextlib.suppress(OSError):
            path.unlink()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        for d in created:  # innermost first; stops at the first one the command filled
            try:
                d.rmdir()
            except OSError:
                break


def _acquire(path: Path, tree: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # another run removed the directory it had created: make it again
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockError(
                f"another smla run holds the lock on {Path(os.path.abspath(tree))} (pid {holder(tree)})",
                hint="wait for it to finish and run the command again",
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file between our open and flock: try again
