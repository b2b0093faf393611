"""The real checkout's release lines: every file the series add is the same on every line that adds
it, unless lines/DIVERGENCE says why not (smla.lines; the rule itself: tests/test_lines.py). Runs once,
for all lines together (it reads the patches only, no vLLM tree)."""
from __future__ import annotations

from gitfixtures import REPO_ROOT
from smla import lines as lines_mod
from smla.project import Project


def test_the_files_the_series_add_agree_across_lines():
    cmp = lines_mod.check(Project.at(REPO_ROOT))
    assert cmp.lines == Project.at(REPO_ROOT).lines()


def test_each_line_adds_files_the_check_can_rebuild():
    """The check is not vacuous: on each line, the kernels and the backend are among the files it rebuilds."""
    project = Project.at(REPO_ROOT)
    for line in project.lines():
        added = lines_mod.added_files(project.on(line).patches_dir)
        assert "vllm/v1/attention/backends/mla/triton_mla_sparse.py" in added, line
        assert any(p.startswith("vllm/v1/attention/ops/") or "triton" in p for p in added), line
        assert all(data for data in added.values()), line


def test_every_line_has_its_official_wheel_recorded():
    """`make build-wheel VLLM=<release>` starts from that release's official wheel: each line's pin
    names a release whose wheel (name, sha256) the toolkit knows without the index."""
    from smla.wheel.official import official_wheel

    project = Project.at(REPO_ROOT)
    for line in project.lines():
        pin = project.on(line).pin()
        name, sha, url = official_wheel(pin, "x86_64")
        assert name.startswith(f"vllm-{pin.version}-") and url is None and len(sha) == 64, line
