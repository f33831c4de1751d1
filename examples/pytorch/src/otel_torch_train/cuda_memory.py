"""The PyTorch caching allocator's view of GPU memory, which NVML (and so gpulse) cannot see.

NVML reports what a process holds on the device: the CUDA context plus everything the caching
allocator reserved. The allocator knows how much of that reserve live tensors actually use
(``memory_allocated``), how much it keeps cached (``memory_reserved``) and the peak. This module
exports those as observable gauges and gives the epoch spans their peak.

The gauges report only devices on which this process already created a CUDA context
(``torch.cuda.is_initialized()``): asking about another would create a context from the metric
reader's thread, costing hundreds of MiB on a GPU the job may never use. With no CUDA, no torch,
or CUDA not initialized yet, the callbacks yield nothing: no points, no exceptions.

Devices carry ``hw.id`` (``GPU-<uuid>``, the same value gpulse puts on its points) and
``pytorch.cuda.device`` (torch's ordinal). No ``gpu.index``: torch's ordinal follows
``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` while NVML's index does not, so the two differ
on many machines and a join on them would be silently wrong; ``hw.id`` never is.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Dict, Iterable, List, Optional, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

_log = logging.getLogger(__name__)

ALLOCATED = "pytorch.cuda.memory.allocated"
RESERVED = "pytorch.cuda.memory.reserved"
MAX_ALLOCATED = "pytorch.cuda.memory.max_allocated"
HW_ID = "hw.id"
TORCH_DEVICE = "pytorch.cuda.device"


class CudaMemory(Protocol):
    """What this module needs from ``torch.cuda``; tests give a fake with several devices."""

    def devices(self) -> List[int]:
        """Ordinals of the devices with a CUDA context in this process; ``[]`` without CUDA."""

    def allocated(self, device: int) -> int: ...

    def reserved(self, device: int) -> int: ...

    def max_allocated(self, device: int) -> int: ...

    def max_reserved(self, device: int) -> int: ...

    def reset_peak(self, device: int) -> None: ...

    def synchronize(self) -> None:
        """Wait until the GPU has finished the work queued so far."""

    def uuid(self, device: int) -> Optional[str]:
        """``GPU-<uuid>`` as NVML spells it, or ``None`` when torch does not say."""

    def name(self, device: int) -> Optional[str]:
        """The device's marketing name (``NVIDIA H100 80GB HBM3``), or ``None``."""

    def summary(self, device: int) -> str:
        """``torch.cuda.memory_summary(device)``: the allocator's statistics as a text table."""


class NoCuda:
    """The backend when torch or CUDA is absent: no devices."""

    def devices(self) -> List[int]:
        return []

    def allocated(self, device: int) -> int:
        return 0

    def reserved(self, device: int) -> int:
        return 0

    def max_allocated(self, device: int) -> int:
        return 0

    def max_reserved(self, device: int) -> int:
        return 0

    def reset_peak(self, device: int) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def uuid(self, device: int) -> Optional[str]:
        return None

    def name(self, device: int) -> Optional[str]:
        return None

    def summary(self, device: int) -> str:
        return ""


class TorchCuda:
    """``torch.cuda`` behind the CudaMemory protocol."""

    def __init__(self, torch_module) -> None:
        self._cuda = torch_module.cuda
        self._uuids: Dict[int, Optional[str]] = {}

    def devices(self) -> List[int]:
        cuda = self._cuda
        if not cuda.is_available() or not cuda.is_initialized():
            return []
        current = cuda.current_device()
        # A device this process never allocated on is not one it uses: no point, rather than a
        # zero that reads as "measured, empty".
        return [
            device
            for device in range(cuda.device_count())
            if device == current or cuda.memory_reserved(device) > 0
        ]

    def allocated(self, device: int) -> int:
        return int(self._cuda.memory_allocated(device))

    def reserved(self, device: int) -> int:
        return int(self._cuda.memory_reserved(device))

    def max_allocated(self, device: int) -> int:
        return int(self._cuda.max_memory_allocated(device))

    def max_reserved(self, device: int) -> int:
        return int(self._cuda.max_memory_reserved(device))

    def reset_peak(self, device: int) -> None:
        self._cuda.reset_peak_memory_stats(device)

    def synchronize(self) -> None:
        for device in self.devices():
            self._cuda.synchronize(device)

    def uuid(self, device: int) -> Optional[str]:
        if device not in self._uuids:
            # Cached: the UUID never changes and get_device_properties is not free.
            self._uuids[device] = format_uuid(
                getattr(self._cuda.get_device_properties(device), "uuid", None)
            )
        return self._uuids[device]

    def name(self, device: int) -> Optional[str]:
        return str(self._cuda.get_device_name(device))

    def summary(self, device: int) -> str:
        return str(self._cuda.memory_summary(device))


def format_uuid(raw) -> Optional[str]:
    """torch's ``_CUuuid`` (or a string) as NVML's ``GPU-xxxxxxxx-...``; ``None`` if unknown."""
    if raw is None:
        return None
    text = str(raw).strip()
    if not text:
        return None
    if text.startswith(("GPU-", "MIG-")):
        return text
    return f"GPU-{text}"


def default_backend() -> CudaMemory:
    """torch.cuda when torch is importable, otherwise a backend with no devices."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811 - only when the training script has not imported it yet
        except ImportError:
            return NoCuda()
    return TorchCuda(torch)


def torch_cuda_module() -> Any:
    """``torch.cuda`` when the application imported torch and a GPU is usable, else ``None``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver means no CUDA timing, not a failed run
        return None


def device_attributes(backend: CudaMemory, device: int) -> Dict[str, object]:
    attributes: Dict[str, object] = {TORCH_DEVICE: device}
    uuid = backend.uuid(device)
    if uuid:
        attributes[HW_ID] = uuid
    return attributes


class MemoryGauges:
    """Registers the three observable gauges on ``meter``; their callbacks never raise."""

    def __init__(self, meter: Meter, backend: CudaMemory) -> None:
        self._backend = backend
        self._failed_once = False
        meter.create_observable_gauge(
            ALLOCATED,
            callbacks=[self._observe_allocated],
            unit="By",
            description="GPU memory occupied by live tensors (torch.cuda.memory_allocated)",
        )
        meter.create_observable_gauge(
            RESERVED,
            callbacks=[self._observe_reserved],
            unit="By",
            description=(
                "GPU memory held by PyTorch's caching allocator (torch.cuda.memory_reserved)"
            ),
        )
        meter.create_observable_gauge(
            MAX_ALLOCATED,
            callbacks=[self._observe_max_allocated],
            unit="By",
            description=(
                "Peak of pytorch.cuda.memory.allocated since the current epoch began "
                "(torch.cuda.max_memory_allocated; reset at each epoch start)"
            ),
        )

    def _observe(self, read) -> Iterable[Observation]:
        try:
            devices = self._backend.devices()
            return [
                Observation(read(device), device_attributes(self._backend, device))
                for device in devices
            ]
        except Exception as error:  # noqa: BLE001 - a metric callback must never break training
            if not self._failed_once:
                self._failed_once = True
                _log.warning(
                    "reading torch.cuda memory statistics failed (%s); the pytorch.cuda.memory.* "
                    "gauges will be missing points while this lasts",
                    error,
                )
            return []

    def _observe_allocated(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self._backend.allocated)

    def _observe_reserved(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self._backend.reserved)

    def _observe_max_allocated(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self._backend.max_allocated)


def reset_peaks(backend: CudaMemory) -> None:
    """Start a new peak on every initialized device (at an epoch's start)."""
    try:
        for device in backend.devices():
            backend.reset_peak(device)
    except Exception as error:  # noqa: BLE001 - losing a peak must not stop an epoch
        _log.debug("could not reset CUDA peak memory statistics: %s", error)


def peak_attributes(backend: CudaMemory) -> Dict[str, object]:
    """Epoch-span attributes: peaks since the last reset, the largest device's and per device."""
    try:
        devices = backend.devices()
        if not devices:
            return {}
        allocated = [backend.max_allocated(device) for device in devices]
        reserved = [backend.max_reserved(device) for device in devices]
    except Exception as error:  # noqa: BLE001
        _log.debug("could not read CUDA peak memory statistics: %s", error)
        return {}
    attributes: Dict[str, object] = {
        "pytorch.cuda.memory.peak_allocated": max(allocated),
        "pytorch.cuda.memory.peak_reserved": max(reserved),
    }
    if len(devices) > 1:
        attributes["pytorch.cuda.memory.peak_allocated.per_device"] = allocated
        attributes["pytorch.cuda.memory.peak_reserved.per_device"] = reserved
    return attributes
