"""The upstream Collector stopped under span load (issue 38, item 3): gpulse's memory stays within
its queue bound, what it refuses or drops is counted in its own metrics and named in its log,
everything within the bound arrives once the Collector is back, and the sender is always
answered within its exporter timeout.

The outage lasts $GPULSE_LOAD_OUTAGE_S seconds (20 here and in CI; docs/reliability.md gives a
run of 60)."""

import os
import time

import otlp_load

QUEUE_MIB = 2
SPAN_RATE = 4000
SENDER_TIMEOUT_S = 2.0


def test_a_stopped_collector_under_span_load(tmp_path, binaries):
    gpulse, lib = binaries
    outage = float(os.environ.get("GPULSE_LOAD_OUTAGE_S", "20"))
    collector = otlp_load.Collector(tmp_path, keep_metrics=True).start()
    health = otlp_load.HealthReader(collector.metrics_path)
    log = tmp_path / "gpulse.log"
    proc, receiver = otlp_load.start_gpulse_receiver(gpulse, lib, log, f"http://127.0.0.1:{collector.http_port}",
                                                     QUEUE_MIB)
    sender = otlp_load.SpanSender(f"http://127.0.0.1:{receiver}/v1/traces", SPAN_RATE, batch=100,
                                  timeout=SENDER_TIMEOUT_S)
    rss = []
    try:
        sender.start()
        time.sleep(5)
        before = otlp_load.rss_kib(proc.pid)
        collector.stop()
        down_until = time.monotonic() + outage
        while time.monotonic() < down_until:
            rss.append(otlp_load.rss_kib(proc.pid))
            time.sleep(0.5)
        refused_in_outage = sender.refused
        collector.start()
        time.sleep(5)
        sender.stop()
        # Everything within the bound arrives: wait until every accepted span is in.
        wanted = sender.accepted_hex_ids()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            count = otlp_load.count_spans(collector.trace_files)
            if wanted <= set(count.ids):
                break
            time.sleep(1)
        # gpulse's health of after the outage (its metrics lane may still be backing off).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reading = health.poll()
            if reading.get("gpulse.receiver.spans", 0) >= sender.accepted:
                break
            time.sleep(1)
        assert proc.poll() is None, f"gpulse died: {log.read_text()[-3000:]}"
    finally:
        sender.stopping.set()
        proc.terminate()
        proc.wait(30)
        collector.stop()
    text = log.read_text()
    growth_mib = (max(r for r in rss if r) - before) / 1024
    missing = len(wanted - set(count.ids))
    dropped = reading.get("gpulse.export.data_points.dropped", 0)
    summary = (f"outage {outage:g} s; RSS before {before / 1024:.1f} MiB, +{growth_mib:.1f} MiB at most during it "
               f"(queue bound {QUEUE_MIB} MiB); sender: {sender.accepted} spans accepted, {sender.refused} refused "
               f"({refused_in_outage} during the outage), {sender.failed} unanswered, slowest answer "
               f"{sender.max_answer_s:.2f} s, answers {sender.answers}; at the Collector {count.total} spans, "
               f"{missing} accepted ones missing; gpulse's health {reading}")
    print(summary)
    # The application is always answered within its timeout, never left hanging by gpulse.
    assert sender.failed == 0, summary
    assert sender.max_answer_s < SENDER_TIMEOUT_S, summary
    # The outage filled the queue: the receiver refused, and said so in its metrics and its log.
    assert refused_in_outage > 0, f"the outage never filled the queue, nothing was tested: {summary}"
    assert reading.get("gpulse.receiver.refused", 0) > 0, summary
    assert "the OTLP receiver refuses requests: the export queue is full" in text, text[-3000:]
    # Memory within the bound: the queue's bytes plus a fixed allowance for the allocator.
    assert growth_mib < QUEUE_MIB + 8, summary
    # Every accepted span arrived, but those gpulse counted as dropped (its own metrics may push
    # the oldest requests out of a full queue; that is counted and logged).
    assert missing <= dropped, summary
    if missing:
        assert "the export queue is full" in text, text[-3000:]
    assert reading.get("gpulse.receiver.spans", 0) >= sender.accepted, summary
