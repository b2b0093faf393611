"""pytest plugin / import hook, used where torchvision is not installed (the CPU suite's Python
has none): transformers' torchvision-backed image/video processor modules that vLLM's multimodal
GLM models import at module level (vllm/model_executor/models/glm4_1v.py, reached from
vllm.models.glm5next) are stub modules whose attributes are empty classes. transformers itself
still sees no torchvision. Nothing here processes an image or a video."""
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import re

# transformers' torchvision-backed processors (they import torchvision at module level); reached
# by `import vllm.models.glm5next` through glm4_1v and qwen2_vl. The *_pil variants and the auto mappings stay real.
STUBBED = re.compile(r"transformers\.models\.\w+\.(image|video)_processing_\w+")


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(f"{cls.__name__}.{name}", (), {})


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (), {"__init__": lambda self, *a, **k: None})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if STUBBED.fullmatch(fullname) and not fullname.endswith(("_pil", "_auto")):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, module):
        pass


if importlib.util.find_spec("torchvision") is None:
    sys.meta_path.insert(0, _Finder())
