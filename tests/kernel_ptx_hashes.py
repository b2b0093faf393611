#!/usr/bin/env python3
"""PTX hashes of the sparse-MLA forward kernel for every tile the launch table picks (CPU, no GPU).

    python tests/kernel_ptx_hashes.py TREE ARCH [PREFIX]

One line per (dtype, heads, tokens, 16-bit or dequantised fp8 kernel): the tile and a hash of the
PTX without its debug lines. Two trees whose lines agree compile to the same GPU code (how the
removal of the float32 query path was shown to change no 16-bit kernel:
tests/gpu/results/refactor-2026-12-03/). Run without TRITON_INTERPRET (see test_kernel_compile.py).
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sparse_mla_reference import MODULE_REL, load_tree_module  # noqa: E402
from test_kernel_compile import _signature  # noqa: E402

DEBUG = (".loc", ".file", "//", ".section", "$L__", ".b8", ".b32", ".b64")  # debug info
CONSTEXPRS = {"D_NOPE", "D_PE", "KV_BS", "BLOCK_H", "BLOCK_N", "BLOCK_DV", "SPLIT", "IEEE_DOT",
              "PDL", "KV_FP8", "FP8_HW", "ROPE_DT", "PACKED", "FP8_PINNED", "SPLIT_SCORES",
              "PREFETCH_LINES"}


def plan_kernel(mod, arch: int, dt_name: str, H: int, T: int, fp8: bool,
                overrides: dict | None = None, attrs: dict | None = None):
    """Compile the kernel the launch table picks for H heads x T tokens on `arch` (the 16-bit
    kernel, also for fp8 rows it dequantises; else the fp8 codes kernel), constexprs and
    register cap as the launcher passes them on an NVIDIA GPU, `overrides` over them; attrs:
    Triton's specialization (e.g. the engine call's 16-byte alignment).
    Returns (cfg, constexprs, compiled kernel)."""
    cap = (arch // 10, arch % 10)
    dtype = torch.bfloat16 if dt_name == "bf16" else torch.float16
    cfg = mod._config_for(H, T, 2048, dtype, 132, cap, kv_fp8=fp8)
    codes = fp8 and not cfg["FP8_DEQUANT"]
    fwd = mod._sparse_mla_fwd_fp8_kernel if codes else mod._sparse_mla_fwd_kernel
    sig = _signature(fwd, dt_name, dict(
        q_ptr="dt", q_pe_ptr="dt", kv_ptr="u8" if fp8 else "dt", slots_ptr="i32",
        out_ptr="dt", part_out_ptr="fp32", part_lse_ptr="fp32"),
        CONSTEXPRS, float_names=("qk_scale",))
    cst = dict(D_NOPE=512, D_PE=64, KV_BS=64, BLOCK_H=cfg["BLOCK_H"],
               BLOCK_N=cfg["BLOCK_N"], BLOCK_DV=512, SPLIT=cfg["num_splits"] > 1,
               PDL=False, KV_FP8=fp8, FP8_HW=fp8 and arch >= 89,
               ROPE_DT=triton.language.bfloat16 if fp8 else None,
               PACKED=fp8, IEEE_DOT=False,
               FP8_PINNED=fp8 and mod._pin_dequant(cap, cfg["num_stages"], cfg["BLOCK_H"]),
               SPLIT_SCORES=mod._split_scores(cap, cfg["BLOCK_H"], cfg["num_warps"]))
    cst["PREFETCH_LINES"] = mod._prefetch_lines(
        cst["SPLIT_SCORES"], 656 if fp8 else 1152, torch.device("cuda"))
    cst.update(overrides or {})
    cst = {k: v for k, v in cst.items() if k in fwd.arg_names}
    options = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg.get("maxnreg"):
        options["maxnreg"] = cfg["maxnreg"]
    k = triton.compile(ASTSource(fn=fwd, signature=sig, constexprs=cst, attrs=attrs),
                       target=GPUTarget("cuda", arch, 32), options=options)
    return cfg, cst, k


def main(tree: str, arch: int, prefix: str = "ptx") -> None:
    mod = load_tree_module(tree, MODULE_REL, prefix, False)
    cap = (arch // 10, arch % 10)
    for dt_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for H in (8, 16, 32, 64):
            for T in (4096, 64):
                for fp8 in (False, True):
                    cfg = mod._config_for(H, T, 2048, dtype, 132, cap, kv_fp8=fp8)
                    if fp8 and not cfg["FP8_DEQUANT"]:
                        continue  # the codes kernel: another kernel
                    cfg, _, k = plan_kernel(mod, arch, dt_name, H, T, fp8)
                    body = "\n".join(ln for ln in k.asm["ptx"].splitlines()
                                     if not ln.lstrip().startswith(DEBUG))
                    print(dt_name, H, T, fp8, cfg["BLOCK_H"], cfg["BLOCK_N"],
                          hashlib.sha256(body.encode()).hexdigest()[:16])


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4])
