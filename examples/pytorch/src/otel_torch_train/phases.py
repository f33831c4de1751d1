"""The phases of a step (``TrainingTelemetry.phase``): a child span of the step, a duration on
the step span (``phase_spans=False``), or, in a step that is not traced, only the live state's
phase; and how a span that failed is ended."""

from __future__ import annotations

from time import time_ns
from typing import TYPE_CHECKING, Any, Optional

from opentelemetry import context as otel_context
from opentelemetry.trace import Span, Status, StatusCode, set_span_in_context

from .live import LiveState

if TYPE_CHECKING:
    from .telemetry import TrainingTelemetry, _Step


def _error_status(error: BaseException) -> Status:
    return Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")


def _fail(span: Span, error: BaseException, end_time: Optional[int] = None) -> None:
    span.record_exception(error)
    span.set_status(_error_status(error))
    span.end(end_time=end_time)


class _NoPhase:
    """Stands in for a phase span in a step that is not traced (``step_spans_every``); the live
    state still learns the phase."""

    __slots__ = ("_live", "_name")

    def __init__(self, live: LiveState, name: str) -> None:
        self._live = live
        self._name = name

    def __enter__(self) -> None:
        self._live.enter_phase(self._name)
        return None

    def __exit__(self, *_exc: object) -> bool:
        self._live.exit_phase()
        return False


class _Phase:
    __slots__ = ("_telemetry", "_name", "_span", "_token")

    def __init__(self, telemetry: "TrainingTelemetry", name: str) -> None:
        self._telemetry = telemetry
        self._name = name

    def __enter__(self) -> Span:
        self._telemetry._sample_precision()
        self._telemetry._live.enter_phase(self._name)
        self._span = self._telemetry._tracer.start_span(self._name)
        self._token = otel_context.attach(set_span_in_context(self._span))
        return self._span

    def __exit__(self, exc_type: Any, error: Optional[BaseException], _tb: Any) -> bool:
        otel_context.detach(self._token)
        telemetry = self._telemetry
        telemetry._live.exit_phase()
        if error is not None:
            telemetry._last_error = error
            _fail(self._span, error)
            return False
        if telemetry._synchronize:
            telemetry._synchronize_devices()
        self._span.end()
        return False


class _PhaseTimer:
    """A phase recorded as ``training.phase.<name>.duration`` (seconds) on the step span."""

    __slots__ = ("_telemetry", "_step", "_name", "_key", "_start")

    def __init__(self, telemetry: "TrainingTelemetry", step: _Step, name: str) -> None:
        self._telemetry = telemetry
        self._step = step
        self._name = name
        self._key = f"training.phase.{name}.duration"

    def __enter__(self) -> None:
        self._telemetry._sample_precision()
        self._telemetry._live.enter_phase(self._name)
        self._start = time_ns()
        return None

    def __exit__(self, exc_type: Any, error: Optional[BaseException], _tb: Any) -> bool:
        self._telemetry._live.exit_phase()
        if error is not None:
            self._telemetry._last_error = error
        elif self._telemetry._synchronize:
            self._telemetry._synchronize_devices()
        phases = self._step.phases
        phases[self._key] = phases.get(self._key, 0.0) + (time_ns() - self._start) / 1e9
        return False
