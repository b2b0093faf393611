"""The e2e harness drives the engine of one line: vLLM 0.26.0, the only line whose engine runs on the
lent GPU image (0.33.0's needs torch 2.14). Its CPU checks that read a vLLM tree (checkpoints loaded
through vLLM's classes, the runner internals the guards rely on, the TP shard layout) are checks of
that engine, so they run on that line; on another line they skip, saying so (before any fixture
builds anything from that line's tree)."""
from __future__ import annotations

import pytest

from conftest import current_line

E2E_LINE = "0.26.0"


def pytest_collection_modifyitems(config, items):
    line = current_line()
    if line == E2E_LINE:
        return
    skip = pytest.mark.skip(reason=f"line {line}: the e2e harness drives the {E2E_LINE} engine (its "
                                   f"checks run on the {E2E_LINE} line; {line}'s engine has not run here)")
    for item in items:
        if "vllm_tree" in getattr(item, "fixturenames", ()) and "/e2e/" in str(item.path):
            item.add_marker(skip)
