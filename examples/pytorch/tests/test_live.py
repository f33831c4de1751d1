"""The live state: where the loop is, sent while a state lasts, with every thread's stack once.

Driven by a real training loop (``TrainingTelemetry.steps`` and phases, a thread that blocks in a
phase) and read back from the SDK's in-memory logs; the reporter's clock is real time with short
settings."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from otel_torch_train import TrainingTelemetry
from otel_torch_train.live import (
    COLLECTIVE_OP,
    COLLECTIVE_SEQ,
    EVENT_NAME,
    PHASE,
    PHASE_ELAPSED,
    STACKTRACE,
    STEP,
    STEP_ELAPSED,
    LiveReporter,
    LiveState,
    live_settings,
)


def logs():
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    return provider, exporter


def records(exporter):
    return [
        dict(r.log_record.attributes)
        for r in exporter.get_finished_logs()
        if r.log_record.event_name == EVENT_NAME
    ]


def test_a_state_is_read_with_its_step_phase_and_oldest_collective():
    live = LiveState()
    assert live.read() is None, "outside a step there is nothing to say"
    live.begin_step(7)
    assert live.read()[PHASE] == "data_wait"
    live.got_batch()
    live.enter_phase("backward")
    first = live.collective_issued("all_reduce")
    second = live.collective_issued("all_reduce")
    state = live.read()
    assert (state[STEP], state[PHASE]) == (7, "backward")
    assert (state[COLLECTIVE_OP], state[COLLECTIVE_SEQ]) == ("all_reduce", first)
    live.collective_done(first)
    assert live.read()[COLLECTIVE_SEQ] == second
    live.collective_done(second)
    assert COLLECTIVE_OP not in live.read()
    live.exit_phase()
    assert live.read()[PHASE] == "step", "back in the step, outside a named phase"
    live.end_step()
    assert live.read() is None
    # A collective between steps (a barrier at the end of an epoch) is a state of its own.
    barrier = live.collective_issued("barrier")
    time.sleep(0.05)
    state = live.read()
    assert (state[STEP], state[COLLECTIVE_OP]) == (7, "barrier") and PHASE not in state
    assert state["_lasted"] >= 0.05, state
    live.collective_done(barrier)
    assert live.read() is None


def test_healthy_steps_send_nothing_and_a_blocked_phase_is_sent_with_every_stack_once():
    provider, exporter = logs()
    tel = TrainingTelemetry(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(),
        logger_provider=provider,
        memory_gauges=False,
        collectives=False,
        live=False,
    )
    reporter = LiveReporter(
        tel._live, lambda: provider.get_logger("t"), interval=0.05, report_after=0.3, stack_after=0.6
    )
    blocked = threading.Event()
    release = threading.Event()

    def train():
        for step, _ in enumerate(tel.steps(range(20))):
            if step == 12:
                with tel.phase("checkpoint"):
                    blocked.set()
                    release.wait(5)
            else:
                time.sleep(0.01)

    worker = threading.Thread(target=train, name="training loop")
    worker.start()
    assert blocked.wait(5)
    time.sleep(1.2)
    release.set()
    worker.join(5)
    time.sleep(0.2)
    reporter.stop()
    sent = records(exporter)
    assert sent, "a phase blocked for 1.2 s with report_after 0.3 s sent nothing"
    assert {r[STEP] for r in sent} == {12}, sent
    assert {r[PHASE] for r in sent} == {"checkpoint"}
    assert all(r[PHASE_ELAPSED] >= 0.3 and r[STEP_ELAPSED] >= r[PHASE_ELAPSED] for r in sent)
    assert len(sent) >= 5, "the state is sent again each interval while it lasts"
    with_stack = [r for r in sent if STACKTRACE in r]
    assert len(with_stack) == 1, "the stacks go once per state"
    stack = with_stack[0][STACKTRACE]
    assert '"training loop"' in stack and "in train" in stack and "release.wait(5)" in stack, stack
    # Other tests' reporters may run in this process too: only this one's own thread is left out.
    assert f"Thread {reporter._thread.ident} " not in stack, "the reporter leaves its own thread out"
    tel.shutdown()


def test_settings_come_from_the_environment_and_bad_ones_say_which():
    assert live_settings({"OTEL_TORCH_TRAIN_LIVE_INTERVAL": "0.5"}) == {"interval": 0.5}
    with pytest.raises(ValueError, match="OTEL_TORCH_TRAIN_LIVE_STACK_AFTER='soon'"):
        live_settings({"OTEL_TORCH_TRAIN_LIVE_STACK_AFTER": "soon"})
    with pytest.raises(ValueError, match="interval > 0"):
        LiveReporter(LiveState(), lambda: None, interval=0)
