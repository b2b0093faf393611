"""Compile-only (Triton's compiler and bundled ptxas, no GPU): every Triton launch GLM-5.3-Flash's
KDA layer makes (and the MTP layer's fused_eh_norm), for one CUDA arch. Usage:
    python kda_compile.py ARCH [--all-configs]   -> one JSON line: a record per compiled launch
(default: of each autotune list its first and its last config, the smallest and the largest
tiles/stages there; --all-configs: every config, ~6 min per arch on this machine's 2 cores)

1. vLLM is imported from $SMLA_033_TREE with the toolkit's stand-ins (CudaPlatform reporting the
   arch's capability) and Triton's active driver replaced by a stand-in that reports the arch as
   its target and the arch's per-block shared memory (what FLA's module-level tile lists read:
   ops/utils.py check_shared_mem / is_nvidia_hopper).
2. The layer's Triton entry points run on CPU tensors of the model's geometry (64 heads of 128 per
   TP=1 rank, KDA's chunk 64, lower bound -5, 2 sequences) exactly as common/kda.py calls them:
   prefill (l2norm, fused gate + cumsum, intra-chunk kkt, solve_tril, w/u, delta-h, output),
   plain decode and the MTP (spec) decode of fused_recurrent_kda with the in-kernel gate, and
   the gated RMSNorm; also the MTP layer's fused enorm/hnorm kernel (hidden 4096). JITFunction.run is replaced by a recorder: nothing executes; each launch's
   arguments (tensor dtypes, scalars, constexprs, num_warps/num_stages) are kept. An autotuned
   launch keeps every config of its autotune list (the ones the autotuner may pick there).
3. Each recorded launch is compiled with triton.compile for the arch; the record says whether a
   cubin came out and the kernel's shared memory (metadata.shared), or the error.
Run without TRITON_INTERPRET (test_kda_compile.py runs it in a subprocess)."""
from __future__ import annotations

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
os.environ["CUDA_VISIBLE_DEVICES"] = ""

# Per-block shared-memory limit (opt-in maximum, bytes) by compute capability (as in
# tests/test_kernel_compile.py).
SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 103: 232448,
              110: 232448, 120: 101376, 121: 101376}

ARCH = int(sys.argv[1])
ALL_CONFIGS = "--all-configs" in sys.argv
TREE = os.environ["SMLA_033_TREE"]
sys.path.insert(0, TREE)
sys.path.insert(0, os.path.dirname(os.environ["SMLA_STANDINS"]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime import autotuner, driver, jit  # noqa: E402

import _selection_standins as standins  # noqa: E402


class _ArchDriver:
    """Triton's active driver as seen by FLA at import: the arch's target and shared memory."""

    class utils:  # noqa: N801
        @staticmethod
        def get_device_properties(_i):
            return {"max_shared_mem": SMEM_LIMIT[ARCH]}

    def get_current_target(self):
        return GPUTarget("cuda", ARCH, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, _device=None):
        return 0


driver.set_active(_ArchDriver())
torch.cuda.get_device_name = lambda *_a: f"stand-in sm{ARCH}"
torch.cuda.get_device_capability = lambda *_a: divmod(ARCH, 10)
torch.cuda.device_count = lambda: 1
standins.import_vllm_tree(TREE, capability=f"{ARCH // 10}.{ARCH % 10}")
# the quantization utilities ask compiled ops at import (as tests/lines/0.33.0/indexer/conftest.py)
import vllm._custom_ops as _custom_ops  # noqa: E402

_saved = {n: getattr(_custom_ops, n) for n in dir(_custom_ops)
          if n.startswith("cutlass_") and "_supports_" in n}
for _n in _saved:
    setattr(_custom_ops, _n, lambda *a, **k: False)
import vllm.model_executor.layers.quantization.utils.w8a8_utils  # noqa: E402,F401

for _n, _f in _saved.items():
    setattr(_custom_ops, _n, _f)

LAUNCHES: list[dict] = []


def _record(self, *args, grid=None, warmup=False, **kwargs):
    """JITFunction.run replaced: keep the launch, run nothing."""
    import inspect

    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")
               if k in kwargs}
    bound = inspect.signature(self.fn).bind(*args, **kwargs)
    bound.apply_defaults()
    LAUNCHES.append(dict(fn=self, args=dict(bound.arguments), options=options,
                         config=getattr(self, "_smla_config", None)))


def _autotune_run(self, *args, **kwargs):
    """Autotuner.run replaced: one launch per config of the list (pruned as the autotuner
    prunes), each recorded, none benchmarked."""
    self.nargs = dict(zip(self.arg_names, args))
    configs = self.prune_configs(kwargs) if self.early_config_prune else self.configs
    for i, config in enumerate(configs):
        if not ALL_CONFIGS and 0 < i < len(configs) - 1:
            continue
        full = {**kwargs, **config.all_kwargs()}
        if config.pre_hook:
            config.pre_hook({**self.nargs, **full})
        self.fn._smla_config = f"{i}/{len(configs)} {config}"
        self.fn.run(*args, **full)
        self.fn._smla_config = None


jit.JITFunction.run = _record
autotuner.Autotuner.run = _autotune_run

# Stand-in: no pinned host memory on a CPU-only torch (FLA's chunk indices stage through it).
import vllm.utils.torch_utils as _torch_utils  # noqa: E402

_torch_utils.PIN_MEMORY = False

# Stand-in: vllm.models.glm5next's __init__ imports the multimodal model (glm4_1v -> transformers'
# image processors -> torchvision, not installed for the CPU suite); the KDA kernels need none of
# it, so the package is entered without running its __init__.
import types  # noqa: E402

for _pkg in ("vllm.models.glm5next",):
    _mod = types.ModuleType(_pkg)
    _mod.__path__ = [os.path.join(TREE, *_pkg.split("."))]
    sys.modules[_pkg] = _mod

from vllm.models.glm5next.nvidia.ops.third_party.kda import (  # noqa: E402
    chunk_kda_with_fused_gate,
    fused_recurrent_kda,
)
from vllm.models.glm5next.nvidia.ops.fused_eh_norm import fused_eh_norm  # noqa: E402
from vllm.third_party.flash_linear_attention.ops.kda import FusedRMSNormGated  # noqa: E402

# GLM-5.3-Flash KDA geometry (transformers' Glm5NextTextConfig: linear_num_heads 64,
# linear_head_dim 128, linear_lower_bound -5.0), one TP rank of 64 heads.
H, D, LOWER_BOUND = 64, 128, -5.0
SEQ_LENS = (100, 37)  # two prefills: a partial chunk each, one over a chunk boundary
NUM_STATES = 4


def _t(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype)


def run_layer_launches() -> None:
    t = sum(SEQ_LENS)
    cu = torch.tensor([0, SEQ_LENS[0], t], dtype=torch.int32)
    a_log, dt_bias = _t(H, dtype=torch.float32), _t(H * D, dtype=torch.float32)
    # prefill: chunk_kda_with_fused_gate as kda.py calls it
    chunk_kda_with_fused_gate(
        q=_t(1, t, H, D), k=_t(1, t, H, D), v=_t(1, t, H, D), raw_g=_t(1, t, H, D),
        beta=_t(1, t, H, dtype=torch.float32), A_log=a_log, g_bias=dt_bias,
        initial_state=_t(2, H, D, D, dtype=torch.float32), output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu, safe_gate=True, lower_bound=LOWER_BOUND)
    # plain decode (2 requests, one token each) and MTP verify (2 requests x 2 tokens)
    state = _t(NUM_STATES, H, D, D, dtype=torch.float32)
    for n_req, per_req, spec in ((2, 1, False), (2, 2, True)):
        n = n_req * per_req
        qkv = _t(n, 3 * H * D)
        q, k, v = qkv.split(H * D, dim=-1)
        fused_recurrent_kda(
            q=q.reshape(1, n, H, D), k=k.reshape(1, n, H, D), v=v.reshape(1, n, H, D),
            g=_t(1, n, H, D), beta=_t(1, n, H), initial_state=state,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.arange(0, n + 1, per_req, dtype=torch.int32),
            ssm_state_indices=(torch.arange(n_req * per_req, dtype=torch.int32)
                               .reshape(n_req, per_req) if spec
                               else torch.arange(n_req, dtype=torch.int32)),
            num_accepted_tokens=torch.ones(n_req, dtype=torch.int32) if spec else None,
            out=_t(1, n, H, D), sigmoid_beta=True, a_log=a_log, g_bias=dt_bias,
            compute_gate=True, lower_bound=LOWER_BOUND)
    # o_norm: FusedRMSNormGated(head_dim, activation="sigmoid") on [tokens, H, D]
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        norm = FusedRMSNormGated(D, activation="sigmoid")
        norm.weight.data = norm.weight.data.to(torch.bfloat16)
        norm.forward_cuda(_t(t, H, D), _t(t, H, D))  # what CudaPlatform dispatches to
    # MTP: the draft layer's fused enorm/hnorm (common/mtp.py), GLM-5.3-Flash's hidden 4096
    hid = 4096
    fused_eh_norm(torch.arange(t), _t(t, hid), _t(t, hid), _t(hid), _t(hid), 1e-5)


TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "i1"}


def compile_launch(rec: dict) -> dict:
    fn = rec["fn"]
    sig, constexprs = {}, {}
    for i, name in enumerate(fn.arg_names):
        value = rec["args"][name]
        if i in fn.constexprs or value is None:
            sig[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + TRITON_DTYPE[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i64" if abs(value) >= 2**31 else "i32"
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{name}: {type(value).__name__}")
    out = dict(kernel=fn.__name__, config=rec["config"], options=rec["options"])
    try:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                           target=GPUTarget("cuda", ARCH, 32), options=dict(rec["options"]))
        out["cubin"] = len(k.asm.get("cubin", b"")) > 0
        out["shared"] = int(k.metadata.shared)
    except Exception as e:  # report, the test decides
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def main() -> None:
    run_layer_launches()

    seen, report = set(), []
    for rec in LAUNCHES:
        key = (rec["fn"].__name__, rec["config"], repr(sorted(
            (n, (str(v.dtype) if isinstance(v, torch.Tensor) else v))
            for n, v in rec["args"].items() if not isinstance(v, (int, float)) or
            rec["fn"].arg_names.index(n) in rec["fn"].constexprs)), repr(rec["options"]))
        if key in seen:
            continue
        seen.add(key)
        report.append(compile_launch(rec))
    print(json.dumps(dict(arch=ARCH, smem_limit=SMEM_LIMIT[ARCH], launches=report)))


if __name__ == "__main__":
    main()
