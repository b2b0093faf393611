"""The sm80/86 code paths of the series' kernels on a newer GPU (SMLA_E2E_SM80_PATHS=1, e2e_plugin).

The portable kernels decide two things by the GPU's capability, each in one cached helper of
its module (the series' kernel patches):
  triton_fp8_e4m3._cuda_capability   e4m3 encode/decode in software below sm89 (the cache
                                     writes, compressor, indexer query, and every reader
                                     through fp8_e4m3_hw)
  triton_sparse_mla._cuda_info       sparse-MLA attention, DSA and DeepSeek-V4 (the V4 kernel
                                     shares this device query): software e4m3 decode below sm89
  triton_dsa_indexer._cuda_info      indexer logits: software e4m3 decode and 16-bit dots
                                     instead of fp8 tensor cores below sm89
With the variable set, this engine's process sees capability 8.0 in those three helpers (the
SM count stays the real one), so on the H200 the portable path runs the kernels an A100 runs.
vLLM's own platform queries are untouched: which classes and ops vLLM selects (Marlin,
top-k, attention class) is covered by the mocked-capability selection tests, not here.
Each patched module is one line `SMLA_SM80 {json}` on stderr (the process that patched it;
the engine core, forked from the front end, inherits the patched modules). What the kernels'
helpers answer inside the worker that runs the model is in the model probe
(`kernel_capability`, worker_view()); compare.py requires all of MODULES patched and the
worker's view equal to SM80_VIEW in an engine that asked for it.
"""
from __future__ import annotations

import functools
import importlib
from pathlib import Path

import log_records

SM80_ENV = "SMLA_E2E_SM80_PATHS"
PREFIX = "SMLA_SM80"
CAPABILITY = (8, 0)
_OPS = "vllm.v1.attention.ops."
MODULES = (_OPS + "triton_fp8_e4m3", _OPS + "triton_sparse_mla", _OPS + "triton_dsa_indexer")
# worker_view() with the sm80 paths: no GPU e4m3 conversion, capability 8.0, no fp8 tensor cores
SM80_VIEW = {"fp8_e4m3_hw": False, "dsv4_capability": [8, 0], "indexer_fp8_mma": False}


def line(record: dict) -> str:
    """A record as written to the engine's log."""
    return log_records.line(PREFIX, record)


@functools.cache
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def _patches() -> dict:
    """module name -> (attribute, replacement)."""
    return {
        MODULES[0]: ("_cuda_capability", lambda index: CAPABILITY),
        MODULES[1]: ("_cuda_info", lambda index: (_sm_count(index), CAPABILITY)),
        MODULES[2]: ("_cuda_info", lambda index: (_sm_count(index), CAPABILITY >= (8, 9))),
    }


def patch_module(module) -> None:
    """Replace the module's capability helper (it must exist: a renamed helper must fail the
    run, not silently run the sm90 path)."""
    attr, fn = _patches()[module.__name__]
    if not callable(getattr(module, attr, None)):
        raise AttributeError(f"{module.__name__}.{attr}: not found; sm80_paths.py needs updating")
    setattr(module, attr, fn)
    log_records.emit(PREFIX, {"module": module.__name__, "helper": attr, "capability": list(CAPABILITY)})


def patched_modules(log: Path) -> list[str]:
    """The modules an engine log says were patched (sorted, unique)."""
    return sorted({r["module"] for r in log_records.read(PREFIX, log)})


def worker_view() -> dict:
    """What the three helpers answer for this process's CUDA device (keys of SM80_VIEW); {}
    without CUDA or without the series' modules (pristine vLLM)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    try:
        fp8, dsv4, indexer = (importlib.import_module(m) for m in MODULES)
    except ImportError:
        return {}
    dev = torch.device("cuda", torch.cuda.current_device())
    return {"fp8_e4m3_hw": bool(fp8.fp8_e4m3_hw(dev)), "dsv4_capability": list(dsv4._device_info(dev)[1]),
            "indexer_fp8_mma": bool(indexer._device_info(dev)[1])}
