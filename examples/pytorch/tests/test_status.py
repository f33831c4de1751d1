"""status(): PyTorch's view plus gpulse's, against a real local HTTP server serving a /status
document recorded from the real gpulse binary (fixtures/record_gpulse_status.sh), rendered the way
a notebook renders it (IPython's display formatter) and as text; and every way gpulse can be
missing."""

from __future__ import annotations

import copy
import json
import os
import socket
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import FIXTURES

from otel_torch_train import StatusReport, status
from otel_torch_train.status import DEFAULT_STATUS_URL, status_url

MiB = 1 << 20
RECORDED = json.loads((FIXTURES / "gpulse_status.json").read_text())
# gpulse's field schema (generated from its src/schema): every device field /status reports.
SCHEMA = json.loads((FIXTURES.parents[3] / "docs" / "schema.json").read_text())
# The recording's trainer is the process on GPU 0; its neighbour is on GPU 1.
TRAINER_PID = next(p["pid"] for p in RECORDED["processes"] if p["device_index"] == 0)
NEIGHBOUR_PID = next(p["pid"] for p in RECORDED["processes"] if p["device_index"] == 1)


def test_the_recording_has_every_device_field_of_gpulse_schema():
    # A field added to gpulse after the recording would be a key the companion never met here.
    keys = [f["key"] for f in SCHEMA["device_fields"] + SCHEMA["gpm_fields"]]
    assert len(keys) > 30
    for device in RECORDED["devices"]:
        missing = [k for k in keys if k not in device]
        assert not missing, (
            f"gpulse_status.json's GPU {device['index']} lacks {missing}: re-record it with "
            "examples/pytorch/tests/fixtures/record_gpulse_status.sh"
        )


class FakeCuda:
    """One initialized device with allocator figures the test sets."""

    def devices(self):
        return [0]

    def allocated(self, device):
        return 100 * MiB

    def reserved(self, device):
        return 256 * MiB

    def max_allocated(self, device):
        return 180 * MiB

    def max_reserved(self, device):
        return 300 * MiB

    def reset_peak(self, device):
        return None

    def synchronize(self):
        return None

    def uuid(self, device):
        return "GPU-7e57c0de-0000-4000-8000-00000000e2e0"

    def name(self, device):
        return "NVIDIA H100 80GB HBM3"

    def summary(self, device):
        return ""


def with_pid(document, old, new):
    """The recorded document with process ``old`` renamed ``new`` everywhere gpulse names it."""
    document = copy.deepcopy(document)
    for process in document["processes"]:
        if process["pid"] == old:
            process["pid"] = new
            process["workload"]["pid"] = new
            process["workload"]["vpid"] = new
    for finding in document["findings"]:
        subject = finding["subject"]
        if subject.get("pid") == old:
            subject["pid"] = new
            subject["vpid"] = new
        if "pids" in subject:
            subject["pids"] = [new if p == old else p for p in subject["pids"]]
    return document


class Server:
    """A real HTTP server on 127.0.0.1 answering GET /status as the test says."""

    def __init__(self, status=200, body=b"", content_type="application/json"):
        self.answer = (status, body, content_type)
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                outer.requests.append(self.path)
                code, payload, kind = outer.answer
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/status"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(document=None, **kwargs):
        if document is not None:
            kwargs.setdefault("body", json.dumps(document).encode())
        server = Server(**kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def notebook_render(report):
    """What Jupyter shows for a cell's value: IPython's display formatter, both mime types."""
    try:
        from IPython.core.formatters import DisplayFormatter
    except ImportError as error:
        reason = (
            f"IPython is not importable ({error}): the notebook rendering was NOT checked. "
            "Install the pinned set: pip install -r examples/pytorch/requirements-test.txt"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    data, _metadata = DisplayFormatter().format(report)
    return data


class Html(HTMLParser):
    """Collects text and checks every opened element is closed in order."""

    VOID = {"br"}

    def __init__(self, text):
        super().__init__()
        self.stack, self.text, self.cells = [], [], []
        self.feed(text)
        self.close()
        assert self.stack == [], f"unclosed elements: {self.stack}"

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack}"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self.stack and self.stack[-1] == "td":
            self.cells.append(data)

    @property
    def plain(self):
        return "".join(self.text)


def test_notebook_shows_torch_figures_and_gpulse_view_of_this_process(serve):
    me = os.getpid()
    server = serve(with_pid(RECORDED, TRAINER_PID, me))
    report = status(server.url, cuda=FakeCuda())
    assert server.requests == ["/status"]

    # What was read: this process on GPU 0 only, by host PID, and the findings about it.
    view = report.gpulse
    assert view.matched_by == f"host PID {me}"
    assert view.host_pids == [me]
    assert [(g.device_index, g.sm_utilization) for g in view.gpus] == [(0, 0.42)]
    assert [(f.rule, f.scope) for f in view.findings] == [
        ("memory_pressure", "GPU 0, all its processes"),
        ("memory_pressure", "this process on GPU 0"),
    ]
    assert view.findings[1].values["process_share_ratio"] == pytest.approx(0.9624, abs=1e-4)

    data = notebook_render(report)
    html = Html(data["text/html"])
    assert "cuda:0" in html.cells and "NVIDIA H100 80GB HBM3" in html.cells
    assert ["100.0 MiB", "256.0 MiB", "180.0 MiB"] == html.cells[3:6]
    assert f"This process is host PID {me}." in html.plain
    assert "42%" in html.cells  # its SM utilisation, from gpulse
    advice = RECORDED["findings"][1]["advice"]
    assert advice in html.plain
    assert str(NEIGHBOUR_PID) not in data["text/html"]

    text = data["text/plain"]
    assert text == str(report)
    assert f"GPU status of this process (pid {me})" in text
    assert "allocated 100.0 MiB, reserved 256.0 MiB, max allocated 180.0 MiB" in text
    assert "GPU 0 (GPU-7e57c0de-0000-4000-8000-00000000e2e0): SM 42%" in text
    assert "[warning] memory_pressure (this process on GPU 0): pid" in text
    assert f"      advice: {advice}" in text
    assert "GPU 1" not in text and str(NEIGHBOUR_PID) not in text


def test_html_escapes_what_gpulse_sends(serve):
    me = os.getpid()
    document = with_pid(RECORDED, TRAINER_PID, me)
    document["findings"][1]["summary"] = "<script>alert('x')</script> & more"
    report = status(serve(document).url, cuda=FakeCuda())
    rendered = report._repr_html_()
    assert "<script>" not in rendered
    assert "&lt;script&gt;" in rendered
    assert "<script>alert('x')</script> & more" in Html(rendered).plain


def test_a_containerised_process_is_matched_by_container_id_and_vpid(serve):
    container = "3f2a" + "0" * 60
    document = copy.deepcopy(RECORDED)
    trainer = next(p for p in document["processes"] if p["pid"] == TRAINER_PID)
    trainer["workload"].update(vpid=7, container_id=container)
    # The neighbour has the same vpid in another container: it must not be taken for us.
    neighbour = next(p for p in document["processes"] if p["pid"] == NEIGHBOUR_PID)
    neighbour["workload"].update(vpid=7, container_id="9" * 64)
    url = serve(document).url

    report = status(url, cuda=FakeCuda(), pid=7, container_id=container)
    assert report.gpulse.matched_by == "container 3f2a00000000 + vpid 7"
    assert report.gpulse.host_pids == [TRAINER_PID]
    assert [g.device_index for g in report.gpulse.gpus] == [0]
    assert "this process on GPU 0" in [f.scope for f in report.gpulse.findings]

    other = status(url, cuda=FakeCuda(), pid=8, container_id=container)
    assert other.gpulse.matched_by is None
    assert "none of them container 3f2a00000000 with vpid 8" in other.gpulse.note
    assert "no CUDA context yet" in str(other)


def test_gpulse_without_this_process_says_so(serve):
    report = status(serve(RECORDED).url, cuda=FakeCuda(), pid=1, container_id=None)
    assert report.gpulse.matched_by is None
    text = str(report)
    assert "gpulse lists 2 GPU process(es), none of them host PID 1" in text
    assert "allocated 100.0 MiB" in text  # the PyTorch half is still there
    assert "none of them host PID 1" in Html(report._repr_html_()).plain


def test_gpulse_still_starting_503(serve):
    server = serve(status=503, body=b"no window closed yet", content_type="text/plain")
    report = status(server.url, cuda=FakeCuda())
    assert report.gpulse is None
    assert "503" in report.gpulse_problem and "first window has not closed" in report.gpulse_problem
    assert "no window closed yet" in report.gpulse_problem
    data = notebook_render(report)
    assert "gpulse: not reachable." in data["text/plain"]
    assert "first window has not closed" in Html(data["text/html"]).plain
    assert "allocated 100.0 MiB" in data["text/plain"]


def test_nothing_listening_is_connection_refused():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Closed again: nothing listens on that port now.
    report = status(f"http://127.0.0.1:{port}", cuda=FakeCuda())
    assert report.gpulse is None
    assert report.url == f"http://127.0.0.1:{port}/status"
    assert "connection refused" in report.gpulse_problem
    assert f"--health-addr {port}" in report.gpulse_problem
    assert "connection refused" in Html(notebook_render(report)["text/html"]).plain


def test_a_port_that_never_answers_is_a_timeout():
    # Listening but never accepting: the connection opens (kernel backlog), no answer comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        report = status(f"http://127.0.0.1:{port}/status", cuda=FakeCuda(), timeout=0.3)
    assert report.gpulse is None
    assert "did not answer within 0.3 s (timeout)" in report.gpulse_problem


@pytest.mark.parametrize(
    "code, body, kind, expected",
    [
        (200, b"<html>grafana</html>", "text/html", "not with JSON"),
        (200, b'{"status": "ok"}', "application/json", "without a `processes` list"),
        (404, b"not found", "text/plain", "answered 404: this gpulse has no /status endpoint"),
        (500, b"boom", "text/plain", "answered HTTP 500"),
    ],
)
def test_something_else_on_the_port(serve, code, body, kind, expected):
    report = status(serve(status=code, body=body, content_type=kind).url, cuda=FakeCuda())
    assert report.gpulse is None
    assert expected in report.gpulse_problem


def test_a_url_that_is_not_http_is_reported_not_raised():
    report = status("ftp://127.0.0.1/status", cuda=FakeCuda())
    assert "is not an http:// URL" in report.gpulse_problem
    assert "GPULSE_STATUS_URL" in report.gpulse_problem


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, DEFAULT_STATUS_URL),
        ({"GPULSE_STATUS_URL": "http://10.0.0.1:9000/status"}, "http://10.0.0.1:9000/status"),
        ({"GPULSE_STATUS_URL": "http://127.0.0.1:9000"}, "http://127.0.0.1:9000/status"),
        ({"GPULSE_HEALTH_ADDR": "8687"}, "http://127.0.0.1:8687/status"),
        ({"GPULSE_HEALTH_ADDR": ":8687"}, "http://127.0.0.1:8687/status"),
        ({"GPULSE_HEALTH_ADDR": "0.0.0.0:8687"}, "http://127.0.0.1:8687/status"),
        ({"GPULSE_HEALTH_ADDR": "[::]:8687"}, "http://[::1]:8687/status"),
        (
            {"GPULSE_STATUS_URL": "http://127.0.0.1:1/status", "GPULSE_HEALTH_ADDR": "8687"},
            "http://127.0.0.1:1/status",
        ),
    ],
)
def test_where_gpulse_is_asked(environ, expected):
    assert status_url(None, environ) == expected


def test_the_environment_points_status_at_gpulse(serve, monkeypatch):
    me = os.getpid()
    server = serve(with_pid(RECORDED, TRAINER_PID, me))
    monkeypatch.setenv("GPULSE_STATUS_URL", server.url)
    report = status(cuda=FakeCuda())
    assert server.requests == ["/status"]
    assert isinstance(report, StatusReport)
    assert report.gpulse.host_pids == [me]


@pytest.mark.cpu_only
def test_real_torch_on_cpu_says_cuda_is_unavailable(torch):
    assert not torch.cuda.is_available()  # cpu_only tests are deselected where it is
    report = status("http://127.0.0.1:9/status", timeout=0.5)
    assert report.torch.torch_version == torch.__version__
    assert report.torch.devices == []
    text = str(report)
    assert f"PyTorch {torch.__version__}" in text
    assert "CUDA is not available to PyTorch" in text
    assert torch.cuda.is_initialized() is False  # status() created no CUDA context


def test_findings_of_its_job_count_those_of_other_processes_do_not(serve):
    me = os.getpid()
    document = with_pid(RECORDED, TRAINER_PID, me)
    process_finding = document["findings"][1]
    neighbour = copy.deepcopy(process_finding)
    neighbour["subject"].update(pid=NEIGHBOUR_PID, vpid=NEIGHBOUR_PID)
    neighbour["summary"] = "the neighbour's own trouble"
    job = {
        "rule": "uneven_multi_gpu",
        "severity": "warning",
        "subject": {
            "kind": "job",
            "key": {"by": "pid", "value": me},
            "pids": [me, NEIGHBOUR_PID],
            "devices": [d["uuid"] for d in document["devices"]],
        },
        "summary": "GPU 1 does 90% of the job's work, GPU 0 42%",
        "advice": "balance the work across the job's GPUs",
        "values": [["busiest_ratio", 0.9]],
        "since": process_finding["since"],
    }
    document["findings"] += [neighbour, job]
    report = status(serve(document).url, cuda=FakeCuda())
    scopes = [(f.rule, f.scope) for f in report.gpulse.findings]
    assert scopes == [
        ("memory_pressure", "GPU 0, all its processes"),
        ("memory_pressure", "this process on GPU 0"),
        ("uneven_multi_gpu", f"this job (pids {me}, {NEIGHBOUR_PID})"),
    ]
    assert "the neighbour's own trouble" not in str(report)
    assert "advice: balance the work across the job's GPUs" in str(report)
