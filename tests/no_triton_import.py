"""Import the modules named on the command line with Triton unavailable (every `import
triton...` raises ImportError), as on a CPU install without Triton; vLLM from $PYTHONPATH.
Prints one JSON line: {module: "ok" | [error, the vLLM file that raised it]} and
vllm.triton_utils.HAS_TRITON."""
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import traceback


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
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        result[name] = "ok"
    except BaseException as e:  # noqa: BLE001 (a module may exit or raise anything)
        frames = [f.filename for f in traceback.extract_tb(e.__traceback__)
                  if "/vllm/" in f.filename and "<frozen" not in f.filename]
        origin = frames[-1].rsplit("/vllm/", 1)[-1] if frames else ""
        result[name] = [f"{type(e).__name__}: {e}"[:300], "vllm/" + origin if origin else ""]
from vllm.triton_utils import HAS_TRITON  # noqa: E402

result["HAS_TRITON"] = HAS_TRITON
print(json.dumps(result))
