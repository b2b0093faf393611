"""Collect the e2e bundle's pieces on the GPU machine over consecutive calls, check, reassemble.

Standard library only: it runs on the device before anything is installed
(the toolkit's own modules need GitPython, which the device lacks).

  stage     copy the pieces this call carried (.e2e/pieces/NN/) into the store
            (/tmp/smla-e2e, survives while the machine stays warm), after
            checking each against .e2e/manifest.json; print what is still missing
  assemble  stage, then require every piece, check each sha256 again and the
            whole payload's, decompress and unpack it into STORE/payload/ and
            check every unpacked file against the manifest

`--use-stored-manifest`: when the call did not carry the bundle's manifest, use the copy the
store kept from an earlier `stage` (the optional `.e2e-extra/` bundle: its pieces are staged in
calls of their own, and the `run` call carries the main bundle's manifest only).

Exit codes: 0 ok, 20 a piece is missing, 21 a checksum does not match,
22 no manifest was carried.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import sys
import tarfile
from pathlib import Path

CHUNK = 1 << 20
MISSING, CHECKSUM, NO_MANIFEST = 20, 21, 22


class PieceError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def load_manifest(bundle: Path, store: Path, use_stored: bool = False) -> dict:
    src = bundle / "manifest.json"
    if not src.is_file() and use_stored and (store / "manifest.json").is_file():
        print(f"{src} not carried: using the manifest staged in {store}", flush=True)
        return json.loads((store / "manifest.json").read_text())
    if not src.is_file():
        raise PieceError(NO_MANIFEST, f"{src} was not carried: name it in `carry` with every piece")
    manifest = json.loads(src.read_text())
    kept = store / "manifest.json"
    if kept.is_file() and json.loads(kept.read_text())["payload"]["sha256"] != manifest["payload"]["sha256"]:
        print("store holds pieces of another bundle: discarding them", flush=True)
        shutil.rmtree(store)
    store.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, kept)
    return manifest


def stage(bundle: Path, store: Path, use_stored: bool = False) -> tuple[dict, list[int]]:
    manifest = load_manifest(bundle, store, use_stored)
    (store / "pieces").mkdir(exist_ok=True)
    for piece in manifest["pieces"]:
        carried = bundle / piece["path"]
        if not carried.is_file():
            continue
        if sha256(carried) != piece["sha256"]:
            # ignored paths of earlier calls stay in the machine's copy of the repo: a piece of
            # another cut of the bundle is left out here (and counted missing if it is)
            print(f"ignoring {carried}: not this manifest's piece {piece['index']} (left from an "
                  f"earlier call, or damaged); carry it again", flush=True)
            continue
        shutil.copyfile(carried, store / "pieces" / Path(piece["path"]).name)
        print(f"staged piece {piece['index']}/{len(manifest['pieces'])}", flush=True)
    missing = [p["index"] for p in manifest["pieces"]
               if not (store / "pieces" / Path(p["path"]).name).is_file()]
    have = len(manifest["pieces"]) - len(missing)
    print(f"store {store}: {have}/{len(manifest['pieces'])} pieces"
          + (f"; missing {missing}" if missing else "; complete"), flush=True)
    return manifest, missing


def assemble(bundle: Path, store: Path, use_stored: bool = False) -> Path:
    manifest, missing = stage(bundle, store, use_stored)
    if missing:
        names = ", ".join(f"{bundle}/pieces/{i:02d}" for i in missing)
        raise PieceError(MISSING, f"piece(s) {missing} of {len(manifest['pieces'])} are not on this machine. "
                         f"Carry {names} (with {bundle}/manifest.json) in calls made while the machine is "
                         "still warm (within 30 s of the previous call); a cold machine starts empty.")
    payload = store / "payload"
    done = payload / ".verified"
    if done.is_file() and done.read_text() == manifest["payload"]["sha256"]:
        print(f"payload already unpacked and verified in {payload}", flush=True)
        return payload
    if payload.exists():
        shutil.rmtree(payload)
    payload.mkdir()
    whole = hashlib.sha256()
    dec = lzma.LZMADecompressor()
    tar_path = store / "payload.tar"
    with open(tar_path, "wb") as out:
        for piece in manifest["pieces"]:
            path = store / "pieces" / Path(piece["path"]).name
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != piece["sha256"]:
                raise PieceError(CHECKSUM, f"piece {piece['index']} changed on the machine")
            whole.update(data)
            out.write(dec.decompress(data))
    if whole.hexdigest() != manifest["payload"]["sha256"] or not dec.eof:
        raise PieceError(CHECKSUM, "reassembled payload does not match the manifest")
    with tarfile.open(tar_path) as tar:
        tar.extractall(payload, filter="data")
    tar_path.unlink()
    for rel, digest in manifest["files"].items():
        f = payload / rel
        if not f.is_file() or sha256(f) != digest:
            raise PieceError(CHECKSUM, f"unpacked {rel} does not match the manifest")
    done.write_text(manifest["payload"]["sha256"])
    print(f"payload verified: {len(manifest['files'])} files in {payload}", flush=True)
    return payload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["stage", "assemble"])
    ap.add_argument("--bundle", type=Path, default=Path(".e2e"))
    ap.add_argument("--store", type=Path, default=Path("/tmp/smla-e2e"))
    ap.add_argument("--use-stored-manifest", action="store_true",
                    help="without a carried manifest, use the one an earlier stage kept in the store")
    args = ap.parse_args(argv)
    try:
        if args.action == "stage":
            stage(args.bundle, args.store, args.use_stored_manifest)
        else:
            assemble(args.bundle, args.store, args.use_stored_manifest)
    except PieceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
