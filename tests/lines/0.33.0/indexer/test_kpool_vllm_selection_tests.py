"""The clone's vLLM-style kpool selection tests (tests/models/glm5next/
test_kpool_indexer_triton_logits.py: the layer's logits kernels per mocked
capability, with and without DeepGEMM, and its refusals), collected here so
they run under this harness's stand-ins; its GPU-only tests are not
imported."""
from models.glm5next.test_kpool_indexer_triton_logits import (  # noqa: F401
    cuda_capability,
    test_kpool_indexer_picks_logits_by_arch,
    test_kpool_indexer_refusals,
)
