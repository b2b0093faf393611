"""Build the Triton 3.8 bundle for the lent H200 (`make t38-bundle`; issue 32, "Proof on the H200").

vLLM 0.33.0 pins torch 2.14 -> Triton 3.8; the H200's image has torch 2.11 + Triton 3.6 and no
network. Triton 3.8 runs there beside torch 2.11 when it is installed with
`pip install --no-deps --target`, but its wheel (236 MB) is over a call's 64 MiB. This builds,
under OUT (default `.t38/`, ignored by git), with tests/e2e/bundle.py's pieces:

  build/triton-3.8.0-cp312-*.whl  the wheel less what a sm90 run never loads (DROP below; every
                                  kept member byte-identical to the source wheel's, checked against
                                  its RECORD; RECORD lists exactly the kept members)
  payload.tar.xz, pieces/NN/payload.partNN, manifest.json   as tests/e2e/bundle.py writes them

tests/e2e/device_pieces.py checks and reassembles the pieces on the device
(tests/gpu/device-run.sh t38-stage / t38, which also say what each call carries).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2e"))

import bundle  # noqa: E402  (tests/e2e/bundle.py)
from smla.errors import SmlaError  # noqa: E402

REQUIREMENT = "triton==3.8.0"
# (rule, reason): members a sm90 kernel run does not load. Rules ending in "/" are prefixes.
DROP: list[tuple[str, str]] = [
    ("triton/backends/nvidia/bin/ptxas-blackwell",
     "ptxas for sm100+ only (backends/nvidia/compiler.py get_ptxas: arch >= 100)"),
    ("triton/backends/nvidia/lib/cupti/", "CUPTI: the proton profiler's only"),
    ("triton/backends/nvidia/lib/cupti-blackwell/", "CUPTI: the proton profiler's only"),
    ("triton/_C/libproton.so", "the proton profiler (triton.profiler imports it; triton does not)"),
    ("triton/instrumentation/libGPUInstrumentationTestLib.so", "a test library"),
    ("triton/plugins/libTritonPluginsTestLib.so", "a test library"),
]


def drop(name: str) -> str | None:
    for rule, reason in DROP:
        if name == rule or (rule.endswith("/") and name.startswith(rule)):
            return reason
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=Path(".t38"), type=Path)
    ap.add_argument("--wheel", type=Path, default=None,
                    help="the Triton 3.8.0 cp312 wheel (default: pip download into OUT/dl)")
    ap.add_argument("--piece-mib", default=bundle.PIECE_MIB, type=int,
                    help="piece size; the repo itself also travels within the 64 MiB of a call")
    ap.add_argument("--resplit", action="store_true", help="only cut OUT's payload again (bundle.py --resplit)")
    args = ap.parse_args(argv)
    out = args.out
    try:
        if args.resplit:
            return bundle.resplit(out, args.piece_mib << 20)
        wheel = args.wheel
        if wheel is None:
            req = out / "requirements.txt"
            out.mkdir(parents=True, exist_ok=True)
            req.write_text(REQUIREMENT + "\n")
            names = bundle.download_deps(req, out / "dl")
            wheel = out / "dl" / next(n for n in names if n.startswith("triton-3.8.0-cp312"))
        build = out / "build"
        if build.exists():
            shutil.rmtree(build)
        summary = bundle.reduce_wheel(wheel.resolve(), build, drop=drop)
        payload, sums = bundle.write_payload(build, out)
        pieces = bundle.split(payload, out, args.piece_mib << 20)
        manifest = {
            "format": 1,
            "extra": False,
            "kind": "triton",
            "wheel": summary,
            "deps": [],
            "files": sums,
            "payload": {"file": payload.name, "bytes": payload.stat().st_size,
                        "sha256": bundle._sha256_file(payload)},
            "pieces": pieces,
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        (out / "payload.tar").unlink(missing_ok=True)
    except SmlaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    mib = 1 << 20
    print(f"reduced wheel {summary['file']}: {summary['members']} members, "
          f"{summary['member_bytes'] / mib:.1f} MiB (dropped "
          + ", ".join(f"{k}: {v / mib:.1f} MiB" for k, v in summary["dropped_bytes"].items()) + ")")
    print(f"payload {manifest['payload']['bytes'] / mib:.1f} MiB in {len(pieces)} pieces")
    for p in pieces:
        print(f"  {out}/{p['path']}  {p['bytes'] / mib:.1f} MiB")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
