"""Kernel-variant sweep: the engine-form attention call (bench_attention.Ours: vLLM's block
cache, the MLA layer's (ql_nope, q_pe) views, workspace out/scratch) of several copies of the
kernel file x launch-config overrides, on the same inputs, beside FlashMLA, each checked against
float64; one run, one GPU.  A tuning aid for changes to triton_sparse_mla.py: a variant is a
directory VARIANTS/<name>/vllm/v1/attention/ops/triton_sparse_mla.py (+ the files it imports).

  SMLA_FLASHMLA_SO=... python bench/kernel_variants.py OUT SPEC.json VARIANTS [--prewarm N]

SPEC.json: {"variants": [names], "groups": [{"heads": [..], "tokens": [..], "paths": [[cache,
path]], "runs": [[name, config or null]]}]}; a config is sparse_mla_fwd's `config` override
(maxnreg included).  Output: OUT/variants.json (rows: heads, tokens, cache, path, variant, cfg,
us, flashmla_us, vs_fm, err).  bench/results/sweeps/2026-12-02b/ holds two runs and a spec.
"""
import json
import os
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
import bench_attention as ba  # noqa: E402
from timing import load_with_own_siblings, median_us, prewarm_workers  # noqa: E402

REL = "vllm/v1/attention/ops/triton_sparse_mla.py"
SPEC = json.loads(Path(sys.argv[2]).read_text())
VARIANTS = Path(sys.argv[3])


def mods():
    """Each variant's kernel file with the kernel modules it imports from its own directory."""
    return {n: load_with_own_siblings(VARIANTS / n, REL, "v_" + n) for n in SPEC["variants"]}


def items():
    """(H, T, cache, path, variant, cfg or None)"""
    out = []
    for grp in SPEC["groups"]:
        for H in grp["heads"]:
            for T in grp["tokens"]:
                for cache, path in grp["paths"]:
                    for v, cfg in grp["runs"]:
                        out.append((H, T, cache, path, v, cfg))
    return out


def worker(which):
    i, n = map(int, which.split("/"))
    M = mods()
    gen = torch.Generator(device="cuda").manual_seed(i)
    nb = 64
    small = {"bfloat16": torch.randn((nb, ba.BS, ba.R + ba.P), generator=gen, device="cuda").to(torch.bfloat16),
             "fp8_ds_mla": ba.fp8_small(gen, nb)}
    for H, T, cache, path, v, cfg in items()[i::n]:  # compile each launch once (Triton's disk cache)
        ql, qpe = ba.engine_query(T, H, gen)
        slots = torch.randint(0, nb * ba.BS, (T, ba.TOPK), generator=gen, device="cuda", dtype=torch.int32)
        try:
            ba.Ours(M[v], small[cache], T, H, cache, path, dict(cfg) if cfg else None)(ql, qpe, slots)
        except Exception as e:  # noqa: BLE001
            print("prewarm", H, T, cache, path, v, cfg, repr(e)[:200], flush=True)
    torch.cuda.synchronize()


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    args = sys.argv[4:]
    if args and args[0] == "--worker":
        worker(args[1])
        return
    if args and args[0] == "--prewarm":
        prewarm_workers(__file__, int(args[1]), sys.argv[1:])
    M = mods()
    torch.ops.load_library(os.environ["SMLA_FLASHMLA_SO"])
    bw = ba.copy_tbps()
    print(f"copy {bw:.2f} TB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    caches = {"bfloat16": torch.randn((ba.NUM_BLOCKS, ba.BS, ba.R + ba.P), generator=gen, device="cuda").to(torch.bfloat16),
              "fp8_ds_mla": ba.fp8_cache(gen)}
    rows = []
    cells = {}
    for it in items():
        cells.setdefault((it[0], it[1]), []).append(it)
    for (H, T), its in cells.items():
        graph = T <= ba.GRAPH_MAX_TOKENS
        ql, qpe = ba.engine_query(T, H, gen)
        slots = torch.randint(0, ba.NUM_BLOCKS * ba.BS, (T, ba.TOPK), generator=gen, device="cuda", dtype=torch.int32)
        fm = {}
        for _, _, cache, path, v, cfg in its:
            kv = caches[cache]
            if cache not in fm:
                f = ba.FlashMLA(kv, T, H, cache, ql, qpe, slots)
                fm[cache] = median_us(f, graph)
                del f
            r = dict(heads=H, tokens=T, cache=cache, path=path, variant=v, cfg=cfg, flashmla_us=fm[cache])
            try:
                o = ba.Ours(M[v], kv, T, H, cache, path, dict(cfg) if cfg else None)
                r["us"] = median_us(lambda: o(ql, qpe, slots), graph)
                r["err"] = ba.check(o(ql, qpe, slots), ql, qpe, kv.view(-1, kv.shape[-1]), slots, cache)
                r["vs_fm"] = r["us"] / fm[cache]
            except Exception as e:  # noqa: BLE001
                r["error"] = repr(e)[:200]
            rows.append(r)
            print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
    (out / "variants.json").write_text(json.dumps(dict(copy_tbps=bw, triton=triton.__version__, rows=rows), indent=1))


if __name__ == "__main__":
    main()
