"""CPU tests of the sm80-path switch (sm80_paths.py, SMLA_E2E_SM80_PATHS=1): what it replaces in
stand-in modules, that the helpers it replaces exist with that signature in the patched tree,
and how run_e2e and compare.py use it."""
from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402
import e2e_plugin  # noqa: E402
import log_records  # noqa: E402
import run_e2e  # noqa: E402
import sm80_paths  # noqa: E402


def _stand_ins():
    real = {"_cuda_capability": lambda index: (9, 0), "_cuda_info": lambda index: (132, (9, 0))}
    mods = []
    for name in sm80_paths.MODULES:
        attr = sm80_paths._patches()[name][0]
        mods.append(types.SimpleNamespace(__name__=name, **{attr: real[attr]}))
    return mods


def test_helpers_report_capability_8_0_with_the_real_sm_count(monkeypatch, capsys):
    monkeypatch.setattr(sm80_paths, "_sm_count", lambda index: 132)
    fp8, dsv4, indexer = _stand_ins()
    for m in (fp8, dsv4, indexer):
        sm80_paths.patch_module(m)
    assert fp8._cuda_capability(0) == (8, 0)
    assert dsv4._cuda_info(0) == (132, (8, 0))
    assert indexer._cuda_info(0) == (132, False)  # no fp8 tensor cores
    records = log_records.parse(sm80_paths.PREFIX, capsys.readouterr().err)
    assert [r["module"] for r in records] == list(sm80_paths.MODULES)


def test_a_missing_helper_fails_loudly():
    with pytest.raises(AttributeError, match="_cuda_info: not found"):
        sm80_paths.patch_module(types.SimpleNamespace(__name__=sm80_paths.MODULES[1]))


def test_the_helpers_exist_in_the_patched_tree(vllm_tree):
    """The three helpers, each `def NAME(index)` at module level, in the modules the series adds."""
    for name in sm80_paths.MODULES:
        attr = sm80_paths._patches()[name][0]
        src = (vllm_tree / (name.replace(".", "/") + ".py")).read_text()
        defs = {n.name: [a.arg for a in n.args.args] for n in ast.parse(src).body
                if isinstance(n, ast.FunctionDef)}
        assert defs.get(attr) == ["index"], (name, attr)


def test_plugin_switch(monkeypatch):
    assert e2e_plugin.install_sm80_paths({}) is None
    patched = []
    monkeypatch.setattr(sm80_paths, "patch_module", patched.append)
    mods = _stand_ins()
    for m in mods:
        monkeypatch.setitem(sys.modules, m.__name__, m)
    assert e2e_plugin.install_sm80_paths({sm80_paths.SM80_ENV: "1"}) == "installed"
    assert patched == mods


def test_run_sets_it_on_v4_ours_only():
    jobs = run_e2e.build_jobs(run_e2e.parse_args(["--models", "deepseek-v4-tiny", "--sides", "ref", "ref2",
                                                  "ref-o16", "ours", "--ours-sm80-paths"]))
    flagged = {j["side"]: j["env"].get(sm80_paths.SM80_ENV) for j in jobs}
    assert flagged == {"ref": None, "ref2": None, "ref-o16": None, "ours": "1"}
    ours = next(j for j in jobs if j["side"] == "ours")
    assert ours["env"]["VLLM_DSV4_PORTABLE"] == "1" and ours["env"]["VLLM_SPARSE_INDEXER_BACKEND"] == "triton"
    plain = run_e2e.build_jobs(run_e2e.parse_args(["--models", "deepseek-v4-tiny"]))
    assert not any(sm80_paths.SM80_ENV in j["env"] for j in plain)
    with pytest.raises(SystemExit):  # the DSA models have no such switch
        run_e2e.parse_args(["--models", "glm5-tiny", "--ours-sm80-paths"])


def test_compare_requires_every_helper_patched_and_the_workers_view(tmp_path):
    from test_e2e_v4 import V4, _run

    full = "".join(sm80_paths.line({"module": m}) + "\n" for m in sm80_paths.MODULES)
    _, bounds = _run(tmp_path, extra=["--ours-sm80-paths"], logs={"ours": full})
    jobs = run_e2e.select_jobs(run_e2e.parse_args(["--models", V4, "--sides", "ref", "ref2", "ref-o16", "ours",
                                                   "--ours-sm80-paths"]))
    name = next(j["name"] for j in jobs if j["side"] == "ours")
    meta_path = tmp_path / name / "meta.json"
    meta = json.loads(meta_path.read_text())

    def with_view(view):
        for probe in meta["model_probe"]:
            probe["kernel_capability"] = view
        meta_path.write_text(json.dumps(meta))
        return compare.compare_all(jobs, tmp_path, bounds)

    s = with_view(dict(sm80_paths.SM80_VIEW))
    assert s["failures"] == [] and s["exit_code"] == 0
    assert s["engines"][name]["sm80_paths"] == sorted(sm80_paths.MODULES)
    assert f"- {name}: triton_dsa_indexer, triton_fp8_e4m3, triton_sparse_mla" in compare.write_report(s)

    # the worker ran the sm90 paths (e.g. an engine core that did not inherit the patches)
    s = with_view({"fp8_e4m3_hw": True, "dsv4_capability": [9, 0], "indexer_fp8_mma": True})
    (failure,) = s["failures"]
    assert "the model's worker saw" in failure and s["exit_code"] != 0

    with_view(dict(sm80_paths.SM80_VIEW))
    log = tmp_path / name / "engine.log"
    log.write_text(log.read_text().replace(sm80_paths.line({"module": sm80_paths.MODULES[1]}) + "\n", ""))
    s = compare.compare_all(jobs, tmp_path, bounds)
    (failure,) = s["failures"]
    assert "patched only" in failure and s["exit_code"] != 0
