"""The state of a stopped rebase, kept inside the tree's git directory.

<tree>/.git/smla-rebase/ holds `state.json` (target, the original branch,
HEAD, base tag and `smla.*` config, the old pin's values, per-patch
outcomes, the index of the patch in flight (`next`) and the commit it started from (`at`), HEAD at a
conflict stop), `pin.txt`
(the old pin file, bytes) and `patches/` (a byte copy of every file of the
old patches/). The replay reads the patches from that copy, so editing
patches/ meanwhile cannot change what gets replayed, and `--abort` puts the
pin file and patches/ back byte for byte.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from smla import pin as pin_mod
from smla import proc, treeinfo
from smla.errors import TreeStateError
from smla.fsutil import atomic_write_bytes, atomic_write_text

STATE_DIR = treeinfo.REBASE_STATE_DIR
STATE_VERSION = 1


def state_dir(tree: Path) -> Path:
    return treeinfo.git_path(tree, STATE_DIR)


def state_path(tree: Path) -> Path | None:
    if not (tree / ".git").exists():
        return None
    return state_dir(tree) / "state.json"


def load(tree: Path) -> dict:
    p = state_path(tree)
    if p is None or not p.is_file():
        raise TreeStateError(f"no rebase in progress in {tree}", hint="start one with `smla rebase --onto ...`")
    try:
        state = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise TreeStateError(f"{p} is corrupt ({exc})",
                             hint=f"inspect it, or remove {p.parent} and reset the tree by hand") from exc
    if state.get("version") != STATE_VERSION:
        raise TreeStateError(f"{p} was written by another version of smla")
    state["tree"] = str(tree)
    return state


def save(tree: Path, state: dict) -> None:
    state = dict(state)
    state["tree"] = str(tree)
    atomic_write_text(state_dir(tree) / "state.json", json.dumps(state, indent=2, sort_keys=True) + "\n")


def back_up(tree: Path, pin_file: Path, patches_dir: Path) -> list[str]:
    """Copy the pin file and every file of patches/ into a fresh state dir; the names copied."""
    sdir = state_dir(tree)
    if sdir.exists():
        shutil.rmtree(sdir)
    (sdir / "patches").mkdir(parents=True)
    (sdir / "pin.txt").write_bytes(pin_file.read_bytes())
    names = []
    for f in sorted(patches_dir.iterdir()):
        if f.is_file():
            shutil.copy2(f, sdir / "patches" / f.name)
            names.append(f.name)
    return names


def backed_up_patch(tree: Path, name: str) -> Path:
    return state_dir(tree) / "patches" / name


def restore_files(tree: Path, pin_file: Path, patches_dir: Path, names: list[str]) -> None:
    """Pin file and patches/ exactly as backed up (files added meanwhile are removed)."""
    sdir = state_dir(tree)
    atomic_write_bytes(pin_file, (sdir / "pin.txt").read_bytes())
    patches_dir.mkdir(parents=True, exist_ok=True)
    for f in patches_dir.iterdir():
        if f.is_file() and f.name not in names:
            f.unlink()
    for name in names:
        atomic_write_bytes(patches_dir / name, (sdir / "patches" / name).read_bytes())
        shutil.copystat(sdir / "patches" / name, patches_dir / name)


def remove(tree: Path) -> None:
    shutil.rmtree(state_dir(tree))


def am_in_progress(tree: Path) -> bool:
    return treeinfo.git_path(tree, "rebase-apply").is_dir()


def unmerged(tree: Path) -> list[str]:
    out = proc.git(tree, "diff", "--name-only", "--diff-filter=U").stdout
    return sorted({ln for ln in out.splitlines() if ln})


def pin_dict(p: pin_mod.Pin) -> dict:
    return {"repo": p.repo, "commit": p.commit, "commit_kind": p.commit_kind, "version": p.version,
            "sdist": p.sdist, "sdist_sha256": p.sdist_sha256}
