"""The new base of a rebase: what `--onto` names, resolved, and brought into the tree's repository.

- a commit (7-40 hex): fetched from the pin's repo or a `--source` mirror
  (a mirror also resolves an abbreviated id);
- a release version: its PyPI sdist (url + sha256 from the index, cached,
  verified), committed as a snapshot whose parent is the old base, so
  `git am --3way` finds every patch's preimage blobs.

The upstream commit of a release: an sdist records only an abbreviated id
(vllm/_version.py). It is completed, in this order, from `--upstream-commit`,
a local mirror (`--source PATH`), or `git ls-remote` of the pin's repo (not
with `--source sdist`). When none of them can, the abbreviated id is kept and
marked (`commit_kind = abbreviated` in the pin): the sdist's sha256 then
identifies the source.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from smla import cache, ids, proc, source
from smla import pin as pin_mod
from smla.errors import FetchError, UsageError, cmd

VERSION_TARGET = re.compile(r"^[0-9]+(\.[0-9]+)+([a-z0-9.+-]*)$")  # a release, not a commit id


@dataclass
class Target:
    """The new base: what the user asked for and what it resolved to."""

    spec: str
    kind: str  # "commit" or "version"
    commit: str  # upstream commit id: 40 hex, or the sdist's abbreviation when commit_kind is abbreviated
    version: str
    sdist: str
    sdist_sha256: str
    source: str  # tree source kind after the rebase: "git" or "sdist"
    notes: list[str] = field(default_factory=list)
    archive: str = ""  # local sdist path (version targets)
    fetch_from: str = ""  # repository the commit was fetched from (commit targets)
    commit_kind: str = pin_mod.FULL

    def to_dict(self) -> dict:
        """For the state file and reports: no local archive path, no credentials in URLs."""
        d = {k: v for k, v in self.__dict__.items() if k not in ("archive",)}
        d["fetch_from"] = cache.redact(self.fetch_from) if self.fetch_from else ""
        return d


def older_than(target: Target, pin: pin_mod.Pin) -> str | None:
    """A note when a version target is an older release than the pin's (the series moves backwards)."""
    from packaging.version import InvalidVersion, Version

    if target.kind != "version":
        return None
    try:
        if Version(target.version) >= Version(pin.version):
            return None
    except InvalidVersion:
        return None
    return (f"vLLM {target.version} is older than the pinned {pin.version}: this moves the series "
            f"backwards (`smla rebase --abort` undoes a stopped rebase; a finished one prints the "
            f"commands that undo it, `undo:`)")


def parse(onto: str, upstream_commit: str | None) -> tuple[str, str]:
    """(kind, spec) of an `--onto` argument; UsageError for anything else."""
    spec = onto.strip()
    if VERSION_TARGET.match(spec):
        kind = "version"
    elif ids.is_commit_id(spec.lower()):
        kind, spec = "commit", spec.lower()
    else:
        raise UsageError(
            f"--onto {onto!r} is neither a release version (like 0.17.0) nor a commit id (7-40 hex digits)"
        )
    if upstream_commit is not None and (kind != "version" or not ids.is_full_commit(upstream_commit)):
        raise UsageError("--upstream-commit takes 40 hex digits and goes with a version target only")
    return kind, spec


def resolve(kind: str, spec: str, pin: pin_mod.Pin, source_spec: str, upstream_commit: str | None) -> Target:
    if kind == "version":
        return _resolve_version(spec, pin, source_spec, upstream_commit)
    return _resolve_commit(spec, pin, source_spec)


def bring_in(tree: Path, old_base: str, target: Target, echo) -> str:
    """Put the new base into the tree's repository (adds objects only); its commit id there."""
    if target.kind == "version":
        return _snapshot_base(tree, old_base, target, echo)
    try:
        source.fetch_commit(tree, target.fetch_from, target.commit)
    except FetchError as exc:  # the default hint's `smla fetch --source PATH` would fetch the pin
        exc.hint = (f"check network access to {cache.redact(target.fetch_from)}, or rebase from a local "
                    f"mirror that holds the commit: {cmd('smla', 'rebase', '--onto', target.spec, '--source', 'PATH')}")
        raise
    return target.commit


def _resolve_commit(spec: str, pin: pin_mod.Pin, source_spec: str) -> Target:
    if source_spec == "sdist" or source_spec.endswith((".tar.gz", ".tgz")):
        raise UsageError("a commit target is fetched from git: use --source git|auto or a mirror PATH")
    url = pin.repo if source_spec in ("auto", "git") else source_spec
    commit = spec
    if source.is_local_repo(url):
        url = str(Path(url).expanduser().resolve())
        found = proc.git(url, "rev-parse", "-q", "--verify", "--end-of-options", f"{spec}^{{commit}}", check=False)
        if found.returncode != 0:
            raise FetchError(f"commit {spec} is not in {url}", hint="check the id, or update the mirror")
        commit = found.stdout.strip()
    elif not ids.is_full_commit(spec):
        raise UsageError(f"--onto {spec}: give the full 40-hex commit id when fetching from {cache.redact(url)}",
                         hint=f"e.g. `git ls-remote {cache.redact(url)} refs/heads/main`")
    notes = [f"vLLM commit {commit[:12]} is not a release: the pin keeps version {pin.version} "
             f"(the last release) and sets sdist = none, so this pin is fetched with git only"]
    return Target(spec, "commit", commit, pin.version, pin_mod.NONE, pin_mod.NONE, "git", notes,
                  fetch_from=url)


def _resolve_version(spec: str, pin: pin_mod.Pin, source_spec: str, given: str | None) -> Target:
    name = f"vllm-{spec}.tar.gz"
    url, sha = cache.pypi_file("vllm", name)
    if not ids.is_sha256(sha):
        raise FetchError(f"the package index gives no sha256 for {name}")
    archive = cache.fetch(url, cache.downloads_dir() / name, sha, what=name)
    short = source.sdist_commit(archive)
    notes = [f"source: {name}, sha256 {sha} (from the package index, verified)"]
    commit = None
    kind = pin_mod.FULL
    if given:
        if short and not ids.same_commit(given, short):
            raise UsageError(f"--upstream-commit {given} does not match the sdist's recorded commit {short}")
        commit = given
        notes.append(f"upstream commit {given[:12]} given with --upstream-commit"
                     + (f" (matches the sdist's {short})" if short else " (the sdist records none)"))
    elif short:
        commit, how = _full_commit(short, spec, pin, source_spec)
        if commit:
            notes.append(f"the sdist records commit {short} (vllm/_version.py); resolved to {commit} ({how})")
        else:
            commit, kind = short, pin_mod.ABBREVIATED
            notes.append(
                f"the sdist records only the abbreviated commit {short} (vllm/_version.py) and {how}: the pin "
                f"gets `commit = {short}` with `commit_kind = abbreviated`; the sdist's sha256 identifies "
                "the source. A git fetch of this pin needs the full id: complete it later with "
                f"`smla rebase --onto {spec} --upstream-commit <40-hex>`"
            )
    if commit is None:
        raise UsageError(
            f"cannot tell the upstream commit of vLLM {spec}: its sdist records no commit id "
            "(vllm/_version.py) and the pin needs one",
            hint=f"pass --upstream-commit <40-hex> (from `git ls-remote {cache.redact(pin.repo)} refs/tags/v{spec}^{{}}`)",
        )
    return Target(spec, "version", commit, spec, name, sha, "sdist", notes, archive=str(archive),
                  commit_kind=kind)


def _full_commit(short: str, version: str, pin: pin_mod.Pin, source_spec: str) -> tuple[str | None, str]:
    """(full id or None, how it was found / why not)."""
    if ids.is_full_commit(short):
        return short, "the sdist records the full id"
    if source.is_local_repo(source_spec):
        found = proc.git(Path(source_spec).expanduser(), "rev-parse", "-q", "--verify", "--end-of-options",
                         f"{short}^{{commit}}", check=False)
        if found.returncode == 0:
            return found.stdout.strip(), f"mirror {source_spec}"
        return None, f"the mirror {source_spec} does not hold it"
    if source_spec == "sdist":
        return None, "--source sdist asks for no git access"
    remote = source_spec if source_spec not in ("auto", "git") else pin.repo
    if Path(remote).suffix in (".gz", ".tgz"):
        return None, "no repository was given"
    tag = f"refs/tags/v{version}"
    res = proc.git(Path.cwd(), "ls-remote", "--", remote, tag, f"{tag}^{{}}", check=False, timeout=60)
    for line in res.stdout.splitlines():
        cid = line.split("\t", 1)[0]
        if cid.startswith(short) and ids.is_full_commit(cid):
            return cid, f"git ls-remote {cache.redact(remote)}"
    err = (res.stderr.strip().splitlines() or ["no matching tag"])[-1]
    return None, f"`git ls-remote {cache.redact(remote)}` could not resolve it ({cache.mask_credentials(err, remote)})"


def _snapshot_base(tree: Path, old_base: str, target: Target, echo) -> str:
    """Commit the sdist as a child of the old base (in a scratch worktree); return its id."""
    echo(f"committing {target.sdist} as the new base (child of {old_base[:12]})")
    upstream = target.commit if target.commit_kind == pin_mod.FULL else f"{target.commit} (abbreviated)"
    with proc.scratch_worktree(tree, old_base, checkout=False, prefix=".smla-rebase-base-") as scratch:
        source.unpack_sdist(Path(target.archive), scratch)
        return source.commit_snapshot(
            scratch,
            f"vLLM {target.version} (sdist {target.sdist})\n\nUpstream-Commit: {upstream}\n"
            f"Sdist-Sha256: {target.sdist_sha256}\nPrevious-Base: {old_base}\n",
        )
