"""The tiny DeepSeek-V4 checkpoint's config.json (the 0.26.0 line's
tests/e2e/models/deepseek-v4-tiny) through vLLM 0.33.0's own config path on the CPU
(tiny_config_check.py in a subprocess): transformers' DeepseekV4Config, vLLM's DeepSeek-V4
fp8 quantization config, per-layer compress ratios, and the attention/indexer/mHC geometry the
0.33.0 V4 layers read. Weights are not loaded here (see README)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import TREE

HERE = Path(__file__).parent
TINY = Path(__file__).resolve().parents[3] / "e2e" / "models" / "deepseek-v4-tiny"


def test_tiny_config_parses_with_033(tmp_path):
    shutil.copy(TINY / "config.json", tmp_path / "config.json")
    env = dict(os.environ, PYTHONPATH=str(TREE))
    proc = subprocess.run([sys.executable, str(HERE / "tiny_config_check.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    cfg = json.loads((TINY / "config.json").read_text())
    assert got["config_class"] == "DeepseekV4Config"
    assert got["architectures"] == ["DeepseekV4ForCausalLM"]
    assert got["quantization"] == "deepseek_v4_fp8"
    assert got["compress_ratios"] == cfg["compress_ratios"] == [0, 4, 128, 0]
    for key, value in got["geometry"].items():
        assert value == cfg[key], key
