"""pytest plugin for the GPU machine (no vLLM installed there): make
``vllm.v1.attention.ops`` importable from the tree in SMLA_TREE, and
``vllm.platforms.current_platform`` answer from torch.cuda
(tests/gpu/platform_stand_in.py), so that the series' own kernel tests
(tests/kernels/attention/test_triton_*.py of the patched tree,
on vLLM's platform API since issue 33) run as they would in vLLM.
usage: PYTHONPATH=tests:tests/gpu python3 -m pytest -p series_ops_stub <tree>/tests/kernels/attention/test_triton_*.py"""
from __future__ import annotations

import os
from pathlib import Path

from platform_stand_in import provide_platforms
from sparse_mla_reference import provide_ops_package

provide_ops_package(Path(os.environ["SMLA_TREE"]))
provide_platforms()
