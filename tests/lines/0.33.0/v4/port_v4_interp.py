"""pytest plugin (-p port_v4_interp) and import-time set-up: Triton kernels run under the
interpreter on the CPU, as vLLM's CUDA code would run them on a GPU."""
import os

os.environ["TRITON_INTERPRET"] = "1"



def _triton_for_the_interpreter():
    """vllm.triton_utils hands out its placeholder when no Triton driver is
    active (no GPU here), and the kernels would not be Triton functions. Under
    TRITON_INTERPRET=1 no driver is used: report the NVIDIA one active so that
    vLLM imports the real Triton."""
    from triton.backends import backends

    nvidia = backends["nvidia"].driver
    nvidia.is_active = staticmethod(lambda: True)


def _interpreter_rounds_bf16_to_nearest():
    """The interpreter (Triton 3.8) truncates float32 -> bfloat16 in .to(tl.bfloat16);
    GPUs round to nearest even (cvt.rn.bf16.f32), as torch does. Round as the GPU."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            x = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            data = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(data.reshape(src.data.shape), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_impl


_triton_for_the_interpreter()
_interpreter_rounds_bf16_to_nearest()


