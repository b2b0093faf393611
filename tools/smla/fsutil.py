"""Small filesystem helpers: atomic writes, hashing, and reading the toolkit's line files."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> bool:
    """Write `data` to `path` via a temp file + rename.

    Returns False (and leaves the file untouched, mtime included) when the
    content is already identical.
    """
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; use normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def umask() -> int:
    """The process umask (read without changing it for good)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> bool:
    return atomic_write_bytes(path, text.encode())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_lines(path: Path, error: type[Exception], hint: str | None = None) -> list[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 line file (vllm-pin.txt, patches/series) that
    holds something: `#` starts a comment, surrounding blanks go. The one reader of both files;
    a file that is not UTF-8 raises `error`, naming it, with `hint`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc})", hint=hint) from exc
    lines = ((n, raw.split("#", 1)[0].strip()) for n, raw in enumerate(text.splitlines(), 1))
    return [(n, line) for n, line in lines if line]


def file_in_the_way(path: Path) -> Path | None:
    """The first existing component of `path` (itself included) that is not a directory, when
    `path` names a directory to create or use: a file where a directory belongs; else None."""
    p = Path(path).absolute()
    for cand in (*reversed(p.parents), p):
        if cand.exists() and not cand.is_dir():
            return cand
        if not cand.exists():
            return None
    return None
