"""CPU proofs of GLM-5.3-Flash (Glm5Next) on the 0.33.0 line beside the attention and the
indexer: KDA compile-only, the tiny checkpoint. The tree is $SMLA_033_TREE (set by
tests/lineproofs.py: the line's patched tree)."""
from __future__ import annotations

import os
from pathlib import Path

TREE = Path(os.environ["SMLA_033_TREE"])
