"""The 0.26.0 line's breakable CUDA graphs patch (eager breaks decided per call) is not
carried onto 0.33.0: 0.33.0's vllm/compilation/breakable_cudagraph.py::eager_break_during_capture
always installs its wrapper and checks for an active capture per call (no import-time
is_breakable_cudagraph_enabled() check). This is that patch's own test, run against the clone
(= 0.33.0's file, unchanged): it passes without the patch."""
import port_v4_interp  # noqa: F401


def test_decorator_breaks_when_enabled_after_import(monkeypatch):
    """A function decorated while VLLM_USE_BREAKABLE_CUDAGRAPH is unset (model
    code imported before VllmConfig auto-enables it) still becomes an eager
    break of a capture that runs later."""
    from vllm.compilation.breakable_cudagraph import (
        BreakableCUDAGraphCapture,
        eager_break_during_capture,
    )

    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)

    @eager_break_during_capture
    def f(x):
        return x + 1

    class RecordingCapture:
        _capturing = True

        def __init__(self):
            self.eager = []

        def add_eager(self, fn):
            self.eager.append(fn)
            return fn()

    capture = RecordingCapture()
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    BreakableCUDAGraphCapture._tls.active = capture
    try:
        assert f(1) == 2
    finally:
        BreakableCUDAGraphCapture._tls.active = None
    assert len(capture.eager) == 1
    assert capture.eager[0]() == 2  # replay calls fn again
    assert f(5) == 6  # no capture active: plain call


# ---------------------------------------------------------------------------
# BreakableCUDAGraphCapture: thread-local + nested rejection
# ---------------------------------------------------------------------------
