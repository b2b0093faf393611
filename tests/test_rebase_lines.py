"""`smla rebase` with release lines: a release target opens a new line and leaves the old one alone;
the semantic check flags patches that apply but no longer fit the new base (tests/gitfixtures.py
builds the worlds; the real 0.26.0 -> 0.33.0 run is in reports/)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from gitfixtures import _commit, pin_file, patches_dir, quiet, write_files
from smla import export as export_mod
from smla import proc, source, treeinfo
from smla.cli import main
from smla.pin import load as load_pin

from test_rebase import NEW, _fake_sdist, new_line, smla, snapshot_line


def test_release_target_opens_a_new_line_and_abort_removes_it(rebase_world, index):
    """--onto 0.0.2 stops on e's conflict inside lines/0.0.2 and work/0.0.2/vllm; the default line is then
    0.0.2, so a plain --abort finds it, and removes the new line and its tree; 0.0.1 never changed."""
    world = rebase_world
    before = snapshot_line(world)
    head = proc.git_out(world["tree"], "rev-parse", "HEAD")
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, "g" + world["c2"][:9], commit=world["c2"]))])
    res = smla(world, "--onto", NEW, "--source", str(world["up"]))
    assert res.exit_code == 11, res.output
    assert new_line(world)["pin"].is_file() and treeinfo.rebase_in_progress(new_line(world)["tree"])
    lines = CliRunner().invoke(main, ["--root", str(world["root"]), "lines", "--json"])
    rows = {r["line"]: r for r in json.loads(lines.output)["lines"]}
    assert rows["0.0.1"]["in_sync"] and rows[NEW]["tree_state"] == "rebase stopped"
    assert smla(world, "--abort").exit_code == 0
    assert not new_line(world)["pin"].parent.exists() and not new_line(world)["tree"].exists()
    assert snapshot_line(world) == before and proc.git_out(world["tree"], "rev-parse", "HEAD") == head


def test_an_existing_line_is_not_opened_again(rebase_world):
    world = rebase_world
    new_line(world)["patches"].mkdir(parents=True)
    pin_file(world["root"], NEW).write_text(world["pin"].read_text().replace("0.0.1", NEW))
    res = smla(world, "--line", "0.0.1", "--onto", NEW)
    assert res.exit_code == 2 and "exists already" in res.output


# --- the semantic check: a world whose series is valid Python ----------------------------------

BASE = {"vllm/__init__.py": "", "vllm/base.py": "HOOK = 1\nOTHER = 2\n",
        "vllm/cuda.py": "PRIO = [\n    'A',\n]\n"}


def semantic_world(tmp_path):
    """Upstream U0 (a hook the series' new module imports) and the line 0.0.1: patch 1 adds
    vllm/backend.py (imports HOOK), patch 2 registers it in vllm/cuda.py."""
    up = tmp_path / "up"
    up.mkdir()
    proc.git(up, "init", "-q")
    write_files(up, BASE)
    u0 = _commit(up, "U0")
    root = tmp_path / "root"
    (root / "lines" / "0.0.1").mkdir(parents=True)
    pin_file(root, "0.0.1").write_text(f"repo = {up}\ncommit = {u0}\nversion = 0.0.1\nsdist = vllm-0.0.1.tar.gz\n"
                              f"sdist_sha256 = {'0' * 64}\n")
    tree = root / "work" / "0.0.1" / "vllm"
    source.fetch(load_pin(pin_file(root)), tree, str(up), **quiet)
    write_files(tree, {"vllm/backend.py": "from vllm.base import HOOK\n\nOURS = HOOK\n"})
    _commit(tree, "Add the backend\n\nWhy: a test.")
    write_files(tree, {"vllm/cuda.py": "PRIO = [\n    'A',\n    'OURS',\n]\n"})
    _commit(tree, "Register the backend\n\nWhy: a test.")
    export_mod.export(tree, patches_dir(root))
    return {"up": up, "root": root, "tree": tree}


def test_a_new_file_written_against_a_removed_interface_is_broken(tmp_path):
    """Both patches apply unchanged, but HOOK is gone upstream: the backend's patch is broken (exit 13),
    in the JSON and the Markdown report, with the import error; the registry patch is not."""
    w = semantic_world(tmp_path)
    write_files(w["up"], {"vllm/base.py": "OTHER = 2\n"})
    u1 = _commit(w["up"], "U1: the hook is gone")
    res = CliRunner().invoke(main, ["--root", str(w["root"]), "rebase", "--onto", u1, "--source", str(w["up"]),
                                    "--report-dir", str(tmp_path / "rep")])
    assert res.exit_code == 13, res.output
    data = json.loads((tmp_path / "rep" / "rebase-report.json").read_text())
    assert data["status"] == "broken"
    by = {p["name"]: p for p in data["patches"]}
    add, reg = by["0001-Add-the-backend.patch"], by["0002-Register-the-backend.patch"]
    assert add["outcome"] == "unchanged" and add["new_files_only"]
    assert any("import vllm.backend" in c and "HOOK" in c for c in add["checks"]), add
    assert reg["checks"] == []
    md = (tmp_path / "rep" / "rebase-report.md").read_text()
    assert "**unchanged**, **broken**" in md and "cannot import name 'HOOK'" in md


def test_the_same_series_on_a_compatible_base_is_clean(tmp_path):
    w = semantic_world(tmp_path)
    write_files(w["up"], {"vllm/base.py": "HOOK = 1\nOTHER = 3\n"})
    u1 = _commit(w["up"], "U1: the hook stays")
    res = CliRunner().invoke(main, ["--root", str(w["root"]), "rebase", "--onto", u1, "--source", str(w["up"]),
                                    "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["status"] == "clean" and data["broken"] == []
    assert data["checks"]["imports"]["modules"] == 2 and data["checks"]["imports"]["failed"] == []


def test_a_conflict_stop_still_reports_the_broken_patches_before_it(tmp_path):
    """As the real 0.26.0 -> 0.33.0 run: the stop at the registry's conflict also names the earlier
    new-file patch that no longer imports, instead of calling it unchanged and fine."""
    w = semantic_world(tmp_path)
    write_files(w["up"], {"vllm/base.py": "OTHER = 2\n", "vllm/cuda.py": "PRIO = [\n    'B',\n]\n"})
    u1 = _commit(w["up"], "U1: hook gone, priorities changed")
    res = CliRunner().invoke(main, ["--root", str(w["root"]), "rebase", "--onto", u1, "--source", str(w["up"]),
                                    "--json"])
    assert res.exit_code == 11, res.output
    data, _ = json.JSONDecoder().raw_decode(res.output)  # the report, then the conflict's error object
    assert data["status"] == "conflict"
    assert [b["name"] for b in data["broken"]] == ["0001-Add-the-backend.patch"]
    assert data["checks"]["selection"] is None  # the series is not complete: not run


def test_abort_of_a_new_line_names_what_it_keeps(rebase_world, index):
    """--abort of a release target keeps what was made during the stop in the new line's patches/ and
    tree (issue 31 item 8) and says so: not "removed" while they are still there."""
    world = rebase_world
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, "g" + world["c2"][:9], commit=world["c2"]))])
    assert smla(world, "--onto", NEW, "--source", str(world["up"])).exit_code == 11
    line = new_line(world)
    mine = line["patches"] / "0009-my-new-work.patch"
    mine.write_text("my new patch, written during the stop\n")
    notes = line["tree"] / "notes.txt"
    notes.write_text("my notes\n")
    res = smla(world, "--abort")
    assert res.exit_code == 0, res.output
    assert mine.read_text() == "my new patch, written during the stop\n" and notes.read_text() == "my notes\n"
    # old code: "the line lines/0.0.2/ it opened and its work tree ... are removed", neither file named
    assert "are removed" not in res.output
    assert str(mine) in res.output and "notes.txt" in res.output
    assert not line["pin"].exists()  # what the rebase copied there goes


def test_abort_of_a_new_line_keeping_only_a_patch_removes_the_tree(rebase_world, index):
    """A file kept in the new line's patches/ does not keep the tree the rebase made (it holds nothing of
    the user's)."""
    world = rebase_world
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, "g" + world["c2"][:9], commit=world["c2"]))])
    assert smla(world, "--onto", NEW, "--source", str(world["up"])).exit_code == 11
    line = new_line(world)
    mine = line["patches"] / "0009-my-new-work.patch"
    mine.write_text("mine\n")
    res = smla(world, "--abort")
    assert res.exit_code == 0, res.output
    assert mine.read_text() == "mine\n" and str(mine) in res.output
    assert not line["tree"].exists()  # old code: kept, since something (the patch) was kept


def test_abort_on_the_old_line_names_the_line_the_rebase_is_stopped_on(rebase_world, index):
    """`make rebase VLLM=0.0.1 ARGS=--abort` after `make rebase VLLM=0.0.1 ONTO=0.0.2`: the stop is on
    the new line; the old line's --abort/--continue names it instead of "no rebase in progress"."""
    world = rebase_world
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, "g" + world["c2"][:9], commit=world["c2"]))])
    assert smla(world, "--onto", NEW, "--source", str(world["up"])).exit_code == 11
    for flag in ("--abort", "--continue"):
        res = CliRunner().invoke(main, ["--root", str(world["root"]), "--line", "0.0.1", "rebase", flag])
        # old code: "no rebase in progress in .../0.0.1/vllm", hint "start one with `smla rebase --onto ...`"
        assert res.exit_code == 7 and f"--line {NEW} rebase {flag}" in res.output, res.output
    assert treeinfo.rebase_in_progress(new_line(world)["tree"])  # nothing changed
    res = CliRunner().invoke(main, ["--root", str(world["root"]), "--line", NEW, "rebase", "--abort"])
    assert res.exit_code == 0, res.output


def test_ctrl_c_while_opening_a_new_line_leaves_no_half_opened_line(rebase_world, index, monkeypatch):
    """Ctrl-C after lines/0.0.2/ was copied but before the rebase's state was saved: the tree the run
    made goes, and so must the line (else --continue finds no rebase and a new --onto is refused:
    "the release line 0.0.2 exists already")."""
    from smla.rebase import newline

    world = rebase_world
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, "g" + world["c2"][:9], commit=world["c2"]))])
    real = newline.open_line

    def then_ctrl_c(*args, **kw):
        real(*args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(newline, "open_line", then_ctrl_c)
    assert smla(world, "--onto", NEW, "--source", str(world["up"])).exit_code == 130
    monkeypatch.setattr(newline, "open_line", real)
    assert not new_line(world)["pin"].parent.exists()  # old code: lines/0.0.2/ stayed, no rebase state
    res = CliRunner().invoke(main, ["--root", str(world["root"]), "--line", "0.0.1", "rebase", "--onto", NEW,
                                    "--source", str(world["up"])])
    assert res.exit_code == 11, res.output  # the same rebase runs again (old code: exit 2, "exists already")


def test_printed_undo_of_a_finished_new_line_rebase_works(rebase_world, index, monkeypatch):
    """Issue 31 item 9 for a release target: the undo a finished rebase prints removes the line and
    tree it opened; followed in the checkout, the old line is as before and the newest line again."""
    import shlex
    import subprocess

    world = rebase_world
    before = snapshot_line(world)
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, "g" + world["c1"][:9]))])
    res = smla(world, "--onto", NEW, "--source", str(world["up"]), "--json")
    assert res.exit_code == 0, res.output
    undo = json.loads(res.stdout)["undo"]
    assert undo
    monkeypatch.chdir(world["root"])
    for c in undo:
        words = shlex.split(c)
        if words[0] == "smla":
            out = CliRunner().invoke(main, words[1:])
            assert out.exit_code == 0, (c, out.output)
        else:
            subprocess.run(words, check=True, capture_output=True)
    assert not new_line(world)["pin"].parent.exists() and not new_line(world)["tree"].exists()
    assert snapshot_line(world) == before
    assert CliRunner().invoke(main, ["status", "--check"]).exit_code == 0  # 0.0.1, the newest line again


def test_a_new_line_stop_hint_names_that_line(rebase_world, index):
    """`make rebase VLLM=0.0.1 ONTO=0.0.2` runs `smla --line 0.0.1 rebase --onto 0.0.2`: the stop's hint
    must send --continue/--abort to line 0.0.2, where the rebase is, not to the line given."""
    world = rebase_world
    index.publish("vllm", [("vllm-0.0.2.tar.gz", _fake_sdist(world, "g" + world["c2"][:9], commit=world["c2"]))])
    res = CliRunner().invoke(main, ["--root", str(world["root"]), "--line", "0.0.1", "rebase", "--onto", NEW,
                                    "--source", str(world["up"])])
    assert res.exit_code == 11, res.output
    hint = res.output.split("hint:", 1)[1]
    # old code (with hints on the given line): `smla --line 0.0.1 rebase --continue`
    assert f"`smla --line {NEW} rebase --continue`" in hint and f"`smla --line {NEW} rebase --abort`" in hint
    assert "--line 0.0.1" not in hint


def test_selection_failure_blames_the_patches_that_change_the_selection_modules():
    """A backend the new tree's selector does not pick is reported on the patches that change the
    registry or the CUDA priorities (by the files they touch, whatever their subjects say), else on
    the last replayed patch."""
    from smla.rebase import verify
    from smla.rebase.report import Outcome

    def outs():
        return [Outcome("0001-k.patch", "[Kernel] kernels", commits=1),
                Outcome("0002-a.patch", "[Attention] the backend", commits=1),
                Outcome("0003-m.patch", "[Model] a model", commits=1)]

    got = outs()
    verify._blame_selection(got, {"vllm.v1.attention.backends.registry": ["0002-a.patch"],
                                  "vllm.platforms.cuda": ["0002-a.patch"],
                                  "vllm.models.x": ["0003-m.patch"]}, "not picked")
    assert [o.checks for o in got] == [[], ["not picked"], []]
    got = outs()
    verify._blame_selection(got, {"vllm.models.x": ["0003-m.patch"]}, "not picked")
    assert [o.checks for o in got] == [[], [], ["not picked"]]
