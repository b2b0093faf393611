"""CPU tests of the e2e harness: bundle reduction, piece transport, workload, configs, comparison.

The GPU run itself is tests/e2e/device-run.sh (results in tests/e2e/results/).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import lzma
import shlex
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
import prompt_lp_guard  # noqa: E402
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


def test_a_corrupted_or_stale_piece_is_never_staged(tmp_path, capsys):
    """A carried piece that is not the manifest's (damaged, or left in the machine's copy of
    the repo by a call with another cut of the bundle) is ignored with a note and counts as
    missing; the run then stops at the missing piece."""
    src, manifest = _bundle(tmp_path, 4096)
    call = _call(tmp_path, src, [1], "c1")
    part = next((call / "pieces" / "01").iterdir())
    part.write_bytes(b"x" + part.read_bytes()[1:])
    store = tmp_path / "store"
    _, missing = device_pieces.stage(call, store)
    assert 1 in missing and not (store / "pieces" / part.name).exists()
    assert f"ignoring {part}" in capsys.readouterr().out
    with pytest.raises(device_pieces.PieceError) as exc:
        device_pieces.assemble(call, store)
    assert exc.value.code == device_pieces.MISSING


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



# --- fp8 KV cache engines (README "fp8 KV cache") ---------------------------------------------

BASE_ARGS = ["--tp", "1", "--models", "deepseek-v32-tiny", "glm5-tiny", "--kv-dtypes", "auto", "fp8",
             "--sides", "ref", "ref2", "ours"]
FP8_ONLY = "(ref2?|fp8kv-(mqa-)?ours)$"
# the README's fp8 device command, verbatim
DEVICE_CMD = ("bash tests/e2e/device-run.sh run --tp 1 --models deepseek-v32-tiny glm5-tiny --kv-dtypes auto fp8 "
              "--sides ref ref2 ours --only '(ref2?|fp8kv-(mqa-)?ours)$' --parallel 16 --engine-timeout 360")
# the previous fp8 command's engines, without the all-MQA ones (fallback of the fp16 fp8 calibration)
FP8_ONLY_NO_MQA = "^(?!.*-mqa-).*(ref2?|fp8kv-ours)$"


def test_default_jobs_keep_todays_names_and_fields():
    jobs = run_e2e.build_jobs(run_e2e.parse_args(["--sides", "ref", "ref2", "ours"]))
    assert [j["name"] for j in jobs] == [f"tp1-{m}-{d}-{s}" for m in ("deepseek-v32-tiny", "glm5-tiny")
                                         for d, sides in (("bfloat16", ("ref", "ref2", "ours")),
                                                          ("float16", ("ref", "ours"))) for s in sides]
    assert {j["kv_cache_dtype"] for j in jobs} == {"auto"}
    assert not any(j["mqa"] or j["force_mqa"] for j in jobs)
    assert {(j["side"], j["backend"]) for j in jobs} == {("ref", "FLASH_ATTN_MLA_SPARSE"),
                                                         ("ref2", "FLASHMLA_SPARSE"), ("ours", "TRITON_MLA_SPARSE")}
    assert all("kv_cache_dtype" not in run_e2e.engine_kwargs(j) for j in jobs)  # LLM(...) as before


def test_kv_dtypes_auto_fp8_give_exactly_these_engines():
    jobs = run_e2e.build_jobs(run_e2e.parse_args(BASE_ARGS))
    by = {j["name"]: j for j in jobs}
    for m in ("deepseek-v32-tiny", "glm5-tiny"):
        mine = {n for n in by if n.startswith(f"tp1-{m}-")}
        assert mine == {f"tp1-{m}-bfloat16-{s}" for s in ("ref", "ref2", "ours")} | {
            f"tp1-{m}-float16-{s}" for s in ("ref", "ours")} | {
            f"tp1-{m}-bfloat16-fp8kv-ref", f"tp1-{m}-bfloat16-fp8kv-ours", f"tp1-{m}-float16-fp8kv-ours",
            f"tp1-{m}-bfloat16-fp8kv-mqa-ref", f"tp1-{m}-bfloat16-fp8kv-mqa-ours"}
        assert sorted(n for n in mine if by[n]["force_mqa"]) == [f"tp1-{m}-bfloat16-fp8kv-mqa-ours",
                                                                f"tp1-{m}-bfloat16-fp8kv-mqa-ref"]
        ref8, ours8 = by[f"tp1-{m}-bfloat16-fp8kv-ref"], by[f"tp1-{m}-float16-fp8kv-ours"]
        assert (ref8["kv_cache_dtype"], ref8["backend"], ref8["side"]) == ("fp8", None, "ref")  # vLLM's own pick
        assert ref8["env"][run_e2e.INDEXER_SWITCH] == "deepgemm"
        assert (ours8["kv_cache_dtype"], ours8["backend"], ours8["dtype"]) == ("fp8", "TRITON_MLA_SPARSE", "float16")
        assert ours8["env"][run_e2e.INDEXER_SWITCH] == "triton"
        kw = run_e2e.engine_kwargs(ref8)
        assert kw["kv_cache_dtype"] == "fp8" and "attention_config" not in kw
        assert "attention_backend" not in kw["speculative_config"]
        kw = run_e2e.engine_kwargs(ours8)
        assert kw["kv_cache_dtype"] == "fp8" and kw["attention_config"] == {"backend": "TRITON_MLA_SPARSE"}
        assert kw["speculative_config"]["attention_backend"] == "TRITON_MLA_SPARSE"
        assert by[f"tp1-{m}-bfloat16-ref"]["kv_cache_dtype"] == "auto"
        # the all-MQA variants: the same engines plus sparse_mla_force_mqa on that engine only
        mref, mours = by[f"tp1-{m}-bfloat16-fp8kv-mqa-ref"], by[f"tp1-{m}-bfloat16-fp8kv-mqa-ours"]
        assert (mref["side"], mref["backend"], mref["kv_cache_dtype"], mref["mqa"]) == ("ref", None, "fp8", True)
        assert mref["env"][run_e2e.INDEXER_SWITCH] == "deepgemm"
        kw = run_e2e.engine_kwargs(mref)
        assert kw["kv_cache_dtype"] == "fp8" and kw["attention_config"] == {"sparse_mla_force_mqa": True}
        assert "attention_backend" not in kw["speculative_config"]  # vLLM's own pick, as the fp8 ref
        assert (mours["side"], mours["backend"], mours["dtype"]) == ("ours", "TRITON_MLA_SPARSE", "bfloat16")
        assert mours["env"][run_e2e.INDEXER_SWITCH] == "triton"
        assert run_e2e.engine_kwargs(mours)["attention_config"] == {"backend": "TRITON_MLA_SPARSE",
                                                                   "sparse_mla_force_mqa": True}
    # --ref-backend moves the kv-auto `ref` only
    jobs = run_e2e.build_jobs(run_e2e.parse_args(BASE_ARGS + ["--ref-backend", "FLASHMLA_SPARSE"]))
    assert {j["backend"] for j in jobs if j["side"] == "ref"} == {"FLASHMLA_SPARSE", None}
    # the global --force-mqa stays as it was: every engine; the names do not change
    jobs = run_e2e.build_jobs(run_e2e.parse_args(BASE_ARGS + ["--force-mqa"]))
    assert all(j["force_mqa"] for j in jobs) and sum(j["mqa"] for j in jobs) == 4 and len(jobs) == 20
    assert run_e2e.engine_kwargs(jobs[0])["attention_config"]["sparse_mla_force_mqa"] is True


def test_the_readme_fp8_device_command_selects_the_fp8_engines():
    assert DEVICE_CMD in (HERE / "README.md").read_text()
    argv = shlex.split(DEVICE_CMD)
    assert argv[:3] == ["bash", "tests/e2e/device-run.sh", "run"]
    args = run_e2e.parse_args(argv[3:] + ["--gpus", "2"])  # device-run.sh adds --out and --gpus
    assert args.only == FP8_ONLY
    jobs = run_e2e.select_jobs(args)
    want = {f"tp1-{m}-{e}" for m in ("deepseek-v32-tiny", "glm5-tiny")
            for e in ("bfloat16-ref", "bfloat16-ref2", "bfloat16-fp8kv-ref", "bfloat16-fp8kv-ours",
                      "bfloat16-fp8kv-mqa-ref", "bfloat16-fp8kv-mqa-ours", "float16-ref", "float16-fp8kv-ours")}
    assert sorted(j["name"] for j in jobs) == sorted(want) and len(jobs) == 16
    assert len(jobs) <= args.parallel  # one wave
    assert len(run_e2e.build_jobs(args)) == 20  # without --only: the 16-bit ours too


KV_LOG = (
    "INFO 11-30 05:54:54 [api_utils.py:273] non-default args: {'kv_cache_dtype': 'fp8'}\n"
    "(EngineCore pid=5428) INFO 11-30 05:55:02 [mla_attention.py:440] Using fp8_ds_mla KV cache format for "
    "FLASHMLA_SPARSE backend.\n"
    "(EngineCore pid=5428) INFO 11-30 05:55:40 [kv_cache_utils.py:2177] GPU KV cache size: 227,520 tokens\n"
    "(EngineCore pid=5428) INFO 11-30 05:55:40 [kv_cache_utils.py:2178] Maximum concurrency for 8,192 tokens "
    "per request: 27.77x\n"
    "(EngineCore pid=5428) Capturing CUDA graphs (decode, FULL):   0%|   | 0/10\rCapturing CUDA graphs: 100%|\n"
)


def test_the_kv_capacity_line_vllm_logs_is_parsed(tmp_path):
    kv = run_e2e.parse_kv_capacity(KV_LOG)
    assert kv["tokens"] == 227520 and kv["max_concurrency"] == pytest.approx(27.77)
    assert kv["line"].endswith("GPU KV cache size: 227,520 tokens") and kv["line"].startswith("(EngineCore")
    assert run_e2e.parse_kv_capacity("no such line\n") == {"tokens": None, "max_concurrency": None,
                                                          "line": None, "concurrency_line": None}

    class Cfg:  # what the record reads of llm.llm_engine.vllm_config
        cache_config = type("CacheConfig", (), {"cache_dtype": "fp8"})()

    (tmp_path / "engine.log").write_text(KV_LOG)
    rec = run_e2e.kv_cache_record(Cfg(), tmp_path / "engine.log")
    assert (rec["dtype_used"], rec["tokens"], rec["max_concurrency"]) == ("fp8", 227520, pytest.approx(27.77))
    rec = run_e2e.kv_cache_record(object(), tmp_path / "missing.log")  # never raises
    assert rec["dtype_used"] is None and rec["tokens"] is None and "error" in rec


BACKEND = {"ref": "FLASH_ATTN_MLA_SPARSE", "ref2": "FLASHMLA_SPARSE", "ours": "TRITON_MLA_SPARSE"}


def _engine(res: Path, job: dict, arrays: dict, *, backend=None, kv_used=None, tokens=None,
            force_mqa_seen=None) -> None:
    """meta.json + arrays.npz as engine_main writes them (probes included)."""
    fp8 = job["kv_cache_dtype"] != "auto"
    backend = backend or ("FLASHMLA_SPARSE" if fp8 and job["side"] == "ref" else BACKEND[job["side"]])
    kv_used = kv_used or ("fp8" if fp8 else "auto")
    layer_kv = "fp8_ds_mla" if fp8 and kv_used == "fp8" else kv_used
    probe = {"attention_backends": [backend], "kv_cache_dtypes": [layer_kv],
             "indexer_logits": ["triton" if job["side"] == "ours" else "deepgemm", "why"]}
    tokens = tokens or (400000 if fp8 else 227520)
    meta = {"ok": True, "model_probe": [probe], "drafter_probe": [probe],
            "worker_cudagraphs": [{"cudagraph_mode": "CUDAGraphMode.FULL_AND_PIECEWISE"}],
            "sparse_mla_force_mqa": job["force_mqa"] if force_mqa_seen is None else force_mqa_seen,
            "kv_cache": {"dtype_used": kv_used, "tokens": tokens, "max_concurrency": tokens / 8192,
                         "line": f"GPU KV cache size: {tokens:,} tokens"}}
    (res / job["name"]).mkdir(parents=True)
    (res / job["name"] / "meta.json").write_text(json.dumps(meta))
    np.savez_compressed(res / job["name"] / "arrays.npz", **arrays)
    (res / job["name"] / "engine.log").write_text(prompt_lp_guard.line(prompt_lp_guard.INSTALLED) + "\n")


def _shifted(a: dict, d: float, sparse_only: bool = False) -> dict:
    """Every prompt logprob (or those of the sparse positions only) moved by d."""
    out = {k: v.copy() for k, v in a.items()}
    seen = np.concatenate([np.arange(1, n) for n in a["prompt_lens"]])
    out["prompt_lp"] += np.where(seen > compare.INDEX_TOPK, d, 0.0 if sparse_only else d).astype(np.float32)
    return out


def _fp8_run(tmp_path, models=("glm5-tiny",), only=None, shifts=None, extra=(), **engine_kw):
    """A run of the fp8 device command's engines on synthetic arrays: `shifts` maps an engine
    (name without tp1-model-) to its prompt-logprob shift against `ref` (others identical)."""
    args = run_e2e.parse_args(["--tp", "1", "--models", *models, "--kv-dtypes", "auto", "fp8",
                               "--sides", "ref", "ref2", "ours", "--only", only or FP8_ONLY, *extra])
    jobs = run_e2e.select_jobs(args)
    base = _arrays()
    for job in jobs:
        short = job["name"].split(f"{job['model']}-", 1)[1]
        shift = (shifts or {}).get(short)
        arrays = base if shift is None else _shifted(base, *shift)
        _engine(tmp_path, job, arrays, **engine_kw.get(short, {}))
    bounds = json.loads((HERE / "bounds.json").read_text())
    return compare.compare_all(jobs, tmp_path, bounds), bounds


def test_fp16_fp8_ours_is_bounded_by_upstreams_all_mqa_fp8_cost_at_all_positions(tmp_path):
    # upstream's fp8 cost where it quantises what our fp16 side quantises (every prefill from
    # the fp8 cache): the all-MQA fp8 ref, 0.2 nats everywhere; the plain fp8 ref pays 0.1 at
    # the sparse positions only (its dense prefill reads fresh 16-bit K/V). Ours (fp16) 0.25
    # everywhere: within 1.5 x 0.2, though 2.5 x what the plain fp8 ref shows
    s, bounds = _fp8_run(tmp_path, shifts={"bfloat16-fp8kv-ref": (0.1, True), "bfloat16-fp8kv-ours": (0.1, True),
                                           "bfloat16-fp8kv-mqa-ref": (0.2,), "bfloat16-fp8kv-mqa-ours": (0.2,),
                                           "float16-fp8kv-ours": (0.25,)})
    assert s["failures"] == [] and s["exit_code"] == 0
    c = {x["name"]: x for x in s["comparisons"]}
    ours = c["tp1-glm5-tiny-float16-fp8kv-ours"]
    assert ours["ref"] == "tp1-glm5-tiny-float16-ref" and ours["broken"] == []
    assert ours["bounds_from"].startswith(
        "1.5 x upstream fp8 cost (tp1-glm5-tiny-bfloat16-fp8kv-mqa-ref vs tp1-glm5-tiny-bfloat16-ref; "
        "all-MQA prefill; teacher-forced: all positions), bfloat16 floors")
    f = bounds["fp8_cost_factor"]
    assert f == 1.5
    assert ours["bounds"]["tf_mean_abs"] == pytest.approx(f * 0.2, rel=1e-4)
    assert ours["bounds"]["tf_p99_abs"] == pytest.approx(f * 0.2, rel=1e-4)
    assert ours["bounds"]["decode_p99_abs"] == bounds["floor"]["bfloat16"]["decode_p99_abs"]  # floor: bf16
    # the fp8 refs are reported against the 16-bit ref, not bounded
    for r in ("tp1-glm5-tiny-bfloat16-fp8kv-ref", "tp1-glm5-tiny-bfloat16-fp8kv-mqa-ref"):
        assert c[r]["ref"] == "tp1-glm5-tiny-bfloat16-ref" and "bounds" not in c[r] and c[r]["broken"] == []
    # each bf16 fp8 ours against the upstream engine on the same cache and the same prefill path
    b8 = c["tp1-glm5-tiny-bfloat16-fp8kv-ours"]
    assert b8["ref"] == "tp1-glm5-tiny-bfloat16-fp8kv-ref" and b8["broken"] == []
    assert b8["bounds_from"].startswith("same fp8 cache on both sides; 2.0 x ref2-vs-ref spread of tp1-glm5-tiny-bfloat16-ref2")
    m8 = c["tp1-glm5-tiny-bfloat16-fp8kv-mqa-ours"]
    assert m8["ref"] == "tp1-glm5-tiny-bfloat16-fp8kv-mqa-ref" and m8["broken"] == []
    assert m8["bounds_from"].startswith("same fp8 cache, all-MQA prefill on both sides; 2.0 x ref2-vs-ref spread of "
                                        "tp1-glm5-tiny-bfloat16-ref2")
    assert m8["bounds"] == b8["bounds"]
    report = compare.write_report(s)
    assert "| tp1-glm5-tiny-bfloat16-fp8kv-ref | fp8 | fp8 / fp8_ds_mla | 400,000 |" in report
    assert "| tp1-glm5-tiny-bfloat16-fp8kv-mqa-ref | fp8 | fp8 / fp8_ds_mla | 400,000 |" in report
    assert "| 1.758 | tp1-glm5-tiny-bfloat16-ref |" in report  # no kv-auto bf16 ours ran: vs its ref
    assert "| tp1-glm5-tiny-bfloat16-fp8kv-mqa-ref | True | FLASHMLA_SPARSE / deepgemm (force MQA) |" in report
    assert "| tp1-glm5-tiny-bfloat16-fp8kv-mqa-ours vs tp1-glm5-tiny-bfloat16-fp8kv-mqa-ref |" in report


def test_fp16_fp8_ours_beyond_the_all_mqa_fp8_cost_bound_fails(tmp_path):
    s, _ = _fp8_run(tmp_path, shifts={"bfloat16-fp8kv-ref": (0.2, True), "bfloat16-fp8kv-ours": (0.2, True),
                                      "bfloat16-fp8kv-mqa-ref": (0.2,), "bfloat16-fp8kv-mqa-ours": (0.2,),
                                      "float16-fp8kv-ours": (0.4,)})
    assert s["failures"] == [] and s["exit_code"] == 1
    c = {x["name"]: x for x in s["comparisons"]}
    ours = c["tp1-glm5-tiny-float16-fp8kv-ours"]
    assert any(b.startswith("tf_mean_abs 0.4") for b in ours["broken"])
    assert any(b.startswith("tf_p99_abs 0.4") for b in ours["broken"])
    assert [n for n, x in c.items() if x["broken"]] == ["tp1-glm5-tiny-float16-fp8kv-ours"]


def test_the_all_mqa_calibration_uses_every_position_not_the_sparse_ones(tmp_path):
    # the all-MQA fp8 ref's cost sits at the sparse positions only (951 of 3008): averaged over
    # all positions it is ~0.063, so ours at 0.25 everywhere breaks the mean (sparse-only would
    # have read 0.2 and passed it); the p99 still sees 0.2
    s, bounds = _fp8_run(tmp_path, shifts={"bfloat16-fp8kv-mqa-ref": (0.2, True), "bfloat16-fp8kv-mqa-ours": (0.2, True),
                                           "float16-fp8kv-ours": (0.25,)})
    ours = next(c for c in s["comparisons"] if c["name"] == "tp1-glm5-tiny-float16-fp8kv-ours")
    calib = next(c for c in s["comparisons"] if c["name"] == "tp1-glm5-tiny-bfloat16-fp8kv-mqa-ref")
    assert ours["bounds"]["tf_mean_abs"] == pytest.approx(1.5 * calib["teacher_forced"]["all"]["mean"])
    assert ours["bounds"]["tf_mean_abs"] == pytest.approx(1.5 * 0.2 * 951 / 3008, rel=1e-4)
    assert ours["bounds"]["tf_p99_abs"] == pytest.approx(1.5 * 0.2, rel=1e-4)
    assert s["exit_code"] == 1 and [b.split()[0] for b in ours["broken"]] == ["tf_mean_abs"]


def test_the_all_mqa_ours_beyond_the_same_cache_spread_fails(tmp_path):
    # our kernel on the all-MQA path 0.2 away from upstream's on the same cache: broken;
    # the mqa ref itself is not bounded, the fp16 ours (within 1.5 x 0.3) passes
    s, _ = _fp8_run(tmp_path, shifts={"bfloat16-fp8kv-mqa-ref": (0.3,), "bfloat16-fp8kv-mqa-ours": (0.1,),
                                      "float16-fp8kv-ours": (0.3,)})
    assert s["failures"] == [] and s["exit_code"] == 1
    c = {x["name"]: x for x in s["comparisons"]}
    assert [n for n, x in c.items() if x["broken"]] == ["tp1-glm5-tiny-bfloat16-fp8kv-mqa-ours"]
    assert any(b.startswith("tf_mean_abs 0.2") for b in c["tp1-glm5-tiny-bfloat16-fp8kv-mqa-ours"]["broken"])


def test_without_the_all_mqa_ref_the_fp16_fp8_ours_falls_back_to_the_sparse_positions(tmp_path):
    # the previous device command: no fp8kv-mqa-* engines; upstream's fp8 cost of the plain fp8
    # ref at its sparse positions (0.2), ours 0.25 everywhere within 1.5 x 0.2, 0.4 beyond
    for d, code in ((0.25, 0), (0.4, 1)):
        res = tmp_path / str(d)
        res.mkdir()
        s, bounds = _fp8_run(res, only=FP8_ONLY_NO_MQA, shifts={
            "bfloat16-fp8kv-ref": (0.2, True), "bfloat16-fp8kv-ours": (0.2, True), "float16-fp8kv-ours": (d,)})
        assert s["failures"] == [] and s["exit_code"] == code
        assert not any("mqa" in n for n in s["engines"])
        ours = next(c for c in s["comparisons"] if c["name"] == "tp1-glm5-tiny-float16-fp8kv-ours")
        assert ours["bounds_from"].startswith(
            "1.5 x upstream fp8 cost (tp1-glm5-tiny-bfloat16-fp8kv-ref vs tp1-glm5-tiny-bfloat16-ref; "
            "teacher-forced: sparse positions; no all-MQA fp8kv-mqa-ref in this run), bfloat16 floors")
        assert ours["bounds"]["tf_mean_abs"] == pytest.approx(1.5 * 0.2, rel=1e-4)
        assert ours["bounds"]["decode_p99_abs"] == bounds["floor"]["bfloat16"]["decode_p99_abs"]
        assert bool(ours["broken"]) == bool(code)


def test_under_the_global_force_mqa_the_plain_fp8_ref_counts_as_all_mqa(tmp_path):
    s, _ = _fp8_run(tmp_path, only=FP8_ONLY_NO_MQA, extra=["--force-mqa"],
                    shifts={"bfloat16-fp8kv-ref": (0.2,), "bfloat16-fp8kv-ours": (0.2,), "float16-fp8kv-ours": (0.25,)})
    assert s["failures"] == [] and s["exit_code"] == 0
    ours = next(c for c in s["comparisons"] if c["name"] == "tp1-glm5-tiny-float16-fp8kv-ours")
    assert "(tp1-glm5-tiny-bfloat16-fp8kv-ref vs tp1-glm5-tiny-bfloat16-ref; all-MQA prefill; teacher-forced: " \
           "all positions)" in ours["bounds_from"]


def test_without_an_fp8_ref_the_fp8_ours_fall_back_to_fixed_bounds(tmp_path):
    s, bounds = _fp8_run(tmp_path, only="(6-ref2?|ours)$")  # every ours, no fp8 ref
    assert s["exit_code"] == 0
    c = {x["name"]: x for x in s["comparisons"]}
    for name in ("tp1-glm5-tiny-bfloat16-fp8kv-ours", "tp1-glm5-tiny-bfloat16-fp8kv-mqa-ours",
                 "tp1-glm5-tiny-float16-fp8kv-ours"):
        assert c[name]["ref"] == name.replace("fp8kv-mqa-ours", "ref").replace("fp8kv-ours", "ref")
        assert c[name]["bounds_from"] == "fixed bfloat16 (no fp8kv-mqa-ref or fp8kv-ref calibration in this run)"
        assert c[name]["bounds"] == bounds["fixed"]["bfloat16"]
    # kv-auto ours keep today's bounds; capacity is compared with the same side's kv-auto engine
    assert c["tp1-glm5-tiny-float16-ours"]["bounds_from"].startswith("1.0 x ref2-vs-ref spread")
    assert s["engines"]["tp1-glm5-tiny-float16-fp8kv-ours"]["kv_capacity_vs"]["engine"] == "tp1-glm5-tiny-float16-ours"
    assert s["engines"]["tp1-glm5-tiny-bfloat16-fp8kv-mqa-ours"]["kv_capacity_vs"]["engine"] == \
        "tp1-glm5-tiny-bfloat16-ours"


@pytest.mark.parametrize("engine,kw,msg", [
    ("float16-fp8kv-ours", {"kv_used": "float16"}, "fp8 KV cache requested, used config float16, layers float16"),
    ("bfloat16-fp8kv-ours", {"kv_used": "auto"}, "fp8 KV cache requested, used config auto"),
    ("bfloat16-fp8kv-ref", {"backend": "FLASH_ATTN_MLA_SPARSE"}, "expected ['FLASHMLA_SPARSE'] for the fp8 cache"),
    ("bfloat16-fp8kv-mqa-ref", {"backend": "FLASH_ATTN_MLA_SPARSE"},
     "expected ['FLASHMLA_SPARSE'] for the fp8 cache"),
    ("bfloat16-fp8kv-mqa-ref", {"kv_used": "bfloat16"}, "fp8 KV cache requested, used config bfloat16"),
    ("bfloat16-fp8kv-mqa-ref", {"force_mqa_seen": False}, "sparse_mla_force_mqa requested, the engine's config says False"),
    ("bfloat16-fp8kv-mqa-ours", {"backend": "FLASHMLA_SPARSE"}, "expected ['TRITON_MLA_SPARSE']"),
])
def test_an_fp8_engine_on_a_16_bit_cache_or_the_wrong_reference_fails(tmp_path, engine, kw, msg):
    s, _ = _fp8_run(tmp_path, **{engine: kw})
    assert s["exit_code"] == 3
    assert [f for f in s["failures"] if msg in f and f.startswith(f"tp1-glm5-tiny-{engine}:")]
    assert len(s["failures"]) == 1


def test_fp8_ds_mla_and_fp8_are_both_accepted_as_the_fp8_cache(tmp_path):
    s, _ = _fp8_run(tmp_path, **{"float16-fp8kv-ours": {"kv_used": "fp8_ds_mla"}})
    assert s["failures"] == [] and s["exit_code"] == 0


def test_glm53_flash_engines():
    """GLM-5.3-Flash (vLLM 0.33.0): engines load the checkpoint generated on the machine
    (load_format auto, keyed by generator + config), `ours` forces TRITON_MLA_SPARSE and the
    Triton pooled-indexer logits through KernelConfig, `ref` DeepGEMM's."""
    args = run_e2e.parse_args(["--tp", "1", "--models", "glm53-flash-tiny", "--dtypes", "bfloat16",
                               "--sides", "ref", "ours"])
    jobs = run_e2e.build_jobs(args)
    assert {j["side"] for j in jobs} == {"ref", "ours"}
    for job in jobs:
        assert job["model_dir"].endswith("/glm53-flash-tiny") and job["load_format"] == "auto"
        kw = run_e2e.engine_kwargs(job)
        want = "triton" if job["side"] == "ours" else "deepgemm"
        assert kw["sparse_indexer_logits_backend"] == want
        if job["side"] == "ours":
            assert kw["attention_config"]["backend"] == "TRITON_MLA_SPARSE"
    cmd = run_e2e.generator_command("glm53-flash-tiny", run_e2e.Path("/tmp/x"))
    assert cmd[-2].endswith("models/glm53-flash-tiny/make_checkpoint.py")
