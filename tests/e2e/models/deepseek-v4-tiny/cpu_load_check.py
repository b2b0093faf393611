"""Load the tiny DeepSeek-V4 checkpoint into vLLM's own model classes on the CPU (no GPU).

usage: python cpu_load_check.py CKPT_DIR [--tp N] [--dump-params FILE]
  with vLLM 0.26.0's Python importable (a source tree on PYTHONPATH is enough), torch,
  transformers 5.x, safetensors. CKPT_DIR is make_checkpoint.py's output.

What it does, with vLLM's code (stand-ins below):
1. EngineArgs(model=CKPT_DIR, MTP 1 token, fp8 KV cache, skip_tokenizer_init) ->
   create_engine_config(): the config parses, quantization = deepseek_v4_fp8, MTP draft =
   DeepSeekV4MTPModel.
2. Builds DeepseekV4ForCausalLM and DeepSeekV4MTP on the CPU and loads CKPT_DIR through
   vLLM's DefaultModelLoader.load_weights (the safetensors iterator, the model's
   hf_to_vllm_mapper and load_weights, including finalize_mhc_broadcast_weights).
3. Every parameter is written by the load: each model is loaded twice, the parameters
   filled with 0x00 bytes before the first load and 0xFF bytes before the second; a byte
   the loader did not write differs between the two. Also: the set load_weights returns
   equals the parameter names, and vLLM's safetensors iterator yields every checkpoint
   tensor (a name neither model can place raises: DeepseekV4Model.load_weights indexes
   params_dict, the MTP loader too; the target skips only `mtp.`, the MTP only the rest).
   (attn_sink: its first n_local_heads entries; the padding up to the FlashMLA head count
   keeps the -inf it is built with and is not in the checkpoint.) The load and the reads of
   step 3 (track_reads, load_filled) serve ../dsa-4bit/ and ../glm53-flash-tiny/'s checks too.
4. Spot checks against the checkpoint bytes: stacked (wq_a|wkv, compressor wkv|wgate,
   shared w1|w3), MXFP4 experts (w1|w3 -> w13, w2) and their UE8M0 scales, block-fp8
   scales, attn_sink, gate.bias -> e_score_correction_bias, tid2eid, the MTP block and its
   head / embedding, and layer 0's hc_attn_fn_broadcast. With --tp N (N gloo processes,
   one TP rank each): 1-3 on every rank, and the rank's slices of attn_sink, wq_b and of
   an MXFP4 expert's w1 / w2 and scales.

STAND-INS (this checks names, shapes and bytes, not kernels): the platform is vLLM's
CudaPlatform faked as an H200 (tests/e2e/cpu_dry_run.py) with device_type "cpu";
torch.cuda.Stream/Event are inert objects; the device communicator is vLLM's base class
(gloo; nothing is communicated while loading); torch.ops._C & co. are namespaces whose ops
raise if called (none is called while building and loading); the missing optional package
`compressed_tensors` is an empty stub; distributed = one gloo process per TP rank.
Prints one line per check and "ALL OK"; exits 1 on the first failure. --dump-params FILE
records the parameter table of both models ({expert_dtype: {"target"|"mtp": {name: [shape,
dtype]}}}, merged into FILE) once every check passed: vllm_params.json, which
tests/test_v4_tiny_checkpoint.py checks the generator against without importing vLLM.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata as md
import json
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
E2E = HERE.parent.parent


def _stub_packages(roots: set[str]) -> None:
    """Import any module under `roots` as an empty stub (classes made up on access)."""

    class Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            val = Meta(f"{cls.__name__}.{name}", (), {})
            setattr(cls, name, val)
            return val

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            val = Meta(name, (), {"__init__": lambda self, *a, **k: None})
            setattr(self, name, val)
            return val

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] in roots:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            mod = Stub(spec.name)
            mod.__path__ = []
            return mod

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


def _stand_ins() -> None:
    version = md.version
    md.version = lambda name: "0.26.0" if name == "vllm" else version(name)
    missing = set()
    for pkg in ("compressed_tensors",):
        try:
            __import__(pkg)
        except ImportError:
            missing.add(pkg)
    _stub_packages(missing)
    sys.path.insert(0, str(E2E))
    from cpu_dry_run import _fake_h200

    _fake_h200()
    import torch

    class Inert:
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

    class NoOps:
        def __init__(self, ns):
            self.ns = ns

        def __getattr__(self, name):
            def op(*a, **k):
                raise RuntimeError(f"stub op torch.ops.{self.ns}.{name} called")
            return op

    for ns in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "_rocm_C"):
        setattr(torch.ops, ns, NoOps(ns))
    torch.cuda.Stream = Inert
    torch.cuda.Event = Inert
    from vllm.platforms import cuda

    cuda.CudaPlatform.device_type = "cpu"
    cuda.CudaPlatform.get_device_communicator_cls = classmethod(
        lambda c: "vllm.distributed.device_communicators.base_device_communicator."
                  "DeviceCommunicatorBase")


def _fill(model, byte: int) -> None:
    import torch

    with torch.no_grad():
        for _, p in model.named_parameters():
            p.data.view(torch.uint8).fill_(byte)


def _snapshot(model) -> dict:
    import torch

    return {n: p.data.detach().contiguous().view(torch.uint8).clone()
            for n, p in model.named_parameters()}


def track_reads(loader_cls) -> set[str]:
    """Every tensor name `loader_cls.get_all_weights` yields from now on goes into the set
    returned (what the loads read of the checkpoint)."""
    seen: set[str] = set()
    orig = loader_cls.get_all_weights

    def tracking(self, model_config, model):
        for name, t in orig(self, model_config, model):
            seen.add(name)
            yield name, t

    loader_cls.get_all_weights = tracking
    return seen


def load_filled(model, loader, model_config, cfg, fill=_fill, snapshot=_snapshot):
    """`model` loaded twice through `loader`, its parameters filled with 0x00, then 0xFF bytes
    before each load: (the names the last load_weights returned, the bytes after each load); a
    byte the load does not write differs between the two."""
    from vllm.config import set_current_vllm_config

    snaps, returned = [], None
    for byte in (0x00, 0xFF):
        fill(model, byte)
        with set_current_vllm_config(cfg):
            returned = model.load_weights(loader.get_all_weights(model_config, model))
        snaps.append(snapshot(model))
    return returned, snaps


class Checker:
    def __init__(self):
        self.n = 0

    def __call__(self, ok: bool, what: str) -> None:
        self.n += 1
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            sys.exit(1)


def main(argv: list[str]) -> int:
    ckpt = Path(argv[0]).resolve()
    dump = Path(argv[argv.index("--dump-params") + 1]) if "--dump-params" in argv else None
    world = int(argv[argv.index("--tp") + 1]) if "--tp" in argv else 1
    if world == 1:
        return run(ckpt, 0, 1, dump)
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(ckpt, r, world)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    print(f"TP={world}: rank exit codes {codes}")
    return 0 if all(c == 0 for c in codes) else 1


def _rank_main(ckpt: Path, rank: int, world: int) -> None:
    sys.exit(run(ckpt, rank, world, None))


def run(ckpt: Path, rank: int, world: int, dump: Path | None) -> int:
    _stand_ins()
    import torch
    from safetensors import safe_open

    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    check = Checker()
    ckcfg = json.loads((ckpt / "config.json").read_text())
    cfg = EngineArgs(
        model=str(ckpt), skip_tokenizer_init=True, max_model_len=8192, tensor_parallel_size=world,
        max_num_batched_tokens=2048, max_num_seqs=64, seed=0, kv_cache_dtype="fp8",
        kv_cache_memory_bytes=4 << 30,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
    ).create_engine_config()
    mc, sc = cfg.model_config, cfg.speculative_config
    check(mc.architectures == ["DeepseekV4ForCausalLM"] and mc.use_mla
          and mc.get_head_size() == 512, f"config parses: {mc.architectures}, mla, head 512")
    check(mc.quantization == "deepseek_v4_fp8", f"quantization {mc.quantization}")
    check(sc.draft_model_config.architectures == ["DeepSeekV4MTPModel"],
          f"MTP draft {sc.draft_model_config.architectures}")
    check(mc.skip_tokenizer_init, f"skip_tokenizer_init (tokenizer_mode {mc.tokenizer_mode})")

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        ck = {k: f.get_tensor(k) for k in f.keys()}

    with set_current_vllm_config(cfg), set_default_torch_dtype(torch.bfloat16):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank,
                                     backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:29533")
        ensure_model_parallel_initialized(world, 1)
        from vllm.models.deepseek_v4 import DeepSeekV4MTP, DeepseekV4ForCausalLM

        target = DeepseekV4ForCausalLM(vllm_config=cfg)
        draft = DeepSeekV4MTP(vllm_config=cfg)
    loader = DefaultModelLoader(cfg.load_config)
    seen = track_reads(DefaultModelLoader)

    def load_twice(model, model_config, what):
        returned, snaps = load_filled(model, loader, model_config, cfg)
        names = {n for n, _ in model.named_parameters()}
        check(returned == names, f"{what}: load_weights returned all {len(names)} parameters"
              + ("" if returned == names else f"; missing {sorted(names - returned)[:8]}, "
                 f"extra {sorted(returned - names)[:8]}"))
        def written(n):
            a, b = snaps[0][n], snaps[1][n]
            if n.endswith("attn_sink"):  # padded to the FlashMLA head count, -inf there
                a, b = a[: 4 * n_local_heads], b[: 4 * n_local_heads]
            return torch.equal(a, b)

        unwritten = [n for n in names if not written(n)]
        check(not unwritten, f"{what}: every byte of every parameter written by the load"
              + ("" if not unwritten else f"; not: {unwritten[:8]}"))

    n_local_heads = ckcfg["num_attention_heads"] // world
    load_twice(target, mc, "DeepseekV4ForCausalLM")
    load_twice(draft, sc.draft_model_config, "DeepSeekV4MTP")
    check(seen == set(ck), f"vLLM's safetensors iterator yields all {len(ck)} checkpoint tensors")
    main_names = {k for k in ck if not k.startswith("mtp.")}
    check(len(main_names) + len([k for k in ck if k.startswith("mtp.")]) == len(ck),
          f"{len(main_names)} target + {len(ck) - len(main_names)} MTP tensors")

    tp = dict(target.named_parameters())
    dp = dict(draft.named_parameters())

    def same(param: torch.Tensor, ref: torch.Tensor) -> bool:
        if param.dtype == torch.uint8 and ref.dtype != torch.uint8:
            ref = ref.view(torch.uint8)
        elif param.dtype != ref.dtype:
            ref = ref.to(param.dtype)
        return param.shape == ref.shape and torch.equal(
            param.contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8))

    q_lora, hd, inter = ckcfg["q_lora_rank"], ckcfg["head_dim"], ckcfg["moe_intermediate_size"]
    m = "model.layers.1."
    if world > 1:
        r, h, li = rank, n_local_heads, inter // world
        check(same(tp[m + "attn.attn_sink"][:h], ck["layers.1.attn.attn_sink"][r * h:(r + 1) * h]),
              f"rank {r}: attn_sink heads {r * h}..{(r + 1) * h - 1} "
              f"(parameter padded to {tp[m + 'attn.attn_sink'].numel()} heads)")
        rows = h * hd
        check(same(tp[m + "attn.wq_b.weight"], ck["layers.1.attn.wq_b.weight"][r * rows:(r + 1) * rows]),
              f"rank {r}: wq_b rows {r * rows}..{(r + 1) * rows - 1}")
        ex = {n.split("routed_experts.")[1]: p for n, p in tp.items()
              if n.startswith(m + "ffn.experts.routed_experts.")}
        e = 5
        w1 = ck[f"layers.1.ffn.experts.{e}.w1.weight"][r * li:(r + 1) * li]
        w3 = ck[f"layers.1.ffn.experts.{e}.w3.weight"][r * li:(r + 1) * li]
        w2 = ck[f"layers.1.ffn.experts.{e}.w2.weight"]
        w2 = w2[:, r * w2.shape[1] // world:(r + 1) * w2.shape[1] // world]
        check(same(ex["w13_weight"][e, :li], w1) and same(ex["w13_weight"][e, li:], w3)
              and same(ex["w2_weight"][e], w2),
              f"rank {r}: expert {e} w1 | w3 rows, w2 columns of this rank")
        s1 = ck[f"layers.1.ffn.experts.{e}.w1.scale"]
        srows = li if ckcfg["expert_dtype"] == "fp4" else li // 128
        check(same(ex[[k for k in ex if k.startswith("w13_weight_scale")][0]][e, :srows],
                   s1[r * srows:(r + 1) * srows]), f"rank {r}: expert {e} w1 scale rows")
        l0 = target.model.layers[0]
        check(l0.hc_attn_fn_broadcast is not None, f"rank {r}: hc_attn_fn_broadcast set")
        print(f"rank {r}: ALL OK ({check.n} checks)", flush=True)
        return 0
    check(same(tp[m + "attn.fused_wqa_wkv.weight"][:q_lora], ck["layers.1.attn.wq_a.weight"])
          and same(tp[m + "attn.fused_wqa_wkv.weight"][q_lora:], ck["layers.1.attn.wkv.weight"]),
          "wq_a | wkv -> fused_wqa_wkv.weight (bytes)")
    nb = q_lora // 128
    check(same(tp[m + "attn.fused_wqa_wkv.weight_scale_inv"][:nb], ck["layers.1.attn.wq_a.scale"])
          and same(tp[m + "attn.fused_wqa_wkv.weight_scale_inv"][nb:], ck["layers.1.attn.wkv.scale"]),
          f"wq_a/wkv .scale -> weight_scale_inv ({tp[m + 'attn.fused_wqa_wkv.weight_scale_inv'].dtype})")
    check(same(tp[m + "attn.wo_a.weight"], ck["layers.1.attn.wo_a.weight"])
          and same(tp[m + "attn.wo_b.weight_scale_inv"], ck["layers.1.attn.wo_b.scale"]),
          "wo_a.weight, wo_b.scale")
    coff = 2
    fw = tp[m + "attn.compressor.fused_wkv_wgate.weight"]
    check(same(fw[:coff * hd], ck["layers.1.attn.compressor.wkv.weight"])
          and same(fw[coff * hd:], ck["layers.1.attn.compressor.wgate.weight"]),
          "compressor wkv | wgate -> fused_wkv_wgate (C4, overlap)")
    fi = tp[m + "attn.indexer.compressor.fused_wkv_wgate.weight"]
    check(same(fi[:2 * ckcfg["index_head_dim"]], ck["layers.1.attn.indexer.compressor.wkv.weight"]),
          "indexer compressor wkv -> fused_wkv_wgate")
    check(same(tp[m + "attn.compressor.ape"], ck["layers.1.attn.compressor.ape"])
          and same(tp[m + "attn.indexer.wq_b.weight"], ck["layers.1.attn.indexer.wq_b.weight"]),
          "compressor ape, indexer wq_b")
    check(same(tp[m + "attn.attn_sink"], ck["layers.1.attn.attn_sink"]), "attn_sink")
    check(same(tp[m + "ffn.gate.e_score_correction_bias"], ck["layers.1.ffn.gate.bias"]),
          "ffn.gate.bias -> e_score_correction_bias")
    check(same(tp["model.layers.0.ffn.gate.tid2eid"], ck["layers.0.ffn.gate.tid2eid"]),
          "hash layer 0: ffn.gate.tid2eid")
    sg = tp[m + "ffn.shared_experts.gate_up_proj.weight"]
    check(same(sg[:inter], ck["layers.1.ffn.shared_experts.w1.weight"])
          and same(sg[inter:], ck["layers.1.ffn.shared_experts.w3.weight"])
          and same(tp[m + "ffn.shared_experts.down_proj.weight_scale_inv"],
                   ck["layers.1.ffn.shared_experts.w2.scale"]),
          "shared experts w1 | w3 -> gate_up_proj, w2.scale -> down_proj.weight_scale_inv")
    ex = {n.split("ffn.experts.")[1]: p for n, p in tp.items() if n.startswith(m + "ffn.experts.")}
    print("     routed expert parameters:", {k: (tuple(v.shape), str(v.dtype)) for k, v in ex.items()})
    w13 = next(v for k, v in ex.items() if k.endswith("w13_weight"))
    w13s = next(v for k, v in ex.items() if k.endswith("w13_weight_scale") or k.endswith("w13_weight_scale_inv"))
    w2 = next(v for k, v in ex.items() if k.endswith("w2_weight"))
    e = 5
    check(same(w13[e, :inter], ck[f"layers.1.ffn.experts.{e}.w1.weight"])
          and same(w13[e, inter:], ck[f"layers.1.ffn.experts.{e}.w3.weight"])
          and same(w2[e], ck[f"layers.1.ffn.experts.{e}.w2.weight"]),
          f"routed expert {e}: w1 | w3 -> w13_weight, w2 -> w2_weight (bytes)")
    rows = inter if ckcfg["expert_dtype"] == "fp4" else inter // 128
    check(same(w13s[e, :rows], ck[f"layers.1.ffn.experts.{e}.w1.scale"]),
          f"routed expert {e}: w1.scale -> w13 scale (bytes, {ckcfg['expert_dtype']} experts)")
    l0 = target.model.layers[0]
    bc = l0.hc_attn_fn.view(-1, l0.hc_mult, l0.hidden_size).sum(dim=1)
    check(l0.hc_attn_fn_broadcast is not None and torch.equal(l0.hc_attn_fn_broadcast, bc),
          "finalize_mhc_broadcast_weights set layer 0's hc_attn_fn_broadcast")

    n = ckcfg["num_hidden_layers"]
    d = f"model.layers.{n}."
    check(same(dp[d + "mtp_block.attn.fused_wqa_wkv.weight"][:q_lora], ck["mtp.0.attn.wq_a.weight"])
          and same(dp[d + "mtp_block.ffn.gate.e_score_correction_bias"], ck["mtp.0.ffn.gate.bias"])
          and same(dp[d + "mtp_block.hc_attn_fn"], ck["mtp.0.hc_attn_fn"])
          and same(dp[d + "mtp_block.attn.attn_sink"], ck["mtp.0.attn.attn_sink"]),
          "MTP block: mtp.0.* -> model.layers.N.mtp_block.*")
    check(same(dp[d + "e_proj.weight"], ck["mtp.0.e_proj.weight"])
          and same(dp[d + "hc_head_fn"], ck["mtp.0.hc_head_fn"])
          and same(dp[d + "shared_head.norm.weight"], ck["mtp.0.norm.weight"])
          and same(dp[d + "shared_head.head.weight"], ck["mtp.0.head.weight"])
          and same(dp["model.embed_tokens.weight"], ck["mtp.0.emb.tok_emb.weight"]),
          "MTP e_proj, hc_head, shared_head norm/head, embed_tokens")
    check(same(tp["lm_head.weight"], ck["head.weight"])
          and same(tp["model.embed_tokens.weight"], ck["embed.weight"])
          and same(tp["model.hc_head_fn"], ck["hc_head_fn"]),
          "head -> lm_head, embed -> embed_tokens, hc_head_fn")
    print(f"ALL OK ({check.n} checks)")
    if dump is not None:
        table = json.loads(dump.read_text()) if dump.exists() else {}
        table[ckcfg["expert_dtype"]] = {
            what: {n: [list(p.shape), str(p.dtype).removeprefix("torch.")]
                   for n, p in model.named_parameters()}
            for what, model in (("target", target), ("mtp", draft))}
        lines = ["{"]
        for i, (dt, models) in enumerate(sorted(table.items())):
            lines.append(f' "{dt}": {{')
            for j, (what, params) in enumerate(sorted(models.items())):
                lines.append(f'  "{what}": {{')
                rows = [f"   {json.dumps(n)}: {json.dumps(v)}" for n, v in sorted(params.items())]
                lines.append(",\n".join(rows))
                lines.append("  }" + ("," if j + 1 < len(models) else ""))
            lines.append(" }" + ("," if i + 1 < len(table) else ""))
        lines.append("}")
        dump.write_text("\n".join(lines) + "\n")
        print(f"wrote {dump}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
