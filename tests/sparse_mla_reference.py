"""Test helpers for the Triton sparse-MLA kernels.

- `load_sparse_mla_module(tree, interpret)` loads
  vllm/v1/attention/ops/triton_sparse_mla.py by file path (no `import vllm`),
  (TRITON_INTERPRET must be set before triton is imported; see its docstring).
- `reference_sparse_mla(...)` is the float64 reference both CPU and GPU tests use.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

MODULE_REL = "vllm/v1/attention/ops/triton_sparse_mla.py"


def load_tree_module(tree: Path, rel: str, prefix: str, interpret: bool = False,
                     missing: str | None = None):
    """Load `rel` of a vLLM tree by path (interpreted or compiled variant) as
    module `<prefix>_interp|_gpu`, once per process.

    Triton 3.6 reads TRITON_INTERPRET when `@triton.jit` decorates -- including
    its own `triton.language.standard` helpers at `import triton` -- and again
    at the first interpreted launch (lazy gluon import asserts it).  So the
    variable must be set before triton is first imported and stay set; it
    cannot be scoped to this load.  Interpreted (CPU) and compiled (GPU)
    kernels therefore cannot share one Python process.  A missing file fails
    the test with `missing` (what is not applied) when given.
    """
    want = "1" if interpret else "0"
    have = "1" if os.environ.get("TRITON_INTERPRET", "0") in ("1", "true", "on") else "0"
    if have != want:
        raise RuntimeError(
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r} but interpret={interpret}: "
            "set it before triton is imported; run CPU and GPU tests in separate processes")
    name = prefix + ("_interp" if interpret else "_gpu")
    if name in sys.modules:
        return sys.modules[name]
    provide_ops_package(Path(tree))
    path = Path(tree) / rel
    if missing is not None and not path.is_file():
        import pytest

        pytest.fail(f"{rel} is missing in the vLLM tree {tree}: {missing} (SMLA_TREE overrides the tree)")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[name] = mod
    return mod


OPS_PACKAGE = "vllm.v1.attention.ops"


def provide_ops_package(tree: Path) -> None:
    """Make ``vllm.v1.attention.ops.<kernel module>`` importable from `tree`
    without running vLLM's package __init__ files (the kernel modules import
    their shared helpers, e.g. triton_fp8_e4m3, by absolute name).  Where a
    real ``vllm`` is already imported (the backend tests), it is used as is."""
    import types

    if "vllm" in sys.modules:
        return
    parts = OPS_PACKAGE.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(Path(tree).joinpath(*parts[:i]))]
        pkg.__smla_stub__ = True
        sys.modules[name] = pkg
    provide_triton_utils()


def provide_triton_utils() -> None:
    """``vllm.triton_utils`` as the kernel modules see it on a GPU: the real Triton. vLLM's own
    module hands out its placeholder where no Triton driver is active (this CPU: "0 active
    driver(s)"), so kernels that import Triton through it would not be Triton functions under
    the interpreter or the compile checks."""
    import types

    import triton
    import triton.language as tl

    mod = types.ModuleType("vllm.triton_utils")
    mod.__smla_stub__ = True
    mod.HAS_TRITON, mod.triton, mod.tl = True, triton, tl
    mod.LOG2E, mod.LOGE2 = 1.4426950408889634, 0.6931471805599453
    sys.modules["vllm.triton_utils"] = mod


def load_sparse_mla_module(tree: Path, interpret: bool = False):
    """The series' sparse-MLA kernel module (see load_tree_module)."""
    return load_tree_module(tree, MODULE_REL, "smla_triton_sparse_mla", interpret)


def flat_kv(kv_cache: torch.Tensor) -> torch.Tensor:
    return kv_cache.reshape(-1, kv_cache.shape[-1])


def reference_sparse_mla(q, kv_cache, slots, sm_scale, kv_lora_rank=512,
                         token_chunk: int | None = None):
    """float64 reference: [T, H, kv_lora_rank] in float64 on q's device.

    For token t, head h, over valid slots j (slot >= 0):
    s_j = sm_scale * <q[t,h,:], kv[slot_j,:]>, p = softmax(s),
    out[t,h,:] = sum_j p_j kv[slot_j,:kv_lora_rank]; zeros if no valid slot.
    `token_chunk` bounds memory (gathers chunk*K rows of float64 at a time).
    """
    kv = flat_kv(kv_cache)
    T, H, _ = q.shape
    out = torch.zeros((T, H, kv_lora_rank), dtype=torch.float64, device=q.device)
    chunk = token_chunk or T
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        sl = slots[t0:t1].long()
        valid = sl >= 0
        g = kv[sl.clamp(min=0)].double()  # [c, K, D]
        qq = q[t0:t1].double()  # [c, H, D]
        s = torch.einsum("chd,ckd->chk", qq, g) * sm_scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        any_valid = valid.any(dim=1)  # [c]
        s = torch.where(any_valid[:, None, None], s, torch.zeros_like(s))
        p = torch.softmax(s, dim=-1)
        p = torch.where(any_valid[:, None, None], p, torch.zeros_like(p))
        out[t0:t1] = torch.einsum("chk,ckd->chd", p, g[..., :kv_lora_rank])
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.double() - ref).norm().item()
    den = ref.norm().item()
    return diff / den if den > 0 else diff


def reference_convert(req_id, block_table, topk_local, block_size):
    """Plain-loop reference for convert_req_local_to_slots."""
    T, K = topk_local.shape
    nb = block_table.shape[1]
    out = torch.full((T, K), -1, dtype=torch.int32)
    bt = block_table.cpu().tolist()
    tk = topk_local.cpu().tolist()
    rq = req_id.cpu().tolist()
    for t in range(T):
        for k in range(K):
            pos = tk[t][k]
            if pos < 0 or pos // block_size >= nb:
                continue
            out[t, k] = bt[rq[t]][pos // block_size] * block_size + pos % block_size
    return out
