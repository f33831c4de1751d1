"""gpulse's OTLP receiver under the Collector project's load generator (telemetrygen), forwarding
to the real Collector: every span arrives exactly once, enriched (telemetrygen is one of the
simulated node's GPU processes, found by its connection). Over gRPC and over HTTP, at 1000
spans/s for a few seconds (benches/load/receiver_load.py measures the higher rates)."""

import time
from types import SimpleNamespace

import pytest

import otlp_load
import receiver_load


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_every_span_arrives_exactly_once_and_enriched(tmp_path, binaries, protocol):
    gpulse, lib = binaries
    (tmp_path / "scenario.toml").write_text(receiver_load.SCENARIO)
    collector = otlp_load.Collector(tmp_path).start()
    args = SimpleNamespace(seconds=5, worker_rate=1000, batch_size=100, gpulse=gpulse, sim_lib=lib)
    grpc_port, http_port = otlp_load.free_port(), otlp_load.free_port()
    endpoint = f"127.0.0.1:{grpc_port if protocol == 'grpc' else http_port}"
    holder, log = receiver_load.telemetrygen_holder(tmp_path, "load", endpoint, protocol, 1000, args)
    middle = None
    try:
        middle = receiver_load.start_middle("gpulse", tmp_path, "gpulse", collector.grpc_port, holder.pid,
                                            grpc_port, http_port, args)
        holder.stdin.write("go\n")
        holder.stdin.close()
        assert holder.wait(60) == 0, log.read_text()[-2000:]
        generated = receiver_load.generated_spans(log)
        assert generated >= 2000, f"telemetrygen generated only {generated} spans:\n{log.read_text()[-2000:]}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            count = otlp_load.count_spans(collector.trace_files)
            if count.total >= generated:
                break
            time.sleep(0.5)
        time.sleep(1)  # a duplicate would come after
        count = otlp_load.count_spans(collector.trace_files)
    finally:
        for proc in (holder, middle):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(15)
        collector.stop()
    gpulse_log = (tmp_path / "gpulse.log").read_text()
    assert count.distinct == generated, (f"{generated} spans sent, {count.distinct} distinct arrived "
                                         f"({count.total} in all):\n{gpulse_log[-3000:]}")
    assert count.total == generated, f"{count.duplicates} spans arrived more than once"
    assert count.enriched == generated, f"only {count.enriched} of {generated} spans were enriched"
