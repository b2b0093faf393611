"""The sequence that once hit an illegal memory access on the H200: DeepGEMM's
and our paged logits captured and replayed as CUDA graphs one after the
other, 32 x 64k then 128 x 16k (issue 19).  Exit 0 when every replay
synchronises cleanly; run it under compute-sanitizer to name the kernel.

usage: python bench/indexer/graph_sequence.py [ours|deepgemm|both]
env:   SMLA_TREE, SMLA_DEEPGEMM_DIR, SMLA_VLLM_C_SO
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "bench"))

from indexer_reference import build_paged_case  # noqa: E402
from test_indexer_gpu import BS, D, H, load_deepgemm, load_vllm_ops  # noqa: E402
from timing import capture, kernel_modules  # noqa: E402

MAX_MODEL_LEN = 65536


def replay(fn, n=20):
    g, out = capture(fn)
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return out


def main(which: str) -> None:
    idx, _ = kernel_modules("vllm/v1/attention/ops/triton_dsa_indexer.py", "smla_idx_seq")
    dg = load_deepgemm()
    ops = load_vllm_ops()
    for i, (B, ctx) in enumerate([(32, 65536), (128, 16384)]):
        case = build_paged_case("cuda", [ctx] * B, 1, H, D, BS, 300 + i, ops,
                                max_model_len=MAX_MODEL_LEN)
        a = (case["q_fp8"], case["kv"], case["w"], case["lens2d"], case["bt"], MAX_MODEL_LEN)
        if which in ("deepgemm", "both") and dg is not None:
            sched = dg.schedule(case["lens2d"], BS)
            replay(lambda: dg.paged(*a, clean=False, sched=sched))
            print(f"deepgemm {B}x{ctx}: ok", flush=True)
        if which in ("ours", "both"):
            replay(lambda: idx.paged_mqa_logits(*a, clean_logits=False))
            print(f"ours {B}x{ctx}: ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "both")
