"""Import DeepSeek-V4's op modules, compressor and CPU model package with Triton unavailable
(every `import triton...` raises ImportError), as on a CPU install without triton-cpu. Prints
JSON: which modules imported, and vllm.triton_utils.HAS_TRITON."""
import importlib
import importlib.abc
import importlib.machinery
import json
import sys


class _NoTriton(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ImportError(f"{spec.name} is not installed (simulated)")

    def exec_module(self, module):  # pragma: no cover
        raise ImportError


sys.meta_path.insert(0, _NoTriton())
result = {}
for name in (
    "vllm.models.deepseek_v4.common.ops",
    "vllm.models.deepseek_v4.compressor",
    "vllm.models.deepseek_v4.nvidia.ops",
    "vllm.models.deepseek_v4.cpu.model",
):
    try:
        importlib.import_module(name)
        result[name] = "ok"
    except Exception as e:  # noqa: BLE001
        result[name] = f"{type(e).__name__}: {e}"[:200]
from vllm.triton_utils import HAS_TRITON  # noqa: E402

result["HAS_TRITON"] = HAS_TRITON
print(json.dumps(result))
