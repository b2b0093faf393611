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

Checked besides each value's form: `repo` is a URL (https/http/ssh/git/file),
an scp-like `host:path` or a path; `sdist` is `vllm-<version>.tar.gz` (or
.zip) of the pinned `version`. A Pin loaded from a file remembers where each
key stands (`where(key)` -> "vllm-pin.txt:9"), so errors name the line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from smla import ids
from smla.errors import PinError, cmd
from smla.fsutil import atomic_write_text, content_lines

KEYS = ("repo", "commit", "version", "sdist", "sdist_sha256")
OPTIONAL_KEYS = {"commit_kind": "full"}  # key -> default when absent
NONE = "none"
FULL = "full"
ABBREVIATED = "abbreviated"
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+-]*)$")
_URL = re.compile(r"^(https?|ssh|git|git\+ssh)://[^/\s]+(/\S*)?$|^file:///\S*$")
_SCP = re.compile(r"^([A-Za-z0-9._-]+@)?[A-Za-z0-9.-]+:[^/\s]\S*$")


@dataclass(frozen=True)
class Pin:
    repo: str
    commit: str
    version: str
    sdist: str
    sdist_sha256: str
    commit_kind: str = FULL
    # Where the pin was read from: the file and {key: line number} (not part of the pin's value).
    origin: str = field(default="", compare=False, repr=False)
    lines: tuple = field(default=(), compare=False, repr=False)

    def where(self, key: str) -> str:
        """'vllm-pin.txt:9' (the file and line of `key`), or the file alone, or '<pin>'."""
        line = dict(self.lines).get(key)
        name = self.origin or "<pin>"
        return f"{name}:{line}" if line else name

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
        def fail(key: str, msg: str) -> PinError:
            loc = self.where(key) if self.lines else where
            return PinError(f"{loc}: {msg}",
                            hint=f"fix the `{key} = ...` line ({loc}); the file's header lists the keys. "
                                 f"`git diff -- {self.origin or 'vllm-pin.txt'}` shows local edits, "
                                 f"`git checkout -- {self.origin or 'vllm-pin.txt'}` restores the committed pin")

        if self.commit_kind not in (FULL, ABBREVIATED):
            raise fail("commit_kind", f"commit_kind must be {FULL!r} or {ABBREVIATED!r}, got {self.commit_kind!r}")
        if self.commit_kind == FULL and not ids.is_full_commit(self.commit):
            raise fail("commit", f"commit must be 40 lowercase hex digits, got {self.commit!r}"
                       + (" (an abbreviated id needs `commit_kind = abbreviated`)"
                          if ids.is_abbreviated_commit(self.commit) else ""))
        if self.commit_kind == ABBREVIATED:
            if not ids.is_abbreviated_commit(self.commit):
                raise fail("commit", f"an abbreviated commit must be 7-39 lowercase hex digits, got {self.commit!r}")
            if self.sdist == NONE:
                raise fail("commit_kind", "an abbreviated commit needs an sdist (its sha256 identifies the "
                                          "source); a commit pin needs the full 40-hex id")
        if not _VERSION.match(self.version):
            raise fail("version", f"version {self.version!r} is not a release version")
        if self.repo.startswith("-"):
            raise fail("repo", "repo must be a URL or path, not an option")
        if not valid_repo(self.repo):
            raise fail("repo", f"repo {self.repo!r} is not a git URL (https://..., ssh://..., git@host:path) "
                               "or a path")
        if (self.sdist == NONE) != (self.sdist_sha256 == NONE):
            raise fail("sdist", "sdist and sdist_sha256 must both be 'none' or both be set")
        if self.sdist == NONE:
            return
        if not ids.is_sha256(self.sdist_sha256):
            raise fail("sdist_sha256", "sdist_sha256 must be 64 lowercase hex digits")
        if "/" in self.sdist or not self.sdist.endswith((".tar.gz", ".zip")):
            raise fail("sdist", "sdist must be a file name like vllm-X.Y.Z.tar.gz (or none)")
        expected = (f"vllm-{self.version}.tar.gz", f"vllm-{self.version}.zip")
        if self.sdist not in expected:
            raise fail("sdist", f"sdist {self.sdist!r} is not the sdist of the pinned version {self.version} "
                                f"({expected[0]})")


def valid_repo(repo: str) -> bool:
    """A git URL, an scp-like `[user@]host:path`, or a filesystem path (absolute, ~, or with a /)."""
    if not repo or any(c.isspace() for c in repo):
        return False
    return bool(_URL.match(repo) or _SCP.match(repo) or repo.startswith(("/", "~", "./", "../")))


def load(path: Path) -> Pin:
    """Read and validate a pin file."""
    if not path.is_file():
        raise PinError(f"pin file not found: {path}",
                       hint="run smla inside the toolkit's checkout, or pass --root; "
                            f"`git checkout -- {path}` restores a deleted pin")
    values: dict[str, str] = {}
    where: dict[str, int] = {}
    hint = (f"fix that line of {path} (its header lists the keys), or restore the committed pin with "
            f"{cmd('git', '-C', path.parent, 'checkout', '--', path.name)}")
    lines = content_lines(path, PinError, hint=hint)
    for lineno, line in lines:
        if "=" not in line:
            raise PinError(f"{path}:{lineno}: expected 'key = value', got {line!r}", hint=hint)
        key, value = (part.strip() for part in line.split("=", 1))
        if key not in KEYS and key not in OPTIONAL_KEYS:
            raise PinError(f"{path}:{lineno}: unknown key {key!r} (known: {', '.join((*KEYS, *OPTIONAL_KEYS))})",
                           hint=hint)
        if key in values:
            raise PinError(f"{path}:{lineno}: duplicate key {key!r}", hint=hint)
        values[key] = value
        where[key] = lineno
    missing = [k for k in KEYS if k not in values]
    if missing:
        raise PinError(f"{path}: missing key(s): {', '.join(missing)}", hint=hint)
    pin = Pin(**values, origin=str(path), lines=tuple(sorted(where.items())))
    pin.validate(str(path))
    return pin


def save(path: Path, pin: Pin) -> None:
    """Rewrite the values in place, keeping comments and layout."""
    lines = path.read_text().splitlines(keepends=True)
    new_values = {k: getattr(pin, k) for k in (*KEYS, *OPTIONAL_KEYS)}
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
