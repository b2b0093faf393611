"""Rendering results: human text, JSON for CI, Markdown for pull requests."""
from __future__ import annotations

import json
from pathlib import Path

from smla.fsutil import atomic_write_text


def to_json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def status_text(s: dict) -> str:
    lines = [
        f"work tree   {s['tree']}",
        f"base        {s['base'][:12]}  vLLM {s['tree_version']} ({s['tree_upstream_commit'][:12]}, from {s['tree_source']})",
        f"pin         vLLM {s['pin']['version']} ({s['pin']['commit'][:12]})"
        + ("" if s["matches_pin"] else "   <- the tree is NOT at the pin"),
        "patches",
    ]
    lines += [f"  {p['state']:<16} {p['name']}" for p in s["patches"]]
    if s["local_commits"]:
        lines.append("commits not in the series (run `smla export`)")
        lines += [f"  {c['commit'][:12]} {c['subject']}" for c in s["local_commits"]]
    if s["unexported"]:
        lines.append("committed but not exported to patches/ (run `smla export`)")
        lines += [f"  {n}" for n in s["unexported"]]
    if s["uncommitted"]:
        lines.append("uncommitted changes in the tree")
        lines += [f"  {f}" for f in s["uncommitted"][:20]]
        if len(s["uncommitted"]) > 20:
            lines.append(f"  ... and {len(s['uncommitted']) - 20} more")
    if not (s["local_commits"] or s["unexported"] or s["uncommitted"]):
        lines.append("no local edits")
    return "\n".join(lines) + "\n"


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
