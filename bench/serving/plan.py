"""The serving benchmark's plan: engines, workloads, the time estimate, the device calls.

Standard library only: it runs here (CPU, tests) and on the GPU machine before
and without vLLM. `python bench/serving/plan.py` prints the plan, the estimate
and the exact device calls; `--json` gives the same as JSON.

One *engine* = one model x KV cache x side, started once (`vllm.LLM`), which then
runs every *workload* (context x batch) of the plan. The cost model below is a
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
MODEL_DIRS = {m: REPO / "tests" / "e2e" / "models" / m for m in MODELS}
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

# Attention backends and indexer switch per side (tests/e2e/README.md "Sides").
INDEXER_SWITCH = "VLLM_SPARSE_INDEXER_BACKEND"
UPSTREAM_BACKEND = {"bf16": "FLASH_ATTN_MLA_SPARSE", "fp8": "FLASHMLA_SPARSE"}
OURS_BACKEND = "TRITON_MLA_SPARSE"
SIDE_INDEXER = {"upstream": "deepgemm", "ours": "triton"}

# Device-call limits (/work/.library/device/README.md): 600 s a command, 30 min a session.
CALL_LIMIT_S = 600
CALL_BUDGET_S = 560  # the runner starts no work it cannot finish by then (install inside; 40 s to pack)
SESSION_BUDGET_S = 1800
N_PIECES = 3  # `make e2e-bundle` with the 0.26.0 wheel: 3 pieces (tests/e2e/README.md)
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
    stage_call_s: float = 45.0  # a staging call: transfer + check of one 56 MiB piece
    machine_start_s: float = 120.0  # a cold machine ("a minute or more")
    call_gap_s: float = 15.0  # between two calls the machine is held, idle, while the next is sent

    def prefill(self, context: int, batch: int, side: str) -> float:
        f = self.ours_factor if side == "ours" else 1.0
        return f * batch * context * (self.token_s + self.token_ctx_s * context)

    def decode(self, context: int, batch: int, steps: int, side: str) -> float:
        f = self.ours_factor if side == "ours" else 1.0
        return steps * (self.step_s + f * self.step_key_s * batch * context)

    def workload(self, w: Workload, side: str) -> float:
        """A workload: the prefill call (max_tokens=1) then the decode call."""
        return self.prefill(w.context, w.batch, side) + self.decode(w.context, w.batch, w.output_len, side)

    def warmup(self, side: str) -> float:
        return sum(self.prefill(c, b, side) + self.decode(c, b, n, side) for c, b, n in WARMUP)

    def engine(self, e: Engine, workloads: list[Workload], profiles: int) -> float:
        return (self.start_s + self.warmup(e.side) + sum(self.workload(w, e.side) for w in workloads)
                + profiles * self.profile_s + self.stop_s)


@dataclasses.dataclass(frozen=True)
class Plan:
    engines: tuple[Engine, ...]
    workloads: tuple[Workload, ...]
    profile_batches: tuple[int, ...] = PROFILE_BATCHES

    def plan_id(self) -> str:
        """Identifies the plan in the resumable manifest (changes when the work changes)."""
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def items(self) -> list[tuple[Engine, Workload]]:
        return [(e, w) for e in self.engines for w in self.workloads]

    def profiles_for(self, e: Engine) -> list[Workload]:
        """The 64k workloads whose decode step is profiled (prompts cached by that workload)."""
        return [w for w in self.workloads if w.context == PROFILE_CONTEXT and w.batch in self.profile_batches]

    def to_json(self) -> dict:
        return {"engines": [dataclasses.asdict(e) | {"name": e.name, "backend": e.backend,
                                                     "indexer": e.indexer} for e in self.engines],
                "workloads": [dataclasses.asdict(w) | {"name": w.name} for w in self.workloads],
                "profile_batches": list(self.profile_batches), "profile_context": PROFILE_CONTEXT,
                "model_dtype": MODEL_DTYPE}


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


def build_plan(models=MODELS, kv_caches=KV_CACHES, sides=SIDES, contexts=CONTEXTS, batches=BATCHES,
               output_len: int = OUTPUT_LEN, profile_batches=PROFILE_BATCHES) -> Plan:
    """Engines in priority order (GLM-5 first; per model the 16-bit cache first; upstream
    then ours, so that a run cut short still holds complete pairs), workloads by context
    then batch."""
    models = _check(models, MODELS, "models")
    kv_caches = _check(kv_caches, KV_CACHES, "KV caches")
    sides = _check(sides, SIDES, "sides")
    contexts, batches = tuple(contexts), tuple(batches)
    if not contexts or not batches or min(contexts) < 1 or min(batches) < 1:
        raise PlanError("contexts and batches must be positive integers")
    if output_len < 2:
        raise PlanError("output_len must be >= 2 (decode figures need a second token)")
    engines = tuple(Engine(m, kv, s) for m in models for kv in kv_caches for s in sides)
    workloads = tuple(Workload(c, b, output_len) for c in sorted(set(contexts)) for b in sorted(set(batches)))
    return Plan(engines, workloads, tuple(b for b in profile_batches if b in batches))


def max_model_len(plan: Plan) -> int:
    """Longest prompt + output, rounded up to a multiple of 256."""
    need = max(w.context + w.output_len for w in plan.workloads)
    need = max(need, max(c + n for c, _, n in WARMUP if c <= max(w.context for w in plan.workloads)))
    return -(-need // 256) * 256


def kv_cache_bytes(plan: Plan) -> int:
    """KV budget per engine: the largest batch x (context + output) tokens of every layer's
    latent cache (bf16 576 x 2 B; fp8_ds_mla 656 B) plus the indexer's keys (128 + 4 B),
    3 layers, x1.25, in whole GiB. Both sides of a pair get the same."""
    tokens = max(w.batch * (w.context + w.output_len + 64) for w in plan.workloads)
    per_token = 3 * (max(1152, 656) + 132)
    gib = 1 << 30
    return -(-int(tokens * per_token * 1.25) // gib) * gib


@dataclasses.dataclass
class Estimate:
    per_engine: dict[str, float]
    calls: list[list[str]]  # engine names run in each bench call (after the staging calls)
    device_s: float
    call_s: list[float]


def engine_time(cost: CostModel, e: Engine, workloads: list[Workload], profiled: list[Workload]) -> float:
    return (cost.start_s + cost.warmup(e.side) + cost.stop_s
            + sum(cost.workload(w, e.side) + (cost.profile_s if w in profiled else 0.0) for w in workloads))


def pack_calls(plan: Plan, cost: CostModel = CostModel(), budget_s: float = CALL_BUDGET_S) -> Estimate:
    """Engines into bench calls as the runner schedules them: an engine starts when
    SAFETY x its estimate fits what is left of the call, or when the call has run
    nothing yet; it then runs the workloads whose SAFETY x estimate still fit, and
    restarts in the next call for the rest (start-up paid again). The first call
    also installs. Call and device times are the plain (not SAFETY) estimates."""
    per_engine = {e.name: cost.engine(e, list(plan.workloads), len(plan.profiles_for(e))) for e in plan.engines}
    calls: list[list[str]] = [[]]
    used = [cost.install_s]
    for e in plan.engines:
        todo = list(plan.workloads)
        profiled = plan.profiles_for(e)
        while todo:
            left = budget_s - used[-1]
            if calls[-1] and SAFETY * engine_time(cost, e, todo, profiled) > left:
                calls.append([])
                used.append(0.0)
                continue
            t = cost.start_s + cost.warmup(e.side)
            fits: list[Workload] = []
            for w in todo:
                extra = cost.workload(w, e.side) + (cost.profile_s if w in profiled else 0.0)
                if t + SAFETY * extra + cost.stop_s > left:
                    break
                fits.append(w)
                t += extra
            if not fits:
                raise PlanError(f"{e.name}: no workload fits a {budget_s:.0f} s call after the start-up")
            whole = len(fits) == len(todo) == len(plan.workloads)
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


def device_calls(estimate: Estimate, budget_s: int = CALL_BUDGET_S) -> list[str]:
    """The exact `run` tool calls, in order (README "Running it")."""
    lines = [f"run({'kind=nvidia-h200, ' if i == 1 else ''}carry=[.e2e/manifest.json, .e2e/pieces/{i:02d}]): "
             f"bash bench/serving/device-run.sh stage" for i in range(1, N_PIECES)]
    for i, _ in enumerate(estimate.calls):
        piece = f", .e2e/pieces/{N_PIECES:02d}" if i == 0 else ""
        lines.append(f"run(carry=[.e2e/manifest.json{piece}, .e2e/serving-state], timeout_s={CALL_LIMIT_S}): "
                     f"BENCH_BUDGET_S={budget_s} bash bench/serving/device-run.sh run")
    return lines


def render(plan: Plan, est: Estimate, cost: CostModel) -> str:
    """Plain-text plan (what `python bench/serving/plan.py` prints)."""
    out = [f"plan {plan.plan_id()}: {len(plan.engines)} engines x {len(plan.workloads)} workloads "
           f"({', '.join(w.name for w in plan.workloads)}), output {plan.workloads[0].output_len} tokens, "
           f"profile at {PROFILE_CONTEXT} for batches {list(plan.profile_batches)}",
           f"max_model_len {max_model_len(plan)}, kv_cache_memory_bytes {kv_cache_bytes(plan) >> 30} GiB", "",
           "estimated seconds per engine (cost model, not measured):"]
    for e in plan.engines:
        out.append(f"  {e.name:34s} {e.backend:22s} indexer={e.indexer:8s} {est.per_engine[e.name]:7.0f}")
    out.append("")
    for i, (c, t) in enumerate(zip(est.calls, est.call_s), 1):
        out.append(f"bench call {i} (~{t:.0f} s): {', '.join(c)}")
    out.append(f"estimated device time: {est.device_s:.0f} s ({est.device_s / 60:.1f} min) of "
               f"{SESSION_BUDGET_S} s (machine start, {N_PIECES - 1} staging calls, the install and the gaps "
               "between calls included)")
    out.append("")
    out.append("device calls, back to back (the machine forgets everything 30 s after a call):")
    out += ["  " + line for line in device_calls(est)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--kv-caches", nargs="+", default=list(KV_CACHES))
    ap.add_argument("--sides", nargs="+", default=list(SIDES))
    ap.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS))
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--budget-s", type=float, default=CALL_BUDGET_S)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        plan = build_plan(args.models, args.kv_caches, args.sides, args.contexts, args.batches)
        cost = CostModel()
        est = pack_calls(plan, cost, args.budget_s)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"plan_id": plan.plan_id(), "plan": plan.to_json(), "cost_model": dataclasses.asdict(cost),
                          "per_engine_s": est.per_engine, "calls": est.calls, "device_s": round(est.device_s, 1),
                          "device_calls": device_calls(est)}, indent=1, sort_keys=True))
    else:
        print(render(plan, est, cost))
    return 0


if __name__ == "__main__":
    sys.exit(main())
