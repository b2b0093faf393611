"""Does the replayed series still *work* on the new base? The semantic check of `smla rebase`.

A patch that applies textually can still be broken: a new file written against interfaces the new
base removed applies "unchanged" (it only adds files). So, after the replay (and at a conflict
stop, for the patches replayed so far), three checks run, on by default:

1. imports: every vllm/ module the replayed patches add or change is imported, each on its own, in
   a fresh interpreter (smla/_import_worker.py, with the selection harness's stand-ins for what a
   CPU checkout lacks, and permissive stand-ins for third-party packages this interpreter does not
   have, e.g. xgrammar: the check judges vLLM's interfaces, not the installed packages), on the new
   result and on the old line's patched tree. A module that imports
   on the old tree and not on the new one is broken, and so is every patch that added or changed it;
   one that fails on both is reported as not checkable here.
2. selection (when the series is complete and the tree has vLLM's selector): the cells of
   SERIES_CELLS where the old patched tree's own selector picks TRITON_MLA_SPARSE (where the series
   says it should) must pick it on the new tree too, unless the new pristine base now has a backend
   of its own there (a hole closed upstream: noted, not broken).
3. tests (when the series is complete, unless --no-test): `python -m pytest -m "not gpu"` of the
   toolkit root with SMLA_LINE/SMLA_TREE naming the new line and tree; skipped when the root has no
   tests/.

Every patch gets `checks` (what failed, attributed by the files it touched); the result's `checks`
holds the details. Any failure makes a finished rebase "broken" (exit 13, RebaseBroken).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from smla import _import_worker, proc, selection
from smla.rebase.report import Outcome

OURS = "TRITON_MLA_SPARSE"
# The selection cells the series promises to fill where upstream has no backend (sm80/86/89 have no
# sparse-MLA backend upstream; sm12x only a bf16 one): DSA geometries, both model dtypes, the default
# cache. Checked only where the old line's patched tree picks OURS.
SERIES_CELLS = selection.matrix_cells(presets=["glm-5", "deepseek-v3.2"], capabilities=["8.0", "8.6", "8.9", "12.0"],
                                      dtypes=["bfloat16", "float16"], kv_cache_dtypes=["auto"], heads=[64])


def check(root: Path, tree: Path, state: dict, outs: list[Outcome], *, complete: bool, run_tests: bool,
          line: str, echo=print) -> dict:
    """Run the checks on HEAD of `tree` (the replay so far); mark each patch's `checks`; the details."""
    touched = _touched_modules(tree, state["new_base"], outs)
    for o in outs:
        o.checks = []
    res: dict = {"complete": complete, "imports": None, "selection": None, "tests": None}
    modules = sorted(touched)
    echo(f"checking the replayed series: {len(modules)} modules it adds or changes import against the new base")
    with proc.scratch_worktree(tree, "HEAD", prefix=".smla-verify-new-") as new, \
            proc.scratch_worktree(tree, state["orig_head"], prefix=".smla-verify-old-") as old:
        res["imports"] = _imports(new, old, modules, touched, outs)
        res["imports"]["by_patch"] = {o.name: sorted(m for m, ps in touched.items() if o.name in ps)
                                      for o in outs if any(o.name in ps for ps in touched.values())}
        if complete:
            res["selection"] = _selection(new, old, tree, state["new_base"], outs, touched)
    if complete and run_tests:
        res["tests"] = run_cpu_suite(root, tree, line, echo)
        if not res["tests"]["passed"] and res["tests"].get("ran", True):
            for o in outs:
                if o.commits:
                    o.checks.append("the line's CPU tests fail on the new base (see the tests section)")
                    break
    elif complete:
        res["tests"] = {"ran": False, "passed": True, "note": "skipped: --no-test", "command": "", "returncode": None,
                        "tail": ""}
    res["broken"] = any(o.checks for o in outs) or bool(res["tests"] and not res["tests"]["passed"])
    return res


def _touched_modules(tree: Path, new_base: str, outs: list[Outcome]) -> dict[str, list[str]]:
    """{module: [patch names]} of the .py files under vllm/ that the replayed commits add or modify."""
    commits = proc.git_out(tree, "rev-list", "--reverse", f"{new_base}..HEAD").split()
    touched: dict[str, list[str]] = {}
    i = 0
    for o in outs:
        for c in commits[i:i + o.commits]:
            out = proc.git_out(tree, "diff-tree", "--no-commit-id", "-r", "--name-status", c)
            for ln in out.splitlines():
                status, _, path = ln.partition("\t")
                if status[:1] in "AM" and path.startswith("vllm/") and path.endswith(".py"):
                    mod = path[:-3].replace("/", ".").removesuffix(".__init__")
                    names = touched.setdefault(mod, [])
                    if o.name not in names:
                        names.append(o.name)
        i += o.commits
    return touched


def _run_imports(tree: Path, modules: list[str]) -> dict:
    """The import worker, again with every third-party package it found missing stood in, until no
    new one is missing (a CPU checkout lacks some of vLLM's requirements: e.g. xgrammar for 0.33.0)."""
    stubs: list[str] = []
    for _ in range(8):
        out = _run_import_worker(tree, modules, stubs)
        new = [m for m in out.get("missing", []) if m not in stubs]
        if not new:
            return out
        stubs += new
    return out


def _run_import_worker(tree: Path, modules: list[str], stubs: list[str]) -> dict:
    payload = json.dumps({"tree": str(tree), "modules": modules, "capability": "9.0", "stub_packages": stubs})
    env = {"VLLM_LOGGING_LEVEL": "ERROR", "VLLM_TARGET_DEVICE": "cuda"}
    r = proc.run([sys.executable, str(Path(_import_worker.__file__).resolve())], input=payload, timeout=900,
                 cwd=str(tree.parent), env=env, check=False)
    if _import_worker.MARKER not in r.stdout:
        err = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return {"setup_error": f"the import check itself failed: {err}",
                "results": {m: f"not run ({err})" for m in modules}, "stand_ins": []}
    return json.loads(r.stdout.split(_import_worker.MARKER, 1)[1])


def _imports(new: Path, old: Path, modules: list[str], touched: dict, outs: list[Outcome]) -> dict:
    if not modules:
        return {"ran": True, "modules": 0, "failed": [], "not_checkable": []}
    now, before = _run_imports(new, modules), _run_imports(old, modules)
    for res, where in ((now, new), (before, old)):  # paths inside the scratch trees: tree-relative
        res["results"] = {m: e and e.replace(f"{where}/", "") for m, e in res["results"].items()}
    failed, unknown = [], []
    by_name = {o.name: o for o in outs}
    for m in modules:
        err = now["results"].get(m)
        if err is None:
            continue
        was = before["results"].get(m)
        on_old = (old / (m.replace(".", "/") + ".py")).exists() or (old / m.replace(".", "/") / "__init__.py").exists()
        if on_old and was is not None:  # fails on the old line too: this check cannot judge it here
            unknown.append({"module": m, "error": err, "old_error": was})
            continue
        failed.append({"module": m, "error": err, "patches": touched[m]})
        for name in touched[m]:
            by_name[name].checks.append(f"import {m}: {err}")
    return {"ran": True, "modules": len(modules), "failed": failed, "not_checkable": unknown,
            "setup_error": now.get("setup_error"), "stand_ins": now.get("stand_ins", [])}


def _has_selector(tree: Path) -> bool:
    return (tree / "vllm" / "v1" / "attention" / "selector.py").is_file()


def _cell_label(r: dict) -> str:
    return f"{r['preset']} sm{r['capability']} {r['dtype']} kv {r['kv_cache_dtype']} {r['heads']} heads"


def _selection(new: Path, old: Path, tree: Path, new_base: str, outs: list[Outcome],
               touched: dict[str, list[str]]) -> dict:
    if not (_has_selector(new) and _has_selector(old)):
        return {"ran": False, "note": "skipped: not a vLLM tree with vllm/v1/attention/selector.py", "failed": []}
    try:
        was, now = selection.run_selections([(old, SERIES_CELLS), (new, SERIES_CELLS)])
    except Exception as exc:  # the selector itself does not run on the new tree
        msg = getattr(exc, "message", str(exc)).strip().splitlines()[-1:] or ["?"]
        _blame_selection(outs, touched, f"the new tree's selector does not run: {msg[0][:300]}")
        return {"ran": True, "failed": [{"cell": "all", "error": msg[0][:300]}], "promised": None}
    promised = [(w, n) for w, n in zip(was, now) if w.get("selected") == OURS]
    wrong = [(w, n) for w, n in promised if n.get("selected") != OURS]
    closed, failed = [], []
    if wrong:
        with proc.scratch_worktree(tree, new_base, prefix=".smla-verify-base-") as base:
            pristine = selection.run_selection(base, [selection.Cell.of(n) for _, n in wrong])
        for (_, n), p in zip(wrong, pristine):
            if p.get("selected") and n.get("selected") == p.get("selected"):
                closed.append({"cell": _cell_label(n), "upstream": p["selected"]})
            else:
                failed.append({"cell": _cell_label(n), "selected": n.get("selected"),
                               "error": (n.get("error") or n.get("input_error") or "")[:300]})
    if failed:
        _blame_selection(outs, touched,
                         f"the selector does not pick {OURS} in {len(failed)} of the {len(promised)} cells "
                               f"the series fills (e.g. {failed[0]['cell']}: {failed[0]['selected'] or 'no backend'})")
    return {"ran": True, "promised": len(promised), "failed": failed, "closed_upstream": closed}


# The modules that register attention backends and order them per platform.
SELECTION_MODULES = ("vllm.v1.attention.backends.registry", "vllm.platforms.cuda")


def _blame_selection(outs: list[Outcome], touched: dict[str, list[str]], msg: str) -> None:
    """A selection failure belongs to the patches that register or order the backend: those that
    change SELECTION_MODULES (touched: {module: [patch names]}), else the last replayed one."""
    names = {n for m in SELECTION_MODULES for n in touched.get(m, [])}
    hit = [o for o in outs if o.commits and o.name in names]
    for o in hit or [o for o in outs if o.commits][-1:]:
        o.checks.append(msg)


def run_cpu_suite(root: Path, tree: Path, line: str, echo=print) -> dict:
    """`pytest -m "not gpu"` of the toolkit root against the new line's tree (its pin is written)."""
    command = 'python -m pytest -m "not gpu"'
    if not (root / "tests").is_dir():
        return {"ran": False, "passed": True, "command": command, "returncode": None,
                "tail": "", "note": f"skipped: {root} has no tests/"}
    echo(f"running the CPU suite against {tree} (line {line}) ...")
    env = {"SMLA_TREE": str(tree), "SMLA_ROOT": str(root), "SMLA_LINE": line}
    res = proc.run([sys.executable, "-m", "pytest", "-m", "not gpu", "-q", "-p", "no:cacheprovider"],
                   cwd=root, env=env,
                   check=False, timeout=3600)
    tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
    echo(tail)
    return {"ran": True, "command": command, "returncode": res.returncode, "passed": res.returncode == 0,
            "tail": tail}
