"""The patch series: `patches/series` plus one `NNNN-name.patch` per concern.

Every patch is a `git format-patch` mail: a header (Subject = what, body =
why) followed by a unified diff. `load` validates everything before any
command touches a tree: the series file and the directory agree, each patch
parses with unidiff into well-formed hunks, and every path stays inside the
tree (no absolute paths, no `..`, no writes through symlinks).
"""
from __future__ import annotations

import email
import email.errors
import email.header
import email.policy
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import unidiff

from smla.errors import SeriesError, cmd
from smla.fsutil import atomic_write_text, content_lines

SERIES_FILE = "series"
_NAME = re.compile(r"^[0-9]{4}-[A-Za-z0-9._-]+\.patch$")


@dataclass(frozen=True)
class Hunk:
    file: str
    index: int  # 1-based within its file
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    header: str

    def describe(self) -> str:
        return (
            f"hunk #{self.index} of {self.file} "
            f"(@@ -{self.source_start},{self.source_length} +{self.target_start},{self.target_length} @@"
            f"{(' ' + self.header) if self.header else ''})"
        )


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    subject: str
    body: str
    files: tuple[str, ...]
    hunks: tuple[Hunk, ...] = field(repr=False)

    def hunk_at(self, file: str, line: int) -> Hunk | None:
        """The hunk of `file` whose source range contains `line` (or the nearest one)."""
        candidates = [h for h in self.hunks if h.file == file]
        for h in candidates:
            if h.source_start <= line <= h.source_start + max(h.source_length, 1) - 1:
                return h
        return min(candidates, key=lambda h: abs(h.source_start - line), default=None)


@dataclass(frozen=True)
class Series:
    directory: Path
    patches: tuple[Patch, ...]

    def names(self) -> list[str]:
        return [p.name for p in self.patches]


def read_series_file(directory: Path) -> list[str]:
    """The patch file names `directory`/series lists, in order (checked: names, no repeats)."""
    path = directory / SERIES_FILE
    if not path.is_file():
        raise SeriesError(f"{path} not found", hint="run `smla export` from a patched tree to create it")
    names: list[str] = []
    hint = (f"fix that line of {path}, or restore the committed file with "
            f"{cmd('git', '-C', directory, 'checkout', '--', SERIES_FILE)}")
    lines = content_lines(path, SeriesError, hint=hint)
    for lineno, line in lines:
        if not _NAME.match(line):
            raise SeriesError(f"{path}:{lineno}: {line!r} is not a patch file name (NNNN-name.patch)", hint=hint)
        if line in names:
            raise SeriesError(f"{path}:{lineno}: {line} is listed twice", hint=hint)
        names.append(line)
    return names


def write_series_file(directory: Path, names: list[str]) -> bool:
    """Write `directory`/series listing `names` (atomically; False when it already says that)."""
    return atomic_write_text(directory / SERIES_FILE, "".join(f"{n}\n" for n in names))


def load(directory: Path, *, allow_empty: bool = False) -> Series:
    """Read and validate the whole series."""
    names = read_series_file(directory)
    on_disk = sorted(p.name for p in directory.glob("*.patch"))
    missing = [n for n in names if n not in on_disk]
    unlisted = [n for n in on_disk if n not in names]
    if missing or unlisted:
        parts = []
        if missing:
            parts.append(f"listed in series but missing: {', '.join(missing)}")
        if unlisted:
            parts.append(f"present but not in series: {', '.join(unlisted)}")
        hints = []
        if unlisted:
            them = "it" if len(unlisted) == 1 else "them"
            hints.append(f"list {', '.join(unlisted)} in {directory}/series (in order) and run `smla apply`, or "
                         f"move {them} out of {directory} (`smla export` never deletes a file the series does "
                         "not list)")
        if missing:
            hints.append(f"restore {', '.join(missing)} ({cmd('git', '-C', directory, 'checkout', '--', *missing)}) or remove "
                         + ("its line" if len(missing) == 1 else "their lines") + f" from {directory}/series")
        raise SeriesError(f"{directory}/series and the directory disagree ({'; '.join(parts)})",
                          hint="; ".join(hints))
    if not names and not allow_empty:
        raise SeriesError(f"{directory}/series lists no patches")
    return Series(directory, tuple(parse_patch(directory / n) for n in names))


def parse_patch(path: Path, raw: bytes | None = None) -> Patch:
    """Parse and validate one format-patch file (`raw`: its bytes, when not yet written to `path`).
    An error without a hint of its own gets one that names this file only."""
    raw = path.read_bytes() if raw is None else raw
    try:
        return _parse_patch(path, raw)
    except SeriesError as exc:
        if exc.hint == SeriesError.default_hint:
            exc.hint = (f"fix {path}, restore the committed file with "
                        f"{cmd('git', '-C', path.parent, 'checkout', '--', path.name)}, or overwrite it with the "
                        f"work tree's commit: {cmd('smla', 'export', '--force')} (plain {cmd('smla', 'export')} "
                        "keeps a hand edit)")
        raise


def _parse_patch(path: Path, raw: bytes) -> Patch:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SeriesError(f"{path.name}: not UTF-8 text ({exc})") from exc
    if re.search(r"^diff --git [^\n]*\r$", text, re.M):  # never in a diff git writes: converted endings
        raise SeriesError(
            f"{path}: its lines end in CRLF (\\r\\n), not LF: the file's line endings were converted, "
            "e.g. by a checkout with core.autocrlf=true",
            hint=f"check it out again without conversion ({cmd('git', '-C', path.parent, 'checkout', '--', path.name)}; "
                 "the repository's .gitattributes keeps patches LF), or convert an edited copy back to LF",
        )
    diff_at = _diff_start(text)
    if diff_at < 0:
        raise SeriesError(f"{path.name}: no diff found (expected `diff --git` lines)")
    subject, body = _header(text[:diff_at], path.name)
    # Paths first (before the parser, which may reject them for other reasons).
    for m in re.finditer(
        r"^(?:diff --git a/(\S+) b/(\S+)|(?:rename|copy) (?:from|to) (\S+)|--- (\S+)\n\+\+\+ (\S+))$", text, re.M
    ):
        for name in filter(None, m.groups()):
            _check_path(name, path.name)
    try:
        patchset = unidiff.PatchSet(text[diff_at:])
    except unidiff.UnidiffParseError as exc:
        raise SeriesError(f"{path.name}: malformed diff: {exc}") from exc
    if not len(patchset):
        raise SeriesError(f"{path.name}: the diff changes no file")
    files: list[str] = []
    hunks: list[Hunk] = []
    for pf in patchset:
        for name in {pf.source_file, pf.target_file}:
            _check_path(name, path.name)
        rel = _strip_prefix(pf.target_file if pf.target_file != "/dev/null" else pf.source_file)
        files.append(rel)
        for i, h in enumerate(pf, 1):
            hunks.append(Hunk(rel, i, h.source_start, h.source_length, h.target_start,
                              h.target_length, (h.section_header or "").strip()))
    return Patch(path.name, path, subject, body, tuple(files), tuple(hunks))


def check_no_symlinks(series: Series, tree: Path) -> None:
    """Refuse a patch that would write through a symlink inside `tree`."""
    for patch in series.patches:
        for rel in patch.files:
            cur = tree
            for part in PurePosixPath(rel).parts:
                cur = cur / part
                if cur.is_symlink():
                    raise SeriesError(
                        f"{patch.name}: {rel} goes through the symlink {cur.relative_to(tree)}; refusing to write through it"
                    )


def _diff_start(text: str) -> int:
    m = re.search(r"^diff --git ", text, re.M)
    return m.start() if m else -1


def _header(head: str, name: str) -> tuple[str, str]:
    msg = email.message_from_string(head.split("\n", 1)[1] if head.startswith("From ") else head,
                                    policy=email.policy.compat32)
    subject = re.sub(r"\s+", " ", decode_header_value(msg.get("Subject") or "")).strip()
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    if not subject:
        raise SeriesError(f"{name}: the patch header has no Subject (what the patch does)")
    payload = msg.get_payload()
    body = (payload if isinstance(payload, str) else "").split("\n---\n", 1)[0].strip()
    return subject, body


def decode_header_value(raw: str) -> str:
    """A mail header as text: RFC 2047 encoded-words (`=?UTF-8?q?...?=`, what `git format-patch`
    writes for a non-ASCII Subject) decoded, folded lines joined."""
    try:
        return str(email.header.make_header(email.header.decode_header(str(raw))))
    except (UnicodeDecodeError, LookupError, email.errors.HeaderParseError):
        return str(raw)


def _strip_prefix(name: str) -> str:
    return name[2:] if name.startswith(("a/", "b/")) else name


def _check_path(name: str, patch_name: str) -> None:
    if name == "/dev/null":
        return
    if name.startswith("/"):
        raise SeriesError(f"{patch_name}: absolute path {name!r} in diff")
    rel = _strip_prefix(name)
    parts = PurePosixPath(rel).parts
    if not parts or ".." in parts or rel.startswith("/"):
        raise SeriesError(f"{patch_name}: path {name!r} leaves the tree")
    if parts[0] == ".git":
        raise SeriesError(f"{patch_name}: path {name!r} writes into .git")
