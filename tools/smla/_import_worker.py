"""Import modules from a vLLM source tree in a fresh interpreter, each on its own, and report each
module's error (the semantic check of `smla rebase`, smla.rebase.verify).

Run by path (`python _import_worker.py`, a JSON payload on stdin: {"tree", "modules",
"capability"}); writes MARKER + {"setup_error", "results": {module: null | "Type: message"},
"stand_ins"} on stdout. For a tree with vLLM's platform package, the stand-ins of the selection
harness (smla/_selection_standins.py, loaded by path beside this file: compiled modules, FlashInfer,
no CUDA device, CudaPlatform with the mocked capability) are installed first, as `smla explain`
does; any other tree is only put first on sys.path. Imports nothing from `smla`.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

MARKER = "@@SMLA-JSON@@"


def _standins():
    spec = importlib.util.spec_from_file_location(
        "_smla_selection_standins", Path(__file__).resolve().with_name("_selection_standins.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _error(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:400]}"


def run(payload: dict) -> dict:
    tree = str(Path(payload["tree"]).resolve())
    sys.path.insert(0, tree)
    out: dict = {"setup_error": None, "results": {}, "stand_ins": []}
    if (Path(tree) / "vllm" / "platforms" / "__init__.py").is_file():
        try:
            out["stand_ins"] = list(_standins().import_vllm_tree(tree, capability=payload.get("capability") or "9.0"))
        except Exception as exc:  # vLLM itself does not import: every module fails with it
            out["setup_error"] = _error(exc)
    for name in payload["modules"]:
        try:
            importlib.import_module(name)
            out["results"][name] = None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a module that exits on import is broken
            out["results"][name] = _error(exc)
    return out


def main() -> int:
    payload = json.loads(sys.stdin.read())
    sys.stdout.write(MARKER + json.dumps(run(payload)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
