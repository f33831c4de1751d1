"""Where this rank is, while it is there: the live state gpulse reads to name the rank that holds
a stuck job (gpulse's ``distributed_hang``; docs/distributed.md, "A stuck job").

A span ends too late for a hang: a collective that never returns never ends its span, and a rank
that sleeps inside a step sends nothing. So the training thread writes where it is into a
``LiveState`` (a few attribute writes per step, phase and collective; ``bench_overhead.py``
measures them), and ``LiveReporter``, a daemon thread of this package, reads it every ``interval``
seconds. While a state (the step, its phase, the collective in flight) has lasted ``report_after``
seconds or more, which a healthy step never does, the reporter sends one log record per interval:

    event ``pytorch.training.live``, severity INFO, attributes
    training.step                         the global step in progress (the last one, between steps)
    training.live.phase                   data_wait, step (in a step, outside a named phase),
                                          a phase name (forward, backward, optimizer, checkpoint...)
    training.live.phase.elapsed           seconds in that phase
    training.live.step.elapsed            seconds since the step began (absent between steps)
    pytorch.distributed.collective.op     the oldest collective in flight (all_reduce, barrier...)
    pytorch.distributed.collective.seq    its number in this process (1, 2, ... in issue order)
    pytorch.distributed.collective.elapsed  seconds since it was issued
    code.stacktrace                       every thread's Python stack, once per state, after
                                          ``stack_after`` seconds in it

The resource is the companion's, so the record names the process, its rank and its job. Healthy
steps send nothing; a state sent once is sent again each interval while it lasts, so gpulse knows
the rank is still there. The reporter takes nothing from the training thread, which may be the one
that is stuck (a sleep, a blocking read, a collective that never returns all release the GIL).

Why a push and not a question from gpulse: asking would need gpulse to signal or connect into
every rank (across containers: a shared PID namespace and CAP_KILL, or a listening socket in the
training process); the record travels the OTLP path the job already uses.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from time import monotonic_ns
from typing import Any, Callable, Dict, Optional, Tuple

from opentelemetry._logs import SeverityNumber

_log = logging.getLogger(__name__)

EVENT_NAME = "pytorch.training.live"
STEP = "training.step"
PHASE = "training.live.phase"
PHASE_ELAPSED = "training.live.phase.elapsed"
STEP_ELAPSED = "training.live.step.elapsed"
COLLECTIVE_OP = "pytorch.distributed.collective.op"
COLLECTIVE_SEQ = "pytorch.distributed.collective.seq"
COLLECTIVE_ELAPSED = "pytorch.distributed.collective.elapsed"
STACKTRACE = "code.stacktrace"

#: The phase of a step outside any named phase.
IN_STEP = "step"
DATA_WAIT = "data_wait"

#: The longest stack text sent (every thread's); longer ones are cut and say so.
MAX_STACK_CHARS = 16_384


class LiveState:
    """Where the training loop is. Written by the training thread (and collective callbacks on
    torch's threads), read by the reporter; every field is one attribute, so each read or write
    is atomic under the GIL and needs no lock."""

    __slots__ = ("step", "step_since", "phase", "phase_since", "_seq", "in_flight", "_outer")

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.step_since: Optional[int] = None  # monotonic ns; None between steps
        self.phase: Optional[str] = None
        self.phase_since = 0
        self._seq = 0
        # seq -> (op, monotonic ns issued); replaced, never mutated, so a reader sees one whole.
        self.in_flight: Dict[int, Tuple[str, int]] = {}
        self._outer: list = []  # the phases a nested phase returns to

    def begin_step(self, step: int) -> None:
        now = monotonic_ns()
        self.step = step
        self.step_since = now
        self.phase = DATA_WAIT
        self.phase_since = now
        self._outer = []

    def got_batch(self) -> None:
        self.phase = IN_STEP
        self.phase_since = monotonic_ns()

    def end_step(self) -> None:
        self.step_since = None
        self.phase = None
        self._outer = []

    def enter_phase(self, name: str) -> None:
        self._outer.append((self.phase, self.phase_since))
        self.phase = name
        self.phase_since = monotonic_ns()

    def exit_phase(self) -> None:
        if self._outer:
            self.phase, since = self._outer.pop()
            # The outer phase goes on from now: its earlier part is not this state's duration.
            self.phase_since = monotonic_ns() if self.phase is not None else since

    def collective_issued(self, op: str) -> int:
        self._seq += 1
        seq = self._seq
        flight = dict(self.in_flight)
        flight[seq] = (op, monotonic_ns())
        self.in_flight = flight
        return seq

    def collective_done(self, seq: int) -> None:
        if seq in self.in_flight:
            flight = dict(self.in_flight)
            flight.pop(seq, None)
            self.in_flight = flight

    def read(self) -> Optional[dict]:
        """What the reporter sends, with the key that says whether the state changed; ``None``
        outside any step and phase."""
        step, step_since = self.step, self.step_since
        phase, phase_since = self.phase, self.phase_since
        flight = self.in_flight
        if phase is None and not flight:
            return None
        now = monotonic_ns()
        state: Dict[str, Any] = {}
        if step is not None:
            state[STEP] = step
        if phase is not None:
            state[PHASE] = phase
            state[PHASE_ELAPSED] = (now - phase_since) / 1e9
        if step_since is not None:
            state[STEP_ELAPSED] = (now - step_since) / 1e9
        # The state began when its phase did, or later when a collective was issued in it; a
        # collective outside any phase (a barrier between epochs) began its own state.
        since = phase_since if phase is not None else None
        if flight:
            seq = min(flight)
            op, issued = flight[seq]
            state[COLLECTIVE_OP] = op
            state[COLLECTIVE_SEQ] = seq
            state[COLLECTIVE_ELAPSED] = (now - issued) / 1e9
            since = issued if since is None else max(since, issued)
        key = (step, phase, phase_since, min(flight) if flight else None)
        state["_key"] = key
        state["_lasted"] = (now - since) / 1e9
        return state


def stacks(skip: Optional[int] = None, max_chars: int = MAX_STACK_CHARS) -> str:
    """Every thread's Python stack, innermost call last, as Python prints a traceback; the
    thread ``skip`` (the reporter's own) left out."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 - the documented way
        if ident == skip:
            continue
        lines = "".join(traceback.format_stack(frame))
        parts.append(f'Thread {ident} "{names.get(ident, "?")}" (most recent call last):\n{lines}')
    text = "\n".join(parts)
    if len(text) > max_chars:
        note = f"\n[cut by otel-torch-train: {len(text)} characters, the first shown]"
        text = text[: max_chars - len(note)] + note
    return text


class LiveReporter:
    """The daemon thread that sends ``state`` while a state lasts (see the module docs).

    ``logger`` makes the OpenTelemetry logger the records go to; it is called at the first one.
    """

    def __init__(
        self,
        state: LiveState,
        logger: Callable[[], Any],
        interval: float = 2.0,
        report_after: float = 10.0,
        stack_after: float = 20.0,
    ) -> None:
        if interval <= 0 or report_after < 0 or stack_after < 0:
            raise ValueError(
                "live reporting needs interval > 0 and report_after, stack_after >= 0 "
                f"(got {interval}, {report_after}, {stack_after})"
            )
        self._state = state
        # Called at the first record, so a job whose steps never linger builds no log exporter.
        self._make_logger = logger
        self._logger: Any = None
        self._interval = interval
        self._report_after = report_after
        self._stack_after = stack_after
        self._stop = threading.Event()
        self._stack_sent_for: Optional[tuple] = None
        self.sent = 0
        self._thread = threading.Thread(
            target=self._run, name="otel-torch-train live state", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self._interval + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.report_once()
            except Exception as error:  # noqa: BLE001 - telemetry must not stop training
                _log.debug("sending the live state failed: %s", error)

    def report_once(self) -> bool:
        """Sends the state when it has lasted long enough; whether it sent."""
        state = self._state.read()
        if state is None:
            return False
        key = state.pop("_key")
        lasted = state.pop("_lasted")
        if lasted < self._report_after:
            return False
        if lasted >= self._stack_after and self._stack_sent_for != key:
            self._stack_sent_for = key
            state[STACKTRACE] = stacks(skip=threading.get_ident())
        if self._logger is None:
            self._logger = self._make_logger()
        self._logger.emit(
            severity_number=SeverityNumber.INFO,
            severity_text="INFO",
            body=EVENT_NAME,
            attributes=state,
            event_name=EVENT_NAME,
        )
        self.sent += 1
        return True


def live_settings(env: Optional[Dict[str, str]] = None) -> Dict[str, float]:
    """``LiveReporter``'s settings from ``OTEL_TORCH_TRAIN_LIVE_INTERVAL``, ``_REPORT_AFTER`` and
    ``_STACK_AFTER`` (seconds), each defaulting to the reporter's own."""
    import os

    env = os.environ if env is None else env
    found: Dict[str, float] = {}
    for key, name in (
        ("interval", "OTEL_TORCH_TRAIN_LIVE_INTERVAL"),
        ("report_after", "OTEL_TORCH_TRAIN_LIVE_REPORT_AFTER"),
        ("stack_after", "OTEL_TORCH_TRAIN_LIVE_STACK_AFTER"),
    ):
        text = env.get(name, "").strip()
        if not text:
            continue
        try:
            found[key] = float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number of seconds (e.g. 2 or 0.5)") from None
    return found
