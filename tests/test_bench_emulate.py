"""bench/timing.py's emulate_capability (bench_attention.py --emulate): the kernel module's
launch table answers as the emulated GPU would, with this GPU's SM count, and Triton is told to
compile dots as mma.sync (DISABLE_MMA_V3) for GPUs without wgmma, not for sm90."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # the kernel module loads under the interpreter (CPU)

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from sparse_mla_reference import load_sparse_mla_module  # noqa: E402
from timing import emulate_capability  # noqa: E402


def test_emulate_capability(vllm_tree, monkeypatch):
    smla = load_sparse_mla_module(vllm_tree, interpret=True)
    # emulate_capability replaces it: monkeypatch puts the real one back afterwards
    monkeypatch.setattr(smla, "_device_info", lambda device: (132, (9, 0)))
    # emulate_capability sets DISABLE_MMA_V3 in os.environ: setenv first makes monkeypatch
    # restore its absence afterwards (delenv of an absent variable records nothing, and a
    # leaked DISABLE_MMA_V3 makes later compile checks build mma.sync kernels for sm90)
    monkeypatch.setenv("DISABLE_MMA_V3", "0")
    monkeypatch.delenv("DISABLE_MMA_V3")
    cpu = torch.device("cpu")
    assert smla.sparse_mla_config(64, 4096, 2048, torch.bfloat16, cpu)["BLOCK_H"] == 64
    assert emulate_capability("9.0", smla) == (9, 0)
    assert "DISABLE_MMA_V3" not in os.environ  # sm90 keeps wgmma
    assert emulate_capability("8.0", smla, None) == (8, 0)
    assert os.environ["DISABLE_MMA_V3"] == "1"
    assert smla._device_info(cpu) == (132, (8, 0))
    cfg = smla.sparse_mla_config(64, 4096, 2048, torch.bfloat16, cpu, "fp8_ds_mla")
    assert cfg["BLOCK_H"] == 32 and not cfg["FP8_DEQUANT"]  # the sm80 table
