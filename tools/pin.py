"""vllm-pin.txt: which upstream vLLM the series is made for.

Format: `key = value` lines; `#` starts a comment. Keys are fixed (KEYS);
unknown keys, a malformed commit or checksum, or a missing key are errors
that name the file and line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from tools.errors import PinError

KEYS = ("repo", "commit", "version", "sdist", "sdist_sha256")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+-]*)$")


@dataclass(frozen=True)
class Pin:
    repo: str
    commit: str
    version: str
    sdist: str
    sdist_sha256: str

    @property
    def short(self) -> str:
        return self.commit[:12]

    def with_changes(self, **changes: str) -> "Pin":
        new = replace(self, **changes)
        new.validate("<updated pin>")
        return new

    def validate(self, where: str) -> None:
        if not _HEX40.match(self.commit):
            raise PinError(f"{where}: commit must be 40 lowercase hex digits, got {self.commit!r}")
        if not _HEX64.match(self.sdist_sha256):
            raise PinError(f"{where}: sdist_sha256 must be 64 lowercase hex digits")
        if not _VERSION.match(self.version):
            raise PinError(f"{where}: version {self.version!r} is not a release version")
        if "/" in self.sdist or not self.sdist.endswith((".tar.gz", ".zip")):
            raise PinError(f"{where}: sdist must be a file name like vllm-X.Y.Z.tar.gz")
        if self.repo.startswith("-"):
            raise PinError(f"{where}: repo must be a URL or path, not an option")


def load(path: Path) -> Pin:
    """Read and validate a pin file."""
    if not path.is_file():
        raise PinError(f"pin file not found: {path}", hint="run smla from the toolkit's checkout")
    values: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise PinError(f"{path}:{lineno}: expected 'key = value', got {raw.strip()!r}")
        key, value = (part.strip() for part in line.split("=", 1))
        if key not in KEYS:
            raise PinError(f"{path}:{lineno}: unknown key {key!r} (known: {', '.join(KEYS)})")
        if key in values:
            raise PinError(f"{path}:{lineno}: duplicate key {key!r}")
        values[key] = value
    missing = [k for k in KEYS if k not in values]
    if missing:
        raise PinError(f"{path}: missing key(s): {', '.join(missing)}")
    pin = Pin(**values)
    pin.validate(str(path))
    return pin


def save(path: Path, pin: Pin) -> None:
    """Rewrite the values in place, keeping comments and layout."""
    from tools.fsutil import atomic_write_text

    lines = path.read_text().splitlines(keepends=True)
    new_values = {f.name: getattr(pin, f.name) for f in fields(pin)}
    out = []
    for raw in lines:
        body = raw.split("#", 1)[0]
        if "=" in body:
            key = body.split("=", 1)[0].strip()
            if key in new_values:
                comment = raw[len(body):].rstrip("\n")
                out.append(f"{key} = {new_values[key]}{(' ' + comment) if comment else ''}\n")
                continue
        out.append(raw)
    atomic_write_text(path, "".join(out))
