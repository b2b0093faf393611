"""Downloads into a cache outside the repository, verified by sha256.

Files are streamed to a temporary name beside the target, checked, then
renamed, so an interrupted or corrupt download never sits in the cache
under its real name. A cached file that does not match the expected
checksum is kept until a download that does match replaces it: a wrong
expected checksum (a bad pin) never destroys a good download. A cache that
cannot be written is a FilesystemError naming the directory and
SMLA_CACHE_DIR. PyPI file locations come from the simple index's JSON form
(PEP 691), which also gives each file's sha256.

Transport: remote index and file URLs must be https (also after
redirects); plain http is accepted only for a loopback host (a mirror on
this machine), and any other scheme an index returns (file:, ftp:, data:,
http: to another host) is refused. Local files are used only when the user
names them (`--source PATH`, `--base-wheel PATH`), never because an index
said so. Credentials in an index URL (https://user:token@host/simple) are
sent as HTTP basic auth to that host only and are never logged or shown:
`redact` replaces them with `***` in every message.
"""
from __future__ import annotations

import base64
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

from smla import nospace
from smla.errors import ChecksumError, FetchError, FilesystemError, cmd
from smla.fsutil import file_in_the_way, sha256_file

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


def progress_console() -> Console:
    """Progress bars go to stderr (stdout stays clean for --json and pipes)."""
    return Console(stderr=True)


def cache_dir() -> Path:
    """$SMLA_CACHE_DIR, else $XDG_CACHE_HOME/vllm-sparse-mla, else ~/.cache/vllm-sparse-mla."""
    if os.environ.get("SMLA_CACHE_DIR"):
        return Path(os.environ["SMLA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-sparse-mla"


def downloads_dir() -> Path:
    """Where downloads are cached (not created here: see `writable_dir`)."""
    return cache_dir() / "downloads"


def writable_dir(path: Path) -> Path:
    """Create `path` (a directory under the cache) or say which one cannot be written and what to do."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".smla-probe-")
        probe.close()
    except OSError as exc:
        raise unwritable(path, exc) from exc
    return path


def unwritable(path: Path, exc: OSError) -> FilesystemError:
    blocker = file_in_the_way(path)
    if blocker is not None:
        return FilesystemError(
            f"cannot use the toolkit's cache {path}: {blocker} is a file, where a directory belongs",
            hint=f"move that file away ({cmd('mv', blocker, f'{blocker}.old')}), or point SMLA_CACHE_DIR at a "
                 "directory (e.g. `SMLA_CACHE_DIR=$HOME/smla-cache smla fetch`)",
        )
    return FilesystemError(
        f"cannot write the toolkit's cache {path}: {exc.strerror or exc}",
        hint=f"make {cache_dir()} writable, or point SMLA_CACHE_DIR at a writable directory "
             "(e.g. `SMLA_CACHE_DIR=$HOME/smla-cache smla fetch`)",
    )


def index_url() -> str:
    return os.environ.get("SMLA_INDEX_URL", DEFAULT_INDEX).rstrip("/")


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def redact(url: str) -> str:
    """`url` with any user:password replaced by `***` (for logs and errors)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_url(url: str, what: str) -> None:
    """Refuse anything but https, and http to a loopback host (a mirror on this machine)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname in _LOOPBACK:
        return
    raise FetchError(
        f"refusing {what} {redact(url)}: only https URLs are downloaded "
        "(plain http only from this machine, 127.0.0.1/localhost)",
        hint="use an https index (SMLA_INDEX_URL), or download the file yourself and pass its path "
             "(--source PATH / --base-wheel PATH)",
    )


def _split_credentials(url: str) -> tuple[str, str | None]:
    """(url without user:password, Authorization header value or None)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    bare = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return bare, f"Basic {token}"


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to an allowed URL; never carry credentials to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        newurl = urllib.parse.urljoin(req.full_url, newurl)
        check_url(newurl, "a redirect to")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).hostname != urllib.parse.urlsplit(req.full_url).hostname:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_CheckedRedirects)


def _open(url: str, *, accept: str | None = None, auth: str | None = None, timeout: float):
    check_url(url, "to download")
    bare, inline = _split_credentials(url)
    headers = {"Accept": accept} if accept else {}
    if inline or auth:
        headers["Authorization"] = inline or auth  # type: ignore[assignment]
    return _OPENER.open(urllib.request.Request(bare, headers=headers), timeout=timeout)


# Authorization for file URLs on the index's own host (credentials given in SMLA_INDEX_URL).
_AUTH_FOR_HOST: dict[str, str] = {}


def pypi_file(project: str, filename: str) -> tuple[str, str]:
    """(url, sha256) of `filename` in `project` on the package index.

    The returned URL never carries credentials (`fetch` adds them again for
    the index's own host); it must be https (or loopback http), else FetchError.
    """
    for name, url, sha in pypi_files(project):
        if name == filename:
            check_url(url, f"{filename} at")
            return url, sha
    raise FetchError(
        f"{filename} is not on the package index ({redact(index_url())}/{project}/)",
        hint=f"check the version (released versions: https://pypi.org/project/{project}/#history), or point "
             "SMLA_INDEX_URL at an index that has it",
    )


def pypi_files(project: str) -> list[tuple[str, str, str]]:
    """(filename, url, sha256) of every file of `project` on the index (same checks as pypi_file)."""
    url = f"{index_url()}/{project}/"
    shown = redact(url)
    bare, auth = _split_credentials(url)
    log.info("GET %s", shown)
    try:
        with _open(url, accept="application/vnd.pypi.simple.v1+json", timeout=60) as resp:
            data = json.load(resp)
    except FetchError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FetchError(
            f"cannot read the package index {shown}: {_redact_text(str(exc), url)}",
            hint="check network access to PyPI, or set SMLA_INDEX_URL to a mirror",
        ) from exc
    out = []
    for entry in data.get("files", []):
        name = entry.get("filename", "")
        file_url = urllib.parse.urljoin(bare, entry.get("url", ""))
        out.append((name, file_url, entry.get("hashes", {}).get("sha256", "")))
        host = urllib.parse.urlsplit(file_url).hostname
        if auth and host == urllib.parse.urlsplit(bare).hostname:
            _AUTH_FOR_HOST[host] = auth
    return out


def mask_credentials(text: str, url: str) -> str:
    """`text` (an error message) with the user and password of `url` (if any) masked."""
    return _redact_text(text, url)


def _redact_text(text: str, url: str) -> str:
    """`text` with the credentials of `url` (if any) masked."""
    parts = urllib.parse.urlsplit(url)
    for secret in (parts.password, parts.username):
        if secret:
            text = text.replace(secret, "***")
    return text


def fetch(
    url: str | Callable[[], str],
    dest: Path,
    sha256: str,
    *,
    what: str | None = None,
    quiet: bool = False,
    mismatch_hint: str | None = None,
) -> Path:
    """Make `dest` hold the verified content of `url`; reuse a valid cached copy.

    `url` may be a callable, asked only when a download is really needed (so a
    warm cache needs no network at all). A cached file that does not match
    `sha256` stays where it is unless a download matching `sha256` replaces
    it; when the download does not match either, ChecksumError (with
    `mismatch_hint`, which should name where `sha256` came from).
    """
    cached_sha = None
    if dest.is_file():
        cached_sha = sha256_file(dest)
        if cached_sha == sha256:
            log.info("cached: %s", dest)
            return dest
        log.warning("cached %s does not match the expected sha256; downloading it again "
                    "(the cached file is kept unless the download matches)", dest.name)
    writable_dir(dest.parent)
    try:
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    except OSError as exc:
        raise unwritable(dest.parent, exc) from exc
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        if callable(url):
            url = url()
        try:
            out = os.fdopen(fd, "wb")
        except OSError as exc:
            os.close(fd)
            raise unwritable(dest.parent, exc) from exc
        with out:
            _stream(url, out, digest, what or dest.name, quiet)
        got = digest.hexdigest()
        if got != sha256:
            agree = (f"; the cached {dest} has the same content and is kept, so the expected sha256 is "
                     "probably wrong" if cached_sha == got else
                     (f"; the cached {dest} is kept" if cached_sha else ""))
            raise ChecksumError(
                f"{dest.name}: sha256 mismatch (expected {sha256}, got {got}) from {redact(url)}{agree}",
                hint=mismatch_hint or "the download was corrupted or the expected sha256 is wrong; run the "
                                      "command again, and check where that sha256 comes from",
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _stream(url: str, out, digest, label: str, quiet: bool) -> None:
    log.info("GET %s", redact(url))
    auth = _AUTH_FOR_HOST.get(urllib.parse.urlsplit(url).hostname or "")
    try:
        with _open(url, auth=auth, timeout=120) as resp:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                transient=True,
                console=progress_console(),
                disable=not progress_enabled(quiet),
            ) as progress:
                task = progress.add_task(label, total=total)
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    progress.advance(task, len(chunk))
    except FetchError:
        raise
    except OSError as exc:
        full = nospace.from_oserror(exc, downloads_dir(), f"downloading {label}")
        if full is not None:
            raise full from exc
        raise FetchError(f"download of {label} failed: {_redact_text(str(exc), url)}",
                         hint="run the command again") from exc
    except (urllib.error.URLError, ValueError) as exc:
        raise FetchError(f"download of {label} failed: {_redact_text(str(exc), url)}",
                         hint="run the command again") from exc
    except Exception as exc:  # http.client.IncompleteRead and friends
        raise FetchError(f"download of {label} interrupted: {_redact_text(repr(exc), url)}",
                         hint="run the command again") from exc
