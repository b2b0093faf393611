"""vllm-pin.txt: which upstream vLLM the series is made for.

Format: `key = value` lines; `#` starts a comment. Keys are fixed (KEYS);
unknown keys, a malformed commit or checksum, or a missing key are errors
that name the file and line. `sdist = none` with `sdist_sha256 = none` says
that no release sdist holds the pinned commit (a nightly after
`smla rebase --onto <commit>`): such a pin is fetched with git only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from smla.errors import PinError

KEYS = ("repo", "commit", "version", "sdist", "sdist_sha256")
NONE = "none"
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
    def has_sdist(self) -> bool:
        return self.sdist != NONE

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
        if not _VERSION.match(self.version):
            raise PinError(f"{where}: version {self.version!r} is not a release version")
        if self.repo.startswith("-"):
            raise PinError(f"{where}: repo must be a URL or path, not an option")
        if (self.sdist == NONE) != (self.sdist_sha256 == NONE):
            raise PinError(f"{where}: sdist and sdist_sha256 must both be 'none' or both be set")
        if self.sdist == NONE:
            return
        if not _HEX64.match(self.sdist_sha256):
            raise PinError(f"{where}: sdist_sha256 must be 64 lowercase hex digits")
        if "/" in self.sdist or not self.sdist.endswith((".tar.gz", ".zip")):
            raise PinError(f"{where}: sdist must be a file name like vllm-X.Y.Z.tar.gz (or none)")


def load(path: Path) -> Pin:
    """Read and validate a pin file."""
    if not path.is_file():
        raise PinError(f"pin file not found: {path}", hint="run smla from the toolkit's checkout")
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PinError(f"{path}: not UTF-8 text ({exc})") from exc
    for lineno, raw in enumerate(text.splitlines(), 1):
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
    from smla.fsutil import atomic_write_text

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
