"""What test_indexer_op.py and test_kpool_indexer_op.py share to run an indexer op on the CPU:
torch stand-ins for the compiled gather and top-k ops (from the CUDA sources' semantics:
top_k_per_row_prefill returns indices relative to its row start, csrc/sampler.cu;
top_k_per_row_decode takes (B, 1) lengths as causal rows, persistent_topk one length per row),
the workspace manager and the forward context, and the fp8 queries."""
from __future__ import annotations

import contextlib
import types

import torch

from indexer_reference import quant_q, read_paged_cache

from vllm.config import CUDAGraphMode


class Recorder:
    """Compiled-op stand-ins for a paged cache of `page` entries per block; keeps what the
    top-k calls received."""

    def __init__(self, page: int):
        self.page = page
        self.prefill = []
        self.decode = []

    def gather(self, kv_cache, k_quant, k_scale, block_table, cu_seq_lens):
        codes, scales = read_paged_cache(kv_cache)
        for r in range(block_table.shape[0]):
            lo, hi = int(cu_seq_lens[r]), int(cu_seq_lens[r + 1])
            pos = torch.arange(hi - lo)
            phys = block_table[r, pos // self.page].long()
            k_quant[lo:hi] = codes[phys, pos % self.page].view(k_quant.dtype)
            k_scale[lo:hi] = scales[phys, pos % self.page].contiguous().view(torch.uint8).view(-1, 4)

    def topk_prefill(self, logits, row_starts, row_ends, out, num_rows, s0, s1, k):
        self.prefill.append((logits.clone(), row_starts.clone(), row_ends.clone()))
        for r in range(num_rows):
            lo, hi = int(row_starts[r]), int(row_ends[r])
            out[r] = -1
            if hi > lo:
                kk = min(k, hi - lo)
                out[r, :kk] = torch.topk(logits[r, lo:hi], kk).indices.to(torch.int32)

    def topk_decode(self, logits, next_n, seq_lens, out, num_rows, s0, s1, k):
        lens = seq_lens.reshape(-1)
        if lens.numel() != num_rows:  # (B, 1): causal rows
            i = torch.arange(next_n)
            lens = (seq_lens.reshape(-1, 1) - next_n + 1 + i).reshape(-1)
        self.decode.append((logits.clone(), lens.clone()))
        self._topk_prefixes(logits, lens, out, num_rows, k)

    def persistent_topk(self, logits, lengths, out, workspace, k, max_seq_len):
        lens = lengths.reshape(-1)
        assert lens.numel() == logits.shape[0], "one length per row"
        self.decode.append((logits.clone(), lens.clone()))
        self._topk_prefixes(logits, lens, out, logits.shape[0], k)

    @staticmethod
    def _topk_prefixes(logits, lens, out, num_rows, k):
        """Row r: the top-k of its first lens[r] logits, -1 after."""
        for r in range(num_rows):
            L = int(lens[r])
            out[r] = -1
            if L > 0:
                kk = min(k, L)
                out[r, :kk] = torch.topk(logits[r, :L], kk).indices.to(torch.int32)


class Workspace:
    def get_simultaneous(self, *specs):
        return [torch.empty(shape, dtype=dtype) for shape, dtype in specs]


@contextlib.contextmanager
def forward_context(module, prefix: str, meta):
    """`module.get_forward_context()` returns a context holding `meta` for the layer `prefix`
    (no CUDA graph) while the block runs."""
    ctx = types.SimpleNamespace(attn_metadata={prefix: meta},
                                cudagraph_runtime_mode=CUDAGraphMode.NONE)
    orig = module.get_forward_context
    module.get_forward_context = lambda: ctx
    try:
        yield
    finally:
        module.get_forward_context = orig


def make_queries(T: int, seed: int, heads: int, dim: int):
    """Random queries and weights of T tokens, `heads` heads of `dim`, through quant_q (fp8)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, heads, dim, generator=g)
    w = torch.randn(T, heads, generator=g)
    return quant_q(q, w, dim ** -0.5, heads ** -0.5)
