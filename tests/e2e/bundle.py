"""Build the end-to-end bundle for the lent GPU machine (`make e2e-bundle`).

The device takes 64 MiB of files per call and has no network, but a vLLM 0.26.0
engine run needs ~300 MB of the wheel plus ~60 MB of dependency wheels. This
script builds, under OUT (default `.e2e/`, ignored by git):

  build/<wheel name>      the wheel reduced to the members the run needs; every
                          member is byte-identical to the source wheel's (checked
                          against the source RECORD), the dist-info is kept with
                          RECORD listing exactly the kept members, so pip
                          installs it and importlib.metadata sees vLLM
  build/deps/*.whl        tests/e2e/device-requirements.txt as cp312 wheels
  payload.tar.xz          a deterministic tar of the two, xz-compressed
  pieces/NN/payload.partNN  the payload cut into pieces of <= --piece-mib MiB
  manifest.json           sha256 and size of every piece, of the payload, of the
                          reduced wheel and of each file in the tar

tests/e2e/device_pieces.py checks and reassembles the pieces on the device.

`--extra` builds a second, optional bundle of dependency wheels only (no vLLM wheel; default
requirements tests/e2e/device-requirements-v4-upstream.txt, `make e2e-bundle-v4-upstream`,
out `.e2e-extra/`): the packages pristine 0.26.0's DeepSeek-V4 path imports on the GPU and the
device image lacks (TileLang for the mHC kernels, NVIDIA's CuTe DSL for the compressor), for
`run_e2e.py --v4-ref-kernels complete` (README "DeepSeek-V4"). Their wheels are deflated zips,
which xz cannot shrink, so each is rewritten with the same members stored uncompressed
(`store_wheel`: member names, bytes, dates and modes unchanged, so the RECORD still holds) and
the payload's xz does the compressing.

Members left out (each one a path rule below, with the reason): the FA2
library (sm80 attention; the sparse path on sm90 uses FA3, and FA2's import is
guarded), the sm100 FMHA headers, DeepGEMM's `_C` for Pythons other than 3.12
(the device runs 3.12) and the Rust HTTP front end binary (`vllm-rs`, used only
with VLLM_USE_RUST_FRONTEND). Everything else is kept.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

from smla import proc
from smla.errors import ChecksumError, SmlaError, UsageError, WheelError

# (rule, reason): a member is dropped when the rule matches its path.
DROP_RULES: list[tuple[str, str]] = [
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FA2: not used by sparse MLA on sm90; import is guarded"),
    ("vllm/third_party/fmha_sm100/", "sm100-only FMHA headers"),
    ("vllm/vllm-rs", "Rust HTTP front end; only with VLLM_USE_RUST_FRONTEND"),
]
DEVICE_PYTHON_TAG = "cpython-312-"
# The device image is Python 3.12.3 on glibc >= 2.39; pip matches manylinux_2_N exactly, so list them all.
PIP_PLATFORMS = ([f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)]
                 + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "any"])
CHUNK = 1 << 20


def dropped_because(name: str) -> str | None:
    """Why member `name` is left out of the reduced wheel, or None to keep it."""
    for rule, reason in DROP_RULES:
        if name == rule or (rule.endswith("/") and name.startswith(rule)):
            return reason
    if name.startswith("vllm/third_party/deep_gemm/_C.cpython-") and DEVICE_PYTHON_TAG not in name:
        return "DeepGEMM extension for another Python"
    return None


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def reduce_wheel(src: Path, dst_dir: Path, drop=dropped_because) -> dict:
    """Write the reduced wheel (same file name) into dst_dir; return its summary. `drop(name)`
    gives the reason a member is left out, or None (default: this bundle's DROP_RULES)."""
    if not src.is_file():
        raise WheelError(f"wheel not found: {src}",
                         hint="make build-wheel, or E2E_WHEEL=/path/to/vllm-*.whl")
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / src.name
    kept, dropped = [], {}
    with zipfile.ZipFile(src) as zin:
        record_name = next((n for n in zin.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise WheelError(f"{src.name} has no dist-info/RECORD")
        rows = list(csv.reader(io.StringIO(zin.read(record_name).decode())))
        record = {r[0]: r for r in rows if r}
        out_rows = []
        with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                name = info.filename
                if name == record_name or name.endswith("/"):
                    continue
                reason = drop(name)
                if reason:
                    dropped[reason] = dropped.get(reason, 0) + info.file_size
                    continue
                data = zin.read(name)
                row = record.get(name)
                if row is None or row[1] != _record_hash(data):
                    raise ChecksumError(f"{src.name}: member {name} does not match the wheel's RECORD")
                new = zipfile.ZipInfo(name, date_time=info.date_time)
                new.external_attr = info.external_attr
                new.compress_type = zipfile.ZIP_STORED
                zout.writestr(new, data)
                out_rows.append(row)
                kept.append((name, len(data)))
            out_rows.append([record_name, "", ""])
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(out_rows)
            rec = zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0))
            rec.external_attr = 0o644 << 16
            zout.writestr(rec, buf.getvalue())
    return {
        "source": src.name,
        "source_sha256": _sha256_file(src),
        "file": dst.name,
        "sha256": _sha256_file(dst),
        "members": len(kept),
        "member_bytes": sum(n for _, n in kept),
        "dropped_bytes": dropped,
    }


def download_deps(req_file: Path, dst: Path) -> list[str]:
    """pip download every pinned line of req_file as a cp312 wheel into dst."""
    dst.mkdir(parents=True, exist_ok=True)
    reqs = [ln.split("#")[0].strip() for ln in req_file.read_text().splitlines()]
    reqs = [r for r in reqs if r]
    plat = [a for p in PIP_PLATFORMS for a in ("--platform", p)]
    for req in reqs:
        proc.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                  "--python-version", "3.12", "--implementation", "cp", *plat, "-d", dst, req])
    wheels = sorted(p.name for p in dst.glob("*.whl"))
    names = {w.split("-")[0].lower().replace("_", "-") for w in wheels}
    missing = [r for r in reqs if r.split("==")[0].lower().replace("_", "-") not in names]
    if missing:
        raise UsageError(f"no wheel downloaded for {', '.join(missing)}")
    return wheels


def store_wheel(path: Path) -> None:
    """Rewrite a wheel in place with every member stored uncompressed (ZIP_STORED): same
    names, bytes, dates and modes, so its RECORD hashes still hold and pip installs it as
    before; only the zip container changes."""
    tmp = path.with_suffix(".stored")
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            new.external_attr = info.external_attr
            new.compress_type = zipfile.ZIP_STORED
            zout.writestr(new, zin.read(info.filename))
    os.replace(tmp, path)


def write_payload(build: Path, out: Path) -> tuple[Path, dict[str, str]]:
    """Deterministic tar of build/ (sorted, mtime 0, root-owned), xz-compressed."""
    files = sorted(p for p in build.rglob("*") if p.is_file())
    tar_path = out / "payload.tar"
    sums = {}
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for p in files:
            rel = p.relative_to(build).as_posix()
            ti = tar.gettarinfo(p, arcname=rel)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname, ti.mode = 0, 0, 0, "", "", 0o644
            with open(p, "rb") as f:
                tar.addfile(ti, f)
            sums[rel] = _sha256_file(p)
    xz_path = out / "payload.tar.xz"
    if xz_path.exists():
        xz_path.unlink()
    proc.run(["xz", "-T2", "-6", "-f", tar_path])
    return xz_path, sums


# A call carries 64 MiB: a piece, the manifest and the repo's tracked files (8 MiB on 2026-12-01).
PIECE_MIB = 50


def split(payload: Path, out: Path, piece_bytes: int) -> list[dict]:
    """Cut payload into out/pieces/NN/payload.partNN (one folder per `carry` path)."""
    pieces_dir = out / "pieces"
    if pieces_dir.exists():
        shutil.rmtree(pieces_dir)
    pieces = []
    with open(payload, "rb") as f:
        idx = 1
        while data := f.read(piece_bytes):
            d = pieces_dir / f"{idx:02d}"
            d.mkdir(parents=True)
            name = f"payload.part{idx:02d}"
            (d / name).write_bytes(data)
            pieces.append({"index": idx, "path": f"pieces/{idx:02d}/{name}", "bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()})
            idx += 1
    return pieces


def resplit(out: Path, piece_bytes: int) -> int:
    """Cut OUT's payload into new pieces and rewrite the manifest's piece list; the payload must
    still be the one the manifest describes (sha256)."""
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise UsageError(f"{manifest_path}: no bundle there; run `make e2e-bundle` first")
    manifest = json.loads(manifest_path.read_text())
    payload = out / manifest["payload"]["file"]
    if not payload.is_file() or _sha256_file(payload) != manifest["payload"]["sha256"]:
        raise UsageError(f"{payload}: missing or not the payload {manifest_path} describes; "
                         f"run `make e2e-bundle` again")
    manifest["pieces"] = split(payload, out, piece_bytes)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    mib = 1 << 20
    print(f"{len(manifest['pieces'])} pieces of <= {piece_bytes / mib:.0f} MiB:")
    for p in manifest["pieces"]:
        print(f"  {out}/{p['path']}  {p['bytes'] / mib:.1f} MiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help="vLLM wheel (build-wheel output or official)")
    ap.add_argument("--extra", action="store_true",
                    help="dependency wheels only, stored uncompressed (default out .e2e-extra, requirements "
                         "device-requirements-v4-upstream.txt)")
    ap.add_argument("--out", default=None, type=Path, help="default .e2e (.e2e-extra with --extra)")
    ap.add_argument("--requirements", default=None, type=Path,
                    help="default device-requirements.txt (device-requirements-v4-upstream.txt with --extra)")
    ap.add_argument("--piece-mib", default=PIECE_MIB, type=int,
                    help="piece size; the repo itself also travels within the 64 MiB of a call")
    ap.add_argument("--resplit", action="store_true",
                    help="only cut the existing bundle's payload (OUT/payload.tar.xz, as its manifest "
                         "names it) into pieces of --piece-mib again: when the repo has grown and a "
                         "piece no longer fits beside it")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    if args.out is None:
        args.out = Path(".e2e-extra" if args.extra else ".e2e")
    if args.requirements is None:
        args.requirements = here / ("device-requirements-v4-upstream.txt" if args.extra else "device-requirements.txt")
    try:
        if args.resplit:
            return resplit(args.out, args.piece_mib << 20)
        if args.wheel is None and not args.extra:
            raise UsageError("--wheel is required (or --extra for a dependency-only bundle)")
        out = args.out
        build = out / "build"
        if build.exists():
            for p in build.glob("*.whl"):
                p.unlink()
        if args.extra:
            if (build / "deps").exists():
                shutil.rmtree(build / "deps")
            wheel = None
        else:
            wheel = reduce_wheel(args.wheel.resolve(), build)
        deps = download_deps(args.requirements, build / "deps")
        if args.extra:
            for name in deps:
                store_wheel(build / "deps" / name)
        payload, sums = write_payload(build, out)
        pieces = split(payload, out, args.piece_mib << 20)
        manifest = {
            "format": 1,
            "extra": bool(args.extra),
            "wheel": wheel,
            "deps": deps,
            "files": sums,
            "payload": {"file": payload.name, "bytes": payload.stat().st_size,
                        "sha256": _sha256_file(payload)},
            "pieces": pieces,
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        (out / "payload.tar").unlink(missing_ok=True)
    except SmlaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    mib = 1 << 20
    if wheel is not None:
        print(f"reduced wheel {wheel['file']}: {wheel['members']} members, {wheel['member_bytes'] / mib:.1f} MiB "
              f"(dropped: " + ", ".join(f"{k} {v / mib:.1f} MiB" for k, v in wheel["dropped_bytes"].items()) + ")")
    print(f"deps: {len(deps)} wheels; payload {manifest['payload']['bytes'] / mib:.1f} MiB "
          f"in {len(pieces)} pieces")
    for p in pieces:
        print(f"  {out}/{p['path']}  {p['bytes'] / mib:.1f} MiB")
    calls = len(pieces)
    print(f"device: {calls} consecutive calls, each carrying {out}/manifest.json and one {out}/pieces/NN; "
          f"see tests/e2e/README.md" + (" (`device-run.sh stage-extra`)" if args.extra else ""))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
