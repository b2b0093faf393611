"""What `build-wheel` reports (WheelResult) and its human summary."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from smla.wheel.label import VERSION_FILE

@dataclass
class WheelResult:
    mode: str  # "overlay" or "from-source"
    version: str
    series_hash: str
    patches: list[str]
    base_wheel: Path | None
    base_sha256: str
    output: Path
    output_sha256: str
    size: int
    replaced: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    not_packaged: list[str] = field(default_factory=list)  # changed paths outside vllm/
    version_file: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "version": self.version,
            "series_hash": self.series_hash,
            "patches": self.patches,
            "base_wheel": str(self.base_wheel) if self.base_wheel else "",
            "base_sha256": self.base_sha256,
            "output": str(self.output),
            "output_sha256": self.output_sha256,
            "size": self.size,
            "replaced": self.replaced,
            "added": self.added,
            "removed": self.removed,
            "not_packaged": self.not_packaged,
            "version_file": self.version_file,
            "notes": self.notes,
        }


def summary_text(r: dict) -> str:
    lines = [
        f"built       {r['output']}",
        f"version     {r['version']}  ({len(r['patches'])} patches, series hash {r['series_hash']})",
        f"mode        {r['mode']}",
        f"base wheel  {r['base_wheel'] or '(none: full CUDA build)'}",
        f"size        {r['size'] / 1e6:.1f} MB   sha256 {r['output_sha256']}",
    ]
    for key in ("replaced", "added", "removed", "not_packaged"):
        if r[key]:
            lines.append(f"{key.replace('_', ' ')} ({len(r[key])})")
            lines += [f"  {p}" for p in r[key]]
    if r["version_file"]:
        lines.append(f"{VERSION_FILE}: {r['version_file']}")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines) + "\n"


