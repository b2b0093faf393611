"""Records the harness's in-engine helpers write to an engine's log: one stderr line each,
`PREFIX {json}` (nan_probe SMLA_NANCHECK, prompt_lp_guard SMLA_PROMPT_LP, sm80_paths
SMLA_SM80), read back by compare.py from engine.log."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def line(prefix: str, record: dict) -> str:
    """One record as it stands in the log."""
    return f"{prefix} " + json.dumps(record, default=str)


def emit(prefix: str, record: dict) -> None:
    print(line(prefix, record), file=sys.stderr, flush=True)


def parse(prefix: str, text: str) -> list[dict]:
    """The records with this prefix in `text`, in order (vLLM's process tags before them ignored)."""
    tag = prefix + " "
    return [json.loads(x.split(tag, 1)[1]) for x in text.splitlines() if tag in x]


def read(prefix: str, log: Path) -> list[dict]:
    """parse() of an engine log; none when the log is missing."""
    return parse(prefix, log.read_text(errors="replace")) if log.is_file() else []
