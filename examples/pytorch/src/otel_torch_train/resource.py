"""The OpenTelemetry Resource of a training process: the attributes a backend joins on.

gpulse puts each GPU process under a resource with ``container.id``, ``process.pid`` (host PID),
``process.vpid`` (PID in the process's own namespace) and ``host.name``. The application only knows
its own namespace, so it reports ``process.pid`` = ``process.vpid`` = ``os.getpid()``: the join key
is ``container.id`` + ``process.vpid`` on both sides (see docs/correlate.md).

Precedence, highest first: ``OTEL_SERVICE_NAME``, then ``OTEL_RESOURCE_ATTRIBUTES``, then what
is detected here, then the ``service.name`` default given by the caller. The environment wins so
an operator can always correct a wrong detection without touching code.
"""

from __future__ import annotations

import os
import socket
from typing import Mapping, Optional

from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    OTELResourceDetector,
    Resource,
)

from . import distributed
from .identity import ContainerIdentity, detect_container

#: Used when neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names the service.
DEFAULT_SERVICE_NAME = "pytorch-training"

PROCESS_PID = "process.pid"
PROCESS_VPID = "process.vpid"
CONTAINER_ID = "container.id"
K8S_POD_UID = "k8s.pod.uid"
HOST_NAME = "host.name"


def detected_attributes(
    identity: Optional[ContainerIdentity] = None,
    *,
    pid: Optional[int] = None,
    host_name: Optional[str] = None,
    proc_root: str = "/proc",
) -> dict:
    """The attributes this module detects by itself, before the environment is applied."""
    if identity is None:
        identity = detect_container(proc_root)
    own_pid = os.getpid() if pid is None else pid
    attributes = {
        PROCESS_PID: own_pid,
        PROCESS_VPID: own_pid,
        HOST_NAME: socket.gethostname() if host_name is None else host_name,
    }
    if identity.container_id:
        attributes[CONTAINER_ID] = identity.container_id
    if identity.pod_uid:
        attributes[K8S_POD_UID] = identity.pod_uid
    # The rank and job (pytorch.distributed.*), when a launcher started this process.
    attributes.update(distributed.attributes())
    return attributes


def build_resource(
    default_service_name: str = DEFAULT_SERVICE_NAME,
    *,
    extra: Optional[Mapping[str, object]] = None,
    identity: Optional[ContainerIdentity] = None,
    proc_root: str = "/proc",
) -> Resource:
    """Resource for this process: detected attributes, ``extra``, then the environment on top."""
    attributes = {SERVICE_NAME: default_service_name}
    attributes.update(detected_attributes(identity, proc_root=proc_root))
    if extra:
        attributes.update(extra)
    # OTELResourceDetector applies OTEL_RESOURCE_ATTRIBUTES and then OTEL_SERVICE_NAME.
    attributes.update(OTELResourceDetector().detect().attributes)
    return Resource.create(attributes)
