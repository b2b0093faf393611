"""Run in a child process with the patched tree first on the path (tests/test_series_v4_cpu.py).

What a `vllm.LLM(...)` / `vllm serve` process does before its config turns breakable CUDA
graphs on for DeepSeek-V4: ModelConfig resolves the checkpoint's quantization config, which
imports vllm.models.deepseek_v4 (get_quantization_config), while VLLM_USE_BREAKABLE_CUDAGRAPH
is still unset; a forked engine core keeps those modules. Prints one JSON line: whether the V4
attention op and the sparse indexer op were imported then, and whether each is an eager-break
wrapper (the series' breakable CUDA graphs patch) rather than the bare function. Third-party
packages of vLLM's full requirements that the toolkit does not install are stood in for by
empty modules.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from unittest import mock

STUBBED = ("compressed_tensors", "llguidance", "xgrammar")


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        return module

    def exec_module(self, module):
        pass


def main() -> None:
    os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    sys.meta_path.insert(0, _Stub())
    from vllm.model_executor.layers import quantization

    quantization.get_quantization_config("fp8")
    names = {"attention": "vllm.models.deepseek_v4.attention",
             "indexer": "vllm.model_executor.layers.sparse_attn_indexer"}
    out = {f"{k}_imported": v in sys.modules for k, v in names.items()}
    attention, indexer = (sys.modules.get(v) for v in names.values())
    out["attention_impl_breaks"] = hasattr(getattr(attention, "DeepseekV4Attention", None).attention_impl,
                                           "__wrapped__") if attention else None
    out["indexer_op_breaks"] = hasattr(indexer.sparse_attn_indexer, "__wrapped__") if indexer else None
    out["breakable_env"] = os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
