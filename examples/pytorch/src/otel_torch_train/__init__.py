"""otel-torch-train: OpenTelemetry traces and CUDA memory metrics for PyTorch training loops.

Resource attributes match what gpulse reports for the same process (``container.id``,
``process.vpid``, ``host.name``), so a backend can join the job's spans with its GPU metrics.
``status()`` shows this process's GPU state from PyTorch and from a running gpulse.
"""

from .cuda_memory import CudaMemory, NoCuda, TorchCuda
from .identity import ContainerIdentity, detect_container, parse_cgroup, parse_mountinfo
from .providers import Providers, TelemetryConfigError, build_providers
from .resource import DEFAULT_SERVICE_NAME, build_resource
from .status import StatusReport, status
from .telemetry import TrainingTelemetry, infer_batch_size

__version__ = "0.1.0"

__all__ = [
    "ContainerIdentity",
    "CudaMemory",
    "DEFAULT_SERVICE_NAME",
    "NoCuda",
    "StatusReport",
    "Providers",
    "TelemetryConfigError",
    "TorchCuda",
    "TrainingTelemetry",
    "build_providers",
    "build_resource",
    "detect_container",
    "infer_batch_size",
    "parse_cgroup",
    "parse_mountinfo",
    "status",
]
