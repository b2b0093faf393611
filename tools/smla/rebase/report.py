"""What a rebase did, per patch, and its reports: text, JSON and Markdown (a pull-request body).

Outcomes (docs/rebase.md):
  unchanged   applies as is (`git apply --check`, no offsets)
  offsets     applies, some hunks moved (no fuzz, context intact)
  merged      needed a three-way merge, merged without conflict
  upstream    the change is already in the new base (nothing left)
  conflict    the merge conflicts: the run stops here
  resolved    after `--continue`: the conflict was resolved by hand
  skipped     after `--continue`: dropped by the user (`git am --skip`)
  pending     not replayed yet
A replayed patch can also be *broken* (its `checks` say what failed: rebase/verify.py), whatever
its textual outcome: a finished rebase with a broken patch has status "broken" (exit 13).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from smla import report
from smla.errors import RebaseBroken, RebaseConflict, SmlaError, cmd
from smla.treeinfo import PENDING  # the same state as apply's

UNCHANGED = "unchanged"
OFFSETS = "offsets"
MERGED = "merged"
CONFLICT = "conflict"
RESOLVED = "resolved"
SKIPPED = "skipped"


@dataclass
class Outcome:
    name: str
    subject: str
    outcome: str = PENDING
    offsets: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # conflicted files
    hunks: list[str] = field(default_factory=list)  # hunks that did not apply as is
    commits: int = 0  # commits this patch produced on the new base
    new_names: list[str] = field(default_factory=list)
    detail: str = ""
    new_files_only: bool = False  # the patch only adds files: it always applies, whatever the new base
    checks: list[str] = field(default_factory=list)  # what the semantic check found broken (rebase/verify.py)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "Outcome":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class RebaseResult:
    status: str  # "clean", "broken" (replayed, semantically broken), "conflict", "noop", "aborted"
    tree: str
    old: dict
    new: dict
    target: dict
    patches: list[Outcome]
    pin_before: dict
    pin_after: dict | None = None
    stopped_at: str | None = None
    export: dict | None = None
    tests: dict | None = None
    stops: list[dict] = field(default_factory=list)  # every conflict stop of this rebase, in order
    range_diff: str = ""  # `git range-diff` old series vs new series (what the rebase changed in each patch)
    report_dir: str | None = None  # remembered from --onto, so --continue/--abort report there too
    report_name: str | None = None
    kept: list[str] = field(default_factory=list)  # what was made or edited during a stop, kept (and where)
    undo: list[str] = field(default_factory=list)  # a finished rebase: the commands that undo it, in order
    checks: dict | None = None  # the semantic check's details (rebase/verify.py)
    line: dict | None = None  # {"from": release, "to": release, "opened": bool}

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "tree": self.tree,
            "old_base": self.old,
            "new_base": self.new,
            "target": self.target,
            "patches": [p.to_dict() for p in self.patches],
            "counts": self.counts(),
            "pin": {"before": self.pin_before, "after": self.pin_after,
                    "changed": bool(self.pin_after) and self.pin_after != self.pin_before},
            "stopped_at": self.stopped_at,
            "export": self.export,
            "tests": self.tests,
            "checks": self.checks,
            "line": self.line,
            "broken": [{"name": p.name, "checks": p.checks} for p in self.patches if p.checks],
            "stops": self.stops,
            "range_diff": self.range_diff,
            "kept": self.kept,
            "undo": self.undo,
        }

    def counts(self) -> dict:
        out: dict[str, int] = {}
        for p in self.patches:
            out[p.outcome] = out.get(p.outcome, 0) + 1
        return out

    def error(self) -> SmlaError | None:
        """RebaseConflict when stopped on a conflict; RebaseBroken when the semantic check failed; else None."""
        if self.status == "conflict":
            stopped = next(p for p in self.patches if p.outcome == CONFLICT)
            return RebaseConflict(
                f"rebase stopped: patch {stopped.name} conflicts in {', '.join(stopped.files) or '?'}",
                hint=resolve_hint(Path(self.tree), self.line),
            )
        if self.status == "broken":
            broken = [p for p in self.patches if p.checks]
            what = "; ".join(f"{p.name}: {p.checks[0]}" for p in broken[:3]) or "the CPU suite failed"
            if self.tests and not self.tests["passed"]:
                what += f"; the CPU suite exited {self.tests['returncode']}"
            return RebaseBroken(
                f"the series replayed onto the new base, but is broken there: {what}",
                hint="the report lists every broken patch and what failed; fix the series in the tree "
                     f"({self.tree}), `smla export`, and check again with `make test`",
            )
        return None

    def raise_for_status(self) -> None:
        err = self.error()
        if err is not None:
            raise err


def resolve_hint(tree: Path, line: dict | None = None) -> str:
    """`line`: the state's/report's line record; a rebase that opened a new line names it (`--line X`),
    so the hint holds also where `--line`, $SMLA_LINE or make's VLLM= picks the old line."""
    on = ["--line", line["to"]] if line and line.get("opened") else []
    go, skip, stop = (cmd("smla", *on, "rebase", flag) for flag in ("--continue", "--continue", "--abort"))
    return (
        f"resolve the conflicts in {tree} (edit, then {cmd('git', '-C', tree, 'add', '<files>')}), "
        f"then run {go}; drop the patch with "
        f"{cmd('git', '-C', tree, 'am', '--skip')} + {skip}; or give up with {stop}"
    )


def text(r: RebaseResult) -> str:
    d = r.to_dict()
    old, new = d["old_base"], d["new_base"]
    if r.status == "aborted":
        if r.line and r.line.get("opened"):
            if not r.kept:
                return (f"rebase onto {r.target['spec']} aborted: the line lines/{r.line['to']}/ it opened and its "
                        f"work tree {r.tree} are removed; line {r.line['from']} was never changed\n")
            return (f"rebase onto {r.target['spec']} aborted: what it made in the line lines/{r.line['to']}/ and "
                    f"its work tree {r.tree} is removed, what was made there during the stop is kept (below: "
                    f"move it where you want it, then remove what is left); line {r.line['from']} was never "
                    "changed\n" + "".join(f"kept: {k}\n" for k in r.kept))
        return (f"rebase onto {r.target['spec']} aborted: {r.tree} is back at {_label(old, None)} "
                "with its original branch; pin file and patches/ restored byte for byte\n"
                + "".join(f"kept: {k}\n" for k in r.kept))
    lines = [f"rebase {r.status}: {_label(old, None)} -> {_label(new, r.target)} in {r.tree}"]
    for p in r.patches:
        extra = []
        if p.offsets:
            extra.append("; ".join(p.offsets))
        if p.files:
            extra.append("files: " + ", ".join(p.files))
        if p.new_names and p.new_names != [p.name]:
            extra.append("now " + ", ".join(p.new_names))
        if p.new_files_only and p.outcome in (UNCHANGED, OFFSETS) and not _imports_checked(r, p):
            extra.append("new files only: not checked against the new base")
        lines.append(f"  {p.outcome:<10} {p.name}" + (f"  ({' | '.join(extra)})" if extra else ""))
        lines += [f"               BROKEN: {c}" for c in p.checks]
        lines += [f"               {h}" for h in (p.hunks if p.outcome == CONFLICT else [])]
    counts = ", ".join(f"{n} {k}" for k, n in sorted(d["counts"].items()))
    lines.append(f"summary: {counts}")
    for note in r.target.get("notes", []):
        lines.append(f"note: {note}")
    if r.status == "conflict":
        lines.append(f"next: {resolve_hint(Path(r.tree), r.line)}")
    if r.pin_after and d["pin"]["changed"]:
        lines.append("pin: " + ", ".join(f"{k} {r.pin_before.get(k, '-')} -> {v}"
                                          for k, v in r.pin_after.items() if r.pin_before.get(k) != v))
    lines += checks_lines(r.checks)
    if r.tests:
        lines.append(f"tests: {r.tests.get('note') or ('passed' if r.tests['passed'] else 'FAILED')} "
                     f"({r.tests['command']})")
    lines += [f"kept: {k}" for k in r.kept]
    if r.undo:
        lines.append("undo: " + ", then ".join(f"`{c}`" for c in r.undo))
    return "\n".join(lines) + "\n"


def _imports_checked(r: RebaseResult, p: Outcome) -> int:
    """How many of the patch's modules the semantic check imported (0: none, or no check ran)."""
    return len(((r.checks or {}).get("imports") or {}).get("by_patch", {}).get(p.name, []))


def checks_lines(c: dict | None) -> list[str]:
    """The semantic check in short (text report and the Markdown's section)."""
    if not c:
        return []
    out = []
    imp = c.get("imports") or {}
    if imp:
        out.append(f"imports: {imp.get('modules', 0)} modules added or changed by the series, "
                   f"{len(imp.get('failed', []))} broken on the new base"
                   + (f", {len(imp['not_checkable'])} fail on the old line too (not judged)"
                      if imp.get("not_checkable") else ""))
        out += [f"  {f['module']}: {f['error']} ({', '.join(f['patches'])})" for f in imp.get("failed", [])]
        stood = [x.split(": ", 1)[1] for x in imp.get("stand_ins", []) if x.startswith("not installed here")]
        if stood:
            out.append(f"  (not installed here, stood in: {', '.join(stood)})")
    sel = c.get("selection")
    if sel is None:
        out.append("selection: not run (the series is not fully replayed)")
    elif not sel.get("ran"):
        out.append(f"selection: {sel.get('note')}")
    else:
        out.append(f"selection: {len(sel.get('failed', []))} of {sel.get('promised')} cells the series fills "
                   f"do not pick {'TRITON_MLA_SPARSE'}"
                   + (f"; {len(sel['closed_upstream'])} now served upstream" if sel.get("closed_upstream") else ""))
        out += [f"  {f['cell']}: {f.get('selected') or 'no backend'} {f.get('error', '')}".rstrip()
                for f in sel.get("failed", [])]
    return out


def _label(base: dict, target: dict | None, q: str = "") -> str:
    """vLLM 0.17.0 (abc) for a release, vLLM commit abc for a commit target."""
    c = f"{q}{base['upstream_commit'][:12]}{q}"
    if target is not None and target.get("kind") == "commit":
        return f"vLLM commit {c}"
    if base.get("commit_kind") == "abbreviated":
        c = f"{q}{base['upstream_commit']}{q}, abbreviated"
    return f"vLLM {base['version']} ({c})"


def markdown(r: RebaseResult) -> str:
    d = r.to_dict()
    old, new = d["old_base"], d["new_base"]
    title = {"clean": "Rebase the sparse-MLA series", "broken": "Rebase BROKEN (replayed, fails the semantic check)",
             "conflict": "Rebase CONFLICT",
             "noop": "Nothing to rebase", "aborted": "Rebase aborted"}[r.status]
    out = [f"## {title}: {_label(old, None, '`')} → {_label(new, r.target, '`')}", ""]
    out.append(f"Target `{r.target['spec']}` ({r.target['kind']}); old base `{old['upstream_commit'][:12]}` "
               f"({old['source']}), new base `{new['upstream_commit'][:12]}` ({new['source']}).")
    out.append("")
    rows = []
    for p in r.patches:
        notes = []
        if p.offsets:
            notes.append("; ".join(p.offsets))
        if p.files:
            notes.append("files: " + ", ".join(f"`{f}`" for f in p.files))
        if p.hunks and p.outcome in (CONFLICT, RESOLVED, MERGED):
            notes.append("hunks: " + "; ".join(h.replace("|", "\\|") for h in p.hunks))
        if p.detail:
            notes.append(p.detail.replace("|", "\\|"))
        if p.new_files_only and p.outcome in (UNCHANGED, OFFSETS):
            checked = _imports_checked(r, p)
            notes.append(f"adds new files only; its {checked} module{'s' if checked != 1 else ''} imported "
                         "against the new base (semantic check)"
                         if checked else NEW_FILES_NOTE)
        notes += [f"**broken**: {c}".replace("|", "\\|") for c in p.checks]
        outcome = f"**{p.outcome}**" + (", **broken**" if p.checks else "")
        rows.append([f"`{p.name}`", p.subject.replace("|", "\\|"), outcome,
                     ", ".join(f"`{n}`" for n in p.new_names) or "—", "<br>".join(notes) or ""])
    out.append(report.md_table(["patch", "subject", "outcome", "exported as", "notes"], rows))
    out.append("Outcomes: " + ", ".join(f"{n} {k}" for k, n in sorted(d["counts"].items())) + ".")
    out.append("")
    if r.pin_after and d["pin"]["changed"]:
        out += ["### `vllm-pin.txt`", "", "```diff"]
        for k, v in r.pin_after.items():
            if r.pin_before.get(k) != v:
                if k in r.pin_before:
                    out.append(f"- {k} = {r.pin_before[k]}")
                out.append(f"+ {k} = {v}")
        out += ["```", ""]
    if r.target.get("notes"):
        out += [f"- {n}" for n in r.target["notes"]] + [""]
    if r.stops:
        out += ["### Conflict stops", ""]
        for i, stop in enumerate(r.stops, 1):
            hunks = "; ".join(h.replace("|", "\\|") for h in stop.get("hunks", [])) or "—"
            out.append(f"{i}. `{stop['patch']}`: files {', '.join(f'`{f}`' for f in stop['files']) or '?'}; "
                       f"hunks with conflict markers: {hunks}"
                       + (f" ({stop['detail']})" if stop.get("detail") else ""))
        out.append("")
    if r.status == "conflict":
        out += ["### Needs a human", "", f"The rebase stopped at `{r.stopped_at}`. {resolve_hint(Path(r.tree), r.line)}.", ""]
    if r.range_diff:
        out += ["### What changed in each patch (`git range-diff` old series → new series)", "",
                "<details><summary>range-diff</summary>", "", "```diff", r.range_diff.rstrip(), "```", "",
                "</details>", ""]
    if r.line and r.line.get("opened"):
        out += [f"Opened the release line `lines/{r.line['to']}/` from `lines/{r.line['from']}/` "
                f"(left unchanged).", ""]
    if r.checks:
        out += ["### Semantic check", "", *[f"- {ln.strip()}" if not ln.startswith("  ") else f"  - {ln.strip()}"
                                            for ln in checks_lines(r.checks)], ""]
    if r.tests and r.tests.get("ran", True):
        out += [f"### Tests: {'passed' if r.tests['passed'] else 'FAILED'}", "",
                f"`{r.tests['command']}` exited {r.tests['returncode']}.", "", "```", r.tests["tail"], "```", ""]
    return "\n".join(out)


NEW_FILES_NOTE = ("adds new files only: applies whatever the new base, so this outcome says nothing about "
                  "its code against the new base's interfaces")


def default_report_name(r: RebaseResult) -> str:
    """`rebase-<old version>-to-<new version or commit>`, the reports/ naming of this repository."""
    new = r.target["version"] if r.target.get("kind") == "version" else r.target["commit"][:12]
    return f"rebase-{r.old['version']}-to-{new}"  # from the target: an aborted rebase reports there too


def portable(r: RebaseResult, root: Path | None) -> RebaseResult:
    """A copy whose paths are relative to the toolkit root (for reports that get committed)."""
    import copy

    if root is None:
        return r
    out = copy.copy(r)

    def rel(p: str) -> str:
        try:
            return str(Path(p).resolve().relative_to(root.resolve()))
        except ValueError:
            return p

    out.tree = rel(r.tree)
    if r.export:
        out.export = {**r.export, "directory": rel(r.export["directory"])}
    return out


def write_reports(r: RebaseResult, directory: Path, name: str | None = None, root: Path | None = None) -> list[Path]:
    """<name>.json/.md/.txt in `directory` (name: rebase-report; `auto`: rebase-<old>-to-<new>),
    paths relative to `root`."""
    name = default_report_name(r) if name == "auto" else (name or "rebase-report")
    r = portable(r, root)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{name}.json", directory / f"{name}.md", directory / f"{name}.txt"]
    report.write(paths[0], report.to_json(r.to_dict()))
    report.write(paths[1], markdown(r))
    report.write(paths[2], text(r))
    return paths


def write_refusal(exc, directory: Path, name: str | None = None, *, action: str = "") -> list[Path]:
    """Reports for a rebase that was refused or failed before (or without) a result: what and why.

    `name`: as for write_reports, so a refusal replaces an older report of that name instead of leaving
    it looking current; `auto` (a target that may never have resolved) writes rebase-refused.*."""
    name = "rebase-report" if name is None else ("rebase-refused" if name == "auto" else name)
    data = {"status": "refused", "action": action, **exc.to_dict()}
    md = "\n".join([f"## Rebase refused: `{action}`", "", exc.message, "",
                     *([f"Next: {exc.hint}", ""] if exc.hint else []),
                     f"Exit code {exc.exit_code} ({type(exc).__name__}); the pin and patches/ are unchanged "
                     "by this run.", ""])
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{name}.json", directory / f"{name}.md", directory / f"{name}.txt"]
    report.write(paths[0], report.to_json(data))
    report.write(paths[1], md)
    report.write(paths[2], f"rebase refused ({action}): {exc.message}\n" + (f"hint: {exc.hint}\n" if exc.hint else ""))
    return paths
