"""GLM-5.3-Flash (Glm5Next) beside the NoPE attention and the pooled indexer, on the lines that
serve it (0.33.0): the line's own CPU proofs in tests/lines/<line>/glm53/, each in a pytest child
against the line's patched tree (tests/lineproofs.py), with the least number each must pass."""
from __future__ import annotations

import pytest

import lineproofs

LINE_PROOFS = {
    "0.33.0": [("glm53", "test_kda_compile.py", 7),             # KDA launches compile sm80-sm121
               ("glm53", "test_tree_glm53_tests_cpu.py", 1),    # the tree's mHC tests (GLM-5.3-Flash mHC patch)
               ("glm53", "test_moe_selection.py", 3),           # FP8 experts: Marlin sm80/86, Triton sm89
               ("glm53", "test_glm53_tiny_checkpoint_config.py", 1),  # the tiny checkpoint's config
               # loads at sm90 (upstream path) and sm86 (the series' portable path)
               ("glm53", "test_glm53_tiny_checkpoint_load.py", 2)],
}


@pytest.mark.parametrize("case", lineproofs.cases(LINE_PROOFS, "no GLM-5.3-Flash (Glm5Next) in its vLLM"))
def test_line_glm53_proof(vllm_tree, case):
    lineproofs.check(case, vllm_tree)
