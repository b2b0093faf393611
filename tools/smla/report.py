"""Rendering results: human text, JSON for CI, Markdown for pull requests."""
from __future__ import annotations

import json
from pathlib import Path

from smla.fsutil import atomic_write_text


def to_json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def export_text(r: dict) -> str:
    lines = [f"exported {len(r['series'])} patches to {r['directory']}"]
    lines += [f"  written    {n}" for n in r["written"]]
    lines += [f"  unchanged  {n}" for n in r["unchanged"]]
    lines += [f"  removed    {n}" for n in r["removed"]]
    return "\n".join(lines) + "\n"


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"
