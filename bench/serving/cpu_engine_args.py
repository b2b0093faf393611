"""CPU check (no GPU): vLLM's own EngineArgs accept a plan's engine arguments, and what
it resolves them to (layers, dense layers, token budget, iteration details, KV budget,
cache dtype, CUDA-graph mode and sizes, drafter, async scheduling).

The platform is faked as an H200 and CUDA ops are stubbed as in tests/e2e/cpu_dry_run.py;
the weights are not loaded (load_format "dummy" for the config only). Needs vLLM 0.26.0's
Python importable (the official wheel, or the patched tree on PYTHONPATH) and
transformers 5.x, e.g.

  PYTHONPATH=work/0.26.0/vllm .venv/bin/python bench/serving/cpu_engine_args.py --deep

Arguments: bench_serving.py's plan options (default: its default plan). One line per
engine of a distinct model x cache x backend; exit 0 when every one was accepted.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO / "tests" / "e2e"))
    import cpu_dry_run

    cpu_dry_run._fake_h200(1)
    from vllm.engine.arg_utils import EngineArgs

    dry = json.loads(subprocess.run([sys.executable, str(HERE / "bench_serving.py"), *argv, "--dry-run"],
                                    capture_output=True, text=True, check=True).stdout)
    seen = set()
    for e in dry["engines"]:
        kw = dict(e["llm_kwargs"], load_format="dummy")
        key = (kw["model"], kw.get("kv_cache_dtype"), json.dumps(kw["attention_config"]))
        if key in seen:
            continue
        seen.add(key)
        cfg = EngineArgs(**kw).create_engine_config()
        mc, sc, cc = cfg.model_config, cfg.scheduler_config, cfg.compilation_config
        print(e["name"], "layers", mc.hf_config.num_hidden_layers, "dense",
              getattr(mc.hf_config, "first_k_dense_replace", None), "max_num_batched_tokens",
              sc.max_num_batched_tokens, "max_num_seqs", sc.max_num_seqs, "iteration_details",
              cfg.observability_config.enable_logging_iteration_details, "kv_cache_memory_bytes",
              cfg.cache_config.kv_cache_memory_bytes, "cache", cfg.cache_config.cache_dtype, "graphs",
              cc.cudagraph_mode, cc.cudagraph_capture_sizes, "drafter", cfg.speculative_config, "async",
              sc.async_scheduling, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
