"""Where the toolkit's files are: the repository root and its default paths."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from smla import pin as pin_mod
from smla.errors import UsageError

PIN_FILE = "vllm-pin.txt"
# The one environment variable naming the vLLM work tree (CLI, tests, rebase --test, bench).
TREE_ENV = "SMLA_TREE"
ROOT_ENV = "SMLA_ROOT"


@dataclass(frozen=True)
class Project:
    root: Path

    @classmethod
    def discover(cls, root: Path | None = None) -> "Project":
        """--root, else $SMLA_ROOT, else the nearest parent of cwd holding vllm-pin.txt."""
        if root is None and os.environ.get(ROOT_ENV):
            root = Path(os.environ[ROOT_ENV])
        if root is not None:
            if not (root / PIN_FILE).is_file():
                raise UsageError(f"{root} has no {PIN_FILE}")
            return cls(root.resolve())
        here = Path.cwd().resolve()
        for cand in (here, *here.parents):
            if (cand / PIN_FILE).is_file():
                return cls(cand)
        raise UsageError(
            f"no {PIN_FILE} in {here} or its parents",
            hint="run smla inside the toolkit's checkout, or pass --root",
        )

    @property
    def pin_file(self) -> Path:
        return self.root / PIN_FILE

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def default_tree(self) -> Path:
        return Path(os.environ.get(TREE_ENV) or self.root / "work" / "vllm")

    @property
    def dist_dir(self) -> Path:
        return self.root / "dist"

    def pin(self) -> pin_mod.Pin:
        return pin_mod.load(self.pin_file)
