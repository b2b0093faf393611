"""The resumable manifest of a serving-benchmark run (`state.json`).

Standard library only. One JSON object:

  format      1
  plan_id     plan.Plan.plan_id() of the plan it belongs to (a state of another plan
              is refused: start over with --reset, or keep the old state apart)
  plan        the plan (engines, workloads) for reading the state without the code
  engines     name -> {"starts": [ {call, init_s, ok, error, ...} ], "meta": {...},
                       "failed": error text or null}
  items       "engine/workload" -> one workload record (bench_serving.py), done only
  profiles    "engine/workload" -> one profile breakdown (profile_breakdown.py)
  calls       one entry per device call: {"call", "started", "wall_s", "engines", "exit"}

Only the runner's parent process writes it, atomically (write + rename), after every
engine. On the GPU machine it lives in /tmp/smla-bench (kept while the machine is
warm) and every call also writes it to $OUT, so it comes back; after a cold start the
next call carries it (.e2e/serving-state/state.json) and the two are merged.
"""
from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

FORMAT = 1


class StateError(ValueError):
    """A manifest that cannot be used (unreadable, another plan, wrong format)."""


def item_key(engine: str, workload: str) -> str:
    return f"{engine}/{workload}"


def new_state(plan) -> dict:
    return {"format": FORMAT, "plan_id": plan.plan_id(), "plan": plan.to_json(),
            "engines": {e.name: {"starts": [], "meta": {}, "failed": None} for e in plan.engines},
            "items": {}, "profiles": {}, "calls": []}


def check(state: dict, plan=None, where: str = "state") -> dict:
    """Raise StateError unless `state` is a manifest of this format (and of `plan`)."""
    if not isinstance(state, dict):
        raise StateError(f"{where}: not a JSON object")
    if state.get("format") != FORMAT:
        raise StateError(f"{where}: format {state.get('format')!r}, expected {FORMAT}")
    for key, typ in (("plan_id", str), ("engines", dict), ("items", dict), ("profiles", dict), ("calls", list)):
        if not isinstance(state.get(key), typ):
            raise StateError(f"{where}: field {key!r} missing or not a {typ.__name__}")
    if plan is not None and state["plan_id"] != plan.plan_id():
        raise StateError(f"{where} belongs to plan {state['plan_id']}, this run is plan {plan.plan_id()}: "
                         "same arguments as the run that wrote it, or --reset to start over")
    return state


def load(path: Path, plan=None) -> dict | None:
    """The manifest at path (None when there is none)."""
    path = Path(path)
    if path.is_dir():
        path = path / "state.json"
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"{path}: unreadable manifest: {exc}") from exc
    return check(state, plan, str(path))


def save(state: dict, path: Path) -> Path:
    """Atomic write, sorted keys (the same state gives the same bytes)."""
    path = Path(path)
    if path.suffix != ".json":
        path = path / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def merge(a: dict | None, b: dict | None) -> dict | None:
    """Union of two manifests of one plan: every done item and profile of either (a wins
    on a key both hold), engine starts and calls of both without duplicates."""
    if a is None or b is None:
        return copy.deepcopy(a if b is None else b)
    if a["plan_id"] != b["plan_id"]:
        raise StateError(f"cannot merge manifests of plans {a['plan_id']} and {b['plan_id']}")
    out = copy.deepcopy(a)
    for key in ("items", "profiles"):
        for k, v in b[key].items():
            out[key].setdefault(k, copy.deepcopy(v))
    for name, eng in b["engines"].items():
        mine = out["engines"].setdefault(name, {"starts": [], "meta": {}, "failed": None})
        seen = {json.dumps(s, sort_keys=True) for s in mine["starts"]}
        mine["starts"] += [copy.deepcopy(s) for s in eng.get("starts", [])
                           if json.dumps(s, sort_keys=True) not in seen]
        mine["starts"].sort(key=lambda s: (s.get("call", 0), s.get("started", "")))
        for k, v in eng.get("meta", {}).items():
            mine["meta"].setdefault(k, copy.deepcopy(v))
        if mine.get("failed") is None:
            mine["failed"] = eng.get("failed")
    seen = {json.dumps(c, sort_keys=True) for c in out["calls"]}
    out["calls"] += [copy.deepcopy(c) for c in b["calls"] if json.dumps(c, sort_keys=True) not in seen]
    out["calls"].sort(key=lambda c: (c.get("call", 0), c.get("started", "")))
    return out


def pending(state: dict, plan) -> list[tuple]:
    """(engine, [workloads not done]) in plan order, engines with nothing left omitted;
    an engine marked failed is skipped (its error is in the manifest)."""
    out = []
    for e in plan.engines:
        if state["engines"].get(e.name, {}).get("failed"):
            continue
        todo = [w for w in plan.all_workloads() if item_key(e.name, w.name) not in state["items"]]
        todo_profiles = [w for w in plan.profiles_for(e) if item_key(e.name, w.name) not in state["profiles"]]
        if todo or todo_profiles:
            out.append((e, todo, todo_profiles))
    return out


def failed(state: dict) -> dict[str, str]:
    return {n: e["failed"] for n, e in sorted(state["engines"].items()) if e.get("failed")}


def record_start(state: dict, engine: str, call: int, info: dict) -> None:
    state["engines"].setdefault(engine, {"starts": [], "meta": {}, "failed": None})
    state["engines"][engine]["starts"].append({"call": call, **info})


def add_item(state: dict, engine: str, workload: str, record: dict) -> None:
    state["items"][item_key(engine, workload)] = record


def add_profile(state: dict, engine: str, workload: str, record: dict) -> None:
    state["profiles"][item_key(engine, workload)] = record


def next_call_number(state: dict) -> int:
    return 1 + max((c.get("call", 0) for c in state["calls"]), default=0)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
