"""The docs cannot drift from the code (issue 20, item 11).

- Every ```console block of README.md and docs/*.md (but the docs of GPU runs) is a transcript
  of real output (tests/doctext.py reads them). `smla explain` commands run through smla.explain, all of
  them at once (one interpreter per tree) against the work tree; the other commands of a
  document run in order, as one session, in bash, in a fresh copy of the toolkit root
  (lines/: each line's pin and patches/; the tree is fetched from the pinned sdist). Paths are shown as
  /src/vllm-sparse-mla (the checkout) and ~/.cache/vllm-sparse-mla (the cache).
- docs/series.md's table is generated from patches/series; no other prose lists patches or
  counts them, so a patch added, folded or renamed cannot leave a stale list behind.
- The README stays short, and the docs' relative links point at files and headings that exist.
`make docs` (pytest --update-docs) rewrites the transcripts and tables from what the code prints.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smla import explain, series
from smla.cache import cache_dir

import doctext
import lineproofs
from conftest import line_dir
from gitfixtures import REPO_ROOT

SHOWN_ROOT = "/src/vllm-sparse-mla"
SHOWN_CACHE = "~/.cache/vllm-sparse-mla"
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
# The documents this project's toolkit side keeps (the kernel docs and bench/ are written with
# the kernels, and may name patches by number).
OWN_DOCS = [README, DOCS / "series.md", DOCS / "toolkit.md", DOCS / "explain.md", DOCS / "errors.md",
            DOCS / "rebase.md", DOCS / "build-wheel.md", DOCS / "proof.md", DOCS / "limits.md"]
README_MAX_LINES = 220  # all of it, the speed section's figures included; details live in docs/


def _shown(text: str, paths: list[tuple[Path, str]]) -> list[str]:
    """Output as the docs show it: the given paths replaced (longest first), the pristine tree's
    base commit as <base commit>, trailing blanks dropped."""
    for real, shown in sorted(paths, key=lambda p: -len(str(p[0]))):
        text = text.replace(str(real), shown)
    text = re.sub(r"(/trees/)[0-9a-f]{40}", r"\1<base commit>", text)
    return [line.rstrip() for line in text.rstrip("\n").splitlines()]


def _is_explain(step: doctext.Step) -> bool:
    return step.command.startswith("smla explain ")


# --------------------------------------------------------------------------- generated tables


def series_table(line: str) -> list[str]:
    """docs/series.md's table of one line: every patch of its series, its Subject and the files it changes."""
    rows = ["| # | patch | what (its Subject) | files |", "|---|---|---|---|"]
    for i, p in enumerate(series.load(REPO_ROOT / "lines" / line / "patches").patches, 1):
        files = ", ".join(f"`{f}`" for f in p.files)
        subject = p.subject.replace("|", "\\|")
        rows.append(f"| {i} | `{p.name}` | {subject} | {files} |")
    return rows


def test_series_table_is_patches_series(update_docs):
    """One table per line in lines/, each its series."""
    path = DOCS / "series.md"
    for line in sorted(p.parent.parent.name for p in (REPO_ROOT / "lines").glob("*/patches/series")):
        name, table = f"series table {line}", series_table(line)
        doctext.check_or_update(path, f"the {name}", doctext.section(path, name), table,
                                update_docs, lambda: doctext.write_section(path, name, table))


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of `path` outside transcripts and generated sections."""
    lines = path.read_text().splitlines()
    skip = set()
    for t in doctext.transcripts(path):
        skip.update(range(t.start, t.end))
    inside = False
    for i, line in enumerate(lines):
        if re.match(r"^<!-- [\w .]+: generated .*-->$", line):
            inside = True
        elif re.match(r"^<!-- end of [\w .]+ -->$", line):
            inside = False
        elif inside:
            skip.add(i)
    return [(i + 1, line) for i, line in enumerate(lines) if i not in skip]


def test_no_hand_written_patch_lists():
    """Patch file names and patch counts appear only where they are generated or real output."""
    bad = []
    for path in OWN_DOCS:
        if path.name in ("rebase.md", "build-wheel.md"):  # they tell history ("the 5-patch series")
            continue
        for n, line in _prose(path):
            if re.search(r"\b\d{4}-[\w.-]+\.patch\b|\b\d+ patches\b|\bpatch(es)? \d{4}\b", line):
                bad.append(f"{path.name}:{n}: {line.strip()}")
    assert bad == [], "a hand-written patch list or count (generate it from patches/series):\n" + "\n".join(bad)


# --------------------------------------------------------------------------- the README and links


def test_readme_is_short_and_keeps_the_speed_section():
    lines = README.read_text().splitlines()
    start = lines.index("## Speed")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    assert len(lines) < README_MAX_LINES, "the README is read in ten minutes"
    assert any(line.startswith("<!-- speed:") or line.strip() for line in lines[start + 1:end])


def test_readme_promise_rows_are_one_short_line_each():
    """The promise table says what ran in a line per level; the full account is docs/proof.md."""
    lines = README.read_text().splitlines()
    start = lines.index("## The promise")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    rows = [ln for ln in lines[start:end] if ln.startswith("| ") and not ln.startswith("| level")]
    assert len(rows) >= 7 and all(len(ln) <= 240 for ln in rows), [ln for ln in rows if len(ln) > 240]
    assert "docs/proof.md" in "\n".join(lines[start:end])
    proof = (DOCS / "proof.md").read_text()
    assert all(f"| {ln.split('|')[1].strip()}" in proof for ln in rows if "DeepSeek-V4" not in ln)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of the Markdown headings in `path`."""
    out = set()
    for line in path.read_text().splitlines():
        m = re.match(r"^#+ (.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_relative_links_exist():
    bad = []
    for path in OWN_DOCS:
        for n, line in _prose(path):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                if not dest.exists():
                    bad.append(f"{path.name}:{n}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    bad.append(f"{path.name}:{n}: {target} (no such heading)")
    assert bad == []


def test_console_blocks_are_transcripts():
    """Every console block starts with a command, and a block is all `smla explain` or none of it
    (the two are run differently); templates and command lists use ```text / ```sh."""
    for path in doctext.checked_docs():
        for t in doctext.transcripts(path):
            kinds = {_is_explain(s) for s in t.steps}
            assert t.steps and len(kinds) == 1, f"{path.name}:{t.start}"


# --------------------------------------------------------------------------- the transcripts


@lineproofs.replaced_on(v0_33_0="docs/explain.md's transcripts are the 0.26.0 line's output (its DeepSeek-V4 "
                                 "ones ask VLLM_DSV4_PORTABLE); tests/test_explain.py checks explain on 0.33.0")
def test_explain_transcripts_are_real_output(vllm_tree, update_docs):
    """Each `smla explain` transcript, as `smla explain` prints it for the work tree now."""
    from smla.cli import main

    found = [(path, t) for path in doctext.checked_docs() for t in doctext.transcripts(path)
             if _is_explain(t.steps[0])]
    assert found, "docs/explain.md shows real output"
    asked = []  # (tree, description, options, cells) per step, in order
    for _, t in found:
        for step in t.steps:
            args = shlex.split(step.command)[2:]
            p = main.commands["explain"].make_context("explain", args).params
            cells = explain.plan(p["model"], capability=p["capability"], dtype=p["dtype"],
                                 kv_cache_dtype=p["kv_cache_dtype"], heads=p["heads"], tp=p["tp"],
                                 backend=p["backend"], matrix=p["matrix"])
            tree, desc = explain.resolve_tree(p["tree_spec"], vllm_tree)
            asked.append((tree, desc, p, cells))
    trees = list(dict.fromkeys(tree for tree, *_ in asked))
    answers = explain.explain_many([(tree, [c for tr, _, _, cells in asked if tr == tree for c in cells])
                                    for tree in trees])
    per_tree = dict(zip(trees, (iter(a) for a in answers)))
    outputs = iter([explain.render([next(per_tree[tree]) for _ in cells], desc, matrix=p["matrix"],
                                   as_json=p["as_json"])
                    for tree, desc, p, cells in asked])
    paths = [(vllm_tree, f"{SHOWN_ROOT}/work/{vllm_tree.parent.name}/vllm"), (REPO_ROOT, SHOWN_ROOT),
             (cache_dir(), SHOWN_CACHE)]
    _check(found, outputs, paths, update_docs)


@pytest.mark.slow  # fetches the pinned sdist
def test_session_transcripts_are_real_output(tmp_path, update_docs):
    """The other transcripts of each document, run in order in a fresh checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "smla").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m smla.cli \"$@\"\n")
    (bin_dir / "smla").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("SMLA_ROOT", "SMLA_TREE")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    sessions = 0
    for path in doctext.checked_docs():
        found = [(path, t) for t in doctext.transcripts(path) if not _is_explain(t.steps[0])]
        if not found:
            continue
        sessions += 1
        root = tmp_path / f"session-{sessions}" / "vllm-sparse-mla"
        shutil.copytree(REPO_ROOT / "lines", root / "lines")
        # A session whose commands name one line's paths (work/<release>/, lines/<release>/) runs on
        # that line ($SMLA_LINE), whichever line is the newest; else on the default, the newest.
        named = set(re.findall(r"\b(?:work|lines)/(\d+\.\d+\.\d+)/",
                               "\n".join(step.command for _, t in found for step in t.steps)))
        session_env = dict(env, SMLA_LINE=named.pop()) if len(named) == 1 else env
        outputs = []
        for _, t in found:
            for step in t.steps:
                res = subprocess.run(["bash", "-c", step.command], cwd=root, env=session_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, timeout=900)
                outputs.append(res.stdout)
        _check(found, iter(outputs), [(root, SHOWN_ROOT), (cache_dir(), SHOWN_CACHE)], update_docs)
    assert sessions, "docs/toolkit.md shows a real session"


def _check(found: list[tuple[Path, doctext.Transcript]], outputs, paths: list[tuple[Path, str]],
           update: bool) -> None:
    """Compare (or, updating, rewrite) the transcripts `found` with the raw `outputs`, one per step."""
    failures = []
    by_doc: dict[Path, list] = {}
    for path, t in found:
        real = [_shown(next(outputs), paths) for _ in t.steps]
        by_doc.setdefault(path, []).append((t, real))
        for step, got in zip(t.steps, real):
            try:
                doctext.check_or_update(path, f"the output of `{step.command}`", step.output, got, update,
                                        lambda: None)
            except AssertionError as exc:
                failures.append(str(exc))
    if update:
        for path, done in by_doc.items():
            doctext.write_transcripts(path, done)
    assert not failures, "\n\n".join(failures)
