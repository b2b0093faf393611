"""What the layer-level CPU checks of every line share: the geometries, the mixed batch and the
float64 reference (tests/lines/<release>/attention/layer_interpret_*.py).

Pure torch; the vLLM class a batch is described with (CommonAttentionMetadata) is passed in, so
this module imports nothing from vLLM.

- GEOMETRY: per-GPU heads (TP8), qk_nope and v_head of DeepSeek-V3.2, GLM-5 and GLM-5.2 (three
  layers: one with the DSA indexer, two IndexCache layers reusing its top-k); kv_lora 512, rope 64
  (GLM-5.3-Flash: rope 0, NoPE).
- batch(): two decodes, a 3-token spec-decode row and a 130-token prefill with 30 tokens of
  context, 64-token blocks in a shuffled block table; the logical top-k of every query token in a
  buffer WIDTH (256) wide, wider than INDEX_TOPK (128), rows reaching past INDEX_TOPK, -1 holes
  anywhere in a row.  GLM-5.3-Flash (a geometry with "kpool"): the model's own top-k geometry
  (index_topk 2048 = 512 pools of 4, buffer width 2176), a decode at 8,203 tokens first, and the
  buffer filled by the line's pooled indexer op (batch's fill_topk).
- reference_layer(): float64 MLA of the layer (W_UK absorption, softmax over the selected rows,
  W_UV) over the rows the attention must read.
"""
from __future__ import annotations

import math

import torch

LORA, ROPE, BLOCK = 512, 64, 64
INDEX_TOPK, WIDTH = 128, 256  # the top-k buffer is wider than index_topk
DTYPE = torch.float16
# (query_len, seq_len): two decodes, a 3-token spec-decode row, a prefill with context
REQUESTS = [(1, 160), (1, 70), (3, 100), (130, 160)]
GEOMETRY = {  # per-GPU heads (TP8), qk_nope, v_head; kv_lora 512, rope 64
    "deepseek-v3.2": dict(heads=16, qk_nope=128, v_head=128, layers=1),
    "glm-5": dict(heads=8, qk_nope=192, v_head=256, layers=1),
    "glm-5.2": dict(heads=8, qk_nope=192, v_head=256, layers=3),
    # GLM-5.3-Flash: 64 heads / TP8, NoPE (no rope part: head size 512; the 0.33.0 line's check),
    # the model's top-k geometry: index_topk 2048 = 512 pools of kpool 4, the buffer
    # round_up(2048 + 4 - 1, 128) = 2176 wide; a decode past 8k tokens (2,050 pools) first
    "glm-5.3-flash": dict(heads=8, qk_nope=256, v_head=256, layers=1, rope=0, index_topk=2048,
                          width=2176, kpool=4, max_model_len=10240,
                          requests=[(1, 8203)] + REQUESTS),
}
DECODE_MAX_QUERY = 3  # query lengths up to this are decodes (the spec-decode row: MTP, 2 drafts)


def geometry_batch(geom: dict) -> tuple[list[tuple[int, int]], int, int]:
    """(requests, index_topk, buffer width) of a GEOMETRY entry (the defaults but GLM-5.3-Flash)."""
    return geom.get("requests", REQUESTS), geom.get("index_topk", INDEX_TOPK), geom.get("width", WIDTH)


def split(requests) -> tuple[int, int, int]:
    """(num_decodes, num_prefills, num_decode_tokens) of a batch: decodes first."""
    dec = [q for q, _ in requests if q <= DECODE_MAX_QUERY]
    return len(dec), len(requests) - len(dec), sum(dec)


def batch(gen: torch.Generator, common_metadata_cls, geom: dict | None = None,
          fill_topk=None) -> dict:
    """Block table, slot mapping of every position, logical top-k of every query token, and the
    batch as vLLM's CommonAttentionMetadata (`common_metadata_cls`); `geom` (a GEOMETRY entry)
    may set the requests and the top-k geometry; one with "kpool" takes its top-k buffer from
    `fill_topk(requests, gen)` (the line's pooled indexer op)."""
    geom = geom or {}
    requests, _, width = geometry_batch(geom)
    num_reqs = len(requests)
    max_blocks = max(math.ceil(s / BLOCK) for _, s in requests)
    num_blocks = num_reqs * max_blocks + 2
    perm = torch.randperm(num_blocks, generator=gen)[: num_reqs * max_blocks]
    block_table = perm.view(num_reqs, max_blocks).to(torch.int32)
    topk = torch.full((512, width), -1, dtype=torch.int32)
    req_of_token, pos_of_token, t = [], [], 0
    for r, (ql, sl) in enumerate(requests):
        for i in range(ql):
            pos = sl - ql + i
            if "kpool" not in geom:
                n = min(width - 32, pos + 1)  # some rows reach past index_topk
                sel = torch.randperm(pos + 1, generator=gen)[:n].to(torch.int32)
                cols = torch.randperm(width, generator=gen)[:n]  # -1 holes anywhere
                topk[t, cols] = sel
            req_of_token.append(r)
            pos_of_token.append(pos)
            t += 1
    if "kpool" in geom:
        topk = fill_topk(requests, gen)
        assert topk.shape == (512, width)
    all_slots = [  # every position of every request (the cache holds the whole sequence)
        torch.tensor([int(block_table[r, p // BLOCK]) * BLOCK + p % BLOCK for p in range(sl)])
        for r, (_, sl) in enumerate(requests)]
    q_lens = [q for q, _ in requests]
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    seq_lens = torch.tensor([s for _, s in requests], dtype=torch.int32)
    T = int(qsl[-1])
    new_slots = torch.cat([all_slots[r][-ql:] for r, (ql, _) in enumerate(requests)])
    cm = common_metadata_cls(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
        num_reqs=num_reqs, num_actual_tokens=T, max_query_len=max(q_lens),
        max_seq_len=int(seq_lens.max()), block_table_tensor=block_table,
        slot_mapping=new_slots.to(torch.int64), seq_lens_cpu_upper_bound=seq_lens.clone())
    return dict(block_table=block_table, num_blocks=num_blocks, topk=topk, T=T, cm=cm,
                all_slots=all_slots, req=req_of_token, pos=pos_of_token)


def reference_layer(q, b, ref_rows, layer, scale):
    """float64 MLA: ql = q_nope W_UK; softmax(scale [ql, q_pe] . k) . kv_c; then W_UV.
    ref_rows[r]: float64 [seq_len, 512 + rope] rows of request r by position; layer.W_UK [512, H, nope]
    and layer.W_UV64 [512, H, v] in float64."""
    heads = layer.num_heads
    out = torch.zeros(b["T"], heads, layer.v_head_dim, dtype=torch.float64)
    for t in range(b["T"]):
        idx = b["topk"][t]
        idx = idx[idx >= 0].long()
        keys = ref_rows[b["req"][t]][idx]  # [k, 512 + rope]
        ql = torch.einsum("hp,lhp->hl", q[t, :, : layer.qk_nope_head_dim].double(), layer.W_UK)
        qf = torch.cat([ql, q[t, :, layer.qk_nope_head_dim:].double()], -1)
        p = torch.softmax(scale * qf @ keys.T, dim=-1)
        lat = p @ keys[:, :LORA]
        out[t] = torch.einsum("hl,lhv->hv", lat, layer.W_UV64)
    return out.reshape(b["T"], -1)


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()
