"""Import modules from a vLLM source tree in a fresh interpreter, each on its own, and report each
module's error (the semantic check of `smla rebase`, smla.rebase.verify).

Run by path (`python _import_worker.py`, a JSON payload on stdin: {"tree", "modules",
"capability", "stub_packages"}); writes MARKER + {"setup_error", "results": {module: null |
"Type: message"}, "missing": [third-party packages not installed here], "stand_ins"} on stdout.
Packages named in "stub_packages" (third-party packages this interpreter lacks, found missing by an
earlier round: smla.rebase.verify retries with them) are stood in by permissive modules, so the
check judges the tree's own interfaces, not this interpreter's installed packages. For a tree with vLLM's platform package, the stand-ins of the selection
harness (smla/_selection_standins.py, loaded by path beside this file: compiled modules, FlashInfer,
no CUDA device, CudaPlatform with the mocked capability) are installed first, as `smla explain`
does; any other tree is only put first on sys.path. Imports nothing from `smla`.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

MARKER = "@@SMLA-JSON@@"


def _standins():
    spec = importlib.util.spec_from_file_location(
        "_smla_selection_standins", Path(__file__).resolve().with_name("_selection_standins.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class _Anything:
    """What a stood-in package's attributes are: callable, subclassable, any attribute."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __iter__(self):
        return iter(())


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Anything,), {})
        setattr(self, name, value)
        return value


class _MissingPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stands in for the named top-level packages and every module under them (last on sys.meta_path)."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def _missing(exc: BaseException) -> str | None:
    """The third-party top-level package an import error says is not installed (None: vLLM's own)."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top != "vllm":
            return top
    return None


def _error(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:400]}"


def run(payload: dict) -> dict:
    tree = str(Path(payload["tree"]).resolve())
    sys.path.insert(0, tree)
    out: dict = {"setup_error": None, "results": {}, "stand_ins": [], "missing": []}
    stubs = sorted(payload.get("stub_packages") or [])
    if stubs:
        sys.meta_path.append(_MissingPackages(stubs))
    if (Path(tree) / "vllm" / "platforms" / "__init__.py").is_file():
        try:
            out["stand_ins"] = list(_standins().import_vllm_tree(tree, capability=payload.get("capability") or "9.0"))
        except Exception as exc:  # vLLM itself does not import: every module fails with it
            out["setup_error"] = _error(exc)
            if _missing(exc):
                out["missing"].append(_missing(exc))
    for name in payload["modules"]:
        try:
            importlib.import_module(name)
            out["results"][name] = None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a module that exits on import is broken
            out["results"][name] = _error(exc)
            if _missing(exc) and _missing(exc) not in out["missing"]:
                out["missing"].append(_missing(exc))
    out["stand_ins"] += [f"not installed here, stood in: {n}" for n in stubs]
    return out


def main() -> int:
    payload = json.loads(sys.stdin.read())
    sys.stdout.write(MARKER + json.dumps(run(payload)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
