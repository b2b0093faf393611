"""Where the toolkit's files are: the repository root, its release lines and their default paths.

A checkout maintains one or more release lines, one directory per vLLM release:

    lines/<release>/vllm-pin.txt         the line's pin (smla.pin)
    lines/<release>/patches/             the line's series (series file + *.patch)
    work/<release>/vllm                  the line's vLLM work tree (default; $SMLA_TREE overrides)

A Project is the root plus the line a command works on: `--line RELEASE`, else $SMLA_LINE, else
the newest release present (by version order).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from smla import pin as pin_mod
from smla.errors import UsageError

LINES_DIR = "lines"
PIN_FILE = "vllm-pin.txt"
# The one environment variable naming the vLLM work tree (CLI, tests, rebase, bench).
TREE_ENV = "SMLA_TREE"
ROOT_ENV = "SMLA_ROOT"
LINE_ENV = "SMLA_LINE"
# A line's name: a release version (what `smla rebase --onto` names a new line after).
_LINE_NAME = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+-]*)$")


def version_key(release: str) -> tuple:
    """Order of release names: PEP 440 where it parses, else the name's numeric parts."""
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(release))
    except InvalidVersion:
        return (1, tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", release)))


def valid_line_name(release: str) -> bool:
    return bool(_LINE_NAME.match(release)) and ".." not in release


def lines_in(root: Path) -> list[str]:
    """The releases with a line under root/lines/ (a directory holding vllm-pin.txt), oldest first."""
    base = root / LINES_DIR
    if not base.is_dir():
        return []
    names = [d.name for d in base.iterdir() if (d / PIN_FILE).is_file()]
    return sorted(names, key=version_key)


def _is_root(cand: Path) -> bool:
    return bool(lines_in(cand))


@dataclass(frozen=True)
class Project:
    root: Path
    line: str

    @classmethod
    def discover(cls, root: Path | None = None, line: str | None = None) -> "Project":
        """--root, else $SMLA_ROOT, else the nearest parent of cwd holding lines/<release>/vllm-pin.txt;
        then the line: `line`, else $SMLA_LINE, else the newest."""
        if root is None and os.environ.get(ROOT_ENV):
            root = Path(os.environ[ROOT_ENV])
        if root is not None:
            if not _is_root(root):
                raise UsageError(f"{root} has no {LINES_DIR}/<release>/{PIN_FILE}",
                                 hint="a toolkit checkout keeps each release line in lines/<release>/")
            return cls.at(root.resolve(), line)
        here = Path.cwd().resolve()
        for cand in (here, *here.parents):
            if _is_root(cand):
                return cls.at(cand, line)
        raise UsageError(
            f"no {LINES_DIR}/<release>/{PIN_FILE} in {here} or its parents",
            hint="run smla inside the toolkit's checkout, or pass --root",
        )

    @classmethod
    def at(cls, root: Path, line: str | None = None) -> "Project":
        """The project at `root` on `line` (else $SMLA_LINE, else the newest line); UsageError for a
        line that is not there."""
        present = lines_in(root)
        chosen = line or os.environ.get(LINE_ENV) or (present[-1] if present else None)
        if chosen is None:
            raise UsageError(f"{root} has no release line under {LINES_DIR}/")
        if chosen not in present:
            where = "--line" if line else f"${LINE_ENV}"
            raise UsageError(f"no release line {chosen} in {root / LINES_DIR} ({where})",
                             hint=f"the lines here: {', '.join(present) or 'none'} (`smla lines` lists them)")
        return cls(root, chosen)

    def lines(self) -> list[str]:
        """Every release line of this checkout, oldest first."""
        return lines_in(self.root)

    def newest_line(self) -> str:
        return self.lines()[-1]

    def on(self, line: str) -> "Project":
        """The same checkout on another line (which may not exist yet: `smla rebase` opens it)."""
        if not valid_line_name(line):
            raise UsageError(f"{line!r} is not a release line name (a version such as 0.33.0)")
        return Project(self.root, line)

    @property
    def line_dir(self) -> Path:
        return self.root / LINES_DIR / self.line

    @property
    def pin_file(self) -> Path:
        return self.line_dir / PIN_FILE

    @property
    def patches_dir(self) -> Path:
        return self.line_dir / "patches"

    @property
    def line_tree(self) -> Path:
        """The line's own work tree, whatever $SMLA_TREE says."""
        return self.root / "work" / self.line / "vllm"

    @property
    def default_tree(self) -> Path:
        return Path(os.environ.get(TREE_ENV) or self.line_tree)

    @property
    def line_python(self) -> Path | None:
        """The Python a line's vLLM imports with: .venv-<release>/bin/python where the line pins its
        own requirements (requirements/line-<release>.txt: 0.33.0's Triton 3.8 and the packages its
        vLLM newly imports; the Makefile builds it), None where the toolkit's own Python serves."""
        if not (self.root / "requirements" / f"line-{self.line}.txt").is_file():
            return None
        return self.root / f".venv-{self.line}" / "bin" / "python"

    @property
    def dist_dir(self) -> Path:
        return self.root / "dist"

    def rel(self, path: Path) -> str:
        """`path` relative to the root where it is inside it (for messages and reports)."""
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return str(path)

    def pin(self) -> pin_mod.Pin:
        return pin_mod.load(self.pin_file)
