"""Compile-only portability check of the Triton sparse-MLA kernels (CPU, no GPU).

Triton ships ptxas, so `triton.compile(ASTSource(...), target=GPUTarget(...))`
builds PTX and a cubin for any CUDA arch on a machine without a GPU.  For each
arch this compiles, with the launch configuration that `sparse_mla_config`'s
heuristic picks for that arch:
  - the attention kernel (bf16 where the arch has it, fp16 else; 16 and 64
    heads, the smallest and the largest head tile),
  - the split-K merge kernel and the slot-conversion kernel,
then checks the cubin and PTX exist and that the kernel's static shared memory
fits that arch's per-block limit (so the heuristic never picks a config that
cannot launch there), and reports registers / spills from cuobjdump.

The compile runs in a subprocess with TRITON_INTERPRET removed from its
environment: tests/test_kernel_interpret.py sets TRITON_INTERPRET=1 for the
whole pytest process at import, and under it `@triton.jit` yields interpreted
functions that cannot be compiled.  `python tests/test_kernel_compile.py
--report 90` prints the same report by hand (also used by bench/ tuning).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lineproofs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Per-block shared-memory limit (opt-in maximum, bytes) by compute capability.
SMEM_LIMIT = {
    80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376,
    121: 101376,
}
ARCHES = [80, 86, 89, 90, 100, 120, 121]


def _signature(fn, dt, ptr_types, constexpr_names, float_names=()):
    sig = {}
    for a in fn.arg_names:
        if a in ptr_types:
            sig[a] = "*" + (dt if ptr_types[a] == "dt" else ptr_types[a])
        elif a in constexpr_names:
            sig[a] = "constexpr"
        elif a in float_names:
            sig[a] = "fp32"
        else:
            sig[a] = "i32"
    return sig


def triton_tool(name: str) -> Path:
    """A CUDA tool Triton ships (ptxas, cuobjdump, ...): backends/nvidia/bin/NAME."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _resources(cubin: bytes) -> dict:
    """REG / STACK / SHARED / LOCAL of the cubin's kernel via Triton's cuobjdump."""
    import tempfile

    tool = triton_tool("cuobjdump")
    if not tool.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        r = subprocess.run([str(tool), "--dump-resource-usage", f.name],
                           capture_output=True, text=True)
    res = {}
    for line in r.stdout.splitlines():
        if "REG:" in line:
            for tok in line.replace(",", " ").split():
                if ":" in tok:
                    k, v = tok.split(":", 1)
                    if v.isdigit():
                        res["sass_" + k.lower()] = int(v)
    return res


def compile_report(arch: int, configs: list[dict] | None = None) -> list[dict]:
    """Compile the kernels for `arch`; one dict per compiled kernel.

    Must run without TRITON_INTERPRET (see the module docstring)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sparse_mla_reference import load_sparse_mla_module

    from conftest import default_tree

    mod = load_sparse_mla_module(default_tree(), interpret=False)
    target = GPUTarget("cuda", arch, 32)
    cap = (arch // 10, arch % 10)
    dt_name, dtype = ("bf16", torch.bfloat16) if arch >= 80 else ("fp16", torch.float16)
    out = []

    def build(fn, sig, cst, opts, label):
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cst), target=target,
                           options=opts)
        rec = dict(arch=arch, kernel=label, shared=int(k.metadata.shared),
                   smem_limit=SMEM_LIMIT.get(arch), has_cubin=len(k.asm.get("cubin", b"")) > 0,
                   has_ptx=len(k.asm.get("ptx", "")) > 0, **opts)
        rec.update(_resources(k.asm["cubin"]) if rec["has_cubin"] else {})
        out.append(rec)

    fwd = mod._sparse_mla_fwd_kernel
    fwd_sig = _signature(
        fwd, dt_name,
        dict(q_ptr="dt", q_pe_ptr="dt", kv_ptr="dt", slots_ptr="i32", out_ptr="dt", part_out_ptr="fp32",
             part_lse_ptr="fp32"),
        {"D_NOPE", "D_PE", "KV_BS", "BLOCK_H", "BLOCK_N", "BLOCK_DV", "SPLIT", "PDL",
         "KV_FP8", "FP8_HW", "ROPE_DT", "PACKED", "FP8_PINNED", "SPLIT_SCORES", "PREFETCH_LINES"},
        float_names=("qk_scale",))
    if configs is None:
        configs = []
        for H in (16, 64):
            cfg = mod._config_for(H, 4096, 2048, dtype, 132, cap)
            configs.append(dict(cfg, H=H))
    for cfg in configs:
        cst = dict(D_NOPE=512, D_PE=64, KV_BS=64, BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"],
                   KV_FP8=False, FP8_HW=False, ROPE_DT=None,
                   BLOCK_DV=cfg["BLOCK_DV"], SPLIT=bool(cfg.get("SPLIT", False)),
                   PDL=bool(cfg.get("SPLIT", False)) and arch >= 90, PACKED=False,
                   FP8_PINNED=False,
                   SPLIT_SCORES=mod._split_scores(cap, cfg["BLOCK_H"], cfg["num_warps"]))
        # as the launcher gives it on an NVIDIA GPU (16-bit rows of 576 values)
        cst["PREFETCH_LINES"] = mod._prefetch_lines(cst["SPLIT_SCORES"], 2 * 576,
                                                    torch.device("cuda"))
        label = "fwd H{} BH{} BN{} DV{}".format(cfg.get("H", "?"), cfg["BLOCK_H"], cfg["BLOCK_N"],
                                                 cfg["BLOCK_DV"])
        build(fwd, fwd_sig, cst,
              dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]), label)

    merge = mod._sparse_mla_merge_kernel
    msig = _signature(merge, dt_name, dict(part_out_ptr="fp32", part_lse_ptr="fp32", out_ptr="dt"),
                      {"D_NOPE", "BLOCK_S", "PDL"})
    build(merge, msig, dict(D_NOPE=512, BLOCK_S=16, PDL=arch >= 90),
          dict(num_warps=4, num_stages=1), "merge S16")

    conv = mod._convert_req_local_to_slots_kernel
    csig = _signature(conv, "i32", dict(req_id_ptr="i32", block_table_ptr="i32", topk_ptr="i32",
                                        out_ptr="i32"), {"BLOCK"})
    build(conv, csig, dict(BLOCK=128), dict(num_warps=4, num_stages=1), "convert")
    return out


def _run_child(arch: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, __file__, "--json", str(arch)], capture_output=True,
                       text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# The GPU's e4m3 conversions in PTX (cvt ... e4m3 ...), instruction lines only: the debug info
# names files such as triton_fp8_e4m3.py.
E4M3_CVT = re.compile(r"^\s*(?:@!?%\w+\s+)?cvt\.[\w.]*e4m3", re.MULTILINE)
# Shared-memory loads of one byte (PTX ld.shared.u8 / .b8 / .s8): e4m3 codes read into a
# tensor-core operand's registers one byte per lane.
SHARED_BYTE_LOAD = re.compile(r"^\s*(?:@!?%\w+\s+)?ld\.shared\.[usb]8\b", re.MULTILINE)
# Arithmetic shifts (PTX shr.s32 / shr.s64): how signed division by a constant compiles, e.g.
# a slot's block and row as slot // KV_BS and slot % KV_BS on signed integers.
SIGNED_SHIFT = re.compile(r"^\s*(?:@!?%\w+\s+)?shr\.s(?:32|64)\b", re.MULTILINE)


# ptxas's "Potential Performance Loss" notes (ptxas -v), e.g. "(C7515) Potential Performance
# Loss: wgmma.mma_async instructions are serialized due to ...": Triton runs ptxas with -v but
# shows its log only under TRITON_DUMP_PTXAS_LOG.
PTXAS_PERF_LOSS = re.compile(r"\((C\d+)\) Potential Performance Loss")


def _ptxas_perf_losses(ptx: str, arch: int) -> list[str]:
    """The codes of ptxas's performance-loss notes for a kernel's PTX: sm90's wgmma kernels
    only (compiled again here with -v, as Triton compiles them), [] for every other."""
    import tempfile

    if arch != 90 or "wgmma.mma_async" not in ptx:
        return []
    tool = triton_tool("ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        r = subprocess.run([str(tool), "-lineinfo", "-v", "--gpu-name=sm_90a", str(src),
                            "-o", str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return sorted(set(PTXAS_PERF_LOSS.findall(r.stdout + r.stderr)))


def finish_record(rec: dict, k) -> dict:
    """Add to a compile record what every compile-only test checks: the arch's shared-memory
    limit, cubin / PTX present, the hardware e4m3 conversions, the one-byte shared-memory
    loads, the L2 prefetches and the arithmetic shifts in the PTX, registers / spills,
    ptxas's performance-loss notes (sm90's wgmma kernels)."""
    ptx = k.asm.get("ptx", "")
    rec["smem_limit"] = SMEM_LIMIT[rec["arch"]]
    rec["has_cubin"] = len(k.asm.get("cubin", b"")) > 0
    rec["has_ptx"] = len(ptx) > 0
    rec["e4m3_cvt"] = len(E4M3_CVT.findall(ptx))
    rec["shared_byte_loads"] = len(SHARED_BYTE_LOAD.findall(ptx))
    rec["l2_prefetches"] = ptx.count("prefetch.global.L2")
    rec["signed_shifts"] = len(SIGNED_SHIFT.findall(ptx))
    rec["ptxas_perf_losses"] = _ptxas_perf_losses(ptx, rec["arch"])
    if rec["has_cubin"]:
        rec.update(_resources(k.asm["cubin"]))
    return rec


def arch_children(script: str, env: dict | None = None, timeout: int = 3600) -> dict:
    """`python script ARCH` for every arch the bundled ptxas knows, os.cpu_count() at a time,
    without TRITON_INTERPRET (see the module docstring): {arch: CompletedProcess}."""
    from concurrent.futures import ThreadPoolExecutor

    env = {k: v for k, v in (env or os.environ).items() if k != "TRITON_INTERPRET"}
    arches = [a for a in ARCHES if _ptxas_supports(a)]

    def run(arch):
        return subprocess.run([sys.executable, script, str(arch)], capture_output=True, text=True,
                              env=env, timeout=timeout)

    with ThreadPoolExecutor(max_workers=max(1, min(len(arches), os.cpu_count() or 1))) as pool:
        return dict(zip(arches, pool.map(run, arches)))


def arch_children_fixture(script: str):
    """A module-scoped fixture for a compile module: `children = arch_children_fixture(__file__)`
    gives its tests {arch: CompletedProcess} of `arch_children(script)` (skips without Triton)."""

    @pytest.fixture(scope="module")
    def children():
        """One child per arch ptxas knows, run concurrently: {arch: CompletedProcess}."""
        pytest.importorskip("triton")
        return arch_children(script)
    return children


def arch_records(children: dict, arch: int) -> list[dict]:
    """The compile records one child of `arch_children` printed (skips an arch ptxas lacks)."""
    if arch not in children:
        pytest.skip(f"bundled ptxas does not list sm_{arch}")
    r = children[arch]
    assert r.returncode == 0, r.stderr[-4000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def assert_compiled(recs: list[dict]) -> None:
    """Every record has a cubin and PTX, fits its arch's shared memory and draws no
    performance-loss note from ptxas (printed).  Such a note once went unseen for a whole
    tile: sm90's 64-head 16-bit tile had every wgmma serialized (C7515) until its loop was
    known to run at least once."""
    too_big = [x for x in recs if x["shared"] > x["smem_limit"]]
    assert not too_big, too_big
    noted = [x for x in recs if x.get("ptxas_perf_losses")]
    assert not noted, "ptxas notes a performance loss (ptxas -v):\n" + "\n".join(
        json.dumps(x) for x in noted)
    for x in recs:
        assert x["has_cubin"] and x["has_ptx"], x
        print(json.dumps(x))


def _ptxas_supports(arch: int) -> bool:
    names = ["ptxas-blackwell", "ptxas"] if arch >= 100 else ["ptxas"]
    for name in names:
        tool = triton_tool(name)
        if not tool.exists():
            continue
        r = subprocess.run([str(tool), "--help"], capture_output=True, text=True)
        if f"sm_{arch}" in r.stdout:
            return True
    return False


@pytest.mark.parametrize("arch", ARCHES)
def test_kernels_compile_for_arch(arch):
    """Kernels compile for `arch` (compile-only, subprocess without TRITON_INTERPRET)."""
    pytest.importorskip("triton")
    if not _ptxas_supports(arch):
        pytest.skip(f"bundled ptxas does not list sm_{arch}")
    recs = _run_child(arch)
    assert len(recs) == 4
    for r in recs:
        assert r["has_cubin"] and r["has_ptx"], r
        assert r["shared"] <= SMEM_LIMIT[arch], (
            f"sm_{arch}: {r['kernel']} needs {r['shared']} B shared memory > {SMEM_LIMIT[arch]}")


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    args = sys.argv[1:]
    if args and args[0] == "--json":
        print(json.dumps(compile_report(int(args[1]))))
    elif args and args[0] == "--configs":
        # --configs ARCH JSON_LIST: resource report of explicit configs (tuning aid)
        for r in compile_report(int(args[1]), json.loads(args[2]))[:-2]:
            print(json.dumps(r))
    else:
        for a in (args[1:] if args and args[0] == "--report" else ARCHES):
            for r in compile_report(int(a)):
                print(json.dumps(r))


# tests/lines/<line>/indexer/test_fused_compile.py: 0.33.0's fused DeepSeek-V3.2 / GLM cache-write and
# index-query kernels (new in 0.33.0, fp8e4nv upstream) compiled for sm80/86 on the series' software
# e4m3 encode (and, as the failure the series fixes, not with upstream's fp8e4nv types on sm80),
# sm89/90 on the hardware path.
# tests/lines/<line>/indexer/test_kpool_compile.py: GLM-5.3-Flash's kpool kernels (fp8e4nv upstream) and
# the Triton logits with its pooled geometry (16 heads, 32/64-pool pages), sm80 to sm121.
LINE_PROOFS = {"0.33.0": [("indexer", "test_fused_compile.py", 5),
                          ("indexer", "test_kpool_compile.py", 13)]}


@pytest.mark.parametrize("case", lineproofs.cases(LINE_PROOFS, "its line has no fused fp8e4nv kernels"))
def test_line_fused_kernels_compile(vllm_tree, case):
    lineproofs.check(case, vllm_tree)
