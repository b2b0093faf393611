"""Helpers shared by the benchmarks (GPU only).

- ``parse_args(doc, extra)``: OUT_DIR [--quick] [--sweep] (+ what ``extra(parser)``
  adds), OUT_DIR created.
- ``kernel_modules(rel, prefix)``: (the kernel file ``rel`` of SMLA_TREE,
  the same file of SMLA_TREE_BEFORE or None), loaded by path; the earlier
  file with the kernel modules it imports from its own tree
  (``load_with_own_siblings``, also kernel_variants.py's loader).

- ``median_us(fn, graph)``: median µs of ``fn`` with triton.testing.do_bench
  (CUDA events, L2 flushed before each run), eager or as CUDA-graph replays
  (warmed up on a side stream, then captured once).
- ``capture(fn)``: the CUDA graph of one call of ``fn`` (and its output).
- ``copy_tbps()``: device-to-device copy bandwidth of 1 GiB, bytes read +
  written over time (the bytes floor the benchmarks compare against).
- ``host_us(fn)``: host time per eager call, 2,000 calls queued back to back.
- ``emulate_capability(cap, *mods)``: the launch table of a GPU without wgmma
  (e.g. "8.0", "8.9", "12.0") on the H200, its dots compiled as mma.sync.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from sparse_mla_reference import OPS_PACKAGE, load_tree_module, provide_ops_package  # noqa: E402


def _line_tree(repo: Path) -> Path:
    """The work tree of the line under test, as tests/conftest.py: $SMLA_LINE, else the newest line."""
    lines = sorted((p.parent.name for p in (repo / "lines").glob("*/vllm-pin.txt")),
                   key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))
    return repo / "work" / (os.environ.get("SMLA_LINE") or lines[-1]) / "vllm"


def parse_args(doc: str | None = None, extra=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--quick", action="store_true", help="a smoke grid")
    ap.add_argument("--sweep", action="store_true", help="also time other launch configs")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    args.out_dir = Path(args.out_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return args


def emulate_capability(cap: str, *mods) -> tuple[int, int]:
    """Run the kernels as a GPU of capability `cap` would (an arch-generic proxy of sm80-89 /
    sm120 on the H200): the modules' device query answers `cap` with this GPU's SM count, so
    their launch tables pick that arch's tiles, e4m3 path and PDL; and Triton compiles every dot
    as mma.sync (DISABLE_MMA_V3, which Triton's cache key includes), as it does for GPUs without
    wgmma.  Set before the first compile; prewarm workers inherit it through the environment.
    The H200's shared memory, clocks and bandwidth stay."""
    major, minor = (int(x) for x in cap.split("."))
    if major in (8, 12):
        os.environ["DISABLE_MMA_V3"] = "1"
    for mod in mods:
        if mod is None:
            continue
        real = mod._device_info

        def fake(device, real=real):
            sms, _ = real(device)
            return sms, (major, minor)

        mod._device_info = fake
    return major, minor


def kernel_modules(rel: str, prefix: str):
    now = load_tree_module(Path(os.environ.get("SMLA_TREE", _line_tree(REPO))), rel,
                           prefix + "_now")
    before = None
    if os.environ.get("SMLA_TREE_BEFORE"):
        before = load_with_own_siblings(Path(os.environ["SMLA_TREE_BEFORE"]), rel,
                                         prefix + "_before")
    return now, before


def load_with_own_siblings(tree: Path, rel: str, prefix: str):
    """load_tree_module of `tree`, whose imports of vllm.v1.attention.ops.* (e.g. the V4 kernel's
    of the DSA kernel's helpers) resolve to `tree`'s files, not to the modules SMLA_TREE's file
    loaded: the stand-in ops package looks in `tree` while it loads, and the modules imported
    meanwhile are dropped afterwards (the loaded kernels keep their own references). A real
    vLLM package (the backend tests) is used as it is."""
    provide_ops_package(tree)
    pkg = sys.modules[OPS_PACKAGE]
    if not getattr(pkg, "__smla_stub__", False):
        return load_tree_module(tree, rel, prefix)

    def submodules() -> dict:  # name in the package -> module (direct children only)
        n = len(OPS_PACKAGE) + 1
        return {k[n:]: m for k, m in sys.modules.items()
                if k.startswith(OPS_PACKAGE + ".") and "." not in k[n:]}

    saved, saved_path = submodules(), pkg.__path__
    for name in saved:
        del sys.modules[f"{OPS_PACKAGE}.{name}"]
    pkg.__path__ = [str(tree.joinpath(*OPS_PACKAGE.split(".")))]
    try:
        return load_tree_module(tree, rel, prefix)
    finally:
        for name in submodules():
            del sys.modules[f"{OPS_PACKAGE}.{name}"]
            pkg.__dict__.pop(name, None)  # `import package.module` reads this attribute
        for name, m in saved.items():
            sys.modules[f"{OPS_PACKAGE}.{name}"] = m
            setattr(pkg, name, m)
        pkg.__path__ = saved_path


def capture(fn):
    """(graph, output) of one captured call of fn."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    torch.cuda.synchronize()
    return g, out


def median_us(fn, graph: bool = False) -> float:
    if graph:
        fn = capture(fn)[0].replay
    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_tbps() -> float:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=10, rep=50, return_mode="median")
    return 2 * n / (ms * 1e-3) / 1e12


def host_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def prewarm_workers(script: str, n: int, argv: list[str]) -> None:
    """Run `script ARGS --worker i/n` for i < n at once (each compiles its share of the
    launches, so that Triton's disk cache serves the timed process) and wait for them;
    ARGS is the bench's own argv less `--prewarm N` and `--prewarm-only`."""
    import subprocess

    args, skip = [], False
    for a in argv:
        if skip or a == "--prewarm":
            skip = not skip
            continue
        if a != "--prewarm-only":
            args.append(a)
    argv = args
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, script, *argv, "--worker", f"{i}/{n}"])
             for i in range(n)]
    rcs = [p.wait() for p in procs]
    print(f"prewarm: {n} workers, rc {rcs}, {time.time() - t0:.1f} s", flush=True)
