"""`make test-gpu`, `make test-e2e`, `make bench-e2e` on a user's own CUDA machine
(tools/gpu-local.sh), checked on the CPU with stand-ins: `nvidia-smi` listing two GPUs, a
`python3` whose `-m venv` makes a venv whose python records every call (argv and the variables
the runners read) instead of installing or running anything, and a `make` whose build-wheel
writes a wheel. What did not run here: pip, the GPU tests and engines themselves.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gitfixtures import REPO_ROOT

WHEEL_NAME = "vllm-0.26.0+sparsemla.g0123456789ab.cafe-cp38-abi3-manylinux_2_28_x86_64.whl"

FAKE_VENV_PYTHON = """#!/bin/sh
# records the call; answers the site-packages question
echo "python $* | SMLA_TREE=$SMLA_TREE PYTHONPATH=$PYTHONPATH" >> "$FAKE_LOG"
case "$*" in *sysconfig*) echo "$(dirname "$0")/../site"; exit 0 ;; esac
exit 0
"""
FAKE_PY = """#!/bin/sh
echo "gpu-py $*" >> "$FAKE_LOG"
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin" "$3/site"
  cp "$FAKE_VENV_PYTHON" "$3/bin/python"
  chmod +x "$3/bin/python"
fi
"""
FAKE_NVIDIA_SMI = """#!/bin/sh
echo "GPU 0: NVIDIA Stand-in (UUID: GPU-0)"
echo "GPU 1: NVIDIA Stand-in (UUID: GPU-1)"
"""
FAKE_MAKE = """#!/bin/sh
echo "make $*" >> "$FAKE_LOG"
mkdir -p dist && echo built > "dist/{wheel}"
"""


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def machine(tmp_path):
    """A checkout (Makefile, tools/gpu-local.sh) and the stand-ins; run(args, **env) -> (rc, out, log)."""
    checkout = tmp_path / "checkout"
    (checkout / "tools").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "Makefile", checkout / "Makefile")
    shutil.copy(REPO_ROOT / "tools" / "gpu-local.sh", checkout / "tools" / "gpu-local.sh")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    venv_python = _exe(fakes / "venv-python", FAKE_VENV_PYTHON)
    _exe(fakes / "python3", FAKE_PY)
    _exe(fakes / "make", FAKE_MAKE.format(wheel=WHEEL_NAME))
    _exe(bindir / "nvidia-smi", FAKE_NVIDIA_SMI)
    log = tmp_path / "log"
    log.write_text("")

    def run(args, *, gpu=True, **env):
        path = f"{bindir}:/usr/bin:/bin" if gpu else "/usr/bin:/bin"
        full = {"PATH": path, "HOME": str(tmp_path), "FAKE_LOG": str(log), "FAKE_VENV_PYTHON": str(venv_python),
                "GPU_PY": str(fakes / "python3"), "MAKE": str(fakes / "make"), **env}
        res = subprocess.run(args, cwd=checkout, env=full, capture_output=True, text=True, timeout=120)
        text = log.read_text()
        log.write_text("")
        return res.returncode, res.stdout + res.stderr, text

    run.checkout = checkout
    return run


def _wheel(machine, name=WHEEL_NAME, content="one") -> Path:
    w = machine.checkout / "wheels" / name
    w.parent.mkdir(exist_ok=True)
    w.write_text(content)
    return w


def test_make_test_gpu_installs_the_given_wheel_then_runs_the_gpu_tests(machine):
    wheel = _wheel(machine)
    rc, out, log = machine(["make", "test-gpu", f"WHEEL={wheel}", "PYTEST_ARGS=-k fp8"],
                           MAKE="make")  # through the Makefile: the variables reach the script
    assert rc == 0, out
    lines = log.splitlines()
    assert lines[0] == "gpu-py -m venv .venv-gpu"
    assert f"python -m pip install {wheel} pytest" in log
    run = next(ln for ln in lines if "-m pytest" in ln)
    assert run.startswith("python -m pytest -m gpu tests/gpu -k fp8 |")
    assert "SMLA_TREE=.venv-gpu/bin/../site" in run
    assert (machine.checkout / ".venv-gpu" / ".smla-wheel").read_text().split()[1] == str(wheel)
    # again with the same wheel: nothing installed; with another: that wheel alone
    rc, out, log = machine(["bash", "tools/gpu-local.sh", "test-gpu"], WHEEL=str(wheel))
    assert rc == 0 and "pip" not in log and "venv" not in log.split("|")[0], out
    other = _wheel(machine, content="two")
    rc, out, log = machine(["bash", "tools/gpu-local.sh", "test-gpu"], WHEEL=str(other))
    assert rc == 0 and f"python -m pip install --force-reinstall --no-deps {other}" in log, out


def test_without_a_wheel_it_is_built_first(machine):
    rc, out, log = machine(["bash", "tools/gpu-local.sh", "test-gpu"])
    assert rc == 0, out
    assert log.splitlines()[0] == "make build-wheel"
    assert f"python -m pip install dist/{WHEEL_NAME} pytest" in log


def test_the_newest_wheel_in_dist_is_taken(machine):
    dist = machine.checkout / "dist"
    dist.mkdir()
    (dist / WHEEL_NAME.replace("cafe", "0ld0")).write_text("old")
    os.utime(dist / WHEEL_NAME.replace("cafe", "0ld0"), (1, 1))
    (dist / WHEEL_NAME).write_text("new")
    rc, out, log = machine(["bash", "tools/gpu-local.sh", "test-gpu"])
    assert rc == 0 and f"pip install dist/{WHEEL_NAME} pytest" in log and "make build-wheel" not in log, out


@pytest.mark.parametrize("wheel, message", [("nowhere.whl", "no such file"), ("README.md", "not a vLLM wheel")])
def test_a_bad_wheel_is_refused_before_anything_is_made(machine, wheel, message):
    (machine.checkout / "README.md").write_text("x")
    rc, out, log = machine(["bash", "tools/gpu-local.sh", "test-e2e"], WHEEL=wheel)
    assert rc == 2 and message in out and "hint: make build-wheel" in out
    assert log == "" and not (machine.checkout / ".venv-gpu").exists()


def test_without_a_gpu_it_says_so(machine):
    rc, out, log = machine(["bash", "tools/gpu-local.sh", "bench-e2e"], gpu=False, WHEEL=str(_wheel(machine)))
    assert rc == 2 and "no nvidia-smi" in out and log == ""


def test_make_test_e2e_runs_the_harness_on_every_gpu_with_its_plugin(machine):
    wheel = _wheel(machine)
    rc, out, log = machine(["make", "test-e2e", f"WHEEL={wheel}", "E2E_ARGS=--models glm5-tiny"], MAKE="make")
    assert rc == 0, out
    run = next(ln for ln in log.splitlines() if "run_e2e.py" in ln)
    assert run.startswith("python tests/e2e/run_e2e.py --out .gpu-out/test-e2e --results .gpu-out/test-e2e/engines "
                          "--v4-checkpoints .gpu-out/test-e2e/models --gpus 2 --models glm5-tiny |")
    assert f"PYTHONPATH={machine.checkout}/tests/e2e" in run
    entry = machine.checkout / ".venv-gpu" / "site" / "smla_e2e_plugin-0.dist-info" / "entry_points.txt"
    assert "e2e_dummy = e2e_plugin:register" in entry.read_text()


def test_make_bench_e2e_runs_the_whole_plan_in_one_call(machine):
    wheel = _wheel(machine)
    rc, out, log = machine(["make", "bench-e2e", f"WHEEL={wheel}", "GPU_OUT=bench-here"], MAKE="make")
    assert rc == 0, out
    run = next(ln for ln in log.splitlines() if "bench_serving.py" in ln)
    assert run.startswith("python bench/serving/bench_serving.py --out bench-here --state-dir bench-here/state "
                          "--carried-state bench-here/state --budget-s 864000 |")


def test_the_piece_route_stays(machine):
    for target, script in (("test-e2e-pieces", "tests/e2e/device-run.sh run"),
                           ("bench-e2e-pieces", "bench/serving/device-run.sh run")):
        res = subprocess.run(["make", "-n", "-C", str(machine.checkout), target], capture_output=True, text=True)
        assert f"bash {script}" in res.stdout, res.stdout + res.stderr
    for script in ("tests/e2e/device-run.sh", "bench/serving/device-run.sh", "tests/gpu/device-run.sh",
                   "tools/gpu-local.sh"):
        assert subprocess.run(["bash", "-n", str(REPO_ROOT / script)]).returncode == 0, script
