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
import os
import shlex
import shutil
from pathlib import Path

from smla import keep
from smla import pin as pin_mod
from smla import proc, treeinfo
from smla.errors import TreeStateError
from smla.fsutil import atomic_write_bytes, atomic_write_text

STATE_DIR = treeinfo.REBASE_STATE_DIR
STATE_VERSION = 1
UNDO_DIR = "smla-rebase-undo"


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


def keep_changes(tree: Path, pin_file: Path, patches_dir: Path, names: list[str], *, move_new: bool) -> list[str]:
    """What changed in the pin file and patches/ since the backup, kept out of the way (smla.keep):
    an edited file is moved aside to `<name>.smla-kept`; a new file stays (`move_new`: moved aside
    too, before an export would replace it). Lines naming each, for the report."""
    sdir = state_dir(tree)
    backed = {pin_file: sdir / "pin.txt", **{patches_dir / n: sdir / "patches" / n for n in names}}
    kept = []
    for path, copy in backed.items():
        old = copy.read_bytes()
        if keep.unknown(path.parent, {path.name: old}, {keep.sha256(old)}):
            kept.append(f"{path} was edited during the rebase: kept as {keep.move_aside(path)}")
    made = sorted(f for f in patches_dir.iterdir()
                  if f.is_file() and f.name not in names and keep.KEPT_SUFFIX not in f.name)
    for f in made:
        kept.append(f"{f} was made during the rebase: " + (f"kept as {keep.move_aside(f)}" if move_new else
                                                              "kept (not in the series)"))
    return kept


def restore_files(tree: Path, pin_file: Path, patches_dir: Path, names: list[str]) -> list[str]:
    """Pin file and patches/ as backed up, byte for byte; what was made or edited meanwhile is kept
    (keep_changes) and named in the lines returned."""
    sdir = state_dir(tree)
    patches_dir.mkdir(parents=True, exist_ok=True)
    kept = keep_changes(tree, pin_file, patches_dir, names, move_new=False)
    atomic_write_bytes(pin_file, (sdir / "pin.txt").read_bytes())
    for name in names:
        atomic_write_bytes(patches_dir / name, (sdir / "patches" / name).read_bytes())
        shutil.copystat(sdir / "patches" / name, patches_dir / name)
    return kept


def keep_for_undo(tree: Path) -> Path:
    """A finished rebase: its backup becomes <git dir>/smla-rebase-undo/ (the previous one goes)."""
    undo = treeinfo.git_path(tree, UNDO_DIR)
    if undo.exists():
        shutil.rmtree(undo)
    sdir = state_dir(tree)
    undo.mkdir(parents=True)
    (sdir / "pin.txt").rename(undo / "pin.txt")
    (sdir / "patches").rename(undo / "patches")
    return undo


def undo_commands(root: Path, pin_file: Path, patches_dir: Path, undo: Path, before: list[str],
                  after: list[str], smla_args: list[str]) -> list[str]:
    """The commands (plain shell) that put the pin file and patches/ back as before a finished rebase
    (`before`: the backed-up names; `after`: the files it exported) and rebuild the tree at the old
    pin. From git when the backup is what the toolkit checkout's HEAD holds, else from the kept copy
    `undo`."""
    made = sorted(set(after) - set(before))
    remove = [_sh("rm", "-f", "--", *(patches_dir / n for n in made))] if made else []
    rebuild = [_sh("smla", *smla_args, "fetch", "--force"), _sh("smla", *smla_args, "apply")]
    rel = [p.relative_to(root) for p in (pin_file, patches_dir)] if _under(root, pin_file, patches_dir) else None
    if rel and _committed(root, {pin_file: undo / "pin.txt", **{patches_dir / n: undo / "patches" / n
                                                                  for n in before}}, patches_dir):
        return [_sh("git", "-C", root, "checkout", "HEAD", "--", *rel), *remove, *rebuild]
    return [_sh("cp", "-p", "--", undo / "pin.txt", pin_file), *remove,
            _sh("cp", "-p", "--", *(undo / "patches" / n for n in before), patches_dir), *rebuild]


def _sh(*argv) -> str:
    return shlex.join(os.fspath(a) for a in argv)


def _under(root: Path, *paths: Path) -> bool:
    return all(p.resolve().is_relative_to(root.resolve()) for p in paths)


def _committed(root: Path, files: dict[Path, Path], patches_dir: Path) -> bool:
    """Does the git HEAD of `root` hold exactly these bytes (the backup copies) at these paths, and
    nothing else under patches_dir?"""
    top = proc.git(root, "rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return False
    for path, copy in files.items():
        rel = path.resolve().relative_to(root.resolve()).as_posix()
        head = proc.git(root, "rev-parse", "-q", "--verify", f"HEAD:{rel}", check=False).stdout.strip()
        if not head or head != proc.git_out(root, "hash-object", "--", copy):
            return False
    listed = proc.git(root, "ls-tree", "-r", "--name-only", "HEAD", "--",
                      patches_dir.resolve().relative_to(root.resolve()).as_posix(), check=False).stdout.split()
    return len(listed) == len(files) - 1


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
