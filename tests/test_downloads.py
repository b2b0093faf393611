"""Downloads: https only (loopback http for a local mirror), no schemes an index makes up, no leaked credentials."""
from __future__ import annotations

import base64
import logging

import pytest

from smla import cache
from smla.errors import ChecksumError, FetchError


def _dest(tmp_path, name):
    return tmp_path / "cache" / "downloads" / name


def test_loopback_index_and_file_work(index, tmp_path):
    index.publish("vllm", [("vllm-1.0.tar.gz", b"payload")])
    url, sha = cache.pypi_file("vllm", "vllm-1.0.tar.gz")
    assert url == f"{index.base}/files/vllm-1.0.tar.gz"
    assert cache.fetch(url, _dest(tmp_path, "vllm-1.0.tar.gz"), sha, quiet=True).read_bytes() == b"payload"


@pytest.mark.parametrize("bad", ["file:///etc/passwd", "http://example.com/vllm-1.0.tar.gz",
                                 "ftp://example.com/vllm-1.0.tar.gz", "data:,payload"])
def test_index_returning_other_schemes_is_refused(index, tmp_path, bad):
    index.publish("vllm", [("vllm-1.0.tar.gz", b"payload")], url_for=lambda _name: bad)
    with pytest.raises(FetchError, match="refusing"):
        cache.pypi_file("vllm", "vllm-1.0.tar.gz")
    with pytest.raises(FetchError, match="refusing"):
        cache.fetch(bad, _dest(tmp_path, "x"), "0" * 64, quiet=True)
    assert not _dest(tmp_path, "x").exists()


def test_remote_plain_http_index_is_refused_before_any_request(monkeypatch):
    monkeypatch.setenv("SMLA_INDEX_URL", "http://pypi.example.invalid/simple")
    with pytest.raises(FetchError, match="only https"):
        cache.pypi_file("vllm", "vllm-1.0.tar.gz")


@pytest.mark.parametrize("target", ["file:///etc/passwd", "http://example.invalid/x.tar.gz"])
def test_redirect_to_a_forbidden_url_is_refused(index, tmp_path, target):
    index.routes["/files/x.tar.gz"] = (None, {"redirect": target})
    with pytest.raises(FetchError, match="refusing a redirect|Redirection to url .* is not allowed"):
        cache.fetch(f"{index.base}/files/x.tar.gz", _dest(tmp_path, "x.tar.gz"), "0" * 64, quiet=True)


def test_credentials_are_sent_but_never_shown(index, tmp_path, monkeypatch, caplog):
    secret = "s3cr3t-token"
    monkeypatch.setenv("SMLA_INDEX_URL", f"http://alice:{secret}@127.0.0.1:{index.server.server_port}/simple")
    auth = "Basic " + base64.b64encode(f"alice:{secret}".encode()).decode()
    index.publish("vllm", [("vllm-1.0.tar.gz", b"payload")], extra={"auth": auth})
    caplog.set_level(logging.DEBUG)
    url, sha = cache.pypi_file("vllm", "vllm-1.0.tar.gz")
    assert secret not in url and "alice" not in url
    cache.fetch(url, _dest(tmp_path, "vllm-1.0.tar.gz"), sha, quiet=True)
    assert [h.get("Authorization") for _, h in index.requests] == [auth, auth]  # index and file
    # errors: wrong checksum, a missing file, an unreachable index
    with pytest.raises(ChecksumError) as exc1:
        cache.fetch(url, _dest(tmp_path, "other.tar.gz"), "f" * 64, quiet=True)
    with pytest.raises(FetchError) as exc2:
        cache.pypi_file("vllm", "missing.tar.gz")
    monkeypatch.setenv("SMLA_INDEX_URL", f"http://alice:{secret}@127.0.0.1:9/simple")
    with pytest.raises(FetchError) as exc3:
        cache.pypi_file("vllm", "vllm-1.0.tar.gz")
    shown = " ".join([caplog.text, str(exc1.value), str(exc2.value), str(exc3.value),
                      exc1.value.hint or "", exc2.value.hint or "", exc3.value.hint or ""])
    assert secret not in shown and "alice" not in shown
    assert "***@127.0.0.1" in shown


def test_credentials_do_not_follow_a_redirect_to_another_host(index, tmp_path):
    import hashlib

    # "localhost" vs "127.0.0.1": another host name for the redirect check, the same index
    port = index.server.server_port
    index.routes["/files/x.tar.gz"] = (None, {"redirect": f"http://localhost:{port}/other/x.tar.gz"})
    index.routes["/other/x.tar.gz"] = (b"payload", None)
    url = f"http://bob:pw@127.0.0.1:{port}/files/x.tar.gz"
    cache.fetch(url, _dest(tmp_path, "x.tar.gz"), hashlib.sha256(b"payload").hexdigest(), quiet=True)
    assert [path for path, _ in index.requests] == ["/files/x.tar.gz", "/other/x.tar.gz"]
    assert index.requests[0][1].get("Authorization")
    assert "Authorization" not in index.requests[1][1]


def test_redact():
    assert cache.redact("https://u:p@host:8443/simple") == "https://***@host:8443/simple"
    assert cache.redact("https://token@host/simple") == "https://***@host/simple"
    assert cache.redact("https://host/simple") == "https://host/simple"


def test_progress_never_writes_to_stdout(index, tmp_path, capfd, monkeypatch):
    """The bar really draws (stderr is made to look like a terminal, as it is for a user), and only
    to stderr. (Before: under pytest stderr is no terminal, so nothing drew and the test could not fail.)"""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("TERM", raising=False)
    index.publish("vllm", [("vllm-1.0.tar.gz", b"payload" * 1000)])
    url, sha = cache.pypi_file("vllm", "vllm-1.0.tar.gz")
    cache.fetch(url, _dest(tmp_path, "vllm-1.0.tar.gz"), sha)  # quiet=False
    out, err = capfd.readouterr()
    assert "vllm-1.0.tar.gz" in err  # the bar's label: it was drawn
    assert out == ""
    # --json (quiet) draws nothing at all
    cache.fetch(url, _dest(tmp_path, "again.tar.gz"), sha, quiet=True)
    assert capfd.readouterr() == ("", "")
