"""`lines`: the release lines of a checkout, and the rule that keeps them one series.

Each maintained vLLM release has a line, lines/<release>/ (pin + patches/; smla.project). What the
series *adds* (new files: kernels, the backend, tests) must be the same file on every line, so a
kernel fix reaches every line at once; only a line's integration (the patches that change vLLM's
own files) differs. `compare` checks it: for every pair of lines, every file that both series add
is compared by its content after the whole series (new files are rebuilt from the patches alone,
no vLLM tree needed). A file that must differ is listed, with its reason, in lines/DIVERGENCE:

    # <path>: <reason>     (one per line; '#' starts a comment)
    vllm/v1/attention/backends/mla/triton_mla_sparse.py: 0.33.0's SparseMLACommonImpl hook ...

An entry without a reason, or one whose file no longer differs between any two lines that both
add it, is an error too (the list stays reviewed and current). `check` raises LinesDiverge
(exit 6) naming each file and pair; `smla lines --diff` prints the differences.
"""
from __future__ import annotations

import difflib
import itertools
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from smla import cache, proc, series as series_mod, treeinfo, treestate
from smla.errors import LinesDiverge, SeriesError, SmlaError, cmd
from smla.project import LINES_DIR, Project

ALLOW_FILE = "DIVERGENCE"
_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_SDIST = re.compile(r"^vllm-([0-9]+(?:\.[0-9]+)+)\.tar\.gz$")  # final releases only (no rc/dev/post)


def allow_list_path(project: Project) -> Path:
    return project.root / LINES_DIR / ALLOW_FILE


def read_allow_list(path: Path) -> dict[str, str]:
    """{path: reason} of lines/DIVERGENCE (missing file: none); SeriesError for an entry without a reason."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        rel, sep, reason = text.partition(":")
        if not sep or not rel.strip() or not reason.strip():
            raise SeriesError(f"{path}:{n}: an entry is `<path>: <reason>`, got {raw!r}",
                              hint="every file allowed to differ between lines says why")
        out[rel.strip()] = reason.strip()
    return out


def added_paths(patches_dir: Path) -> dict[str, list[str]]:
    """{path: [patch names]} of the files some patch of the series creates (`new file mode`)."""
    out: dict[str, list[str]] = {}
    for p in series_mod.load(patches_dir, allow_empty=True).patches:
        lines = p.path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            m = _DIFF_GIT.match(line)
            if not m:
                continue
            for follow in lines[i + 1:i + 4]:
                if follow.startswith("new file mode"):
                    out.setdefault(m.group(2), []).append(p.name)
                    break
                if follow.startswith(("diff --git", "@@", "--- ")):
                    break
    return out


def added_files(patches_dir: Path) -> dict[str, bytes]:
    """{path: content after the whole series} of every file the series adds: the patches' hunks for
    those files alone, applied in order to an empty repository (they exist in no vLLM base)."""
    paths = added_paths(patches_dir)
    if not paths:
        return {}
    s = series_mod.load(patches_dir, allow_empty=True)
    with tempfile.TemporaryDirectory(prefix="smla-lines-") as tmp:
        work = Path(tmp)
        proc.git(work, "init", "-q")
        for p in s.patches:
            touched = [f for f in p.files if f in paths]
            if not touched:
                continue
            includes = [f"--include={f}" for f in touched]
            res = proc.git(work, "apply", "--whitespace=nowarn", *includes, p.path, check=False)
            if res.returncode != 0:
                raise SeriesError(f"{p.name}: its hunks for the files the series adds do not apply in order "
                                  f"({(res.stderr.strip().splitlines() or ['git apply failed'])[-1]})",
                                  hint="the series must build its new files from nothing")
        return {rel: (work / rel).read_bytes() for rel in sorted(paths) if (work / rel).is_file()}


@dataclass
class Comparison:
    lines: list[str]
    differ: list[dict] = field(default_factory=list)  # {path, lines: [a, b], allowed: reason|None, diff}
    same: list[str] = field(default_factory=list)  # added by two or more lines, identical everywhere
    only: dict[str, list[str]] = field(default_factory=dict)  # line -> paths only that line adds
    stale: list[str] = field(default_factory=list)  # allow-list entries that no longer differ anywhere
    allow: dict[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        out = [f"{d['path']} differs between lines {d['lines'][0]} and {d['lines'][1]} (not in "
               f"{LINES_DIR}/{ALLOW_FILE})" for d in self.differ if d["allowed"] is None]
        out += [f"{LINES_DIR}/{ALLOW_FILE} lists {p}, which no longer differs between two lines that add it"
                for p in self.stale]
        return out

    def to_dict(self) -> dict:
        return {"lines": self.lines, "ok": not self.failures, "failures": self.failures,
                "differ": [{k: v for k, v in d.items() if k != "diff"} for d in self.differ],
                "same": self.same, "only": self.only, "allow_list": self.allow}


def compare(project: Project, *, with_diff: bool = False) -> Comparison:
    """Compare the added files of every pair of lines (oldest first), against lines/DIVERGENCE."""
    names = project.lines()
    allow = read_allow_list(allow_list_path(project))
    files = {ln: added_files(project.on(ln).patches_dir) for ln in names}
    cmp = Comparison(names, allow=allow)
    differing: set[str] = set()
    shared: set[str] = set()
    for a, b in itertools.combinations(names, 2):
        for rel in sorted(files[a].keys() & files[b].keys()):
            shared.add(rel)
            if files[a][rel] == files[b][rel]:
                continue
            differing.add(rel)
            diff = ""
            if with_diff:
                diff = "".join(difflib.unified_diff(
                    files[a][rel].decode(errors="replace").splitlines(keepends=True),
                    files[b][rel].decode(errors="replace").splitlines(keepends=True),
                    f"{a}/{rel}", f"{b}/{rel}"))
            cmp.differ.append({"path": rel, "lines": [a, b], "allowed": allow.get(rel), "diff": diff})
    cmp.same = sorted(shared - differing)
    for ln in names:
        others = set().union(*(files[o].keys() for o in names if o != ln)) if len(names) > 1 else set()
        only = sorted(files[ln].keys() - others)
        if only and len(names) > 1:
            cmp.only[ln] = only
    cmp.stale = sorted(p for p in allow if p not in differing)
    return cmp


def check(project: Project) -> Comparison:
    """compare(), raising LinesDiverge when a file differs without an allow-list entry or an entry is stale."""
    cmp = compare(project)
    if cmp.failures:
        raise LinesDiverge(
            "the lines' added files diverge: " + "; ".join(cmp.failures),
            hint=f"make the file the same on every line (edit it in one line's tree, carry the change to the "
                 f"others), or list it with its reason in {LINES_DIR}/{ALLOW_FILE}; "
                 f"{cmd('smla', 'lines', '--diff')} shows the differences",
        )
    return cmp


def newer_releases(project: Project) -> list[str]:
    """vLLM releases on the package index (their sdists) newer than every line here, oldest first:
    what the nightly job opens a line for (`smla lines --newer-releases`)."""
    from smla.project import version_key

    newest = version_key(project.newest_line())
    found = {m.group(1) for name, _url, _sha in cache.pypi_files("vllm") if (m := _SDIST.match(name))}
    return sorted((v for v in found if version_key(v) > newest), key=version_key)


def overview(project: Project) -> list[dict]:
    """One row per line: release, pin, series length, its work tree and whether that tree is in sync."""
    rows = []
    for ln in project.lines():
        p = project.on(ln)
        row = {"line": ln, "default": ln == project.newest_line(), "selected": ln == project.line,
               "tree": str(p.line_tree), "tree_state": "absent", "in_sync": False}
        try:
            pin = p.pin()
            s = series_mod.load(p.patches_dir, allow_empty=True)
            row.update(pin={"version": pin.version, "commit": pin.commit_label()}, patches=len(s.patches))
            row["tree_state"], row["in_sync"] = _tree_state(p.line_tree, pin.commit, s)
        except SmlaError as exc:
            row["error"] = exc.message
        rows.append(row)
    return rows


def _tree_state(tree: Path, pin_commit: str, s) -> tuple[str, bool]:
    info = treeinfo.read_tree_info(tree)
    if info is None:
        return ("absent" if not tree.exists() else "not an smla tree"), False
    if treeinfo.rebase_in_progress(tree):
        return "rebase stopped", False
    if info.upstream_commit != pin_commit:
        return f"not at the pin (holds vLLM {info.version})", False
    st = treestate.compare(tree, s)
    return ("in sync" if st.in_sync else st.kind), st.in_sync


def text(rows: list[dict], cmp: Comparison | None = None, *, show_diff: bool = False) -> str:
    out = []
    for r in rows:
        mark = "*" if r["selected"] else " "
        if "error" in r:
            out.append(f"{mark} {r['line']:<10} error: {r['error']}")
            continue
        out.append(f"{mark} {r['line']:<10} vLLM {r['pin']['version']} ({r['pin']['commit']}), "
                   f"{r['patches']} patches, tree {r['tree']}: {r['tree_state']}"
                   + ("  [default]" if r["default"] else ""))
    if cmp is not None:
        out.append("")
        if len(cmp.lines) < 2:
            out.append("added files: one line, nothing to compare")
        else:
            out.append(f"added files: {len(cmp.same)} identical on every line that adds them, "
                       f"{len({d['path'] for d in cmp.differ})} differ")
        for d in cmp.differ:
            why = f"allowed: {d['allowed']}" if d["allowed"] else "NOT ALLOWED (lines/DIVERGENCE)"
            out.append(f"  differs {d['path']} ({d['lines'][0]} vs {d['lines'][1]}): {why}")
            if show_diff and d["diff"]:
                out += ["    " + ln for ln in d["diff"].rstrip("\n").splitlines()]
        for ln, paths in cmp.only.items():
            out.append(f"  only in {ln}: {', '.join(paths)}")
        for p in cmp.stale:
            out.append(f"  stale allow-list entry: {p}")
    return "\n".join(out) + "\n"
