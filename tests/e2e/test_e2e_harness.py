"""CPU tests of the e2e harness: bundle reduction, piece transport, workload, configs, comparison.

The GPU run itself is tests/e2e/device-run.sh (results in tests/e2e/results/).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import lzma
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bundle  # noqa: E402
import compare  # noqa: E402
import device_pieces  # noqa: E402
import run_e2e  # noqa: E402
from smla.errors import ChecksumError  # noqa: E402


def _rec(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(path: Path, members: dict[str, bytes], tamper: str | None = None) -> Path:
    rows = [f"{n},{_rec(d)},{len(d)}" for n, d in members.items()] + ["vllm-0.26.0.dist-info/RECORD,,"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            z.writestr(n, d + (b"!" if n == tamper else b""))
        z.writestr("vllm-0.26.0.dist-info/RECORD", "\n".join(rows) + "\n")
    return path


MEMBERS = {
    "vllm/__init__.py": b"x = 1\n",
    "vllm/_C_stable_libtorch.abi3.so": b"\x7fELF core ops",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"\x7fELF fa2",
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"\x7fELF fa3",
    "vllm/third_party/fmha_sm100/x.hpp": b"// sm100",
    "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"dg312",
    "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": b"dg311",
    "vllm/vllm-rs": b"rust",
    "vllm-0.26.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n",
}
KEPT = {"vllm/__init__.py", "vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so", "vllm-0.26.0.dist-info/METADATA"}


def test_reduced_wheel_keeps_exact_members_and_a_matching_record(tmp_path):
    src = _wheel(tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", MEMBERS)
    info = bundle.reduce_wheel(src, tmp_path / "out")
    with zipfile.ZipFile(tmp_path / "out" / src.name) as z:
        names = set(z.namelist()) - {"vllm-0.26.0.dist-info/RECORD"}
        assert names == KEPT
        for n in KEPT:
            assert z.read(n) == MEMBERS[n]
        record = z.read("vllm-0.26.0.dist-info/RECORD").decode().splitlines()
    assert {r.split(",")[0] for r in record} == KEPT | {"vllm-0.26.0.dist-info/RECORD"}
    assert info["members"] == len(KEPT)


def test_reduced_wheel_refuses_a_member_that_does_not_match_record(tmp_path):
    src = _wheel(tmp_path / "v.whl", MEMBERS, tamper="vllm/__init__.py")
    with pytest.raises(ChecksumError):
        bundle.reduce_wheel(src, tmp_path / "out")


def _bundle(tmp_path: Path, piece_bytes: int) -> tuple[Path, dict]:
    build = tmp_path / "build"
    (build / "deps").mkdir(parents=True)
    # incompressible, so the payload spans several pieces
    (build / "deps" / "a.whl").write_bytes(np.random.default_rng(0).bytes(20000))
    (build / "vllm-x.whl").write_bytes(b"wheel" * 5000)
    out = tmp_path / "bundle"
    out.mkdir()
    sums = {}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for p in sorted(build.rglob("*.whl")):
            rel = p.relative_to(build).as_posix()
            tar.add(p, arcname=rel)
            sums[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    payload = out / "payload.tar.xz"
    payload.write_bytes(lzma.compress(raw.getvalue()))
    pieces = bundle.split(payload, out, piece_bytes)
    manifest = {"files": sums, "pieces": pieces,
                "payload": {"sha256": hashlib.sha256(payload.read_bytes()).hexdigest()}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out, manifest


def _call(tmp_path: Path, src: Path, idx: list[int], name: str) -> Path:
    """What one device call carries: the manifest and the pieces `idx`."""
    d = tmp_path / name / ".e2e"
    (d / "pieces").mkdir(parents=True)
    (d / "manifest.json").write_bytes((src / "manifest.json").read_bytes())
    for i in idx:
        (d / "pieces" / f"{i:02d}").mkdir()
        for f in (src / "pieces" / f"{i:02d}").iterdir():
            (d / "pieces" / f"{i:02d}" / f.name).write_bytes(f.read_bytes())
    return d


def test_pieces_over_consecutive_calls_reassemble_and_verify(tmp_path):
    src, manifest = _bundle(tmp_path, 4096)
    n = len(manifest["pieces"])
    assert n >= 3
    store = tmp_path / "store"
    for i in range(1, n):
        _, missing = device_pieces.stage(_call(tmp_path, src, [i], f"c{i}"), store)
        assert missing == list(range(i + 1, n + 1))
    payload = device_pieces.assemble(_call(tmp_path, src, [n], "last"), store)
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((payload / rel).read_bytes()).hexdigest() == digest


def test_a_missing_piece_fails_clearly(tmp_path, capsys):
    src, manifest = _bundle(tmp_path, 4096)
    n = len(manifest["pieces"])
    store = tmp_path / "store"
    device_pieces.stage(_call(tmp_path, src, [1], "c1"), store)  # piece 2.. never carried
    with pytest.raises(device_pieces.PieceError) as exc:
        device_pieces.assemble(_call(tmp_path, src, [n], "last"), store)
    assert exc.value.code == device_pieces.MISSING
    assert "[2" in str(exc.value) and "warm" in str(exc.value)


def test_a_corrupted_piece_is_refused(tmp_path):
    src, _ = _bundle(tmp_path, 4096)
    call = _call(tmp_path, src, [1], "c1")
    part = next((call / "pieces" / "01").iterdir())
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(device_pieces.PieceError) as exc:
        device_pieces.stage(call, tmp_path / "store")
    assert exc.value.code == device_pieces.CHECKSUM


def test_workload_covers_batch_topk_chunking_and_prefixes():
    prompts, labels = run_e2e.workload(8192)
    assert prompts == run_e2e.workload(8192)[0]  # deterministic: same inputs on both sides
    lens = [len(p) for p in prompts]
    assert len(prompts) >= 32
    assert sum(n > 2048 for n in lens) >= 8  # sparse selection bites
    assert max(lens) > run_e2e.ENGINE["max_num_batched_tokens"]  # chunked prefill
    assert max(lens) + run_e2e.GEN_TOKENS <= run_e2e.ENGINE["max_model_len"]
    shared = [p for p, lab in zip(prompts, labels) if lab.startswith("prefixA")]
    assert len(shared) >= 2 and all(p[:3000] == shared[0][:3000] for p in shared)
    assert all(3 <= t < 8192 for p in prompts for t in p)


@pytest.mark.parametrize("name,nope,v,heads,idx_heads", [("deepseek-v32-tiny", 128, 128, 32, 64),
                                                          ("glm5-tiny", 192, 256, 16, 32)])
def test_tiny_configs_keep_the_real_attention_and_indexer_geometry(name, nope, v, heads, idx_heads):
    c = json.loads((HERE / "models" / name / "config.json").read_text())
    assert (c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]) == (512, 64, nope, v)
    assert (c["index_n_heads"], c["index_head_dim"], c["index_topk"]) == (idx_heads, 128, 2048)
    assert c["num_attention_heads"] == heads and heads % 2 == 0  # TP=2 splits the heads
    assert c["num_nextn_predict_layers"] == 1
    assert 0 < c["first_k_dense_replace"] < c["num_hidden_layers"] <= 4


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    lens = np.array([10, 3000], np.int32)
    n = int((lens - 1).sum())
    ids = rng.integers(0, 100, (2, 8)).astype(np.int32)
    return {"prompt_lens": lens, "prompt_lp": rng.normal(-5, 1, n).astype(np.float32),
            "prompt_top1": rng.integers(0, 100, n).astype(np.int32), "gen_ids": ids,
            "gen_top": np.stack([ids, ids + 1], -1),
            "gen_lp": np.stack([np.full((2, 8), -1.0), np.full((2, 8), -1.5)], -1).astype(np.float32)}


def test_compare_identical_sides_is_zero_and_perturbations_are_seen():
    ref = _arrays()
    same = compare.compare_pair(ref, {k: v.copy() for k, v in ref.items()})
    assert same["teacher_forced"]["all"]["max"] == 0 and same["greedy"]["identical_rows"] == 2
    oth = {k: v.copy() for k, v in ref.items()}
    oth["prompt_lp"][-1] += 0.25  # last token of the 3000-token prompt: a sparse position
    oth["gen_ids"][1, 5] = ref["gen_top"][1, 5, 1]
    c = compare.compare_pair(ref, oth)
    assert c["teacher_forced"]["sparse"]["max"] == pytest.approx(0.25, abs=1e-6)
    assert c["teacher_forced"]["dense"]["max"] == 0
    assert c["greedy"]["per_row"][1] == {"matched": 5, "ref_margin": pytest.approx(0.5)}
    bounds = json.loads((HERE / "bounds.json").read_text())
    b, _ = compare.bounds_for("bfloat16", same | {"name": "calib"}, bounds)
    assert b["tf_mean_abs"] == bounds["floor"]["bfloat16"]["tf_mean_abs"]  # zero spread: the floor
    assert any("divergence_margin_max" in x for x in compare.check_bounds(c, b))


def test_a_divergence_on_an_exact_tie_has_margin_zero_whatever_order_the_tie_came_back_in():
    ref = _arrays()
    ref["gen_top"][0, 3] = [ref["gen_ids"][0, 3] + 7, ref["gen_ids"][0, 3]]  # tie partner listed first
    ref["gen_lp"][0, 3] = [-2.0, -2.0]
    oth = {k: v.copy() for k, v in ref.items()}
    oth["gen_ids"][0, 3] = ref["gen_ids"][0, 3] + 7
    row = compare.compare_pair(ref, oth)["greedy"]["per_row"][0]
    assert row == {"matched": 3, "ref_margin": 0.0}
    oth["gen_ids"][0, 3] = 99999  # outside the reference's top-2: margin at least top-1 minus top-2
    ref["gen_top"][0, 3] = [ref["gen_ids"][0, 3], ref["gen_ids"][0, 3] + 7]
    ref["gen_lp"][0, 3] = [-2.0, -2.5]
    g = compare.compare_pair(ref, oth)["greedy"]
    assert g["per_row"][0] == {"matched": 3, "ref_margin_at_least": 0.5} and g["divergence_below_top2"] == 1

