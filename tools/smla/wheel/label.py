"""The wheel's version label: <release>+sparsemla.g<base commit>.<series hash>, and rewriting it
into METADATA and vllm/_version.py."""
from __future__ import annotations

import hashlib
import re
from packaging.version import InvalidVersion, Version
from smla.errors import WheelError
from smla.series import SERIES_FILE, Series

PROJECT = "vllm"
PACKAGE_DIR = "vllm/"
VERSION_FILE = "vllm/_version.py"
LOCAL_LABEL = "sparsemla"
BASE_ID_DIGITS = 9  # hex digits of the upstream commit in the label (what a release sdist records)
# ---------------------------------------------------------------- versions


def series_hash(series: Series) -> str:
    """First 8 hex digits of a sha256 over patches/series and every patch file, in order."""
    h = hashlib.sha256()
    series_file = series.directory / SERIES_FILE
    chunks = [(SERIES_FILE, series_file.read_bytes() if series_file.is_file() else b"")]
    chunks += [(p.name, p.path.read_bytes()) for p in series.patches]
    for name, data in chunks:  # length-prefixed: no two different inputs hash alike
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:8]


def base_id(commit: str) -> str:
    """The upstream commit as it appears in the label: `g` + its first 9 hex digits (setuptools-scm style)."""
    return "g" + commit[:BASE_ID_DIGITS]


def local_version(release: str, commit: str, short_hash: str) -> str:
    """`<release>+sparsemla.g<commit>.<hash>` in PEP 440 normal form (used verbatim everywhere).

    `release` is the base wheel's public version (its local segment, if any,
    is dropped: a nightly's `+g<sha>` is replaced by ours, which names the
    same commit). The label names the upstream base and the series.
    """
    try:
        public = Version(release).public
        return str(Version(f"{public}+{LOCAL_LABEL}.{base_id(commit)}.{short_hash}"))
    except InvalidVersion as exc:
        raise WheelError(f"cannot make a PEP 440 version from {release!r}: {exc}") from exc


def _version_tuple(version: str) -> tuple:
    """Like setuptools-scm's version tuple: release numbers, then the local label as one string."""
    v = Version(version)
    return (*v.release, *((v.local,) if v.local else ()))


def rewrite_version_file(text: str, old: str, new: str) -> str:
    """Set the version in a setuptools-scm `_version.py`, keeping everything else."""
    ver = re.compile(r"^(__version__ = version = )(['\"])([^'\"]*)\2[ \t]*$", re.M)
    tup = re.compile(r"^(__version_tuple__ = version_tuple = )\(.*\)[ \t]*$", re.M)
    found = ver.findall(text)
    if len(found) != 1 or len(tup.findall(text)) != 1:
        raise WheelError(f"{VERSION_FILE} in the base wheel does not have the setuptools-scm layout")
    if found[0][2] != old:
        raise WheelError(f"{VERSION_FILE} in the base wheel says {found[0][2]!r}, expected {old!r}")
    text = ver.sub(lambda m: f"{m.group(1)}{new!r}", text)
    return tup.sub(lambda m: f"{m.group(1)}{_version_tuple(new)!r}", text)


def rewrite_metadata(data: bytes, old: str, new: str) -> bytes:
    """Change the `Version:` header of METADATA; the rest stays byte-identical."""
    head, sep, body = data.partition(b"\n\n")
    lines = head.split(b"\n")
    hits = [i for i, line in enumerate(lines) if line.startswith(b"Version:")]
    if len(hits) != 1:
        raise WheelError("METADATA of the base wheel has no single Version: header")
    got = lines[hits[0]][len(b"Version:"):].strip().decode()
    if got != old:
        raise WheelError(f"METADATA of the base wheel says Version: {got}, expected {old}")
    lines[hits[0]] = f"Version: {new}".encode()
    return b"\n".join(lines) + sep + body


