"""The official wheel of the pinned release: found on the package index (or known), cached,
verified; opened and read."""
from __future__ import annotations

import csv
import io
import platform
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from wheel.wheelfile import WHEEL_INFO_RE, WheelFile
from wheel.wheelfile import WheelError as _LibWheelError
from smla import cache, ids
from smla.errors import WheelError
from smla.pin import Pin
from smla.wheel.label import PROJECT

# The official wheel of a release is found on the package index: the one
# `vllm-<version>-cp3X-abi3-manylinux_<glibc>_<arch>.whl` (the glibc tag moves:
# manylinux_2_31 for 0.16.0, manylinux_2_28 for 0.26.0 and 0.33.0), with the
# index's sha256. Wheels listed here (name and sha256 as on PyPI, checked on
# 2026-11-30; 0.33.0 on 2026-12-02) need no index at all when they are already
# in the cache. The release comes from the line's pin (`--line`, `make
# build-wheel VLLM=<release>`): nothing here assumes one release.
OFFICIAL_WHEELS: dict[tuple[str, str], tuple[str, str]] = {
    ("0.16.0", "x86_64"): (
        "vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl",
        "f066b2a2f8597a4a3ada8fbbfd122b59086864b2260ca42dc81bf9fb57af0c42",
    ),
    ("0.16.0", "aarch64"): (
        "vllm-0.16.0-cp38-abi3-manylinux_2_31_aarch64.whl",
        "dfaa14846608fd229dda9d372e2ad3f13854fd09147c2ba36b40579cf3c03804",
    ),
    ("0.26.0", "x86_64"): (
        "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de",
    ),
    ("0.26.0", "aarch64"): (
        "vllm-0.26.0-cp38-abi3-manylinux_2_28_aarch64.whl",
        "52a4c3e55c2c80cc8793e52ccc244457ceade25b0ad7caa1c15e5002a95a1b2c",
    ),
    ("0.33.0", "x86_64"): (
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    ),
    ("0.33.0", "aarch64"): (
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl",
        "e9e404f52c8494b69bd83fe99fe7ecfa9f6b89fbd156d2a9639c24ea41d6d606",
    ),
}
# ------------------------------------------------------------- base wheel


def official_wheel_pattern(version: str, arch: str) -> re.Pattern:
    """File names of the official Linux wheel of `version` for `arch` (any abi3 CPython tag, any manylinux)."""
    return re.compile(rf"^{re.escape(PROJECT)}-{re.escape(version)}-cp3\d+-abi3-"
                      rf"(?:manylinux_\d+_\d+|manylinux\d+)_{re.escape(arch)}\.whl$")


def official_wheel(pin: Pin, arch: str | None = None) -> tuple[str, str, str | None]:
    """(file name, sha256, url or None) of the official wheel of the pinned release.

    Known wheels (OFFICIAL_WHEELS) need no index; otherwise the index's
    listing is searched for the one file matching `official_wheel_pattern`.
    """
    arch = arch or platform.machine()
    known = OFFICIAL_WHEELS.get((pin.version, arch))
    if known:
        return known[0], known[1], None
    pattern = official_wheel_pattern(pin.version, arch)
    files = cache.pypi_files(PROJECT)
    found = sorted((f for f in files if pattern.match(f[0])), key=lambda f: f[0])
    if not found:
        raise WheelError(
            f"the package index has no official Linux {arch} wheel of vLLM {pin.version}",
            hint="pass --base-wheel PATH, or use --from-source",
        )
    if len(found) > 1:
        raise WheelError(f"several official wheels of vLLM {pin.version} for {arch}: "
                         + ", ".join(f[0] for f in found), hint="pick one with --base-wheel PATH")
    name, url, sha = found[0]
    if not ids.is_sha256(sha):
        raise WheelError(f"the package index gives no sha256 for {name}", hint="pass --base-wheel PATH")
    cache.check_url(url, f"{name} at")
    return name, sha, url


def base_wheel_path(pin: Pin, explicit: Path | None = None, *, quiet: bool = False) -> Path:
    """`explicit`, else the official wheel of the pinned release from the cache (downloaded when missing)."""
    if explicit is not None:
        if not explicit.is_file():
            raise WheelError(f"--base-wheel {explicit}: no such file")
        return explicit
    if not pin.has_sdist:
        raise WheelError(
            f"the pinned commit {pin.short} is not a release: no official wheel matches it, and the wheel "
            f"of release {pin.version} holds other sources and binaries",
            hint="pass --base-wheel PATH: a wheel built from that very commit (a vLLM nightly wheel, whose "
                 "vllm/_version.py records it), or use --from-source",
        )
    name, sha, url = official_wheel(pin)
    dest = cache.downloads_dir() / name
    source = url if url is not None else (lambda: cache.pypi_file(PROJECT, name)[0])
    return cache.fetch(source, dest, sha, what=name, quiet=quiet)


@dataclass
class BaseWheel:
    """The wheel a build starts from, opened and checked (open_base_wheel)."""

    path: Path
    tags: str  # "cp38-abi3-manylinux_2_31_x86_64"
    dist_info: str  # "vllm-0.16.0.dist-info"
    infos: list[zipfile.ZipInfo]
    version: str = ""  # the version in the file name ("0.16.0", or a nightly's "0.26.1.dev5+gabc")


def open_base_wheel(path: Path, release: str | None) -> tuple[WheelFile, BaseWheel]:
    """Open and check the base wheel: name, version (`release`; None = any) and RECORD coverage
    (hashes are checked on read)."""
    m = WHEEL_INFO_RE.match(path.name)
    if not m or not path.name.endswith(".whl"):
        raise WheelError(f"{path.name} is not a wheel file name")
    if m.group("name").lower() != PROJECT:
        raise WheelError(f"{path.name} is not a {PROJECT} wheel")
    if release is not None and m.group("ver") != release:
        raise WheelError(
            f"{path.name} is vLLM {m.group('ver')}, but the pin is {release}",
            hint="use the official wheel of the pinned release (drop --base-wheel or point it at the right file)",
        )
    if m.group("build"):
        raise WheelError(f"{path.name} carries a build tag; expected an official release wheel")
    try:
        wf = WheelFile(path)
    except (zipfile.BadZipFile, _LibWheelError, OSError, ValueError, KeyError) as exc:
        raise WheelError(f"{path} is not a valid wheel: {exc}", hint="delete it and run again to re-download") from exc
    infos = [i for i in wf.infolist() if not i.is_dir()]
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        wf.close()
        raise WheelError(f"{path.name} has duplicate members")
    dist_info = wf.dist_info_path
    if dist_info != f"{m.group('namever')}.dist-info":
        wf.close()
        raise WheelError(f"{path.name}: unexpected .dist-info directory {dist_info}")
    recorded = recorded_paths(wf)
    present = set(names) - {wf.record_path}
    missing = sorted(recorded - present)
    unrecorded = sorted(present - recorded)
    if missing or unrecorded:
        wf.close()
        detail = (f"listed in RECORD but absent: {', '.join(missing[:5])}" if missing
                  else f"not listed in RECORD: {', '.join(unrecorded[:5])}")
        raise WheelError(f"{path.name}: RECORD does not match the archive ({detail})",
                         hint="the base wheel is corrupt; delete it and run again")
    tags = path.name[:-len(".whl")].split("-", 2)[2]
    return wf, BaseWheel(path, tags, dist_info, infos, m.group("ver"))


def recorded_paths(wf: WheelFile) -> set[str]:
    """Paths RECORD lists with a hash (WheelFile has already rejected malformed rows)."""
    with wf.open(wf.record_path) as fh:
        rows = csv.reader(io.TextIOWrapper(fh, encoding="utf-8", newline=""))
        return {row[0] for row in rows if len(row) >= 2 and row[1]}


def read_member(wf: WheelFile, name: str) -> bytes:
    """A member's bytes, checked against its RECORD hash (and the zip CRC)."""
    try:
        with wf.open(name) as fh:
            return fh.read()
    except (_LibWheelError, zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise WheelError(f"{Path(wf.filename or '').name}: {name}: {exc}",
                         hint="the base wheel is corrupt; delete it and run again") from exc


