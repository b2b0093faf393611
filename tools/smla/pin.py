"""vllm-pin.txt: which upstream vLLM the series is made for.

Format: `key = value` lines; `#` starts a comment. Keys are fixed (KEYS);
unknown keys, a malformed commit or checksum, or a missing key are errors
that name the file and line. `sdist = none` with `sdist_sha256 = none` says
that no release sdist holds the pinned commit (a nightly after
`smla rebase --onto <commit>`): such a pin is fetched with git only.

`commit_kind` (optional, default `full`) says whether `commit` is the full
40-hex id or `abbreviated`: the 7-39 hex digits a release sdist records in
vllm/_version.py, written when `smla rebase --onto <release>` could not
resolve the full id (PyPI access alone). An abbreviated commit is allowed
only with an sdist: the sdist's sha256 then identifies the source, and
everything that needs the full id (a git fetch) says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from smla.errors import PinError

KEYS = ("repo", "commit", "version", "sdist", "sdist_sha256")
OPTIONAL_KEYS = {"commit_kind": "full"}  # key -> default when absent
NONE = "none"
FULL = "full"
ABBREVIATED = "abbreviated"
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX_ABBREV = re.compile(r"^[0-9a-f]{7,39}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+-]*)$")


@dataclass(frozen=True)
class Pin:
    repo: str
    commit: str
    version: str
    sdist: str
    sdist_sha256: str
    commit_kind: str = FULL

    @property
    def has_sdist(self) -> bool:
        return self.sdist != NONE

    @property
    def commit_is_full(self) -> bool:
        return self.commit_kind == FULL

    def commit_label(self) -> str:
        """The commit for messages: 12 hex digits, or the abbreviation marked as such."""
        return self.short if self.commit_is_full else f"{self.commit} (abbreviated)"

    @property
    def short(self) -> str:
        return self.commit[:12]

    def with_changes(self, **changes: str) -> "Pin":
        new = replace(self, **changes)
        new.validate("<updated pin>")
        return new

    def validate(self, where: str) -> None:
        if self.commit_kind not in (FULL, ABBREVIATED):
            raise PinError(f"{where}: commit_kind must be {FULL!r} or {ABBREVIATED!r}, got {self.commit_kind!r}")
        if self.commit_kind == FULL and not _HEX40.match(self.commit):
            raise PinError(f"{where}: commit must be 40 lowercase hex digits, got {self.commit!r}"
                           + (" (an abbreviated id needs `commit_kind = abbreviated`)"
                              if _HEX_ABBREV.match(self.commit) else ""))
        if self.commit_kind == ABBREVIATED:
            if not _HEX_ABBREV.match(self.commit):
                raise PinError(f"{where}: an abbreviated commit must be 7-39 lowercase hex digits, "
                               f"got {self.commit!r}")
            if self.sdist == NONE:
                raise PinError(f"{where}: an abbreviated commit needs an sdist (its sha256 identifies the "
                               "source); a commit pin needs the full 40-hex id")
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
        if key not in KEYS and key not in OPTIONAL_KEYS:
            raise PinError(f"{path}:{lineno}: unknown key {key!r} (known: {', '.join((*KEYS, *OPTIONAL_KEYS))})")
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
    out: list[str] = []
    seen = set()
    commit_at = None
    for raw in lines:
        body = raw.split("#", 1)[0]
        if "=" in body:
            key = body.split("=", 1)[0].strip()
            if key in new_values:
                seen.add(key)
                comment = raw[len(body):].rstrip("\n")
                out.append(f"{key} = {new_values[key]}{(' ' + comment) if comment else ''}\n")
                if key == "commit":
                    commit_at = len(out)
                continue
        out.append(raw)
    # An optional key absent from the file is added (after `commit`) only when not at its default.
    for key, default in OPTIONAL_KEYS.items():
        if key not in seen and new_values[key] != default:
            line = f"{key} = {new_values[key]}\n"
            if commit_at is None:
                out.append(line)
            else:
                out.insert(commit_at, line)
    atomic_write_text(path, "".join(out))
