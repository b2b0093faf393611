"""The toolkit's import structure (issue 20, items 7-9): no import circle anywhere in smla (lazy
imports inside functions count too); command modules never import command modules; the facts about a
work tree live in smla.treeinfo, below source and treestate; cli.py only parses and calls."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "tools" / "smla"

# One module (or package) per `smla` command. They may use every library module, never each other.
COMMANDS = {"smla.fetch", "smla.clean", "smla.apply", "smla.export", "smla.status", "smla.wheel",
            "smla.explain", "smla.rebase", "smla.lines"}
# The one exception, by name: a rebase applies a changed patches/ first and re-exports the result
# (as `smla patch` is fetch + apply); it calls those two entry points and takes nothing else from them.
ALLOWED = {("smla.rebase", "smla.apply"): {"apply_series"}, ("smla.rebase", "smla.export"): {"export"}}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports(name: str) -> dict[str, set[str]]:
    """{imported smla module: names used from it ('*' for the module itself)}, function-level imports included."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("smla"):
                    found.setdefault(a.name, set()).add("*")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("smla"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    found.setdefault(sub, set()).add("*")
                else:
                    found.setdefault(base, set()).add(a.name)
    found.pop(name, None)
    return found


def owner(module: str) -> str:
    """The command a module belongs to (smla.rebase.replay -> smla.rebase), else itself."""
    for c in COMMANDS:
        if module == c or module.startswith(c + "."):
            return c
    return module


def test_no_import_circle():
    graph = {m: {i for i in imports(m) if i in MODULES} for m in MODULES}
    # a package's submodules import each other through the package: only circles between modules count
    for m in graph:
        graph[m] = {i for i in graph[m] if not (m.startswith(i + ".") and MODULES[i].name == "__init__.py")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_command_modules_never_import_command_modules():
    assert COMMANDS <= set(MODULES), COMMANDS - set(MODULES)
    bad = []
    for m in MODULES:
        me = owner(m)
        if me not in COMMANDS:
            continue
        for imported, names in imports(m).items():
            other = owner(imported)
            if other in COMMANDS and other != me and not names <= ALLOWED.get((me, other), set()):
                bad.append(f"{m} imports {sorted(names)} from {imported}")
    assert bad == []


def test_tree_facts_live_below_source_and_treestate():
    facts = {"BASE_TAG", "BRANCH", "REBASE_STATE_DIR", "TreeInfo", "read_tree_info", "rebase_in_progress",
             "require_tree", "dirty_files", "commits_above_base", "APPLIED", "ALREADY", "UPSTREAM", "PENDING"}
    treeinfo = imports("smla.treeinfo")
    assert set(treeinfo) <= {"smla.proc", "smla.errors"}, treeinfo
    for m in MODULES:
        tree = ast.parse(MODULES[m].read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        if m != "smla.treeinfo":
            assert not defined & facts, f"{m} defines {defined & facts}: they belong in smla.treeinfo"
        for imported, names in imports(m).items():
            if imported != "smla.treeinfo":
                assert not names & facts, f"{m} takes {names & facts} from {imported}, not from smla.treeinfo"


def test_cli_only_parses_and_calls():
    """cli.py holds no command's logic: no git, no files, no guards of its own."""
    text = (PKG / "cli.py").read_text()
    for forbidden in ("proc.", "shutil", "treestate.", "source.remove_tree", "os.remove", "rmtree",
                      "write_refusal", "write_reports"):
        assert forbidden not in text, forbidden


def test_one_name_per_concept():
    """Issue 20, item 10: each concept is defined once and asked for by that name. Commit ids and
    checksums: smla.ids; a question to vLLM's selector: selection.Cell (explain builds one, it has
    no class of its own); the base tag's commit and paths inside .git: smla.treeinfo; the download
    cache: cache.downloads_dir(); the pin's and the series file's lines: fsutil.content_lines;
    writing patches/series: series.write_series_file."""
    rules = [
        ("smla.ids", r"\[0-9a-f\]\{", "a commit-id or checksum pattern"),
        ("smla.treeinfo", r'"--git-path"', "a path inside .git"),
        ("smla.treeinfo", r"refs/tags/\{BASE_TAG\}", "the base tag's commit"),
        ("smla.cache", r'/ "downloads"', "the download cache"),
        ("smla.fsutil", r"enumerate\(text\.splitlines\(\), 1\)", "a line-file reader"),
        ("smla.series", r"atomic_write\w*\([^)]*SERIES_FILE", "writing patches/series"),
    ]
    bad = []
    for m, path in MODULES.items():
        text = path.read_text()
        for owner, pattern, what in rules:
            if m != owner and re.search(pattern, text):
                bad.append(f"{m} has its own {what} ({pattern!r}); it belongs to {owner}")
    assert bad == []
    explain = (PKG / "explain.py").read_text()
    assert "class " not in explain and "selection.Cell(" in explain


def test_no_module_over_450_lines():
    """One concern per module, and each readable in one sitting (explain.py was 583: split by concern)."""
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 450}
    assert long == {}
