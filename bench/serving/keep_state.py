"""Keep a device call's manifest here: merge FROM/state.json into DEST/state.json.

`make bench-e2e-keep BENCH_FROM=<folder the call's files came back to>`. DEST
(.e2e/serving-state, ignored by git) is what the next call carries after a cold
start and what `make bench-e2e-report` reads; env.txt and run.log are copied beside
it (run.log as run-callN.log). Standard library only.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import state as st  # noqa: E402


def keep(src: Path, dest: Path) -> Path:
    new = st.load(src)
    if new is None:
        raise st.StateError(f"{src}: no state.json there")
    old = st.load(dest)
    if old is not None and old["plan_id"] != new["plan_id"]:
        raise st.StateError(f"{dest} holds plan {old['plan_id']}, {src} plan {new['plan_id']}: "
                            "move the old one away first")
    merged = st.merge(new, old)
    path = st.save(merged, dest / "state.json")
    call = max((c.get("call", 0) for c in new["calls"]), default=0)
    if (src / "env.txt").is_file():
        shutil.copyfile(src / "env.txt", dest / "env.txt")
    if (src / "run.log").is_file():
        shutil.copyfile(src / "run.log", dest / f"run-call{call}.log")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: keep_state.py FROM DEST", file=sys.stderr)
        return 2
    try:
        print(keep(Path(argv[0]), Path(argv[1])))
    except st.StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
