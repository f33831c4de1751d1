"""What the training loop is configured to do, as span attributes gpulse's advice can quote.

gpulse sees a GPU waiting; only the loop knows why it could be: how the DataLoader is set up
(``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``, ``batch_size``),
whether the forward pass runs under ``torch.autocast`` (and in which dtype) and whether
``torch.compile`` compiled anything. This module reads those facts without changing them and
names them; ``TrainingTelemetry`` puts them on the run and epoch spans. The names are a contract
with gpulse's diagnosis rules, which read exactly these keys.

Everything here is read-only and never raises: a loader that is not a
``torch.utils.data.DataLoader`` gives only what it has, and without torch the autocast and compile
facts are simply absent.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional

LOADER_NUM_WORKERS = "pytorch.dataloader.num_workers"
LOADER_PIN_MEMORY = "pytorch.dataloader.pin_memory"
LOADER_PREFETCH_FACTOR = "pytorch.dataloader.prefetch_factor"
LOADER_PERSISTENT_WORKERS = "pytorch.dataloader.persistent_workers"
LOADER_BATCH_SIZE = "pytorch.dataloader.batch_size"
AUTOCAST_ENABLED = "pytorch.autocast.enabled"
AUTOCAST_DTYPE = "pytorch.autocast.dtype"
COMPILE_USED = "pytorch.compile.used"

# Device types whose autocast state is worth asking about, the GPU first: a loop that autocasts
# on CUDA and (by default, disabled) on CPU is a CUDA-autocast loop.
_AUTOCAST_DEVICE_TYPES = ("cuda", "cpu")


def loader_attributes(loader: Any) -> Dict[str, Any]:
    """The DataLoader settings of ``loader``, by attribute name; ``{}`` for a plain iterable.

    ``prefetch_factor`` is absent when the loader has no workers (PyTorch sets it to ``None``
    then: nothing is prefetched). ``batch_size`` comes from the batch sampler when the loader was
    built with one (``DataLoader.batch_size`` is ``None`` then), and is absent when batches are
    not of a fixed size.
    """
    attributes: Dict[str, Any] = {}
    num_workers = _int_or_none(getattr(loader, "num_workers", None))
    if num_workers is None:
        # Not a DataLoader (a list, a generator, a custom iterable): nothing to report.
        return attributes
    attributes[LOADER_NUM_WORKERS] = num_workers
    for key, name in (
        (LOADER_PIN_MEMORY, "pin_memory"),
        (LOADER_PERSISTENT_WORKERS, "persistent_workers"),
    ):
        value = getattr(loader, name, None)
        if isinstance(value, bool):
            attributes[key] = value
    prefetch = _int_or_none(getattr(loader, "prefetch_factor", None))
    if prefetch is not None and num_workers > 0:
        attributes[LOADER_PREFETCH_FACTOR] = prefetch
    batch_size = _int_or_none(getattr(loader, "batch_size", None))
    if batch_size is None:
        sampler = getattr(loader, "batch_sampler", None)
        batch_size = _int_or_none(getattr(sampler, "batch_size", None))
    if batch_size is not None:
        attributes[LOADER_BATCH_SIZE] = batch_size
    return attributes


def _int_or_none(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def autocast_state() -> Optional[str]:
    """The dtype autocast runs in right now (``"bfloat16"``), ``""`` when off, ``None`` without
    torch (the training script never imported it, so there is nothing to ask)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        for device_type in _AUTOCAST_DEVICE_TYPES:
            if torch.is_autocast_enabled(device_type):
                return dtype_name(torch.get_autocast_dtype(device_type))
    except Exception:  # noqa: BLE001 - an old torch without per-device autocast queries
        return None
    return ""


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` as ``bfloat16``: the name without the module, as people write it."""
    text = str(dtype)
    return text[len("torch.") :] if text.startswith("torch.") else text


def compile_used() -> Optional[bool]:
    """Whether ``torch.compile`` compiled at least one frame in this process so far.

    Read from TorchDynamo's process-wide counters (``frames.ok``), which count a compiled module
    and a compiled function alike. ``torch._dynamo`` is only looked at when something already
    imported it (``torch.compile`` does): importing it here would cost seconds. ``None`` without
    torch.
    """
    if sys.modules.get("torch") is None:
        return None
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:
        return False
    try:
        return int(dynamo_utils.counters["frames"]["ok"]) > 0
    except Exception:  # noqa: BLE001 - the counters are internal; their shape may change
        return False


class PrecisionWatch:
    """Remembers whether autocast was seen active, and in which dtype, across samples.

    Autocast is thread-local state that is only visible from inside its ``with`` block, so the
    telemetry samples it where the loop's code runs: on entering each phase and in
    ``record_step`` (until it has been seen in the epoch). Put ``tel.phase("forward")`` inside ``torch.autocast(...)`` (or call
    ``record_step`` inside it) for it to be seen.
    """

    __slots__ = ("seen", "dtype")

    def __init__(self) -> None:
        self.seen: Optional[bool] = None  # None: torch absent, nothing known
        self.dtype: Optional[str] = None

    def sample(self) -> None:
        state = autocast_state()
        if state is None:
            return
        if state:
            self.seen = True
            self.dtype = state
        elif self.seen is None:
            self.seen = False

    def merge(self, other: "PrecisionWatch") -> None:
        """Fold an epoch's observations into the run's."""
        if other.seen:
            self.seen = True
            self.dtype = other.dtype
        elif other.seen is False and self.seen is None:
            self.seen = False

    def attributes(self) -> Dict[str, Any]:
        attributes: Dict[str, Any] = {}
        if self.seen is not None:
            attributes[AUTOCAST_ENABLED] = self.seen
        if self.seen and self.dtype:
            attributes[AUTOCAST_DTYPE] = self.dtype
        compiled = compile_used()
        if compiled is not None:
            attributes[COMPILE_USED] = compiled
        return attributes
