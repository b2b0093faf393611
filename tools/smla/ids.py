"""Commit ids and checksums: what each looks like, and when two ids name one commit. The one place
that says so (the pin, fetch, rebase and build-wheel ask here).

  full commit         40 lowercase hex digits: a pin's `commit`, what a git fetch needs
  abbreviated commit  7-39 lowercase hex digits: what a release sdist records in
                      vllm/_version.py (a pin's `commit_kind = abbreviated`)
  commit id           either of them (an `--onto` argument)
  sha256              64 lowercase hex digits (`sdist_sha256`, a package index's hashes)
"""
from __future__ import annotations

import re

_FULL_COMMIT = re.compile(r"[0-9a-f]{40}")
_ABBREVIATED_COMMIT = re.compile(r"[0-9a-f]{7,39}")
_COMMIT_ID = re.compile(r"[0-9a-f]{7,40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The line setuptools-scm writes into vllm/_version.py (sdists and wheels of 0.17.0 and later).
_RECORDED_COMMIT = re.compile(r"""^__commit_id__\s*=\s*commit_id\s*=\s*['"]g?([0-9a-f]{7,40})['"]""", re.M)


def is_full_commit(text: str | None) -> bool:
    return bool(text) and _FULL_COMMIT.fullmatch(text) is not None


def is_abbreviated_commit(text: str | None) -> bool:
    return bool(text) and _ABBREVIATED_COMMIT.fullmatch(text) is not None


def is_commit_id(text: str | None) -> bool:
    return bool(text) and _COMMIT_ID.fullmatch(text) is not None


def is_sha256(text: str | None) -> bool:
    return bool(text) and _SHA256.fullmatch(text) is not None


def same_commit(a: str | None, b: str | None) -> bool:
    """Two ids name the same commit when one is a prefix of the other (an abbreviation)."""
    return bool(a) and bool(b) and (a.startswith(b) or b.startswith(a))


def recorded_commit(version_py: str) -> str | None:
    """The (abbreviated) commit id a vLLM `vllm/_version.py` records, if any."""
    m = _RECORDED_COMMIT.search(version_py)
    return m.group(1) if m else None
