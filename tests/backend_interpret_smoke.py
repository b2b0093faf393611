"""Backend smoke run under the Triton CPU interpreter, in its own process.

Usage: TRITON_INTERPRET=1 python tests/backend_interpret_smoke.py TREE
Drives TritonMLASparseMetadataBuilder.build (vLLM's SparseMLACommonMetadataBuilder)
+ TritonMLASparseImpl.forward_mqa on a tiny mixed decode/prefill batch (fp32,
16 heads, top-k 128; the query passed as vLLM's MLA layer passes it: a
(ql_nope, q_pe) pair of strided views) and prints "rel_err <x>" against the
float64 reference.  Relies on the stand-ins of smla.selection.import_vllm_tree
(vllm._C and the other compiled modules, cuda->meta tensor factories), on
vllm.utils.torch_utils.PIN_MEMORY = False (no accelerator to pin for) and on
the SimpleNamespace stand-ins of tests/gpu/test_backend_gpu.py for the
VllmConfig, KV-cache spec and DSA indexer.
"""
import os
import sys
import time

assert os.environ.get("TRITON_INTERPRET") == "1"
# vllm.triton_utils hands out the real Triton only with an active driver, or none expected: no GPU
# here, so say so (as a Ray worker does) and the kernels run in the interpreter as on a GPU.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "gpu"))
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402

import test_backend_gpu as T  # noqa: E402
from smla.selection import import_vllm_tree  # noqa: E402

print(import_vllm_tree(sys.argv[1]))
from vllm.v1.attention.backends.mla import triton_mla_sparse as m  # noqa: E402
import vllm.utils.torch_utils as torch_utils  # noqa: E402

# Stand-in: the mocked CUDA platform says pinned memory is available, but
# there is no accelerator to pin for on this machine.
torch_utils.PIN_MEMORY = False

T.REQUESTS = [(1, 300), (1, 70), (3, 100), (2, 2)]
T.TOPK = 128
dev = torch.device("cpu")
heads, dtype = 16, torch.float16  # the backend runs 16-bit models only
b, md = T.small_decode_case(m, dtype, dev, heads)
assert torch.equal(md.req_id_per_token, b["req_id"])
buf = torch.full((32, T.TOPK), -1, dtype=torch.int32)
buf[: b["T"]] = b["topk"]
impl = T._make_impl(m, heads, 0.06, SimpleNamespace(topk_indices_buffer=buf))
q = b["q"]
ql_nope = q[..., :512].transpose(0, 1).contiguous().transpose(0, 1)
t0 = time.time()
out, lse = impl.forward_mqa((ql_nope, q[..., 512:]), b["kv_cache"], md, None)
assert lse is None
slots = T.reference_convert(b["req_id"], b["block_table"], b["topk"], 64)
ref = T.reference_sparse_mla(q, b["kv_cache"], slots, 0.06)
print("rel_err", T.rel_err(out, ref), "secs", time.time() - t0, tuple(out.shape))
