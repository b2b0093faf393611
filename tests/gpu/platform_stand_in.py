"""``vllm.platforms`` for the GPU machine's bundles (no vLLM installed there; tests/gpu/make-bundle.sh
and kpool-bundle.sh copy only kernel files and tests): ``current_platform`` answers as vLLM's
CudaPlatform does on that machine, from torch.cuda (an NVIDIA GPU, or none: then nothing is CUDA and
no capability is met, so the tests' CUDA skip marks apply). Only what the bundled tests and kernel
files call, with vLLM's signatures (vllm/platforms/interface.py, cuda.py):
  is_cuda, is_cuda_alike, is_rocm, is_cpu, fp8_dtype, get_device_capability (DeviceCapability),
  has_device_capability / is_device_capability (a (major, minor) tuple or <major><minor>),
  is_device_capability_family, is_arch_support_pdl.
tests/gpu/series_ops_stub.py and line_ops_stub.py install it (provide_platforms)."""
from __future__ import annotations

import sys
import types
from typing import NamedTuple

import torch


class DeviceCapability(NamedTuple):
    major: int
    minor: int

    def as_version_str(self) -> str:
        return f"{self.major}.{self.minor}"

    def to_int(self) -> int:
        assert 0 <= self.minor < 10
        return self.major * 10 + self.minor


class CudaPlatformStandIn:
    device_type = "cuda"
    device_name = "cuda"

    @staticmethod
    def is_cuda() -> bool:
        return torch.cuda.is_available() and torch.version.hip is None

    @classmethod
    def is_cuda_alike(cls) -> bool:
        return cls.is_cuda()

    @staticmethod
    def is_rocm() -> bool:
        return False

    @classmethod
    def is_cpu(cls) -> bool:
        return not cls.is_cuda()

    @staticmethod
    def fp8_dtype() -> torch.dtype:
        return torch.float8_e4m3fn

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability | None:
        if not cls.is_cuda():
            return None
        major, minor = torch.cuda.get_device_capability(device_id)
        return DeviceCapability(major=major, minor=minor)

    @classmethod
    def has_device_capability(cls, capability: tuple[int, int] | int, device_id: int = 0) -> bool:
        current = cls.get_device_capability(device_id=device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return current >= capability
        return current.to_int() >= capability

    @classmethod
    def is_device_capability(cls, capability: tuple[int, int] | int, device_id: int = 0) -> bool:
        current = cls.get_device_capability(device_id=device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return current == capability
        return current.to_int() == capability

    @classmethod
    def is_device_capability_family(cls, capability: int, device_id: int = 0) -> bool:
        current = cls.get_device_capability(device_id=device_id)
        return current is not None and current.to_int() // 10 == capability // 10

    @classmethod
    def is_arch_support_pdl(cls) -> bool:
        return cls.has_device_capability(90)


def provide_platforms() -> None:
    """``vllm.platforms`` (and ``vllm.platforms.interface``'s DeviceCapability) as the stand-in,
    where the ``vllm`` package is the tests' stand-in (sparse_mla_reference.provide_ops_package);
    a real vLLM, already imported, keeps its own."""
    vllm = sys.modules.get("vllm")
    if vllm is None or not getattr(vllm, "__smla_stub__", False) or "vllm.platforms" in sys.modules:
        return
    interface = types.ModuleType("vllm.platforms.interface")
    interface.DeviceCapability = DeviceCapability
    interface.__smla_stub__ = True
    platforms = types.ModuleType("vllm.platforms")
    platforms.__path__ = []
    platforms.__smla_stub__ = True
    platforms.interface = interface
    platforms.current_platform = CudaPlatformStandIn()
    platforms.CudaPlatformStandIn = CudaPlatformStandIn
    sys.modules["vllm.platforms"] = platforms
    sys.modules["vllm.platforms.interface"] = interface
    vllm.platforms = platforms
