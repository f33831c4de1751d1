"""What the load benchmark (benches/load/receiver_load.py), the real-time soak (scripts/soak
--real-time) and the load tests (tests/load/) share: the real OpenTelemetry Collector as the
upstream (otelcol-gpulse, built by scripts/backends) writing every span it gets to a file, a
counting of those spans (total, distinct span ids, enriched by gpulse), a small OTLP/HTTP span
sender that knows exactly which spans were accepted, and per-process CPU and memory readings.

Standard library plus opentelemetry-proto (the sender), which the test venv has
(tests/receiver/requirements.txt).
"""

import ctypes
import http.client
import json
import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BACKENDS_DIR = Path(os.environ.get("GPULSE_BACKENDS_DIR", Path.home() / ".cache" / "gpulse" / "backends"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
# What gpulse adds to a span whose process it knows (src/enrich/span_attributes.rs).
ENRICHED_KEY = "gpulse.gpu.samples"


def backend(name):
    """A binary scripts/backends built, or an error naming the command that builds it."""
    path = BACKENDS_DIR / "bin" / name
    if not os.access(path, os.X_OK):
        raise SystemExit(f"{path} is missing: build it with `scripts/backends` (pinned Go modules, cached)")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------------------------------
# Per-process readings


def rss_kib(pid):
    """VmRSS of `pid` in KiB, or None when it is gone."""
    return _status_kib(pid, "VmRSS:")


def hwm_kib(pid):
    """VmHWM (peak RSS) of `pid` in KiB, or None when it is gone."""
    return _status_kib(pid, "VmHWM:")


def _status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


_librt = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def cpu_seconds(pid):
    """CPU time of `pid`, all threads (exited ones included), from its CPU-time clock: ns
    resolution, where /proc's stat has 10 ms ticks."""
    clock = ctypes.c_int()
    if _librt.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        raise OSError(f"clock_getcpuclockid({pid}) failed: is the process gone?")
    ts = _Timespec()
    if _librt.clock_gettime(clock, ctypes.byref(ts)) != 0:
        raise OSError(ctypes.get_errno(), f"clock_gettime of pid {pid}")
    return ts.tv_sec + ts.tv_nsec / 1e9


# ---------------------------------------------------------------------------------------------
# The Collector as the upstream


def collector_config(grpc_port, http_port, traces_path, metrics_path=None):
    """OTLP in (gRPC and HTTP) and the traces out to a file, one JSON request per line. Metrics
    go to `metrics_path` the same way, rotated at 16 MB with one backup (where gpulse's own
    health is read back, see `HealthReader`), or without it to the debug exporter (basic: counts
    only, at info, which the warn-level log leaves out); logs always go there."""
    exporters = {"file/traces": {"path": str(traces_path), "format": "json"}, "debug": {"verbosity": "basic"}}
    metrics = ["debug"]
    if metrics_path is not None:
        exporters["file/metrics"] = {"path": str(metrics_path), "format": "json",
                                     "rotation": {"max_megabytes": 16, "max_backups": 1}}
        metrics = ["file/metrics"]
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                             "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
        "exporters": exporters,
        "service": {"telemetry": {"logs": {"level": "warn"}, "metrics": {"level": "none"}}, "pipelines": {
            "traces": {"receivers": ["otlp"], "exporters": ["file/traces"]},
            "metrics": {"receivers": ["otlp"], "exporters": metrics},
            "logs": {"receivers": ["otlp"], "exporters": ["debug"]}}},
    }


def forwarding_collector_config(grpc_port, http_port, upstream_grpc_port):
    """The pipeline gpulse's receiver replaces, run by the Collector: OTLP in (gRPC and HTTP),
    the batch processor as the Collector's documentation recommends, OTLP/gRPC out."""
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                             "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
        "processors": {"batch": {}},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{upstream_grpc_port}", "tls": {"insecure": True}}},
        "service": {"telemetry": {"logs": {"level": "warn"}, "metrics": {"level": "none"}},
                    "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                             "exporters": ["otlp"]}}},
    }


class Collector:
    """otelcol-gpulse on fixed ports, restartable: each start writes its spans to a new file,
    so that a restart never truncates what an earlier run received."""

    def __init__(self, work: Path, name="collector", config=None, keep_metrics=False):
        self.work = Path(work)
        self.name = name
        self.grpc_port, self.http_port = free_port(), free_port()
        self.metrics_path = self.work / f"{name}-metrics.jsonl" if keep_metrics else None
        self.make_config = config or (lambda g, h, path: collector_config(g, h, path, self.metrics_path))
        self.trace_files = []
        self.proc = None
        self.log = self.work / f"{name}.log"
        self.starts = 0

    def start(self, timeout=60):
        self.starts += 1
        traces = self.work / f"{self.name}-traces-{self.starts}.jsonl"
        self.trace_files.append(traces)
        path = self.work / f"{self.name}-{self.starts}.yaml"
        path.write_text(json.dumps(self.make_config(self.grpc_port, self.http_port, traces), indent=1))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(backend("otelcol-gpulse")), "--config", str(path)],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (port_open(self.http_port) and port_open(self.grpc_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Collector did not start (exit {self.proc.poll()}); "
                                   f"see {self.log}:\n{self.tail()}")
            time.sleep(0.1)
        return self

    def stop(self, timeout=30):
        """SIGTERM (the Collector drains its pipeline and closes the file), then SIGKILL."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines=20):
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class SpanCount:
    """The spans found in a Collector's trace files."""

    def __init__(self):
        self.total = 0
        self.ids = {}
        self.enriched = 0

    @property
    def distinct(self):
        return len(self.ids)

    @property
    def duplicates(self):
        return self.total - self.distinct

    def enriched_ids(self):
        return {i for i, e in self.ids.items() if e}


def count_spans(paths):
    """Counts the spans of the file exporter's JSON lines in `paths` (missing files count as
    empty): every span, its id, and whether gpulse enriched it."""
    count = SpanCount()
    for path in paths:
        try:
            f = open(path, encoding="utf-8")
        except FileNotFoundError:
            continue
        with f:
            for line in f:
                try:
                    request = json.loads(line)
                except ValueError:
                    continue  # a line cut by a SIGKILL
                for rs in request.get("resourceSpans", []):
                    for ss in rs.get("scopeSpans", []):
                        for span in ss.get("spans", []):
                            count.total += 1
                            enriched = any(a.get("key") == ENRICHED_KEY for a in span.get("attributes", []))
                            count.enriched += enriched
                            count.ids[span.get("spanId", "")] = enriched
    return count


# ---------------------------------------------------------------------------------------------
# gpulse with its OTLP/HTTP receiver


def start_gpulse_receiver(gpulse, lib, log, endpoint, queue_mib, extra=(), preexec_fn=None):
    """`gpulse run` on nvml-sim's built-in node (200 ms sampling, 1 s export) with its OTLP/HTTP
    receiver on a free port, exporting OTLP/HTTP to `endpoint` with `--queue-max-bytes
    queue_mib`MiB; waits until the receiver listens. Returns (process, receiver port)."""
    receiver = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GPULSE_"))}
    env.update({"GPULSE_LOG": "warn", "NO_COLOR": "1", "GPULSE_KUBELET_SOCKET": "none"})
    proc = subprocess.Popen(
        [str(gpulse), "run", "--nvml-lib", str(lib), "--sample-interval", "200ms", "--export-interval", "1s",
         "--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf", "--queue-max-bytes", f"{queue_mib}MiB",
         "--otlp-receiver-http", f"127.0.0.1:{receiver}", *extra],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "w"), preexec_fn=preexec_fn)
    deadline = time.monotonic() + 60
    while not port_open(receiver):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"gpulse did not start listening (exit {proc.poll()}):\n"
                               f"{Path(log).read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, receiver


# ---------------------------------------------------------------------------------------------
# gpulse's own metrics, as the Collector received them

HEALTH = ("gpulse.export.queue.size", "gpulse.export.queue.bytes", "gpulse.export.dropped",
          "gpulse.export.data_points.dropped", "gpulse.export.failures", "gpulse.nvml.errors",
          "gpulse.receiver.spans", "gpulse.receiver.refused")


def health_of(request):
    """{name: value summed over its points} of gpulse's health metrics in one OTLP JSON metrics
    request (the node resource's), or {} when it carries none."""
    values = {}
    for rm in request.get("resourceMetrics", []):
        for sm in rm.get("scopeMetrics", []):
            for metric in sm.get("metrics", []):
                name = metric.get("name")
                if name not in HEALTH:
                    continue
                data = metric.get("gauge") or metric.get("sum") or {}
                values[name] = sum(float(p.get("asDouble", p.get("asInt", 0))) for p in data.get("dataPoints", []))
    return values


class HealthReader:
    """Reads gpulse's latest health from the tail of the Collector's metrics file."""

    TAIL_BYTES = 4 << 20

    def __init__(self, path):
        self.path = Path(path)
        self.latest = {}
        self.updates = 0
        self.size = None

    def poll(self):
        """The latest health; `updates` counts the times it changed file position."""
        try:
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                if size == self.size:
                    return self.latest
                self.size = size
                f.seek(max(0, size - self.TAIL_BYTES))
                lines = f.read().split(b"\n")
        except OSError:
            return self.latest
        for line in reversed(lines):
            if b"gpulse.export.dropped" not in line:
                continue
            try:
                values = health_of(json.loads(line))
            except ValueError:
                continue  # the first, cut line of the tail
            if values:
                self.latest = values
                self.updates += 1
                break
        return self.latest


# ---------------------------------------------------------------------------------------------
# A span sender that knows what was accepted


class SpanSender(threading.Thread):
    """Sends OTLP/HTTP protobuf trace requests of `batch` spans to `url`, `rate` spans/s, one
    request at a time on a keep-alive connection, each with `timeout` as an SDK would. Each span
    id is unique (a random 24-bit run tag and a sequence number), so the receiving end can tell
    a lost span from a duplicate. Counts what was accepted (2xx), refused (any other answer: the
    SDK would retry 429/503 or drop the rest; this sender drops and counts) and failed
    (connection error or timeout), and the longest answer time."""

    def __init__(self, url, rate, batch=50, timeout=10.0, service="load-sender", padding=0):
        super().__init__(daemon=True)
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401
        self.url = url
        self.host, _, rest = url.removeprefix("http://").partition("/")
        self.path = "/" + rest
        self.rate = rate
        self.batch = batch
        self.timeout = timeout
        self.service = service
        # Bytes of one string attribute on every span: what an application's attributes weigh.
        self.padding = "x" * padding
        self.tag = random.getrandbits(24)
        self.seq = 0
        self.accepted_ids = []
        self.accepted = self.refused = self.failed = 0
        self.answers = {}
        self.max_answer_s = 0.0
        # The body of the last refusal (a google.rpc.Status; its message is readable text).
        self.last_refusal = None
        self.stopping = threading.Event()
        self.conn = None

    def span_id(self, seq):
        return struct.pack(">Q", (self.tag << 40) | seq)

    def request(self, first, count, now_ns):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
        from opentelemetry.proto.trace.v1.trace_pb2 import Span
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=self.service)))
        ss = rs.scope_spans.add()
        ss.scope.name = "gpulse-load"
        trace_id = random.getrandbits(128).to_bytes(16, "big")
        attributes = [KeyValue(key="load.padding", value=AnyValue(string_value=self.padding))] if self.padding else []
        for seq in range(first, first + count):
            ss.spans.append(Span(trace_id=trace_id, span_id=self.span_id(seq), name="step",
                                 kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=now_ns - 20_000_000,
                                 end_time_unix_nano=now_ns, attributes=attributes))
        return req.SerializeToString()

    def send_one(self):
        first, count = self.seq, self.batch
        self.seq += count
        body = self.request(first, count, time.time_ns())
        started = time.monotonic()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, timeout=self.timeout)
            self.conn.request("POST", self.path, body, {"Content-Type": "application/x-protobuf"})
            response = self.conn.getresponse()
            answer = response.read()
            status = response.status
            if not 200 <= status < 300:
                self.last_refusal = answer.decode("latin-1")
        except (OSError, http.client.HTTPException):
            status = None
            if self.conn is not None:
                self.conn.close()
            self.conn = None
        self.max_answer_s = max(self.max_answer_s, time.monotonic() - started)
        key = str(status) if status else "error"
        self.answers[key] = self.answers.get(key, 0) + 1
        if status and 200 <= status < 300:
            self.accepted += count
            self.accepted_ids.append((first, count))
        elif status:
            self.refused += count
        else:
            self.failed += count

    def run(self):
        interval = self.batch / self.rate
        next_at = time.monotonic()
        while not self.stopping.is_set():
            self.send_one()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stopping.wait(delay)
            else:
                next_at = time.monotonic()  # behind: do not burst to catch up

    def stop(self):
        self.stopping.set()
        self.join(self.timeout + 5)

    def accepted_hex_ids(self):
        """The hex span ids (as the Collector's JSON writes them) of every accepted span."""
        return {self.span_id(seq).hex() for first, count in self.accepted_ids for seq in range(first, first + count)}
