"""The Resource: join attributes, and the environment's precedence over detection and defaults."""

from __future__ import annotations

import os
import socket

import pytest

from otel_torch_train.identity import ContainerIdentity
from otel_torch_train.resource import build_resource

CID = "523c835670a5065bb35e0b537f4ab7fffdb6fa0d55b6d72d7b6bb4af0cf13045"
POD = "7d1a8f0e-3c5b-4d2a-9e6f-0a1b2c3d4e5f"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)


def test_detected_join_attributes():
    attributes = build_resource(identity=ContainerIdentity(CID, "docker", POD, "cgroup")).attributes
    assert attributes["process.pid"] == os.getpid()
    assert attributes["process.vpid"] == os.getpid()
    assert attributes["container.id"] == CID
    assert attributes["k8s.pod.uid"] == POD
    assert attributes["host.name"] == socket.gethostname()
    assert attributes["service.name"] == "pytorch-training"
    assert attributes["telemetry.sdk.language"] == "python"


def test_no_container_means_no_container_attributes():
    attributes = build_resource("svc", identity=ContainerIdentity()).attributes
    assert "container.id" not in attributes
    assert "k8s.pod.uid" not in attributes
    assert attributes["service.name"] == "svc"


def test_otel_service_name_wins_over_the_default(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "resnet-trainer")
    assert build_resource("svc", identity=ContainerIdentity()).attributes["service.name"] == (
        "resnet-trainer"
    )


def test_resource_attributes_env_overrides_detection(monkeypatch):
    # An operator correcting a wrong detection must not need a code change.
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", f"container.id=fixed,k8s.pod.uid={POD},service.name=from-env"
    )
    attributes = build_resource(
        "svc", identity=ContainerIdentity(CID, "docker", None, "cgroup")
    ).attributes
    assert attributes["container.id"] == "fixed"
    assert attributes["k8s.pod.uid"] == POD
    assert attributes["service.name"] == "from-env"


def test_service_name_variable_beats_resource_attributes(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-variable")
    assert build_resource(identity=ContainerIdentity()).attributes["service.name"] == (
        "from-variable"
    )


def test_extra_attributes_are_added():
    attributes = build_resource(
        identity=ContainerIdentity(), extra={"deployment.environment.name": "dev"}
    ).attributes
    assert attributes["deployment.environment.name"] == "dev"


def test_proc_root_is_used_for_detection(tmp_path):
    own = tmp_path / "self"
    own.mkdir()
    (own / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")
    assert build_resource(proc_root=str(tmp_path)).attributes["container.id"] == CID
