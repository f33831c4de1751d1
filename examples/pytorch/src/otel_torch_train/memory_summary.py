"""``torch.cuda.memory_summary()`` as one log record when a device's per-epoch peak keeps rising.

A peak of allocated memory (``max_memory_allocated``, reset at each epoch start) that is higher
every epoch is what a leak looks like from inside the process; the allocator's own summary (block
counts, cached vs. active, allocation retries, OOMs) is what an engineer then asks for. Sending it
continuously would be noise, so it is opt-in (``TrainingTelemetry(memory_summary_after=N)``) and
sent only when one device's peak has risen N epochs in a row: one record, then the count starts
again, so a steady leak gives at most one record every N epochs.

The record: event name ``pytorch.cuda.memory_summary``, severity WARN, the summary text as body
(cut to ``max_chars`` characters, ``pytorch.cuda.memory.summary.truncated`` says when), in the
epoch span's trace, with the device (``pytorch.cuda.device``, ``hw.id``), the epoch, the peak of
the epoch that completed the streak and the peak before the streak. A one-line warning goes to
Python's ``logging`` as well, for whoever reads the job's output rather than a backend.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional

from opentelemetry._logs import Logger, SeverityNumber
from opentelemetry.context import Context

from .cuda_memory import HW_ID, TORCH_DEVICE, CudaMemory

_log = logging.getLogger(__name__)

EVENT_NAME = "pytorch.cuda.memory_summary"
RISING_EPOCHS = "pytorch.cuda.memory.summary.rising_epochs"
TRUNCATED = "pytorch.cuda.memory.summary.truncated"
PEAK_ALLOCATED = "pytorch.cuda.memory.peak_allocated"
PEAK_BEFORE = "pytorch.cuda.memory.peak_allocated.before"
EPOCH = "training.epoch"

#: Enough for the full (non-abbreviated) summary of one device, about 6 KB.
DEFAULT_MAX_CHARS = 16_384
_MIN_MAX_CHARS = 256


class _Streak:
    __slots__ = ("last_peak", "start_peak", "rises")

    def __init__(self, peak: int) -> None:
        self.last_peak = peak
        self.start_peak = peak
        self.rises = 0


class PeakGrowthWatch:
    """Per device: how many epochs in a row the peak rose; sends the summary at the streak."""

    def __init__(
        self,
        backend: CudaMemory,
        logger: Logger,
        rising_epochs: int,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        if isinstance(rising_epochs, bool) or not isinstance(rising_epochs, int):
            raise TypeError(
                f"memory_summary_after must be a whole number of epochs, got {rising_epochs!r}"
            )
        if rising_epochs < 1:
            raise ValueError(
                f"memory_summary_after must be 1 or more epochs, got {rising_epochs}; "
                "leave it unset (None) to never send the memory summary"
            )
        if max_chars < _MIN_MAX_CHARS:
            raise ValueError(
                f"memory_summary_max_chars must be at least {_MIN_MAX_CHARS}, got {max_chars}: "
                "a shorter summary would not show even its header"
            )
        self._backend = backend
        self._logger = logger
        self._rising_epochs = rising_epochs
        self._max_chars = max_chars
        self._streaks: Dict[int, _Streak] = {}
        self.sent = 0

    def epoch_ended(self, epoch: int, context: Optional[Context]) -> None:
        """Compare each device's peak of the epoch that just ended with the previous epoch's."""
        try:
            backend = self._backend
            peaks = {device: backend.max_allocated(device) for device in backend.devices()}
        except Exception as error:  # noqa: BLE001 - a missed comparison must not stop training
            _log.debug("could not read CUDA peaks for the memory summary: %s", error)
            return
        for device, peak in peaks.items():
            streak = self._streaks.get(device)
            if streak is None:
                self._streaks[device] = _Streak(peak)
                continue
            if peak > streak.last_peak:
                streak.rises += 1
            else:
                streak.rises = 0
                streak.start_peak = peak
            streak.last_peak = peak
            if streak.rises >= self._rising_epochs:
                self._send(device, epoch, streak, context)
                streak.rises = 0
                streak.start_peak = peak

    def _send(self, device: int, epoch: int, streak: _Streak, context: Optional[Context]) -> None:
        try:
            text = self._backend.summary(device)
        except Exception as error:  # noqa: BLE001
            text = f"torch.cuda.memory_summary({device}) failed: {type(error).__name__}: {error}"
        truncated = len(text) > self._max_chars
        if truncated:
            note = f"\n[cut by otel-torch-train: {len(text)} characters, the first shown]"
            text = text[: self._max_chars - len(note)] + note
        attributes: Dict[str, object] = {
            TORCH_DEVICE: device,
            EPOCH: epoch,
            RISING_EPOCHS: self._rising_epochs,
            PEAK_ALLOCATED: streak.last_peak,
            PEAK_BEFORE: streak.start_peak,
            TRUNCATED: truncated,
        }
        try:
            uuid = self._backend.uuid(device)
        except Exception:  # noqa: BLE001
            uuid = None
        if uuid:
            attributes[HW_ID] = uuid
        _log.warning(
            "CUDA device %d: the per-epoch peak of allocated memory rose %d epochs in a row "
            "(%d -> %d bytes, epoch %d), which is how a leak looks; "
            "torch.cuda.memory_summary() was sent as a log record (%s)",
            device,
            self._rising_epochs,
            streak.start_peak,
            streak.last_peak,
            epoch,
            EVENT_NAME,
        )
        try:
            self._logger.emit(
                context=context,
                severity_number=SeverityNumber.WARN,
                severity_text="WARN",
                body=text,
                attributes=attributes,
                event_name=EVENT_NAME,
            )
            self.sent += 1
        except Exception as error:  # noqa: BLE001 - telemetry must not stop training
            _log.warning("sending the CUDA memory summary log record failed: %s", error)
