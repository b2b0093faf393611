"""Run the series' kernel test module (tests/kernels/attention/test_triton_sparse_mla.py
of the 0.33.0 tree) on the CPU under Triton's interpreter: DEVICE set to "cpu", test
functions called directly. bfloat16 left out (the interpreter has no bf16 arithmetic)."""
import importlib.util
import os
import sys
import types
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
import torch  # noqa: E402

tree = Path(sys.argv[1])
# vllm.v1.attention.ops.* importable without running vLLM's package __init__s
parts = "vllm.v1.attention.ops".split(".")
for i in range(1, len(parts) + 1):
    m = types.ModuleType(".".join(parts[:i]))
    m.__path__ = [str(tree.joinpath(*parts[:i]))]
    sys.modules[m.__name__] = m
spec = importlib.util.spec_from_file_location(
    "t", tree / "tests/kernels/attention/test_triton_sparse_mla.py")
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
t.DEVICE = "cpu"
for kv in ("auto", "fp8_ds_mla"):
    for h, n in ((8, 1), (64, 5)):
        t.test_sparse_mla_fwd(kv, h, n, torch.float16, False, topk=64)  # software e4m3
        print("ok test_sparse_mla_fwd", kv, h, n, flush=True)
t.test_convert_req_local_to_slots()
print("ok test_convert_req_local_to_slots")
