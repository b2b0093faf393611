"""The rule of every command that removes or rewrites files (docs/errors.md, "What no command destroys"):

    no command deletes or overwrites anything it did not create or cannot restore,
    unless the user named that thing and forced it.

It is enforced here, once, for the three commands that remove or rewrite what a user may own:
  require_work_tree(root, tree)   `clean` (even with --discard) removes only a directory `smla fetch`
                                  made (its own git config names `smla.upstream`), never the toolkit
                                  checkout or a directory holding it
  unknown(directory, plan, known) the files a plan (name -> new bytes, or None: delete) would change
                                  whose present bytes are neither the planned ones nor `known` (sha256
                                  of what the command wrote or can restore: the tree's record and
                                  commits for `export`, the backup for `rebase --abort`); `known_at`
                                  narrows that for some names to what was written under that name
                                  (a copy of a patch under a name of the user's is the user's)
  refuse_unknown(...)             raise for them unless each is named in `forced` (`export`)
  move_aside(path)                keep a file under a new name that no command reads as its own
                                  (`rebase --abort` keeps what was made during the stop this way)
"""
from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from pathlib import Path

from smla import proc
from smla.errors import SmlaError, UsageError, cmd

KEPT_SUFFIX = ".smla-kept"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------- directories


def made_by_smla(tree: Path) -> bool:
    """True when `tree` is a git repository of its own whose config names `smla.upstream`: what
    `smla fetch` makes (a work tree, with or without its base tag). A user's vLLM checkout, a plain
    folder and a folder inside some other repository are not."""
    if not (tree / ".git").exists():
        return False
    top = proc.git(tree, "rev-parse", "--show-toplevel", check=False).stdout.strip()
    if not top or Path(top).resolve() != tree.resolve():
        return False
    return bool(proc.git(tree, "config", "--get", "smla.upstream", check=False).stdout.strip())


def require_work_tree(root: Path, tree: Path) -> None:
    """Refuse to remove `tree` unless smla made it (an empty directory holds nothing to lose)."""
    here, home = tree.resolve(), root.resolve()
    if here == home or here in home.parents:
        raise UsageError(
            f"{tree} is the toolkit checkout" + ("" if here == home else f" or holds it ({root})")
            + "; refusing to remove it",
            hint="a line's work tree is <root>/work/<release>/vllm unless --tree or $SMLA_TREE names another: "
                 f"{cmd('smla', 'status')} shows which one commands use",
        )
    if (tree.is_dir() and not any(tree.iterdir())) or made_by_smla(tree):
        return
    raise UsageError(
        f"{tree} is not an smla work tree (`smla fetch` did not make it); refusing to remove it, "
        "with or without --discard",
        hint=f"check --tree and $SMLA_TREE ({cmd('smla', 'status')} names the work tree); "
             "a directory smla did not make is yours to remove by hand",
    )


# ----------------------------------------------------------------- files


def unknown(directory: Path, plan: Mapping[str, bytes | None], known: Collection[str],
            known_at: Mapping[str, Collection[str]] | None = None) -> list[str]:
    """Names in `plan` whose file in `directory` exists and would change (new bytes, or None: removed)
    although its bytes are neither the planned ones nor among `known` (sha256), or, for a name in
    `known_at`, among `known_at[name]` (what smla wrote under that very name)."""
    out = []
    for name, new in sorted(plan.items()):
        path = directory / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if data == new or sha256(data) in (known if known_at is None or name not in known_at else known_at[name]):
            continue
        out.append(name)
    return out


def refuse_unknown(directory: Path, plan: Mapping[str, bytes | None], known: Collection[str], *,
                   known_at: Mapping[str, Collection[str]] | None = None, forced: Collection[str] = (),
                   what: str, error: type[SmlaError], hint: str) -> None:
    """Raise `error` when `plan` would change a file of `directory` that is not known, unless the
    user forced and that file is among `forced` (names the user put there, e.g. patches/series)."""
    bad = [n for n in unknown(directory, plan, known, known_at) if n not in forced]
    if not bad:
        return
    removed = [n for n in bad if plan[n] is None]
    rewritten = [n for n in bad if plan[n] is not None]
    parts = ([f"delete {', '.join(removed)}"] if removed else []) + (
        [f"overwrite {', '.join(rewritten)}"] if rewritten else [])
    raise error(
        f"{what} would {' and '.join(parts)} in {directory}: smla did not write "
        + ("it" if len(bad) == 1 else "them") + " (a file of your own, or edited since smla last wrote it)",
        hint=hint,
    )


def move_aside(path: Path) -> Path:
    """Rename `path` to `<name>.smla-kept` (`.smla-kept.2`, ... when taken); the new path."""
    n = 1
    while True:
        dest = path.with_name(path.name + KEPT_SUFFIX + ("" if n == 1 else f".{n}"))
        if not dest.exists() and not dest.is_symlink():
            path.rename(dest)
            return dest
        n += 1
