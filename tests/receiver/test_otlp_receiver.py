"""Checks of the OTLP test receiver itself: the Rust end-to-end tests trust its fault modes, so
they are pinned here with independent clients (urllib, the grpc stubs)."""

import gzip
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "otlp_receiver.py")


def request_bytes(name="hw.gpu.utilization"):
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    metric = req.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = name
    metric.gauge.data_points.add().as_double = 0.5
    return req.SerializeToString()


@pytest.fixture
def start(tmp_path):
    procs = []

    def run(*args):
        out = tmp_path / f"out{len(procs)}.jsonl"
        proc = subprocess.Popen(
            [sys.executable, SCRIPT, "--output", str(out), *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        ports = json.loads(proc.stdout.readline())

        def lines():
            if not out.exists():
                return []
            return [json.loads(line) for line in out.read_text().splitlines()]

        return ports, lines, proc

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def post(port, body, headers=None, path="/v1/metrics"):
    headers = {"Content-Type": "application/x-protobuf", **(headers or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_http_gzip_request_is_recorded_with_its_headers(start):
    ports, lines, _ = start()
    status, _, body = post(
        ports["http"], gzip.compress(request_bytes()), {"Content-Encoding": "gzip", "X-Key": "v"}
    )
    assert status == 200
    metrics_service_pb2.ExportMetricsServiceResponse.FromString(body)
    (line,) = lines()
    assert line["signal"] == "metrics" and line["transport"] == "http"
    assert line["content_encoding"] == "gzip"
    assert line["headers"]["x-key"] == "v"
    metric = line["request"]["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]
    assert metric["name"] == "hw.gpu.utilization"


def test_fail_until_file_answers_503_until_the_file_is_gone(start, tmp_path):
    flag = tmp_path / "down"
    flag.write_text("")
    ports, lines, _ = start("--fail-until-file", str(flag))
    status, _, body = post(ports["http"], request_bytes())
    assert status == 503
    assert "unavailable" in status_pb2.Status.FromString(body).message
    flag.unlink()
    assert post(ports["http"], request_bytes())[0] == 200
    assert [line["answer"] for line in lines()] == ["unavailable", "ok"]


def test_fail_signal_fails_only_that_signal(start):
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    ports, lines, _ = start("--fail-status", "unavailable", "--fail-signal", "traces")
    traces = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()
    assert post(ports["http"], traces, path="/v1/traces")[0] == 503
    assert post(ports["http"], request_bytes())[0] == 200
    assert post(ports["http"], traces, path="/v1/traces")[0] == 503
    assert [(line["signal"], line["answer"]) for line in lines()] == [
        ("traces", "unavailable"),
        ("metrics", "ok"),
        ("traces", "unavailable"),
    ]


def test_http_429_carries_retry_after_and_only_for_the_first_request(start):
    ports, _, _ = start("--fail-status", "http_429_retry_after", "--fail-count", "1", "--retry-after", "4")
    status, headers, _ = post(ports["http"], request_bytes())
    assert status == 429 and headers["Retry-After"] == "4"
    assert post(ports["http"], request_bytes())[0] == 200


def test_invalid_argument_is_a_400_with_an_rpc_status(start):
    ports, _, _ = start("--fail-status", "invalid_argument")
    status, headers, body = post(ports["http"], request_bytes())
    assert status == 400 and headers["Content-Type"] == "application/x-protobuf"
    assert status_pb2.Status.FromString(body).code == 3


def test_grpc_resource_exhausted_carries_retry_info(start):
    ports, lines, _ = start("--fail-status", "resource_exhausted_retry_info", "--retry-after", "3")
    with grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(request_bytes())
        with pytest.raises(grpc.RpcError) as raised:
            stub.Export(req, metadata=(("x-key", "v"),), timeout=5)
    err = raised.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = dict(err.trailing_metadata())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info)
    assert info.retry_delay.seconds == 3
    assert lines()[0]["headers"]["x-key"] == "v"


def test_partial_success_is_reported(start):
    ports, _, _ = start("--partial-success", "5")
    status, _, body = post(ports["http"], request_bytes())
    response = metrics_service_pb2.ExportMetricsServiceResponse.FromString(body)
    assert status == 200 and response.partial_success.rejected_data_points == 5


def test_sigterm_exits_zero(start):
    _, _, proc = start()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
