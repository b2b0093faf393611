"""What must hold before a wheel is built: the tree at the pin, equal to patches/, clean where
it is packaged; the base wheel matching the pin; no compiled or build sources for an overlay."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from wheel.wheelfile import WheelFile
from smla import ids, proc, treestate
from smla.errors import WheelError
from smla.pin import Pin
from smla.series import Series
from smla.treeinfo import BASE_TAG
from smla.wheel.label import VERSION_FILE, base_id
from smla.wheel.official import BaseWheel, read_member

# Paths (relative to the vLLM source root) that the overlay cannot carry:
# compiled code, the build system, and inputs of generated files.
_BUILD_DIRS = ("csrc/", "cmake/")
_BUILD_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "use_existing_torch.py")
_BUILD_NAMES = ("CMakeLists.txt",)
_BUILD_PREFIXES = ("requirements/",)  # they become Requires-Dist in METADATA
_COMPILED_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp",
                      ".proto", ".pyx", ".pxd")

# ----------------------------------------------------------- tree changes


@dataclass(frozen=True)
class Change:
    status: str  # "A", "M" or "D"
    path: str


def tree_changes(tree: Path) -> list[Change]:
    """Files that differ between the base and HEAD (renames as delete + add)."""
    out = proc.git(tree, "diff", "--name-status", "--no-renames", "-z", f"{BASE_TAG}..HEAD", "--").stdout
    parts = [p for p in out.split("\0") if p]
    changes = []
    for status, path in zip(parts[0::2], parts[1::2]):
        kind = status[0]
        if kind not in "AMDT":
            raise WheelError(f"unexpected change {status} for {path} in {tree}")
        changes.append(Change("M" if kind == "T" else kind, path))
    return sorted(changes, key=lambda c: c.path)


def check_tree_at_pin(pin: Pin, tree: Path) -> None:
    """The tree's upstream commit must be the pin's: the label names the pin's base (treestate's one check)."""
    treestate.require_at_pin(pin, tree, "build a wheel labelled for the pin (it would hold other sources)")


def _recorded_commit(wf: WheelFile) -> str | None:
    """The (abbreviated) commit the wheel's vllm/_version.py records, if any."""
    try:
        return ids.recorded_commit(read_member(wf, VERSION_FILE).decode("utf-8", "replace"))
    except KeyError:
        return None


def check_base_matches_pin(pin: Pin, base: "BaseWheel", recorded: str | None) -> list[str]:
    """Refuse a base wheel built from other sources than a commit pin's; notes for a release pin.

    A release pin takes the official wheel of that release (its file name and
    METADATA say the version). A commit pin (sdist = none) has no official
    wheel: the base must record that very commit in vllm/_version.py (vLLM's
    nightly wheels do), so nightly sources never land on release binaries.
    """
    same = ids.same_commit(pin.commit, recorded)
    if not pin.has_sdist:
        if not same:
            raise WheelError(
                f"{base.path.name} was built from "
                + (f"vLLM commit {recorded}" if recorded else "an unrecorded commit")
                + f", but the pin is vLLM commit {pin.short}: refusing to pack those sources onto binaries "
                "built from other sources",
                hint=f"pass --base-wheel with a wheel built from {pin.short} (vllm/_version.py records it), "
                     "or use --from-source",
            )
        return [f"base wheel {base.path.name} records commit {recorded}, the pinned commit"]
    if recorded and not same:
        return [f"the official {pin.version} wheel records commit {recorded}, the pin (its sdist) "
                f"{pin.commit_label()}: the wheel is the release's own build; its vllm/ sources are "
                "replaced only where the series changes them"]
    return []


def _label_notes(pin: Pin) -> list[str]:
    if pin.commit_is_full:
        return []
    return [f"the pin records only the abbreviated upstream commit {pin.commit} (from the sdist; "
            f"commit_kind = abbreviated): the label's base id {base_id(pin.commit)} is that abbreviation"]


def build_source_paths(paths) -> list[str]:
    """The paths among `paths` that only a real build can carry."""
    bad = []
    for p in paths:
        pp = PurePosixPath(p)
        if (p.startswith(_BUILD_DIRS) or p in _BUILD_FILES or pp.name in _BUILD_NAMES
                or p.startswith(_BUILD_PREFIXES) or pp.suffix in _COMPILED_SUFFIXES):
            bad.append(p)
    return sorted(set(bad))


def check_series_matches_tree(series: Series, tree: Path) -> None:
    """The tree must equal the series (treestate: by content), so the label tells the truth."""
    treestate.require_in_sync(tree, series, "build a wheel labelled with the series", error=WheelError)


def _check_clean(tree: Path, paths: list[str]) -> None:
    if not paths:
        return
    dirty = proc.git(tree, "status", "--porcelain", "--untracked-files=no", "--", *paths).stdout
    if dirty.strip():
        raise WheelError(
            f"files the wheel takes from {tree} have uncommitted changes: "
            + ", ".join(line[3:] for line in dirty.splitlines()[:5]),
            hint="commit them and `smla export`, or discard them",
        )


