"""`--from-source`: vLLM's own setup.py on a clean checkout of the tree's HEAD."""
from __future__ import annotations

import logging

import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from wheel.wheelfile import WHEEL_INFO_RE
from smla import proc
from smla.errors import CommandError, WheelError
from smla.fsutil import sha256_file
from smla.pin import Pin
from smla.series import Series
from smla.wheel.checks import _recorded_commit, check_base_matches_pin, check_series_matches_tree, check_tree_at_pin, tree_changes
from smla.wheel.label import PACKAGE_DIR, PROJECT, local_version, series_hash
from smla.wheel.official import open_base_wheel, base_wheel_path
from smla.wheel.result import WheelResult

log = logging.getLogger("smla.wheel")

# -------------------------------------------------------------- from source


def from_source_invocation(
    checkout: Path,
    wheel_dir: Path,
    version: str,
    base_wheel: Path | None,
    *,
    full_cuda: bool = False,
    python: str | None = None,
    source_date_epoch: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the vLLM setup.py build (`pip wheel`, no isolation, no deps)."""
    argv = [python or sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--wheel-dir", str(wheel_dir), str(checkout)]
    env = {
        # setup.py's get_vllm_version(): the override goes to SETUPTOOLS_SCM_PRETEND_VERSION and
        # into vllm/_version.py, with no +precompiled/+cuXXX suffix.
        "VLLM_VERSION_OVERRIDE": version,
        "SETUPTOOLS_SCM_PRETEND_VERSION": version,
        "VLLM_TARGET_DEVICE": "cuda",
    }
    if source_date_epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(source_date_epoch)
    if full_cuda:
        # envs.VLLM_USE_PRECOMPILED is true when either variable is set: clear both.
        env["VLLM_USE_PRECOMPILED"] = "0"
        env["VLLM_PRECOMPILED_WHEEL_LOCATION"] = ""
    else:
        if base_wheel is None:
            raise WheelError("a python-only build needs the official wheel (VLLM_PRECOMPILED_WHEEL_LOCATION)")
        env["VLLM_USE_PRECOMPILED"] = "1"
        env["VLLM_PRECOMPILED_WHEEL_LOCATION"] = str(base_wheel.resolve())
    return argv, env


_PROBE = "import torch; print(torch.__version__, torch.version.cuda or '-')"
_TORCH_PIN = re.compile(r"""["']?torch\s*==\s*([0-9][0-9a-z.]*)""")


def required_torch(tree: Path) -> str:
    """The torch version the tree's build needs: `torch == X` in pyproject.toml's build requirements
    (or requirements/build.txt), as committed in the tree."""
    for rel in ("pyproject.toml", "requirements/build.txt"):
        shown = proc.git(tree, "show", f"HEAD:{rel}", check=False)
        if shown.returncode != 0:
            continue
        text = shown.stdout
        if rel == "pyproject.toml":
            m = re.search(r"^\[build-system\](.*?)(?=^\[)", text + "\n[", re.S | re.M)
            text = m.group(1) if m else ""
        found = _TORCH_PIN.search(text)
        if found:
            return found.group(1)
    raise WheelError(f"cannot tell which torch the build of {tree} needs (no `torch == X` in pyproject.toml's "
                     "[build-system] or requirements/build.txt)")


def check_build_python(python: str, torch_for_build: str) -> None:
    """vLLM's setup.py imports torch and needs a CUDA build of the pinned torch: check before building."""
    hint = (f"use --python with an environment holding torch=={torch_for_build} (CUDA) and vLLM's "
            "build requirements (see docs/build-wheel.md)")
    try:
        probe = proc.run([python, "-c", _PROBE], check=False, timeout=300)
    except CommandError as exc:
        raise WheelError(f"cannot run {python}: {exc.message}", hint=hint) from exc
    if probe.returncode != 0:
        raise WheelError(f"{python} cannot import torch", hint=hint)
    parts = probe.stdout.split()
    torch_version, cuda = (parts + ["?", "-"])[:2]
    if torch_version.split("+")[0] != torch_for_build or cuda == "-":
        raise WheelError(f"{python} has torch {torch_version} (CUDA {cuda}); vLLM's build needs "
                         f"torch {torch_for_build} built with CUDA", hint=hint)


def build_from_source(
    pin: Pin,
    series: Series,
    tree: Path,
    dist_dir: Path,
    *,
    base_wheel: Path | None = None,
    full_cuda: bool = False,
    allow_unexported: bool = False,
    python: str | None = None,
    quiet: bool = False,
    echo: Callable[[str], None] = lambda _msg: None,
) -> WheelResult:
    """Build through vLLM's own setup.py from a clean checkout of the tree's HEAD."""
    check_tree_at_pin(pin, tree)
    if not allow_unexported:
        check_series_matches_tree(series, tree)
    check_build_python(python or sys.executable, required_torch(tree))
    short = series_hash(series)
    version = local_version(pin.version, pin.commit, short)
    base = base_wheel_path(pin, base_wheel, quiet=quiet) if not full_cuda else None
    if base is not None:
        wf, b = open_base_wheel(base, pin.version if pin.has_sdist else None)
        with wf:
            check_base_matches_pin(pin, b, _recorded_commit(wf))
    changes = tree_changes(tree)
    dist_dir.mkdir(parents=True, exist_ok=True)
    stamp = int(os.environ.get("SOURCE_DATE_EPOCH") or proc.git_out(tree, "log", "-1", "--format=%ct", "HEAD"))
    # A detached worktree: the build writes _version.py, gRPC stubs and copied .so files into
    # its source directory; none of that may land in the user's tree.
    with tempfile.TemporaryDirectory(prefix=".build-wheel.", dir=dist_dir) as scratch, \
            proc.scratch_worktree(tree, "HEAD", prefix=".smla-build-wheel-") as checkout:
        wheel_dir = Path(scratch) / "out"
        argv, env = from_source_invocation(checkout, wheel_dir, version, base,
                                           full_cuda=full_cuda, python=python, source_date_epoch=stamp)
        echo(f"building vLLM {version} from {tree} ({'full CUDA build' if full_cuda else 'python-only, precompiled'})")
        try:
            proc.run(argv, cwd=checkout, env=env)
        except CommandError as exc:
            raise WheelError(
                f"vLLM's setup.py build failed: {exc.message[-2000:]}",
                hint="see docs/build-wheel.md for what the build needs (the pinned torch with CUDA, build "
                     "requirements)",
            ) from exc
        built = sorted(wheel_dir.glob(f"{PROJECT}-*.whl"))
        if len(built) != 1:
            raise WheelError(f"expected one vllm wheel from the build, found {[p.name for p in built]}")
        m = WHEEL_INFO_RE.match(built[0].name)
        if not m or m.group("ver") != version:
            raise WheelError(f"the build made {built[0].name}, not version {version}")
        final = dist_dir / built[0].name
        os.replace(built[0], final)
    result = WheelResult(
        mode="from-source (full CUDA)" if full_cuda else "from-source (python-only, precompiled)",
        version=version, series_hash=short, patches=series.names(),
        base_wheel=base, base_sha256=sha256_file(base) if base else "",
        output=final, output_sha256=sha256_file(final), size=final.stat().st_size,
        not_packaged=sorted(c.path for c in changes if not c.path.startswith(PACKAGE_DIR)),
        version_file=f"written by vLLM's setup.py ({version})",
    )
    echo(f"wrote {final}")
    return result
