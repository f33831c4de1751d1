"""Fixtures of the container-engine tests: the images (built once per run by scripts/image), the
real Collector with its file exporter, and cleanup of every `gpulse-test-*` container and pod."""

import pytest

from engine import BUSYBOX_IMAGE_OR_BUILD, REPO, build_images, name, podman, require_engine
from backend_stack import Stack, backend, free_port, port_open


@pytest.fixture(scope="session")
def engine():
    require_engine()
    yield
    for kind in ("pod", "container"):
        names = podman(kind, "ls", "-a", "--format", "{{.Name}}", check=False).stdout.split()
        gone = [n for n in names if n.startswith("gpulse-test-")]
        if gone:
            podman(kind, "rm", "-f", *gone, check=False)


@pytest.fixture(scope="session")
def gpulse_image(engine):
    build_images("gpulse")
    return "localhost/gpulse:dev"


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path)
    yield s
    s.stop_all()


@pytest.fixture
def collector(stack, tmp_path):
    """otel-config/debug.yaml as shipped, its OTLP/HTTP receiver on all addresses (containers
    reach it through host.containers.internal), its file exporter writing tmp_path/otlp.jsonl.
    Returns (port, path of the OTLP/JSON lines)."""
    port, grpc = free_port(), free_port()
    sets = [f"receivers::otlp::protocols::http::endpoint=0.0.0.0:{port}",
            f"receivers::otlp::protocols::grpc::endpoint=127.0.0.1:{grpc}",
            "exporters::debug::verbosity=basic", "service::telemetry::metrics::level=none"]
    stack.start("collector", [backend("otelcol-gpulse"), "--config", REPO / "otel-config" / "debug.yaml"]
                + [f"--set={s}" for s in sets], cwd=tmp_path)
    stack.wait_until("the collector's OTLP/HTTP port", lambda: port_open(port), timeout=60)
    return port, tmp_path / "otlp.jsonl"


@pytest.fixture
def workload(engine):
    """A process in another real container: busybox `sleep` under a busybox shell, so the GPU
    process is not its container's PID 1 and its namespace PID is not 1."""
    ctr = name("workload")
    podman("run", "-d", "--name", ctr, BUSYBOX_IMAGE_OR_BUILD(),
           "/bin/busybox", "sh", "-c", "/bin/busybox sleep 600 & wait")
    yield ctr
    podman("rm", "-f", "-t", "0", ctr, check=False)
