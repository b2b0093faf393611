"""Issue 22: bad input, interruptions and the pin. Every case a clear error (`error:` + `hint:`, or
JSON under --json, with its exit code), nothing lost, `status` always true. Real temporary git repos,
a local package index, real processes and signals, a really unwritable directory."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from smla import treeinfo
from smla import apply as apply_mod, cache, proc, series
from smla.cli import main
from smla.errors import ChecksumError, FetchError, NotInSync, PinError, SeriesError, TreeStateError, UsageError

from gitfixtures import REPO_ROOT, IndexServer, make_project, make_sdist, quiet, patches_dir, pin_file


def cli(root: Path, tree: Path | None, *args: str, env: dict | None = None):
    where = ["--root", str(root)] + (["--tree", str(tree)] if tree is not None else [])
    return CliRunner().invoke(main, [*where, *args], env=env)


def error_json(res) -> dict:
    return json.loads(res.stdout)["error"]


# --- 1. an unwritable cache ----------------------------------------------------------------------

@pytest.fixture
def unwritable_dir(tmp_path):
    """An empty directory nobody can write into, root included: `chattr +i` (immutable) where the
    filesystem supports it; as a non-root user without chattr, mode 0555. Checked before use."""
    d = tmp_path / "immutable-cache"
    d.mkdir()
    how = None
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0:
        how = "chattr"
    elif os.geteuid() != 0:
        d.chmod(0o555)
        how = "chmod"
    try:
        if how is None:
            pytest.skip("no way to make a directory unwritable for root here (chattr +i unsupported)")
        with pytest.raises(OSError):
            (d / "probe").mkdir()
        yield d
    finally:
        if how == "chattr":
            subprocess.run(["chattr", "-i", str(d)], check=True)
        elif how == "chmod":
            d.chmod(0o755)


def _sdist_project(tmp_path: Path, index: IndexServer) -> Path:
    """A project whose pin matches an sdist the local index serves (no git remote)."""
    sdist, sha = make_sdist(tmp_path)
    index.publish("vllm", [(sdist.name, sdist.read_bytes())])
    return make_project(tmp_path, "http://127.0.0.1:9/nowhere.git", "2" * 40, sdist_sha=sha)


def test_unwritable_cache_is_a_clear_error_and_json_under_json(tmp_path, index, unwritable_dir, monkeypatch, series_project):
    monkeypatch.setenv("SMLA_CACHE_DIR", str(unwritable_dir))
    (tmp_path / "s").mkdir()
    root = _sdist_project(tmp_path / "s", index)
    res = cli(root, root / "work" / "vllm", "fetch", "--source", "sdist")
    # old code: PermissionError traceback, exit 1, no error:/hint:
    assert res.exit_code == 15, (res.output, res.exception)  # FilesystemError
    assert f"error: cannot write the toolkit's cache {unwritable_dir}/downloads" in res.stderr
    assert "hint:" in res.stderr and "SMLA_CACHE_DIR" in res.stderr
    assert not (root / "work").exists()  # nothing half-made, not even work/
    # explain --tree pristine exports the base into the cache: JSON error under --json
    p_root, p_tree, _ = series_project
    ex = cli(p_root, p_tree, "explain", "--model", "glm-5", "--capability", "8.6", "--tree", "pristine", "--json")
    assert ex.exit_code == 15 and error_json(ex)["kind"] == "FilesystemError", ex.output
    assert "SMLA_CACHE_DIR" in error_json(ex)["hint"] and f"{unwritable_dir}/trees" in error_json(ex)["message"]
    # build-wheel --json downloads the official wheel into the cache
    apply_mod.apply_series(series.load(patches_dir(p_root)), p_tree, **quiet)
    index.publish("vllm", [("vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl", b"not a wheel")])
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    bw = cli(p_root, p_tree, "build-wheel", "--json", "--out", str(tmp_path / "dist"))
    assert bw.exit_code == 15 and error_json(bw)["kind"] == "FilesystemError", bw.output
    assert list(unwritable_dir.iterdir()) == []


# --- 2. Ctrl-C, SIGTERM and SIGKILL during apply ----------------------------------------------------

HOOK = """#!/bin/sh
# Runs inside `git worktree add` of smla's scratch checkout: say so once, then hang there.
# Only in the smla process the test started (the rerun in the test's own process passes through).
[ -z "$SMLA_TEST_MARKER" ] && exit 0
[ -e "$SMLA_TEST_MARKER" ] && exit 0
touch "$SMLA_TEST_MARKER"
exec sleep 30
"""


def _leftovers(tree: Path) -> list[str]:
    return sorted(p.name for p in tree.parent.iterdir() if p.name.startswith(".smla-"))


def _worktrees(tree: Path) -> int:
    return proc.git_out(tree, "worktree", "list", "--porcelain").count("worktree ")


def _smla(root: Path, tree: Path, *args: str, marker: Path) -> subprocess.Popen:
    env = {**os.environ, "SMLA_TEST_MARKER": str(marker)}
    return subprocess.Popen([sys.executable, "-m", "smla.cli", "--root", str(root), "--tree", str(tree), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _start_apply_and_wait_in_scratch(root: Path, tree: Path, tmp_path: Path) -> subprocess.Popen:
    hook = tree / ".git" / "hooks" / "post-checkout"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(HOOK)
    hook.chmod(0o755)
    marker = tmp_path / "in-scratch"
    p = _smla(root, tree, "apply", marker=marker)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "apply never reached its scratch worktree"
        time.sleep(0.05)
    assert _leftovers(tree) and _worktrees(tree) == 2  # the scratch worktree exists now
    return p


def _finish(p: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=60)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the hook's sleep, if anything is left
        except ProcessLookupError:
            pass
    return p.returncode, out, err


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupted_apply_removes_its_scratch_worktree(series_project, tmp_path, how):
    root, tree, _ = series_project
    head = proc.git_out(tree, "rev-parse", "HEAD")
    p = _start_apply_and_wait_in_scratch(root, tree, tmp_path)
    if how == "ctrl-c":
        os.killpg(p.pid, signal.SIGINT)  # what the terminal does: the whole foreground group
    else:
        os.kill(p.pid, signal.SIGTERM)
    rc, _out, err = _finish(p)
    # old code: the scratch worktree stayed (Ctrl-C inside `git worktree add`; SIGTERM killed at once)
    assert rc == (130 if how == "ctrl-c" else 143), err
    assert "error: interrupted" in err and "hint:" in err
    assert _leftovers(tree) == [] and _worktrees(tree) == 1
    assert proc.git_out(tree, "rev-parse", "HEAD") == head  # all or nothing: nothing applied


@pytest.mark.parametrize("then", ["apply", "clean"])
def test_what_a_killed_apply_left_is_removed_by_the_next_run(series_project, tmp_path, then):
    root, tree, _ = series_project
    p = _start_apply_and_wait_in_scratch(root, tree, tmp_path)
    os.killpg(p.pid, signal.SIGKILL)  # nothing can clean up after this
    _finish(p)
    assert _leftovers(tree), "SIGKILL leaves the scratch worktree"
    res = cli(root, tree, then)
    # old code: reruns of apply and `smla clean` left it (only `make clean` removed it)
    assert res.exit_code == 0, res.output
    assert _leftovers(tree) == []
    if then == "apply":
        assert _worktrees(tree) == 1 and len(treeinfo.commits_above_base(tree)) == 3
    else:
        assert not tree.exists()


# --- 3. a dirty tree and `make patch` ----------------------------------------------------------------

def test_uncommitted_edit_does_not_block_make_targets(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    (tree / "vllm" / "ops" / "kernel.py").write_text("def k():\n    return 3  # trying something\n")
    res = cli(root, tree, "patch")  # what make test / build-wheel / explain run first
    # old code: exit 7 "has uncommitted changes ... or rerun with --force"
    assert res.exit_code == 0, res.output
    assert "uncommitted changes" in res.output and "smla export" in res.output
    assert "return 3" in (tree / "vllm" / "ops" / "kernel.py").read_text()


def test_dirty_tree_hint_names_options_that_exist(series_project):
    root, tree, _ = series_project
    (tree / "README.md").write_text("mine\n")
    refused = cli(root, tree, "patch")
    assert refused.exit_code == TreeStateError.exit_code
    hint = refused.stderr.split("hint:", 1)[1]
    assert "`smla apply --force`" in hint and "`make patch ARGS=--force`" in hint
    forced = cli(root, tree, "patch", "--force")  # old code: "No such option: --force"
    assert forced.exit_code == 0, forced.output
    assert len(treeinfo.commits_above_base(tree)) == 3 and (tree / "README.md").read_text() == "mine\n"
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "$(SMLA) patch $(ARGS)" in makefile


# --- 4. a wrong sha256 in the pin ---------------------------------------------------------------------

def test_wrong_pin_sha_keeps_the_good_cached_sdist(tmp_path, index):
    root = _sdist_project(tmp_path, index)
    ok = cli(root, None, "fetch", "--source", "sdist")
    assert ok.exit_code == 0, ok.output
    cached = tmp_path / "cache" / "downloads" / "vllm-9.9.9.tar.gz"
    good = cached.read_bytes()
    pin = pin_file(root)
    pin.write_text("\n".join("sdist_sha256 = " + "0" * 64 if line.startswith("sdist_sha256") else line
                             for line in pin.read_text().splitlines()) + "\n")
    line = next(i for i, l in enumerate(pin.read_text().splitlines(), 1) if l.startswith("sdist_sha256"))
    res = cli(root, tmp_path / "other" / "vllm", "fetch", "--source", "sdist")
    # old code: "cached ... does not match its sha256; downloading it again", then mismatch, file deleted
    assert res.exit_code == ChecksumError.exit_code == 5, res.output
    assert cached.read_bytes() == good
    assert f"vllm-pin.txt:{line}" in res.stderr and "the cached" in res.stderr and "is kept" in res.stderr
    assert "hint:" in res.stderr and "sdist_sha256" in res.stderr.split("hint:", 1)[1]


def test_a_wrong_expected_sha_never_deletes_the_cached_file(tmp_path, index):
    """Also without an index sha256 to compare with: the download is checked, the cache kept."""
    sdist, sha = make_sdist(tmp_path)
    index.routes["/files/x.tar.gz"] = (sdist.read_bytes(), None)
    dest = tmp_path / "cache" / "downloads" / "x.tar.gz"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(sdist.read_bytes())
    with pytest.raises(ChecksumError, match="same content and is kept") as err:
        cache.fetch(f"{index.base}/files/x.tar.gz", dest, "0" * 64, quiet=True, mismatch_hint="look at the pin")
    assert err.value.hint == "look at the pin"
    assert dest.read_bytes() == sdist.read_bytes()  # old code: unlinked before downloading


# --- 5. a fuzzed apply is not "in sync" ---------------------------------------------------------------

def test_fuzzed_apply_is_not_reported_in_sync(series_project):
    root, tree, _ = series_project
    third = sorted((patches_dir(root)).glob("0003-*.patch"))[0]
    text = third.read_text()
    assert "\n line 18\n" in text
    third.write_text(text.replace("\n line 18\n", "\n line eighteen\n"))  # one context line differs
    strict = cli(root, tree, "apply")
    assert strict.exit_code == 8, strict.output
    fuzzed = cli(root, tree, "apply", "--fuzz", "1")
    assert fuzzed.exit_code == 0, fuzzed.output
    assert "fuzz" in fuzzed.output and third.name in fuzzed.output
    st = cli(root, tree, "status", "--json")
    data = json.loads(st.stdout)
    # old code: "in sync", --check exit 0, yet `smla export` rewrote 0003
    assert not data["in_sync"] and data["state"] == "tree-edited" and data["inexact"] == [third.name]
    assert [p["state"] for p in data["patches"]] == ["already-applied", "already-applied", "fuzzed"]
    assert "smla export" in data["hint"]
    check = cli(root, tree, "status", "--check")
    assert check.exit_code == NotInSync.exit_code and "error:" in check.stderr and "hint:" in check.stderr
    exported = cli(root, tree, "export", "--json")
    assert json.loads(exported.stdout)["written"] == [third.name]
    assert cli(root, tree, "status", "--check").exit_code == 0


# --- the smaller ones ---------------------------------------------------------------------------------

def _set_pin(root: Path, **values: str) -> int:
    """Rewrite keys of the project's pin; return the line number of the first one."""
    pin = pin_file(root)
    lines = pin.read_text().splitlines()
    first = None
    for i, l in enumerate(lines):
        key = l.split("=", 1)[0].strip()
        if key in values:
            lines[i] = f"{key} = {values[key]}"
            first = first or i + 1
    pin.write_text("\n".join(lines) + "\n")
    return first


def test_pin_version_that_is_not_the_trees_is_not_in_sync(series_project):
    root, tree, _ = series_project
    apply_mod.apply_series(series.load(patches_dir(root)), tree, **quiet)
    line = _set_pin(root, version="9.9.10", sdist="vllm-9.9.10.tar.gz")
    st = cli(root, tree, "status")
    # old code: "pin vLLM 9.9.10" without a word, and --check exit 0
    assert "NOT at the pin" in st.output and f"vllm-pin.txt:{line}" in st.output
    assert cli(root, tree, "status", "--check").exit_code == NotInSync.exit_code


@pytest.mark.parametrize("values,message", [
    ({"sdist": "vllm-9.9.8.tar.gz"}, "is not the sdist of the pinned version 9.9.9"),
    ({"repo": "not a url"}, "is not a git URL"),
    ({"commit": "xyz"}, "40 lowercase hex"),
])
@pytest.mark.parametrize("command", [["apply"], ["export"], ["status"], ["explain", "--model", "glm-5",
                                                                          "--capability", "8.6"]])
def test_every_command_validates_the_pin_and_names_the_line(series_project, values, message, command):
    root, tree, _ = series_project
    line = _set_pin(root, **values)
    res = cli(root, tree, *command)
    # old code: apply/export/explain never read the pin; the pin accepted these; no hint
    assert res.exit_code == PinError.exit_code == 3, res.output
    assert f"vllm-pin.txt:{line}: " in res.stderr and message in res.stderr
    assert "hint:" in res.stderr and f"({pin_file(root)}:{line})" in res.stderr


def test_lost_base_tag_hints_lead_out(series_project):
    root, tree, _ = series_project
    base = proc.git_out(tree, "rev-parse", "smla-base")
    proc.git(tree, "tag", "-d", "smla-base")
    for args in (["status"], ["apply"], ["fetch"], ["clean"]):
        res = cli(root, tree, *args)
        # old code: status hinted `smla fetch`; fetch said "not an smla work tree... remove it yourself"
        assert res.exit_code == TreeStateError.exit_code, (args, res.output)
        assert "lost its smla-base tag" in res.stderr, args
        assert f"git -C {tree} tag smla-base {base}" in res.stderr, args
    proc.git(tree, "tag", "smla-base", base)  # the hint's command
    assert cli(root, tree, "status").exit_code == 0


@pytest.mark.parametrize("args,code,kind", [
    (["apply", "--json", "--fuzz", "5"], 2, "UsageError"),
    (["apply", "--json", "--no-such-option"], 2, "UsageError"),
    (["explain", "--json", "--model", "glm-5"], 2, "UsageError"),
])
def test_usage_errors_are_json_under_json(series_project, args, code, kind):
    root, tree, _ = series_project
    res = cli(root, tree, *args)
    assert res.exit_code == code, res.output
    err = error_json(res)  # old code: click's plain text
    assert err["kind"] == kind and err["exit_code"] == code and err["hint"]


def test_usage_errors_without_json_say_error_and_hint(series_project):
    root, tree, _ = series_project
    res = cli(root, tree, "patch", "--no-such-option")
    assert res.exit_code == 2 and "error: No such option '--no-such-option'" in res.stderr
    assert "hint: `smla patch --help`" in res.stderr
    assert CliRunner().invoke(main, ["--help"]).exit_code == 0
    assert CliRunner().invoke(main, ["--version"]).exit_code == 0


def test_errors_that_had_no_hint(series_project, tmp_path, index):
    root, tree, _ = series_project
    bad = sorted((patches_dir(root)).glob("0002-*.patch"))[0]
    bad.write_text(bad.read_text().replace("@@ -1,3 +1,4 @@", "@@ -1,3 +1,9 @@"))
    malformed = cli(root, tree, "apply", "--json")
    assert malformed.exit_code == SeriesError.exit_code and error_json(malformed)["hint"], malformed.output
    index.publish("vllm", [])
    with pytest.raises(FetchError) as missing:
        cache.pypi_file("vllm", "vllm-0.99.0.tar.gz")
    assert missing.value.hint and "pypi.org/project/vllm" in missing.value.hint
    nosrc = cli(root, tmp_path / "fresh" / "vllm", "fetch", "--source", "/nonexistent")
    assert nosrc.exit_code == UsageError.exit_code, nosrc.output  # old code: 4 (fetch)
    assert "no such path" in nosrc.stderr and "hint:" in nosrc.stderr


def test_refused_first_fetch_leaves_no_empty_work_dir(tmp_path, monkeypatch):
    sdist, sha = make_sdist(tmp_path)
    root = make_project(tmp_path, "http://127.0.0.1:9/nowhere.git", "2" * 40, sdist_sha=sha)
    monkeypatch.setenv("SMLA_CACHE_DIR", str(tmp_path / "empty-cache"))
    res = cli(root, None, "fetch", env={"SMLA_INDEX_URL": "http://example.com/simple"})
    assert res.exit_code == FetchError.exit_code and "only https" in res.stderr, res.output
    assert not (root / "work").exists()  # old code: an empty work/


def test_rebase_onto_the_current_release_or_commit_claims_nothing(rebase_world):
    w = rebase_world
    pin_before = (w["pin"]).read_text()
    res = cli(w["root"], w["tree"], "rebase", "--onto", w["c0"])
    assert res.exit_code == 0, res.output
    # old code: "... sets sdist = none, so this pin is fetched with git only" while nothing changed
    assert "sdist = none" not in res.output and "nothing to rebase" in res.output
    assert "unchanged" in res.output
    assert (w["pin"]).read_text() == pin_before


def test_rebase_onto_an_older_release_says_so():
    from smla.pin import Pin
    from smla.rebase import target as target_mod

    pin = Pin(repo="https://example.invalid/vllm.git", commit="1" * 40, version="0.26.0",
              sdist="vllm-0.26.0.tar.gz", sdist_sha256="0" * 64)
    older = target_mod.Target("0.25.0", "version", "2" * 40, "0.25.0", "vllm-0.25.0.tar.gz", "0" * 64, "sdist")
    newer = target_mod.Target("0.27.0", "version", "2" * 40, "0.27.0", "vllm-0.27.0.tar.gz", "0" * 64, "sdist")
    assert "older than the pinned 0.26.0" in target_mod.older_than(older, pin)
    assert target_mod.older_than(newer, pin) is None


def test_the_triton_cache_stays_under_the_toolkits_cache_in_tests():
    if os.environ.get("SMLA_TEST_USER_TRITON_CACHE"):
        pytest.skip("the user set TRITON_CACHE_DIR")
    assert Path(os.environ["TRITON_CACHE_DIR"]).is_relative_to(cache.cache_dir())


def test_explain_below_sm80_names_no_indexer_kernel(vllm_tree):
    res = CliRunner().invoke(main, ["--root", str(REPO_ROOT), "--tree", str(vllm_tree), "explain", "--model", "glm-5",
                                    "--capability", "7.5", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    # old code: "indexer: portable Triton kernels" at 7.5, which the series does not run on
    assert data["selected"] is None and data["indexer"]["path"] == "none"
    assert "8.0+" in data["indexer"]["reason"]
