#!/usr/bin/env python3
"""DeepSeek-V4 sparse-MLA decode as the engine calls it: ours vs FlashMLA, same run.

Ours: sparse_mla_dsv4_decode (vllm/v1/attention/ops/triton_sparse_mla_dsv4.py), called
with the argument expressions of DeepseekV4TritonAttention._forward_decode
(vllm/models/deepseek_v4/nvidia/triton_sparse.py), read from that file's source and
evaluated over the tensors below; the split-K scratch is a view of one workspace
buffer, sized as the class sizes it.  Upstream: flash_mla_with_kvcache with the
argument expressions of DeepseekV4FlashMLAAttention._forward_decode (flashmla.py of
the same tree), from vLLM 0.26.0's wheel: its flash_mla_interface.py
(SMLA_FLASHMLA_INTERFACE) over its _flashmla_C (SMLA_FLASHMLA_SO); its tile-scheduler
metadata is made by one call before the timed region (in the engine the first layer
of each kind makes it inside the step's graph).  Both class files must be in the tree
given (tests/gpu/make-bundle.sh copies them into the bundle's kern/).

Tensors as the engine lays them out (64 heads: V4's padded heads, bf16):
  q        [B, 64, 512] bf16; out the same (the output slice of the layer)
  caches   uint8 fp8_ds_mla V4 layout, [blocks, block, 584] with the block stride
           padded to a multiple of 576 B (alignment=576): SWA and C4 64 entries per
           block (37,440 B), C128 2 per block (1,728 B); filled by the series' own
           pure-torch writer (write_v4_cache of tests/kernels/attention/
           test_triton_sparse_mla_dsv4.py, imported by path), pools of 262,144
           entries (153 MB SWA, 153 MB C4, 226 MB C128: above the 60 MB L2)
  SWA      indices [B, 1, 128]: the last 128 positions of each request through its
           own random blocks; lengths [B] = 128
  C4       extra indices [B, 1, 512]: 512 random distinct entries of ctx/4 through
           the request's random block table; lengths 512
  C128     extra indices [B, 1, ceil(ctx/128 / 128) * 128]: all ctx/128 entries,
           -1 past them; lengths ctx/128
  sink     fp32 [64], half the heads -inf (FlashMLA's padding)
Cells: layer swa (SWA only) | c4 | c128, batch 1/16/64, context 8k/64k, each a
decode step (one query token per request), timed as CUDA-graph replays
(triton.testing.do_bench medians, L2 flushed).  Bytes: 584 B per gathered row
(valid entries below the lengths) + q + out, over the copy bandwidth measured in
the run.  Numerics: ours vs FlashMLA (relative norm error, all tokens) and both vs
float64 on the first 2 tokens.  Output: OUT_DIR/dsv4.json {"copy_tbps", "rows"}.

  python bench/bench_dsv4.py OUT_DIR [--quick] [--sweep] [--batch N ...] [--context N ...]
  python bench/bench_dsv4.py OUT_DIR --cpu-smoke [--sweep]   (TRITON_INTERPRET=1, tiny
        shapes, fp16 (the interpreter has no bf16 arithmetic), ours only, vs float64)
--sweep: per cell also the same call with each launch config of SWEEP (BLOCK_H:BLOCK_N:
warps:stages[:splits], passed as the kernel's `config`), timed and checked against float64 the same
way: row["sweep"]. Only the plan the engine uses is "ours_us"; the sweep finds candidates.
env: SMLA_TREE (the patched tree or the bundle's kern/), SMLA_TREE_BEFORE (optional),
     SMLA_FLASHMLA_SO, SMLA_FLASHMLA_INTERFACE, SMLA_DSV4_SWEEP (space-separated configs
     replacing SWEEP)
"""
from __future__ import annotations

import ast
import json
import os
import sys
import types
from pathlib import Path

if "--cpu-smoke" in sys.argv:  # before triton is first imported (tests/sparse_mla_reference.py)
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from sparse_mla_reference import load_tree_module, provide_ops_package, rel_err  # noqa: E402
from timing import copy_tbps, kernel_modules, median_us, parse_args  # noqa: E402

KERNEL = "vllm/v1/attention/ops/triton_sparse_mla_dsv4.py"
SERIES_TEST = "tests/kernels/attention/test_triton_sparse_mla_dsv4.py"
TRITON_CLASS = ("vllm/models/deepseek_v4/nvidia/triton_sparse.py", "DeepseekV4TritonAttention",
                "sparse_mla_dsv4_decode")
FLASHMLA_CLASS = ("vllm/models/deepseek_v4/nvidia/flashmla.py", "DeepseekV4FlashMLAAttention",
                  "flash_mla_with_kvcache")
HEAD_DIM, ROW_BYTES = 512, 584
SCALE = HEAD_DIM ** -0.5  # DeepseekV4Attention.scale = head_dim ** -0.5
HEADS = 64
WINDOW, TOPK_C4 = 128, 512
SWA_BLOCK, C4_BLOCK, C128_BLOCK = 64, 64, 2
POOL_ENTRIES = 262_144
BATCHES, CONTEXTS, LAYERS = [1, 16, 64], [8192, 65536], ["swa", "c4", "c128"]
# CPU smoke: tiny shapes under the interpreter
SMOKE = dict(batch=2, heads=16, context=1024, window=32, topk=64, pool=1024)
SMOKE_BOUND = 2e-3  # fp16, the series' test bound
# --sweep: the same call with its launch config overridden (sparse_mla_dsv4_decode's `config`,
# BLOCK_H:BLOCK_N:num_warps:num_stages[:num_splits]; without the fifth field the splits follow
# from the shape as in the plan): the plan's two head tiles, each in every cell (16:32:4:2,
# 32:32:4:2: the launch table's choice both ways), and their neighbours (bench/README.md,
# "Pipelined under Triton 3.8; 32 heads for wide grids")
SWEEP = tuple(os.environ.get("SMLA_DSV4_SWEEP", "").split()) or (
    "16:32:4:2", "32:32:4:2", "16:32:8:2", "16:64:4:2", "16:16:4:2", "16:32:4:3")
SMOKE_SWEEP = ("16:32:8:1", "32:16:4:1")  # the interpreter ignores warps and stages


def _line_tree(repo: Path) -> Path:
    """The work tree of the line under test, as tests/conftest.py: $SMLA_LINE, else the newest line."""
    lines = sorted((p.parent.name for p in (repo / "lines").glob("*/vllm-pin.txt")),
                   key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))
    return repo / "work" / (os.environ.get("SMLA_LINE") or lines[-1]) / "vllm"


def sweep_config(spec: str) -> dict:
    """'BLOCK_H:BLOCK_N:num_warps:num_stages[:num_splits]' -> sparse_mla_dsv4_decode's
    config (without num_splits the splits follow from the shape as in the plan)."""
    vals = [int(v) for v in spec.split(":")]
    if len(vals) not in (4, 5):
        raise ValueError(f"sweep config {spec!r}: BLOCK_H:BLOCK_N:warps:stages[:splits]")
    return dict(zip(("BLOCK_H", "BLOCK_N", "num_warps", "num_stages", "num_splits"), vals))


def tree() -> Path:
    return Path(os.environ.get("SMLA_TREE", _line_tree(REPO)))


def call_form(src: str, cls: str, func: str, method: str = "_forward_decode"):
    """(positional expressions, [(keyword, expression)]) of the call of `func` in
    `cls`.`method` of the source `src`."""
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for meth in node.body:
                if isinstance(meth, ast.FunctionDef) and meth.name == method:
                    for c in ast.walk(meth):
                        if isinstance(c, ast.Call) and ast.unparse(c.func) == func:
                            return ([ast.unparse(a) for a in c.args],
                                    [(k.arg, ast.unparse(k.value)) for k in c.keywords])
    raise LookupError(f"no call of {func} in {cls}.{method}")


def engine_forms(root: Path | None = None, method: str = "_forward_decode",
                 funcs: tuple[str, str] | None = None):
    """(ours form, FlashMLA form): the calls of the two classes' `method` in the tree (of
    `funcs`, default the decode calls)."""
    root = tree() if root is None else root
    forms = []
    for i, (rel, cls, func) in enumerate((TRITON_CLASS, FLASHMLA_CLASS)):
        path = root / rel
        if not path.is_file():
            raise SystemExit(f"{path} is missing: SMLA_TREE must be the patched tree or a bundle "
                             "kern/ made by tests/gpu/make-bundle.sh")
        forms.append(call_form(path.read_text(), cls, funcs[i] if funcs else func, method))
    return forms[0], forms[1]


def evaluate(form, ns: dict):
    """args, kwargs of a call form evaluated over the namespace ns."""
    args = [eval(e, {}, ns) for e in form[0]]  # noqa: S307 (the tree's own source)
    return args, {k: eval(e, {}, ns) for k, e in form[1]}


def series_test_module(device: str):
    """The series' kernel test module (its cache writer and float64 reference); it imports
    vllm.platforms, which the bundle lacks: the harness stand-in answers (tests/gpu)."""
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    from platform_stand_in import provide_platforms

    provide_ops_package(tree())
    provide_platforms()
    mod = load_tree_module(tree(), SERIES_TEST, "smla_dsv4_series_test",
                           interpret=os.environ.get("TRITON_INTERPRET") == "1")
    mod.DEVICE = "cpu"  # rows and reference stay on the host; caches are moved below
    return mod


def to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """t on device with its storage, so its strides (the padded block stride) stay."""
    if device == "cpu":
        return t
    base = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
    return base.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def make_caches(tm, pool: int, device: str, gen):
    """{layer kind: (cache [blocks, block, 584] on device, float64 rows on the host, block)}"""
    out = {}
    for kind, bs in (("swa", SWA_BLOCK), ("c4", C4_BLOCK), ("c128", C128_BLOCK)):
        cache, rows = tm.make_cache(pool, bs, gen)
        out[kind] = (to_device(cache, device), rows, bs)
    return out


def step_inputs(layer, B, H, ctx, window, topk, caches, dtype, device, gen):
    """The decode step's tensors as the engine hands them to _forward_decode."""
    swa_cache, _, bs = caches["swa"]
    pool = swa_cache.shape[0]
    p = ctx - 1  # each request's decode position
    n = min(p + 1, window)
    pos = torch.arange(p - n + 1, p + 1)
    first = (p - n + 1) // bs
    swa_idx = torch.full((B, 1, window), -1, dtype=torch.int32)
    for b in range(B):
        table = torch.randperm(pool, generator=gen)[: p // bs - first + 1]
        swa_idx[b, 0, :n] = (table[pos // bs - first] * bs + pos % bs).int()
    swa_lens = torch.full((B,), n, dtype=torch.int32)
    topk_idx = topk_lens = kv_cache = None
    if layer != "swa":
        kv_cache, _, cbs = caches[layer]
        cpool = kv_cache.shape[0]
        ratio = 4 if layer == "c4" else 128
        entries = ctx // ratio
        width = topk if layer == "c4" else triton.cdiv(entries, 128) * 128
        k = min(entries, width)
        topk_idx = torch.full((B, 1, width), -1, dtype=torch.int32)
        for b in range(B):
            table = torch.randperm(cpool, generator=gen)[: triton.cdiv(entries, cbs)]
            local = (torch.randperm(entries, generator=gen)[:k] if layer == "c4"
                     else torch.arange(entries))
            topk_idx[b, 0, :k] = (table[local // cbs] * cbs + local % cbs).int()
        topk_lens = torch.full((B,), k, dtype=torch.int32)
    q = (torch.randn(B, H, HEAD_DIM, generator=gen) * 0.5).to(dtype)
    sink = torch.randn(H, generator=gen) * 2.0
    sink[H // 2:] = float("-inf")
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    return dict(layer=layer, q=dev(q), swa_idx=dev(swa_idx), swa_lens=dev(swa_lens),
                topk_idx=dev(topk_idx), topk_lens=dev(topk_lens), kv_cache=kv_cache,
                swa_cache=swa_cache, sink=dev(sink),
                output=torch.empty(B, H, HEAD_DIM, dtype=dtype, device=device))


def ns_for(x, scratch=None, tile_metadata=None, flashmla=False) -> dict:
    """The names _forward_decode's calls use, bound as the class binds them."""
    swa_only = x["layer"] == "swa"
    self = types.SimpleNamespace(swa_cache_layer=types.SimpleNamespace(kv_cache=x["swa_cache"]),
                                 scale=SCALE, attn_sink=x["sink"])
    ns = dict(self=self, swa_metadata=types.SimpleNamespace(decode_swa_lens=x["swa_lens"]),
              q=x["q"], kv_cache=x["kv_cache"], swa_indices=x["swa_idx"], swa_lens=x["swa_lens"],
              topk_indices=x["topk_idx"], topk_lens=x["topk_lens"], output=x["output"],
              scratch=scratch, swa_only=swa_only, tile_metadata=tile_metadata)
    if flashmla:  # the lines before FlashMLA's call: q.unsqueeze(1), caches [.., 1, 584]
        ns.update(q=x["q"].unsqueeze(1), swa_cache=x["swa_cache"].unsqueeze(-2),
                  kv_cache=None if x["kv_cache"] is None else x["kv_cache"].unsqueeze(-2))
    return ns


class Ours:
    """sparse_mla_dsv4_decode as DeepseekV4TritonAttention._forward_decode calls it."""

    def __init__(self, mod, form, x, workspace, config=None):
        self.mod = mod
        q, topk = x["q"], x["topk_idx"]
        numel = mod.sparse_mla_dsv4_scratch_numel(q.shape[0], q.shape[1], x["swa_idx"].shape[-1],
                                                  q.device, 0 if topk is None else topk.shape[-1],
                                                  config=config)
        scratch = workspace[:numel] if numel else None
        assert numel <= workspace.numel(), (numel, workspace.numel())
        self.args, self.kw = evaluate(form, ns_for(x, scratch))
        if config:  # --sweep: the engine's call with another launch config
            self.kw["config"] = config
        self.numel = numel

    def __call__(self):
        return self.mod.sparse_mla_dsv4_decode(*self.args, **self.kw)


def flashmla_interface():
    """(flash_mla_with_kvcache, its scheduler-metadata class) from the wheel's interface file."""
    m = flashmla_module()
    return m.flash_mla_with_kvcache, m.FlashMLASchedMeta


def flashmla_module():
    """The wheel's flash_mla_interface.py over its _flashmla_C (bench_dsv4_prefill.py takes
    flash_mla_sparse_fwd from it)."""
    torch.ops.load_library(os.environ["SMLA_FLASHMLA_SO"])
    path = Path(os.environ.get("SMLA_FLASHMLA_INTERFACE", ""))
    if not path.is_file():
        raise SystemExit("SMLA_FLASHMLA_INTERFACE must name the wheel's "
                         "vllm/third_party/flashmla/flash_mla_interface.py (bundle fm/)")
    import importlib.util

    # its `import vllm._flashmla_C` only loads the library, loaded above
    sys.modules.setdefault("vllm._flashmla_C", types.ModuleType("vllm._flashmla_C"))
    spec = importlib.util.spec_from_file_location("smla_flash_mla_interface", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class FlashMLA:
    """flash_mla_with_kvcache as DeepseekV4FlashMLAAttention._forward_decode calls it; the
    tile-scheduler plan made by a first call here (outside the timed region)."""

    def __init__(self, fn, meta_cls, form, x):
        self.fn = fn
        self.args, self.kw = evaluate(form, ns_for(x, tile_metadata=meta_cls(), flashmla=True))
        self()  # plans
        torch.cuda.synchronize()

    def __call__(self):
        return self.fn(*self.args, **self.kw)[0]


def gathered_rows(x) -> int:
    def valid(idx, lens):
        if idx is None:
            return 0
        pos = torch.arange(idx.shape[-1], device=idx.device)
        return int(((idx.view(idx.shape[0], -1) >= 0) & (pos[None] < lens[:, None])).sum())
    return valid(x["swa_idx"], x["swa_lens"]) + valid(x["topk_idx"], x["topk_lens"])


def f64_err(tm, caches, x, out, n=2) -> float:
    """relative error of out vs the series' float64 reference on the first n tokens."""
    n = min(n, out.shape[0])
    lists = [(caches["swa"][1], x["swa_idx"][:n, 0].cpu(), x["swa_lens"][:n].cpu(), None)]
    if x["topk_idx"] is not None:
        lists.append((caches[x["layer"]][1], x["topk_idx"][:n, 0].cpu(),
                      x["topk_lens"][:n].cpu(), None))
    sink = x["sink"].cpu()
    ref = tm.reference(x["q"][:n].cpu(), lists, sink)
    return rel_err(out[:n].cpu().reshape(ref.shape), ref)


def cpu_smoke(out_dir: Path, sweep: bool = False) -> int:
    mod = load_tree_module(tree(), KERNEL, "smla_dsv4", interpret=True)
    form, _ = engine_forms()
    tm = series_test_module("cpu")
    gen = torch.Generator().manual_seed(0)
    s = SMOKE
    caches = make_caches(tm, s["pool"], "cpu", gen)
    rows, bad = [], 0
    for layer in LAYERS:
        x = step_inputs(layer, s["batch"], s["heads"], s["context"], s["window"], s["topk"],
                        caches, torch.float16, "cpu", gen)
        workspace = torch.empty(1, dtype=torch.float32)
        ours = Ours(mod, form, x, workspace)
        ret = ours()
        assert ret is x["output"], "the call must write the layer's output in place"
        err = f64_err(tm, caches, x, ret, n=s["batch"])
        r = dict(call="cpu-smoke", layer=layer, heads=s["heads"], batch=s["batch"],
                 context=s["context"], bytes=gathered_rows(x) * ROW_BYTES,
                 rows_gathered=gathered_rows(x), rel_err_vs_f64=err)
        bad += not (err < SMOKE_BOUND and torch.isfinite(ret).all())
        if sweep:
            r["sweep"] = []
            for spec in SMOKE_SWEEP:
                got = Ours(mod, form, x, torch.empty(1 << 16, dtype=torch.float32),
                           sweep_config(spec))().clone()
                e = f64_err(tm, caches, x, got, n=s["batch"])
                r["sweep"].append(dict(config=spec, rel_err_vs_f64=e))
                bad += not (e < SMOKE_BOUND and torch.isfinite(got).all())
        rows.append(r)
        print(json.dumps(r), flush=True)
    (out_dir / "dsv4-cpu-smoke.json").write_text(
        json.dumps(dict(rows=rows), indent=1) + "\n")
    return 1 if bad else 0


def main() -> None:
    args = parse_args(__doc__, lambda ap: (
        ap.add_argument("--cpu-smoke", action="store_true",
                        help="TRITON_INTERPRET=1, tiny shapes, ours only"),
        ap.add_argument("--batch", type=int, action="append",
                        help="only this batch (repeatable; default 1, 16, 64, --quick 1 and 64)"),
        ap.add_argument("--context", type=int, action="append",
                        help="only this context (repeatable; default 8192, 65536, --quick 8192)")))
    if args.cpu_smoke:
        sys.exit(cpu_smoke(args.out_dir, args.sweep))
    before_tree = os.environ.get("SMLA_TREE_BEFORE")
    if before_tree and not (Path(before_tree) / KERNEL).is_file():
        os.environ.pop("SMLA_TREE_BEFORE")  # an earlier series without the V4 kernel
    mod, before = kernel_modules(KERNEL, "smla_dsv4")
    ours_form, fm_form = engine_forms()
    fm = None
    if os.environ.get("SMLA_FLASHMLA_SO"):
        fm_fn, fm_meta = flashmla_interface()
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s  device {torch.cuda.get_device_name(0)}", flush=True)
    tm = series_test_module("cuda")
    gen = torch.Generator().manual_seed(0)
    caches = make_caches(tm, POOL_ENTRIES, "cuda", gen)
    # one workspace for the split-K scratch, as the class's workspace manager
    workspace = torch.empty(1 << 26, dtype=torch.float32, device="cuda")
    batches, contexts = ([1, 64], [8192]) if args.quick else (BATCHES, CONTEXTS)
    batches, contexts = args.batch or batches, args.context or contexts
    rows = []
    for layer in LAYERS:
        for ctx in contexts:
            for B in batches:
                x = step_inputs(layer, B, HEADS, ctx, WINDOW, TOPK_C4, caches, torch.bfloat16,
                                "cuda", gen)
                nrows = gathered_rows(x)
                nbytes = nrows * ROW_BYTES + 2 * B * HEADS * HEAD_DIM * 2
                r = dict(call="engine", layer=layer, heads=HEADS, batch=B, context=ctx,
                         swa_width=x["swa_idx"].shape[-1],
                         extra_width=0 if x["topk_idx"] is None else x["topk_idx"].shape[-1],
                         rows_gathered=nrows, bytes=nbytes, graph=True)
                ours = Ours(mod, ours_form, x, workspace)
                if hasattr(mod, "_plan"):
                    r["ours_plan"] = mod._plan(x["q"].device, B, HEADS, r["swa_width"],
                                               r["extra_width"], fp8=True)
                r["ours_us"] = median_us(ours, graph=True)
                got = ours().clone()
                r["rel_err_vs_f64"] = f64_err(tm, caches, x, got)
                r["pct_copy_bw"] = 100 * nbytes / (r["ours_us"] * 1e-6) / (bw * 1e12)
                if before is not None:
                    r["before_us"] = median_us(Ours(before, ours_form, x, workspace), graph=True)
                if args.sweep:
                    r["sweep"] = []
                    for spec in SWEEP:
                        try:
                            cand = Ours(mod, ours_form, x, workspace, sweep_config(spec))
                            t = median_us(cand, graph=True)
                            e = f64_err(tm, caches, x, cand().clone())
                            r["sweep"].append(dict(config=spec, us=t, rel_err_vs_f64=e))
                        except Exception as e:  # e.g. out of shared memory: recorded
                            r["sweep"].append(dict(config=spec, error=repr(e)[:200]))
                if os.environ.get("SMLA_FLASHMLA_SO"):
                    try:
                        fm = FlashMLA(fm_fn, fm_meta, fm_form, x)
                        r["flashmla_us"] = median_us(fm, graph=True)
                        fo = fm().view(got.shape)
                        r["ours_vs_flashmla"] = r["ours_us"] / r["flashmla_us"]
                        r["rel_err_vs_flashmla"] = rel_err(got, fo.double())
                        r["flashmla_rel_err_vs_f64"] = f64_err(tm, caches, x, fo)
                        r["flashmla_pct_copy_bw"] = (100 * nbytes / (r["flashmla_us"] * 1e-6)
                                                     / (bw * 1e12))
                        for c in r.get("sweep", []):
                            if "us" in c:
                                c["vs_flashmla"] = c["us"] / r["flashmla_us"]
                    except Exception as e:  # recorded, the other cells still run
                        r["flashmla_error"] = repr(e)[:300]
                rows.append(r)
                print(json.dumps(r), flush=True)
                del ours, fm
                fm = None
                torch.cuda.empty_cache()
    res = dict(copy_tbps=bw, device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__, rows=rows)
    (args.out_dir / "dsv4.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
