"""The tiny DeepSeek-V4 checkpoint (the 0.26.0 line's generator) loaded into vLLM 0.33.0's own
DeepseekV4ForCausalLM / DeepSeekV4MTP on the CPU, with the CUDA platform faked as an sm86 GPU
(RTX 3090): the 0.26.0 line's cpu_load_check.py (26 checks: config, quantization, MTP draft,
every parameter byte written by load_weights, name mapping spot checks) with its fake GPU's
capability set to 8.6, run against VLLM_COMBO_TREE: the clone with port-idx's three commits
cherry-picked on top (0.33.0's SparseAttnIndexer requires DeepGEMM without them). Asserts the
portable path is what the model builds there: Triton attention, bf16 o_proj, torch/Triton mHC,
Triton indexer logits. Skipped when VLLM_COMBO_TREE (default /tmp/v4combo) is absent."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


E2E = Path(__file__).resolve().parents[3] / "e2e"
COMBO = Path(os.environ["VLLM_COMBO_TREE"])  # set by tests/lineproofs.py: the line's patched tree


def test_tiny_checkpoint_loads_on_fake_sm86(tmp_path):
    ckpt = tmp_path / "ckpt"
    subprocess.run([sys.executable, str(E2E / "models/deepseek-v4-tiny/make_checkpoint.py"),
                    str(ckpt)], check=True, capture_output=True, timeout=900)
    harness = tmp_path / "harness"
    harness.mkdir()
    dry = (E2E / "cpu_dry_run.py").read_text()
    assert "DeviceCapability(9, 0)" in dry
    (harness / "cpu_dry_run.py").write_text(dry.replace(
        "DeviceCapability(9, 0)", "DeviceCapability(8, 6)").replace(
        '"NVIDIA H200"', '"NVIDIA GeForce RTX 3090"'))
    check = (E2E / "models/deepseek-v4-tiny/cpu_load_check.py").read_text()
    check = check.replace("sys.path.insert(0, str(E2E))", f"sys.path.insert(0, {str(harness)!r})")
    (harness / "cpu_load_check.py").write_text(check)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                          "VLLM_TARGET_DEVICE")}
    env["PYTHONPATH"] = str(COMBO)
    proc = subprocess.run([sys.executable, str(harness / "cpu_load_check.py"), str(ckpt)],
                          env=env, capture_output=True, text=True, timeout=1800, cwd="/tmp")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "ALL OK (26 checks)" in out, out[-4000:]
    for line in (
        r"DeepSeek-V4 attention: DeepseekV4TritonAttention \(no FlashMLA sparse kernel on sm86\)",
        r"DeepSeek-V4 attention output projection: bf16",
        r"DeepSeek-V4 mHC kernels: torch/Triton",
        r"Sparse attention indexer: Triton logits",
    ):
        assert re.search(line, out), line
    shutil.rmtree(ckpt)
