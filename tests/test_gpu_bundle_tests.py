"""The vLLM tests the lent H200 runs out of the bundle (tests/gpu/make-bundle.sh: kern/, kpool/),
as tests/gpu/device-run.sh and t38-run.sh run them, with their stand-ins for vLLM
(tests/gpu/series_ops_stub.py, line_ops_stub.py, platform_stand_in.py): on the CPU, under Triton's
interpreter, in child processes (the stand-ins take over `vllm` in sys.modules). Every module must
import (their CUDA tests skip here, the rest pass): on 2026-12-02 the H200 runs of both phases lost
the series' tests at collection (no vllm.platforms in the bundle) and four of the line's to a
module fused_q asks on CUDA (vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import platform_stand_in  # noqa: E402

KPOOL_FILE = "vllm/models/glm5next/nvidia/ops/kpool_compress.py"


@pytest.fixture(scope="module")
def bundle(vllm_tree, tmp_path_factory) -> Path:
    """kern/ (and kpool/, where the line has the kpool patch) as make-bundle.sh builds them."""
    out = tmp_path_factory.mktemp("bundle") / ".gpu-port"
    wheel = out.parent / "unused.whl"  # kern and kpool take nothing from the wheel
    wheel.write_bytes(b"")
    parts = "kern kpool" if (vllm_tree / KPOOL_FILE).is_file() else "kern"
    env = dict(os.environ, SMLA_BUNDLE_PARTS=parts, SMLA_TREE=str(vllm_tree))
    r = subprocess.run(["bash", "tests/gpu/make-bundle.sh", str(out), str(wheel)], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def _pytest(plugin: str, tree: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest as the device scripts call it (PYTHONPATH, the plugin, SMLA_TREE), interpreted."""
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO / 'tests' / 'gpu'}",
               SMLA_TREE=str(tree), TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
                           "--rootdir", str(REPO), "-p", plugin, "-p", "no:cacheprovider", "-q", "-rA",
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _all_modules_ran(r: subprocess.CompletedProcess, files: list[Path]) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "error" not in out.splitlines()[-1].lower(), out[-4000:]
    for f in files:  # each module collected something (a test passed or skipped)
        assert f.name in out, f"{f.name} collected nothing:\n{out[-4000:]}"


def test_series_kernel_tests_import_with_the_bundle_stand_ins(bundle):
    """t38-run.sh's series group (all of kern/'s tests; speed runs the same)."""
    tests = bundle / "kern" / "tests" / "kernels" / "attention"
    files = sorted(tests.glob("test_triton_*.py"))
    assert len(files) == 4
    r = _pytest("series_ops_stub", bundle / "kern", str(tests))
    _all_modules_ran(r, files)


def test_glm53_series_test_selects_fwd_nope(bundle):
    """device-run.sh glm53 / nope: the series' NoPE test alone."""
    f = bundle / "kern" / "tests" / "kernels" / "attention" / "test_triton_sparse_mla.py"
    r = _pytest("series_ops_stub", bundle / "kern", str(f), "-k", "fwd_nope", "--collect-only")
    assert r.returncode == 0 and "test_sparse_mla_fwd_nope[" in r.stdout, r.stdout + r.stderr


def test_series_stub_cache_writer_skips_where_vllms_ops_are_not_carried(bundle, tmp_path, monkeypatch):
    """The series' writer test (vllm._custom_ops.concat_and_cache_mla) skips with the reason on a
    route that carries no compiled ops, instead of importing vLLM's real _custom_ops."""
    monkeypatch.delenv("SMLA_VLLM_C_SO", raising=False)
    f = tmp_path / "test_writer_call.py"
    f.write_text("def test_writer_call():\n"
                 "    from vllm import _custom_ops as ops\n"
                 "    ops.concat_and_cache_mla(None, None, None, None, 'fp8_ds_mla', None)\n")
    r = _pytest("series_ops_stub", bundle / "kern", str(f))
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout + r.stderr
    assert "compiled cache writer is not carried (SMLA_VLLM_C_SO)" in r.stdout


def test_line_kernel_tests_import_with_the_bundle_stand_ins(bundle):
    """t38-run.sh's line group: the 0.33.0 line's own tests of its fused V3.2/GLM and kpool kernels."""
    if not (bundle / "kpool").is_dir():
        pytest.skip("this line has no kpool patch (tests/gpu/kpool-bundle.sh: the 0.33.0 line)")
    files = sorted((bundle / "kpool" / "tests" / "kernels").glob("test_*.py"))
    assert len(files) == 2
    r = _pytest("line_ops_stub", bundle / "kpool", *map(str, files))
    _all_modules_ran(r, files)


def test_fused_q_on_cuda_below_sm100_runs_the_triton_kernel(bundle, tmp_path):
    """fused_q on a CUDA platform asks the CuTe DSL module whether it applies (sm100+ only): with
    the stand-ins on a platform that says sm90 (the H200), the line's fused_q checks pass on the
    Triton kernel, interpreted; at sm100 the stand-in refuses to answer rather than guess."""
    if not (bundle / "kpool").is_dir():
        pytest.skip("this line has no kpool patch (tests/gpu/kpool-bundle.sh: the 0.33.0 line)")
    script = tmp_path / "fused_q_sm90.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.util, sys
        import line_ops_stub  # noqa: F401
        from platform_stand_in import CudaPlatformStandIn, DeviceCapability
        CudaPlatformStandIn.is_cuda = staticmethod(lambda: True)
        cap = [DeviceCapability(9, 0)]
        CudaPlatformStandIn.get_device_capability = classmethod(lambda cls, device_id=0: cap[0])
        CudaPlatformStandIn.is_arch_support_pdl = classmethod(lambda cls: False)  # no PDL interpreted
        from vllm.models.deepseek_v32.common import kernels as K
        spec = importlib.util.spec_from_file_location(
            "t", {str(bundle / "kpool/tests/kernels/test_fused_deepseek_v32_fp8_encode.py")!r})
        t = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(t)
        t.check_fused_q_codes("cpu")
        t.check_index_cache_skip_layer("cpu")
        cap[0] = DeviceCapability(10, 0)
        try:
            t.check_fused_q_codes("cpu")
        except RuntimeError as e:
            assert "CuTe DSL" in str(e), e
        else:
            sys.exit("sm100: the CuTe DSL stand-in answered")
        print("fused_q ok")
    """))
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO / 'tests' / 'gpu'}",
               SMLA_TREE=str(bundle / "kpool"), TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "fused_q ok" in r.stdout, r.stdout + r.stderr[-4000:]


@pytest.mark.parametrize("cap,answers", [
    (None, dict(cuda=False, has89=False, has90=False, is90=False, pdl=False)),
    ((9, 0), dict(cuda=True, has89=True, has90=True, is90=True, pdl=True)),
    ((8, 0), dict(cuda=True, has89=False, has90=False, is90=False, pdl=False)),
    ((10, 0), dict(cuda=True, has89=True, has90=True, is90=False, pdl=True)),
])
def test_platform_stand_in_answers_from_torch_cuda(monkeypatch, cap, answers):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cap is not None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    p = platform_stand_in.CudaPlatformStandIn()
    got = dict(cuda=p.is_cuda(), has89=p.has_device_capability(89),
               has90=p.has_device_capability((9, 0)), is90=p.is_device_capability(90),
               pdl=p.is_arch_support_pdl())
    assert got == answers
    assert p.is_rocm() is False and p.fp8_dtype() == torch.float8_e4m3fn
    if cap is not None:
        assert p.get_device_capability() == cap and p.get_device_capability().to_int() == cap[0] * 10 + cap[1]
        assert p.is_device_capability_family(cap[0] * 10 + 3)
