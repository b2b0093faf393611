"""The serving benchmark's plan: engines, workloads, the time estimate, the device calls.

Standard library only: it runs here (CPU, tests) and on the GPU machine before
and without vLLM. `python bench/serving/plan.py` prints the plan, the estimate
and the exact device calls; `--json` gives the same as JSON.

One *engine* = one model x KV cache x side, started once (`vllm.LLM`), which then
runs every *workload* of the plan: the throughput workloads (context x batch: a
prefill call, then a decode call) and the mixed workloads (`MixedWorkload`: decode
streams running while prefills arrive; `--deep` is the plan of the deep models on it). The cost model below is a
planning assumption, not a measurement: the device runner replaces it with
what it measures as soon as an engine has run (see `calibrated`).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = ("glm5-tiny", "deepseek-v32-tiny")  # tests/e2e/models/<name>/config.json
# The deep variants (issue 34): the tiny models with the real layer count (GLM-5 78,
# DeepSeek-V3.2 61; the first 3 dense, as the real models' first_k_dense_replace), the
# same tiny hidden size, heads and experts: per-layer host time weighs as in the real model.
DEEP_MODELS = ("glm5-deep", "deepseek-v32-deep")
ALL_MODELS = MODELS + DEEP_MODELS  # the one registry of the serving benchmark's models
MODEL_DIRS = {m: REPO / "tests" / "e2e" / "models" / m for m in ALL_MODELS}
KV_CACHES = ("bf16", "fp8")  # bf16: kv_cache_dtype "auto" of a bf16 model; fp8: "fp8" (fp8_ds_mla)
SIDES = ("upstream", "ours")
CONTEXTS = (4096, 16384, 65536)
BATCHES = (1, 16, 64)
OUTPUT_LEN = 256
MODEL_DTYPE = "bfloat16"
PROFILE_CONTEXT = 65536
PROFILE_BATCHES = (64,)
# vLLM's own worker profiler (ProfilerConfig): skip the cached-prefix step and one
# decode step, then record this many whole decode steps.
PROFILE_DELAY_ITERS = 3
PROFILE_ITERS = 8
WARMUP = ((4096, 64, 8), (16384, 16, 8), (65536, 1, 8))  # (context, batch, output tokens)
# A plan of mixed workloads only: the decode streams' shape for a few tokens and one
# prompt of each prefill length (JIT at every length, the decode batch's CUDA graph).
MIXED_WARMUP_OUTPUT = 8
# vLLM's own default of max_num_batched_tokens for `vllm serve` on an H200 (0.26.0,
# EngineArgs.get_batch_defaults, OPENAI_API_SERVER: 8192; LLM's is 16384): the mixed
# workloads run the serving chunk size; throughput workloads keep LLM's default.
MIXED_BATCHED_TOKENS = 8192
# Per token and layer: the latent cache (bf16 576 x 2 B; fp8_ds_mla 656 B) plus the
# indexer's keys (128 + 4 B).
KV_BYTES_PER_TOKEN_LAYER = max(1152, 656) + 132

# Attention backends and indexer switch per side (tests/e2e/README.md "Sides").
INDEXER_SWITCH = "VLLM_SPARSE_INDEXER_BACKEND"
UPSTREAM_BACKEND = {"bf16": "FLASH_ATTN_MLA_SPARSE", "fp8": "FLASHMLA_SPARSE"}
OURS_BACKEND = "TRITON_MLA_SPARSE"
SIDE_INDEXER = {"upstream": "deepgemm", "ours": "triton"}

# Device-call limits (/work/.library/device/README.md): 600 s a command, 30 min a session.
CALL_LIMIT_S = 600
CALL_BUDGET_S = 560  # the runner starts no work it cannot finish by then (install inside; 40 s to pack)
SESSION_BUDGET_S = 1800
N_PIECES = 4  # `make e2e-bundle VLLM=0.26.0`: 4 pieces of at most 50 MiB since 2026-12-01 (tests/e2e/README.md)
SAFETY = 1.2  # the runner starts an engine / a workload only if estimate x SAFETY fits


class PlanError(ValueError):
    """A plan that cannot be built from the arguments given."""


@dataclasses.dataclass(frozen=True)
class Engine:
    model: str
    kv_cache: str
    side: str

    @property
    def name(self) -> str:
        return f"{self.model}-{self.kv_cache}kv-{self.side}"

    @property
    def backend(self) -> str:
        return OURS_BACKEND if self.side == "ours" else UPSTREAM_BACKEND[self.kv_cache]

    @property
    def indexer(self) -> str:
        return SIDE_INDEXER[self.side]

    @property
    def kv_cache_dtype(self) -> str:
        """The value passed to vLLM as kv_cache_dtype."""
        return "auto" if self.kv_cache == "bf16" else "fp8"


@dataclasses.dataclass(frozen=True)
class Workload:
    context: int
    batch: int
    output_len: int = OUTPUT_LEN

    @property
    def name(self) -> str:
        return f"c{self.context}-b{self.batch}"

    kind = "throughput"


@dataclasses.dataclass(frozen=True)
class MixedWorkload:
    """Decode streams running while prefills arrive (issue 34).

    `decodes` requests of `decode_context` random prompt tokens are prefilled first (the
    ramp: the first of them decode while the last are prefilled), then decode. Decode
    step 0 is the step that gives the last of them its first token; the measured phase is
    decode steps 0 to `decode_tokens` - 1, and each stream asks for `stream_tokens` =
    `decode_tokens` + `ramp_steps` tokens, so that none ends inside it (the decode batch
    is `decodes` in every measured step). After `lead` decode steps (decode-only steps,
    the baseline) the prefills arrive, one every `every` decode steps, in a seeded order
    of the lengths in `prefills` (fresh random prompts, max_tokens=1: each leaves when
    its prefill is done, so the decode batch stays `decodes`). Arrivals come faster than
    a step's token budget (MIXED_BATCHED_TOKENS) drains them, so from the first arrival
    until the last prefill is done every step is a mixed prefill/decode step (vLLM runs
    such steps outside the decode CUDA graphs, attention eagerly per layer); after it,
    `tail` more decode-only steps. A decode step is counted in the frontend: one per
    engine output that holds a token of the first decode stream.
    """

    decodes: int = 32
    decode_context: int = 4096
    prefills: tuple[int, ...] = (4096, 4096, 16384, 16384, 65536, 65536)
    every: int = 2
    lead: int = 16
    tail: int = 16
    seed: int = 0

    kind = "mixed"

    @property
    def name(self) -> str:
        lens = "-".join(f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in sorted(set(self.prefills)))
        return f"mixed-d{self.decodes}x{self.decode_context // 1024}k-p{len(self.prefills)}x{lens}-e{self.every}"

    @property
    def mixed_steps(self) -> int:
        """Decode steps from the first arrival until the last prefill is done, at least
        (the arrivals' span, or the prefill tokens over a step's budget after the decodes)."""
        per_step = MIXED_BATCHED_TOKENS - self.decodes
        return max(self.every * (len(self.prefills) - 1) + 1, -(-sum(self.prefills) // per_step))

    @property
    def decode_tokens(self) -> int:
        """Measured decode steps: lead + the mixed phase (x1.25 + 4 for chunks that do not
        fill a step) + tail."""
        return self.lead + int(self.mixed_steps * 1.25) + 4 + self.tail

    @property
    def ramp_steps(self) -> int:
        """Steps between the first and the last decode stream's first token, at most (their
        prompts at a step's budget less the tokens of the streams already decoding), + 2."""
        return -(-self.decodes * self.decode_context // (MIXED_BATCHED_TOKENS - self.decodes)) + 2

    @property
    def stream_tokens(self) -> int:
        """max_tokens of a decode stream."""
        return self.decode_tokens + self.ramp_steps

    def arrivals(self) -> list[tuple[int, int]]:
        """(decode step, prompt length) of every prefill, in arrival order: the lengths of
        `prefills` in an order drawn from `seed` (the same on every engine and run)."""
        import random

        order = list(self.prefills)
        random.Random(self.seed).shuffle(order)
        return [(self.lead + i * self.every, n) for i, n in enumerate(order)]

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"name": self.name, "kind": self.kind, "decode_tokens": self.decode_tokens,
                                           "stream_tokens": self.stream_tokens, "arrivals": self.arrivals()}


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds per piece of work (planning assumptions; see bench/serving/README.md)."""

    start_s: float = 90.0  # LLM(...) to ready; e2e: 108-138 s with 7-16 engines sharing 32 cores (README)
    stop_s: float = 10.0  # engine shutdown, process exit
    token_s: float = 5e-6  # prefill: per prompt token, context-independent part
    token_ctx_s: float = 3e-11  # prefill: per prompt token per token of context (indexer, top-k)
    step_s: float = 4e-3  # decode: per step, batch- and context-independent part
    step_key_s: float = 2e-10  # decode: per cached key a step reads (indexer + top-k, 3 layers)
    profile_s: float = 8.0  # one profiled window (cached prompts, 16 steps) incl. trace export
    ours_factor: float = 1.3  # our kernels vs upstream's (indexer/attention tables: 1.0-2.2x)
    install_s: float = 90.0  # first call: unpack, check and pip-install the bundle
    stage_call_s: float = 15.0  # a staging call of one 50 MiB piece on a warm machine: 6-8 s held, measured 2026-12-02
    machine_start_s: float = 120.0  # a cold machine ("a minute or more")
    call_gap_s: float = 15.0  # between two calls the machine is held, idle, while the next is sent
    # Deep models (more than the tiny models' 3 layers): the GPU work above scales with the
    # layers (layers / 3); start-up grows by start_layer_s per layer beyond 3 (compilation,
    # graph capture); a mixed step pays eager_layer_s of host time per layer (attention run
    # eagerly: issue 34 measured 112-156 µs per call for ours, ~20-40 µs upstream's).
    start_layer_s: float = 1.0
    eager_layer_s: float = 2e-4

    def prefill(self, context: int, batch: int, side: str, layers: int = 3) -> float:
        f = self.ours_factor if side == "ours" else 1.0
        return f * layers / 3 * batch * context * (self.token_s + self.token_ctx_s * context)

    def decode(self, context: int, batch: int, steps: int, side: str, layers: int = 3) -> float:
        f = self.ours_factor if side == "ours" else 1.0
        return steps * (self.step_s + f * layers / 3 * self.step_key_s * batch * context)

    def workload(self, w: Workload, side: str, layers: int = 3) -> float:
        """A throughput workload: the prefill call (max_tokens=1) then the decode call;
        a mixed workload: see mixed."""
        if isinstance(w, MixedWorkload):
            return self.mixed(w, side, layers)
        return (self.prefill(w.context, w.batch, side, layers)
                + self.decode(w.context, w.batch, w.output_len, side, layers))

    def mixed(self, w: MixedWorkload, side: str, layers: int = 3) -> float:
        """The decode streams' prefill, every arriving prefill, the decode steps (each
        mixed one with eager per-layer host time), and its profiled window."""
        pre = self.prefill(w.decode_context, w.decodes, side, layers) + sum(
            self.prefill(n, 1, side, layers) for n in w.prefills)
        steps = self.decode(w.decode_context, w.decodes, w.stream_tokens, side, layers)
        return pre + steps + w.mixed_steps * layers * self.eager_layer_s + self.profile_s

    def start(self, layers: int = 3) -> float:
        return self.start_s + self.start_layer_s * max(0, layers - 3)

    def warmup(self, side: str, layers: int = 3, warmup=WARMUP) -> float:
        return sum(self.prefill(c, b, side, layers) + self.decode(c, b, n, side, layers) for c, b, n in warmup)

    def engine(self, e: Engine, workloads: list, profiles: int, warmup=WARMUP) -> float:
        layers = model_layers(e.model)
        return (self.start(layers) + self.warmup(e.side, layers, warmup)
                + sum(self.workload(w, e.side, layers) for w in workloads) + profiles * self.profile_s + self.stop_s)


def model_config(model: str) -> dict:
    return json.loads((MODEL_DIRS[model] / "config.json").read_text())


def model_layers(model: str) -> int:
    """Decoder layers of a model (its config.json; the MTP layer is not built: MTP off)."""
    return int(model_config(model)["num_hidden_layers"])


def weight_params(cfg: dict) -> dict:
    """Parameters of a DSA model from its config (DeepSeek-V3.2 / GLM-5 layout, no MTP):
    embedding + head, per layer the MLA projections, the indexer, a dense MLP for the
    first `first_k_dense_replace` layers and routed + shared experts with the router for
    the others, the norms. An estimate for the memory plan, not vLLM's own count."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    attn = (h * qr + qr + qr * heads * (nope + rope) + h * (kvr + rope) + kvr + kvr * heads * (nope + v)
            + heads * v * h)
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    indexer = qr * ih * idim + h * idim + 2 * idim + h * ih
    dense = 3 * h * cfg["intermediate_size"]
    ne, mi = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    moe = (ne + cfg.get("n_shared_experts", 0)) * 3 * h * mi + h * ne + ne
    layers, k = cfg["num_hidden_layers"], min(cfg.get("first_k_dense_replace", 0), cfg["num_hidden_layers"])
    per_layer = attn + indexer + 2 * h
    total = 2 * cfg["vocab_size"] * h + h + layers * per_layer + k * dense + (layers - k) * moe
    return {"layers": layers, "dense_layers": k, "per_moe_layer": per_layer + moe, "total": total}


# Beside the weights and the KV cache: activations of a step (the indexer's prefill logits:
# a chunk x the context in fp32, 2 GiB at 8192 x 64k, 4 GiB at 16384), the sampler,
# CUDA-graph pools, the CUDA context. An allowance, not a measurement.
ACTIVATION_ALLOWANCE_GIB = 8
H200_GIB = 139


@dataclasses.dataclass(frozen=True)
class Plan:
    engines: tuple[Engine, ...]
    workloads: tuple[Workload, ...]
    profile_batches: tuple[int, ...] = PROFILE_BATCHES
    mixed: tuple[MixedWorkload, ...] = ()

    def all_workloads(self) -> list:
        """Every workload each engine runs: the throughput ones, then the mixed ones."""
        return list(self.workloads) + list(self.mixed)

    def warmup(self) -> tuple:
        """WARMUP with throughput workloads; else the mixed workloads' decode shape and
        one prompt of each prefill length."""
        if self.workloads:
            return WARMUP
        out = [(m.decode_context, m.decodes, MIXED_WARMUP_OUTPUT) for m in self.mixed]
        out += [(n, 1, 2) for n in sorted({n for m in self.mixed for n in m.prefills})]
        return tuple(dict.fromkeys(out))

    def batches(self) -> list[int]:
        """Decode batch sizes (the CUDA-graph capture sizes)."""
        return sorted({w.batch for w in self.workloads} | {b for _, b, _ in self.warmup()}
                      | {m.decodes for m in self.mixed})

    def max_num_seqs(self) -> int:
        return max([w.batch for w in self.workloads] + [b for _, b, _ in self.warmup()]
                   + [m.decodes + len(m.prefills) for m in self.mixed])

    def plan_id(self) -> str:
        """Identifies the plan in the resumable manifest (changes when the work changes)."""
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def items(self) -> list[tuple[Engine, Workload]]:
        return [(e, w) for e in self.engines for w in self.all_workloads()]

    def profiles_for(self, e: Engine) -> list[Workload]:
        """The 64k workloads whose decode step is profiled (prompts cached by that workload)."""
        return [w for w in self.workloads if w.context == PROFILE_CONTEXT and w.batch in self.profile_batches]

    def to_json(self) -> dict:
        out = {"engines": [dataclasses.asdict(e) | {"name": e.name, "backend": e.backend,
                                                    "indexer": e.indexer} for e in self.engines],
               "workloads": [dataclasses.asdict(w) | {"name": w.name} for w in self.workloads],
               "profile_batches": list(self.profile_batches), "profile_context": PROFILE_CONTEXT,
               "model_dtype": MODEL_DTYPE}
        if self.mixed:  # absent otherwise: the plan id of a plan without them stays what it was
            out["mixed"] = [m.to_json() for m in self.mixed]
            out["mixed_batched_tokens"] = MIXED_BATCHED_TOKENS
        return out


def _check(values, allowed, what: str) -> tuple:
    values = tuple(values)
    bad = [v for v in values if v not in allowed]
    if bad:
        raise PlanError(f"unknown {what} {bad}: choose from {list(allowed)}")
    if not values:
        raise PlanError(f"no {what} chosen")
    if len(set(values)) != len(values):
        raise PlanError(f"{what} repeated: {list(values)}")
    return values


MIXED = {"mixed": MixedWorkload()}  # --mixed NAME: the mixed workloads by name
DEEP_ARGS = {"models": DEEP_MODELS, "contexts": (), "batches": (), "mixed": ("mixed",)}  # --deep


def build_plan(models=MODELS, kv_caches=KV_CACHES, sides=SIDES, contexts=CONTEXTS, batches=BATCHES,
               output_len: int = OUTPUT_LEN, profile_batches=PROFILE_BATCHES, mixed=()) -> Plan:
    """Engines in priority order (GLM-5 first; per model the 16-bit cache first; upstream
    then ours, so that a run cut short still holds complete pairs), workloads by context
    then batch, then the mixed workloads (names of MIXED). No contexts (or no batches):
    no throughput workloads, a plan of mixed workloads only."""
    models = _check(models, ALL_MODELS, "models")
    kv_caches = _check(kv_caches, KV_CACHES, "KV caches")
    sides = _check(sides, SIDES, "sides")
    mixed = tuple(mixed)
    if mixed:
        mixed = _check(mixed, MIXED, "mixed workloads")
    contexts, batches = tuple(contexts), tuple(batches)
    if (contexts and batches) and (min(contexts) < 1 or min(batches) < 1):
        raise PlanError("contexts and batches must be positive integers")
    if not (contexts and batches) and not mixed:
        raise PlanError("no workloads: give contexts and batches, or mixed workloads")
    if output_len < 2:
        raise PlanError("output_len must be >= 2 (decode figures need a second token)")
    engines = tuple(Engine(m, kv, s) for m in models for kv in kv_caches for s in sides)
    workloads = tuple(Workload(c, b, output_len) for c in sorted(set(contexts)) for b in sorted(set(batches))) \
        if contexts and batches else ()
    plan = Plan(engines, workloads, tuple(b for b in profile_batches if b in batches),
                tuple(MIXED[n] for n in mixed))
    for m in models:
        need = memory_gib(plan, m)
        if need["total"] > H200_GIB:
            raise PlanError(f"{m}: ~{need['total']:.0f} GiB of GPU memory (KV {need['kv']:.0f} GiB for "
                            f"{kv_tokens(plan)} tokens x {model_layers(m)} layers) does not fit an H200's "
                            f"{H200_GIB} GiB: fewer or shorter workloads (the deep models run the mixed workload)")
    return plan


def max_model_len(plan: Plan) -> int:
    """Longest prompt + output, rounded up to a multiple of 256."""
    need = max([w.context + w.output_len for w in plan.workloads]
               + [max(m.decode_context + m.stream_tokens, max(m.prefills) + 1) for m in plan.mixed])
    if plan.workloads:
        need = max(need, max(c + n for c, _, n in WARMUP if c <= max(w.context for w in plan.workloads)))
    return -(-need // 256) * 256


def kv_tokens(plan: Plan) -> int:
    """Tokens the cache must hold at once: the largest batch x (context + output), or a
    mixed workload's decode streams at full length plus two prefills in progress (the
    scheduler chunks them in arrival order; done ones leave, their cached blocks are
    evictable)."""
    return max([w.batch * (w.context + w.output_len + 64) for w in plan.workloads]
               + [m.decodes * (m.decode_context + m.stream_tokens + 64) + 2 * max(m.prefills) for m in plan.mixed])


def kv_cache_bytes(plan: Plan, model: str | None = None) -> int:
    """KV budget of an engine of `model` (default: the plan's deepest model): kv_tokens x
    the layers x KV_BYTES_PER_TOKEN_LAYER (the latent cache at bf16, the larger, plus the
    indexer's keys) x1.25, in whole GiB. Both sides of a pair get the same."""
    layers = model_layers(model) if model else max(model_layers(e.model) for e in plan.engines)
    gib = 1 << 30
    return -(-int(kv_tokens(plan) * layers * KV_BYTES_PER_TOKEN_LAYER * 1.25) // gib) * gib


def memory_gib(plan: Plan, model: str) -> dict:
    """Estimated GPU memory of one engine of `model`: bf16 weights + the KV budget + the
    activation allowance, against an H200 (one engine at a time; the bench never runs two)."""
    w = weight_params(model_config(model))["total"] * 2 / (1 << 30)
    kv = kv_cache_bytes(plan, model) / (1 << 30)
    total = w + kv + ACTIVATION_ALLOWANCE_GIB
    return {"weights": round(w, 2), "kv": round(kv, 2), "activations": ACTIVATION_ALLOWANCE_GIB,
            "total": round(total, 2), "h200": H200_GIB, "fits_two": 2 * total <= H200_GIB}


@dataclasses.dataclass
class Estimate:
    per_engine: dict[str, float]
    calls: list[list[str]]  # engine names run in each bench call (after the staging calls)
    device_s: float
    call_s: list[float]


def engine_time(cost: CostModel, e: Engine, workloads: list, profiled: list, warmup=WARMUP) -> float:
    layers = model_layers(e.model)
    return (cost.start(layers) + cost.warmup(e.side, layers, warmup) + cost.stop_s
            + sum(cost.workload(w, e.side, layers) + (cost.profile_s if w in profiled else 0.0) for w in workloads))


def pack_calls(plan: Plan, cost: CostModel = CostModel(), budget_s: float = CALL_BUDGET_S) -> Estimate:
    """Engines into bench calls as the runner schedules them: an engine starts when
    SAFETY x its estimate fits what is left of the call, or when the call has run
    nothing yet; it then runs the workloads whose SAFETY x estimate still fit, and
    restarts in the next call for the rest (start-up paid again). The first call
    also installs. Call and device times are the plain (not SAFETY) estimates."""
    warm = plan.warmup()
    per_engine = {e.name: cost.engine(e, plan.all_workloads(), len(plan.profiles_for(e)), warm)
                  for e in plan.engines}
    calls: list[list[str]] = [[]]
    used = [cost.install_s]
    for e in plan.engines:
        todo = plan.all_workloads()
        profiled = plan.profiles_for(e)
        layers = model_layers(e.model)
        while todo:
            left = budget_s - used[-1]
            if calls[-1] and SAFETY * engine_time(cost, e, todo, profiled, warm) > left:
                calls.append([])
                used.append(0.0)
                continue
            t = cost.start(layers) + cost.warmup(e.side, layers, warm)
            fits: list = []
            for w in todo:
                extra = cost.workload(w, e.side, layers) + (cost.profile_s if w in profiled else 0.0)
                if t + SAFETY * extra + cost.stop_s > left:
                    break
                fits.append(w)
                t += extra
            if not fits:
                raise PlanError(f"{e.name}: no workload fits a {budget_s:.0f} s call after the start-up")
            whole = len(fits) == len(todo) == len(plan.all_workloads())
            calls[-1].append(e.name if whole else f"{e.name}[{fits[0].name}..{fits[-1].name}]")
            used[-1] += t + cost.stop_s
            todo = todo[len(fits):]
            if todo:
                calls.append([])
                used.append(0.0)
    n_calls = N_PIECES - 1 + sum(1 for c in calls if c)
    device = (cost.machine_start_s + (N_PIECES - 1) * cost.stage_call_s + sum(used)
              + (n_calls - 1) * cost.call_gap_s)
    return Estimate(per_engine, [c for c in calls if c], device, [u for c, u in zip(calls, used) if c])


def sessions(est: Estimate, cost: CostModel = CostModel()) -> list[tuple[list[int], float]]:
    """The bench calls (1-based) of each device session of SESSION_BUDGET_S, greedily, with
    its estimated device time: a session after the first starts a cold machine again, stages
    the pieces again and installs again (its first call), then resumes from the carried
    manifest."""
    fixed = cost.machine_start_s + (N_PIECES - 1) * (cost.stage_call_s + cost.call_gap_s)
    out: list[tuple[list[int], float]] = []
    for i, t in enumerate(est.call_s, 1):
        t_here = t + (cost.install_s if out and not out[-1][0] else 0.0) + cost.call_gap_s
        if out and out[-1][0] and out[-1][1] + t_here <= SESSION_BUDGET_S:
            out[-1][0].append(i)
            out[-1] = (out[-1][0], out[-1][1] + t_here)
            continue
        extra = cost.install_s if out else 0.0  # call 1's time holds the first install already
        out.append(([i], fixed + t + extra))
    return out


def plan_tag(plan: Plan) -> str:
    """The manifest's folder suffix: '' for plans of throughput workloads (.e2e/serving-state,
    as before), 'deep' for plans with mixed workloads on deep models only
    (.e2e/serving-state-deep), 'mixed' for other plans with mixed workloads (e.g. the tiny
    models on it, for contrast): a carried manifest of another plan stops a call (exit 2),
    so these never share a folder."""
    if not plan.mixed:
        return ""
    return "deep" if all(e.model in DEEP_MODELS for e in plan.engines) else "mixed"


def device_calls(estimate: Estimate, budget_s: int = CALL_BUDGET_S, run_args: str = "", tag: str = "") -> list[str]:
    """The exact `run` tool calls, in order (README "Running it"). run_args: the
    bench_serving.py options of a plan other than the default (e.g. --deep); tag: its
    manifest folder suffix (plan_tag)."""
    state = ".e2e/serving-state" + (f"-{tag}" if tag else "")
    env = f"BENCH_BUDGET_S={budget_s}" + (f" BENCH_TAG={tag}" if tag else "")
    lines = [f"run({'kind=nvidia-h200, ' if i == 1 else ''}carry=[.e2e/manifest.json, .e2e/pieces/{i:02d}]): "
             f"bash bench/serving/device-run.sh stage" for i in range(1, N_PIECES)]
    for i, _ in enumerate(estimate.calls):
        piece = f", .e2e/pieces/{N_PIECES:02d}" if i == 0 else ""
        lines.append(f"run(carry=[.e2e/manifest.json{piece}, {state}], timeout_s={CALL_LIMIT_S}): "
                     f"{env} bash bench/serving/device-run.sh run" + (f" {run_args}" if run_args else ""))
    return lines


def render(plan: Plan, est: Estimate, cost: CostModel, run_args: str = "") -> str:
    """Plain-text plan (what `python bench/serving/plan.py` prints)."""
    if plan.workloads:
        out = [f"plan {plan.plan_id()}: {len(plan.engines)} engines x {len(plan.workloads)} workloads "
               f"({', '.join(w.name for w in plan.workloads)}), output {plan.workloads[0].output_len} tokens, "
               f"profile at {PROFILE_CONTEXT} for batches {list(plan.profile_batches)}"]
    else:
        out = [f"plan {plan.plan_id()}: {len(plan.engines)} engines x {len(plan.mixed)} mixed workloads"]
    for m in plan.mixed:
        out.append(f"mixed workload {m.name}: {m.decodes} decode streams of {m.decode_context} prompt tokens, "
                   f"{m.stream_tokens} tokens each, {m.decode_tokens} decode steps measured; after {m.lead} decode steps {len(m.prefills)} prefills "
                   f"(max_tokens 1), one every {m.every} decode steps: "
                   + ", ".join(f"{n} at step {a}" for a, n in m.arrivals())
                   + f"; >= {m.mixed_steps} mixed steps at max_num_batched_tokens {MIXED_BATCHED_TOKENS}; "
                   f"profiled: {PROFILE_ITERS} mixed steps")
    if plan.mixed:
        out.append(f"max_model_len {max_model_len(plan)}, kv_cache_memory_bytes per model: "
                   + ", ".join(f"{m} {kv_cache_bytes(plan, m) >> 30} GiB"
                               for m in dict.fromkeys(e.model for e in plan.engines)))
        for m in dict.fromkeys(e.model for e in plan.engines):
            g = memory_gib(plan, m)
            out.append(f"GPU memory, {m} ({model_layers(m)} layers): weights {g['weights']:.1f} GiB (bf16) + KV "
                       f"{g['kv']:.0f} GiB + activations/graphs <= {g['activations']} GiB = {g['total']:.1f} GiB of "
                       f"{g['h200']} GiB (one engine at a time; two would {'fit' if g['fits_two'] else 'not fit'})")
    else:
        out.append(f"max_model_len {max_model_len(plan)}, kv_cache_memory_bytes {kv_cache_bytes(plan) >> 30} GiB")
    out += ["", "estimated seconds per engine (cost model, not measured):"]
    for e in plan.engines:
        out.append(f"  {e.name:34s} {e.backend:22s} indexer={e.indexer:8s} {est.per_engine[e.name]:7.0f}")
    out.append("")
    for i, (c, t) in enumerate(zip(est.calls, est.call_s), 1):
        out.append(f"bench call {i} (~{t:.0f} s): {', '.join(c)}")
    out.append(f"estimated device time: {est.device_s:.0f} s ({est.device_s / 60:.1f} min) of "
               f"{SESSION_BUDGET_S} s (machine start, {N_PIECES - 1} staging calls, the install and the gaps "
               "between calls included)")
    ses = sessions(est, cost)
    if len(ses) > 1:
        out.append(f"more than one session's device time: {len(ses)} sessions, each the staging calls, then "
                   "its bench calls (the first of each installs; a later one carries the kept manifest):")
        out += [f"  session {k}: bench calls {', '.join(map(str, c))} (~{t:.0f} s)" for k, (c, t) in enumerate(ses, 1)]
    out.append("")
    out.append("device calls, back to back (the machine forgets everything 30 s after a call):")
    out += ["  " + line for line in device_calls(est, run_args=run_args, tag=plan_tag(plan))]
    return "\n".join(out)


def add_plan_options(ap: argparse.ArgumentParser) -> None:
    """The plan's options, shared by plan.py and bench_serving.py (the same options give
    the same plan)."""
    ap.add_argument("--deep", action="store_true",
                    help="the deep models on the mixed workload only (issue 34): the defaults become "
                         f"--models {' '.join(DEEP_ARGS['models'])} --contexts --batches --mixed mixed")
    ap.add_argument("--models", nargs="+", default=None, help=f"of {list(ALL_MODELS)}")
    ap.add_argument("--kv-caches", nargs="+", default=list(KV_CACHES))
    ap.add_argument("--sides", nargs="+", default=list(SIDES))
    ap.add_argument("--contexts", nargs="*", type=int, default=None, help="none: no throughput workloads")
    ap.add_argument("--batches", nargs="*", type=int, default=None)
    ap.add_argument("--mixed", nargs="*", default=None, help=f"mixed workloads, of {list(MIXED)}")
    ap.add_argument("--output-len", type=int, default=OUTPUT_LEN)
    ap.add_argument("--profile-batches", nargs="*", type=int, default=list(PROFILE_BATCHES),
                    help="batches whose decode step is profiled at 64k context (none: no profile)")


def plan_args(args: argparse.Namespace) -> dict:
    """build_plan's keyword arguments from add_plan_options' options."""
    base = DEEP_ARGS if args.deep else {"models": MODELS, "contexts": CONTEXTS, "batches": BATCHES, "mixed": ()}
    pick = {k: list(getattr(args, k) if getattr(args, k) is not None else base[k])
            for k in ("models", "contexts", "batches", "mixed")}
    return {"models": pick["models"], "kv_caches": list(args.kv_caches), "sides": list(args.sides),
            "contexts": pick["contexts"], "batches": pick["batches"], "output_len": args.output_len,
            "profile_batches": list(args.profile_batches), "mixed": pick["mixed"]}


def run_args_of(argv: list[str]) -> str:
    """The options to repeat on the device's run calls (the plan's; not --budget-s/--json)."""
    out, skip = [], False
    for a in argv:
        if a in ("--json",):
            continue
        if a == "--budget-s":
            skip = True
            continue
        if skip:
            skip = False
            continue
        out.append(a)
    return " ".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_plan_options(ap)
    ap.add_argument("--budget-s", type=float, default=CALL_BUDGET_S)
    ap.add_argument("--json", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    run_args = run_args_of(argv)
    try:
        plan = build_plan(**plan_args(args))
        cost = CostModel()
        est = pack_calls(plan, cost, args.budget_s)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        mem = {m: memory_gib(plan, m) for m in dict.fromkeys(e.model for e in plan.engines)}
        print(json.dumps({"plan_id": plan.plan_id(), "plan": plan.to_json(), "cost_model": dataclasses.asdict(cost),
                          "per_engine_s": est.per_engine, "calls": est.calls, "device_s": round(est.device_s, 1),
                          "sessions": sessions(est, cost), "memory_gib": mem,
                          "device_calls": device_calls(est, run_args=run_args, tag=plan_tag(plan))},
                         indent=1, sort_keys=True))
    else:
        print(render(plan, est, cost, run_args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
