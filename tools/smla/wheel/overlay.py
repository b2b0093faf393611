"""The default build: the official wheel with the series' vllm/ files swapped in, relabelled."""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from wheel.wheelfile import WheelFile
from wheel.wheelfile import WheelError as _LibWheelError
from smla import cache
from smla.errors import WheelError
from smla.fsutil import sha256_file
from smla.pin import Pin
from smla.series import Series
from smla.wheel.checks import _check_clean, _label_notes, _recorded_commit, build_source_paths, check_base_matches_pin, check_series_matches_tree, check_tree_at_pin, tree_changes
from smla.wheel.label import PACKAGE_DIR, PROJECT, VERSION_FILE, local_version, rewrite_metadata, rewrite_version_file, series_hash
from smla.wheel.official import open_base_wheel, read_member, recorded_paths, base_wheel_path
from smla.wheel.result import WheelResult
from smla.wheel.zipwriter import _FixedWheelFile, _fixed_date, _mode, _zinfo

# ----------------------------------------------------------------- overlay


def build_overlay(
    pin: Pin,
    series: Series,
    tree: Path,
    dist_dir: Path,
    *,
    base_wheel: Path | None = None,
    allow_unexported: bool = False,
    quiet: bool = False,
    echo: Callable[[str], None] = lambda _msg: None,
) -> WheelResult:
    """The official wheel with the series' files swapped in, relabelled; written to `dist_dir`."""
    check_tree_at_pin(pin, tree)
    changes = tree_changes(tree)
    touched = sorted({f for p in series.patches for f in p.files} | {c.path for c in changes})
    refused = build_source_paths(touched)
    if refused:
        raise WheelError(
            "the series changes compiled or build sources, which a wheel overlay cannot carry: "
            + ", ".join(refused[:8]) + (" ..." if len(refused) > 8 else ""),
            hint="build with `smla build-wheel --from-source` (add --full-cuda-build for csrc/ changes)",
        )
    if not allow_unexported:
        check_series_matches_tree(series, tree)
    packaged = [c for c in changes if c.path.startswith(PACKAGE_DIR)]
    _check_clean(tree, [c.path for c in packaged if c.status != "D"])

    base = base_wheel_path(pin, base_wheel, quiet=quiet)
    short = series_hash(series)
    wf, b = open_base_wheel(base, pin.version if pin.has_sdist else None)
    with wf:
        notes = check_base_matches_pin(pin, b, _recorded_commit(wf))
        version = local_version(b.version, pin.commit, short)
        result = WheelResult(
            mode="overlay", version=version, series_hash=short, patches=series.names(),
            base_wheel=base, base_sha256="", output=Path(), output_sha256="", size=0,
            not_packaged=sorted(c.path for c in changes if not c.path.startswith(PACKAGE_DIR)),
            notes=notes + _label_notes(pin),
        )
        if not series.patches:
            result.notes.append("the series is empty: the wheel differs from the official one only by its version")
        if allow_unexported:
            result.notes.append("--allow-unexported: the version label may not describe the tree's commits")
        base_names = {i.filename: i for i in b.infos}
        new_dist_info = f"{PROJECT}-{version}.dist-info"
        date = _fixed_date(b.infos)
        # name -> (bytes or None = take from the base, mode)
        members: dict[str, tuple[bytes | None, int]] = {
            i.filename: (None, _mode(i)) for i in b.infos if not i.filename.startswith(b.dist_info + "/")
        }
        for c in packaged:
            if c.status == "D":
                if c.path in members:
                    del members[c.path]
                    result.removed.append(c.path)
                continue
            src = tree / c.path
            if src.is_symlink() or not src.is_file():
                raise WheelError(f"{c.path} in {tree} is not a regular file")
            mode = 0o755 if src.stat().st_mode & 0o111 else 0o644
            (result.replaced if c.path in base_names else result.added).append(c.path)
            members[c.path] = (src.read_bytes(), mode)
        if VERSION_FILE in members:
            old = members[VERSION_FILE]
            text = (old[0] if old[0] is not None else read_member(wf, VERSION_FILE)).decode()
            members[VERSION_FILE] = (rewrite_version_file(text, b.version, version).encode(), old[1])
            result.version_file = f"rewritten to {version}"
        else:
            result.version_file = "absent from the wheel (nothing to rewrite)"
        dist_members: list[tuple[str, bytes, int]] = []
        for info in sorted(b.infos, key=lambda i: i.filename):
            if not info.filename.startswith(b.dist_info + "/") or info.filename == wf.record_path:
                continue
            data = read_member(wf, info.filename)
            rel = info.filename[len(b.dist_info) + 1:]
            if rel == "METADATA":
                data = rewrite_metadata(data, b.version, version)
            dist_members.append((f"{new_dist_info}/{rel}", data, _mode(info)))
        if not any(n.endswith("/METADATA") for n, _, _ in dist_members):
            raise WheelError(f"{base.name} has no METADATA")

        out_name = f"{PROJECT}-{version}-{b.tags}.whl"
        dist_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".build-wheel.", dir=dist_dir))
        try:
            tmp_out = scratch / out_name
            total = sum(base_names[n].file_size if d is None else len(d) for n, (d, _) in members.items())
            with Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                          TimeRemainingColumn(), transient=True, console=cache.progress_console(),
                          disable=not cache.progress_enabled(quiet)) as progress:
                task = progress.add_task(f"writing {out_name}", total=total)
                with _FixedWheelFile(tmp_out, date) as out:
                    for name, data in _prefetch(wf, members):
                        out.writestr(_zinfo(name, date, members[name][1]), data)
                        progress.advance(task, len(data))
                    for name, data, mode in dist_members:
                        out.writestr(_zinfo(name, date, mode), data)
            _self_check(tmp_out, version)
            final = dist_dir / out_name
            os.replace(tmp_out, final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    result.base_sha256 = sha256_file(base)
    result.output = final
    result.output_sha256 = sha256_file(final)
    result.size = final.stat().st_size
    echo(f"wrote {final}")
    return result


def _prefetch(wf: WheelFile, members: dict[str, tuple[bytes | None, int]]):
    """(name, bytes) in sorted order; the next base member is read (inflated, hash-checked) in a
    thread while the caller compresses the current one (zlib and hashlib release the GIL)."""
    names = sorted(members)

    def load(name: str) -> bytes:
        data = members[name][0]
        return data if data is not None else read_member(wf, name)

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(load, names[0]) if names else None
        for i, name in enumerate(names):
            data = pending.result()
            pending = pool.submit(load, names[i + 1]) if i + 1 < len(names) else None
            yield name, data


def _self_check(path: Path, version: str) -> None:
    """Reopen the new wheel: RECORD parses, covers every member, and METADATA says `version`."""
    try:
        with WheelFile(path) as wf:
            names = {i.filename for i in wf.infolist()} - {wf.record_path}
            recorded = recorded_paths(wf)
            meta = read_member(wf, f"{wf.dist_info_path}/METADATA")
    except (zipfile.BadZipFile, _LibWheelError) as exc:
        raise WheelError(f"the new wheel {path.name} does not read back: {exc}") from exc
    if names != recorded:
        raise WheelError(f"the new wheel's RECORD does not cover its members: {sorted(names ^ recorded)[:5]}")
    if f"\nVersion: {version}\n".encode() not in meta:
        raise WheelError(f"the new wheel's METADATA does not say Version: {version}")


