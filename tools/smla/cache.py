"""Downloads into a cache outside the repository, verified by sha256.

Files are streamed to a temporary name beside the target, checked, then
renamed, so an interrupted or corrupt download never sits in the cache
under its real name. A cached file that no longer matches its checksum is
replaced. PyPI file locations come from the simple index's JSON form
(PEP 691), which also gives each file's sha256.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from smla.errors import ChecksumError, FetchError
from smla.fsutil import sha256_file

log = logging.getLogger("smla.cache")

DEFAULT_INDEX = "https://pypi.org/simple"
_progress_on = True


def set_progress(enabled: bool) -> None:
    """Turn download progress bars on or off for this process."""
    global _progress_on
    _progress_on = enabled


@contextlib.contextmanager
def no_progress() -> Iterator[None]:
    """No progress bars inside the block (the CLI under --json)."""
    before = _progress_on
    set_progress(False)
    try:
        yield
    finally:
        set_progress(before)


def progress_enabled(quiet: bool = False) -> bool:
    """Progress bars go to stderr, and only when it is a terminal and nobody asked for quiet."""
    return _progress_on and not quiet and sys.stderr.isatty()


def cache_dir() -> Path:
    """$SMLA_CACHE_DIR, else $XDG_CACHE_HOME/vllm-sparse-mla, else ~/.cache/vllm-sparse-mla."""
    if os.environ.get("SMLA_CACHE_DIR"):
        return Path(os.environ["SMLA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-sparse-mla"


def index_url() -> str:
    return os.environ.get("SMLA_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def pypi_file(project: str, filename: str) -> tuple[str, str]:
    """(url, sha256) of `filename` in `project` on the package index."""
    url = f"{index_url()}/{project}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    log.info("GET %s", url)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FetchError(
            f"cannot read the package index {url}: {exc}",
            hint="check network access to PyPI, or set SMLA_INDEX_URL to a mirror",
        ) from exc
    for entry in data.get("files", []):
        if entry.get("filename") == filename:
            sha = entry.get("hashes", {}).get("sha256", "")
            return urllib.parse.urljoin(url, entry["url"]), sha
    raise FetchError(f"{filename} is not on the package index ({url})")


def fetch(
    url: str | Callable[[], str],
    dest: Path,
    sha256: str,
    *,
    what: str | None = None,
    quiet: bool = False,
) -> Path:
    """Make `dest` hold the verified content of `url`; reuse a valid cached copy.

    `url` may be a callable, asked only when a download is really needed (so a
    warm cache needs no network at all).
    """
    if dest.is_file():
        if sha256_file(dest) == sha256:
            log.info("cached: %s", dest)
            return dest
        log.warning("cached %s does not match its sha256; downloading it again", dest.name)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        if callable(url):
            url = url()
        with os.fdopen(fd, "wb") as out:
            _stream(url, out, digest, what or dest.name, quiet)
        got = digest.hexdigest()
        if got != sha256:
            raise ChecksumError(
                f"{dest.name}: sha256 mismatch (expected {sha256}, got {got}) from {url}",
                hint="the download was corrupted or the pin is wrong; check vllm-pin.txt",
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _stream(url: str, out, digest, label: str, quiet: bool) -> None:
    log.info("GET %s", url)
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                transient=True,
                console=Console(stderr=True),
                disable=not progress_enabled(quiet),
            ) as progress:
                task = progress.add_task(label, total=total)
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    progress.advance(task, len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FetchError(f"download of {label} failed: {exc}", hint="run the command again") from exc
    except Exception as exc:  # http.client.IncompleteRead and friends
        raise FetchError(f"download of {label} interrupted: {exc!r}", hint="run the command again") from exc
