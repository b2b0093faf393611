#!/usr/bin/env python3
"""What one launch-table tile of the sparse-MLA kernel compiles to, per loop step (CPU, no GPU).

    python tests/kernel_sass_loop.py TREE ARCH HEADS TOKENS [--fp8] [--dtype fp16] [NAME=INT ...]

Compiles the 16-bit (or dequantising fp8) kernel the launch table picks for HEADS x TOKENS on ARCH,
with the engine call's 16-byte alignment and the launcher's constexprs (NAME=INT overrides one,
e.g. PREFETCH_LINES=0 or D_PE=0 for NoPE), and prints one JSON object: the tile, ptxas's
performance-loss notes (sm90 wgmma kernels), registers / stack / shared memory, and the SASS of
the main loop (the longest backward branch): its instruction count and the count per opcode.
How sm90's 64-head tile was found to wait for every wgmma (40 WARPGROUP.DEPBAR per step, ptxas
note C7515; bench/results/wgmma-serial-2026-12-05/). Run without TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
# "@P0 BRA 0x20", and sm120's "BRA.U !UP0, 0x2e00" (a uniform predicate as an operand)
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)")
PREDICATE = re.compile(r"^@!?U?P[0-9T]+\s+")


def main_loop(sass: str) -> list[str]:
    """The instructions of the longest backward branch's body (the kernel's tile loop)."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in SASS_LINE.finditer(sass)]
    best = None
    for addr, text in ins:
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < addr:
            span = (int(m.group(1), 16), addr)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        return []
    return [text for addr, text in ins if best[0] <= addr <= best[1]]


def opcode(text: str) -> str:
    return PREDICATE.sub("", text).split()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree")
    ap.add_argument("arch", type=int)
    ap.add_argument("heads", type=int)
    ap.add_argument("tokens", type=int)
    ap.add_argument("--fp8", action="store_true", help="fp8_ds_mla rows (the dequantising tiles)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("overrides", nargs="*", help="NAME=INT constexpr overrides")
    a = ap.parse_args()
    # Triton and the kernel helpers only here: importing this module for main_loop (its test)
    # must not import Triton ahead of the interpreter tests, which set TRITON_INTERPRET first.
    import triton

    from kernel_ptx_hashes import plan_kernel
    from sparse_mla_reference import MODULE_REL, load_tree_module
    from test_kernel_compile import _ptxas_perf_losses, _resources, triton_tool
    from test_kernel_compile_matrix import _runtime_attrs

    overrides = {k: int(v) for k, v in (o.split("=", 1) for o in a.overrides)}
    mod = load_tree_module(a.tree, MODULE_REL, "sass", False)
    cfg, cst, k = plan_kernel(mod, a.arch, a.dtype, a.heads, a.tokens, a.fp8, overrides,
                              _runtime_attrs(mod._sparse_mla_fwd_kernel))
    tool = triton_tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    loop = main_loop(sass)
    print(json.dumps(dict(
        triton=triton.__version__, arch=a.arch, heads=a.heads, tokens=a.tokens, fp8=a.fp8,
        config=cfg, constexprs={n: v for n, v in cst.items() if isinstance(v, (int, bool))},
        ptxas_perf_losses=_ptxas_perf_losses(k.asm["ptx"], a.arch),
        shared=int(k.metadata.shared), **_resources(k.asm["cubin"]),
        loop_instructions=len(loop),
        loop_opcodes=dict(collections.Counter(opcode(t) for t in loop).most_common())),
        indent=1))


if __name__ == "__main__":
    main()
