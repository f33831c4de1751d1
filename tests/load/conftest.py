"""Shared set-up of tests/load: the helpers of benches/load on the path, and the binaries the
tests run (gpulse and nvml-sim from the debug build scripts/test makes; the Collector and
telemetrygen from scripts/backends). A missing backend skips with the command that builds it;
under CI=true it fails instead."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches" / "load"))

import otlp_load  # noqa: E402


def require_backend(name):
    path = otlp_load.BACKENDS_DIR / "bin" / name
    if not os.access(path, os.X_OK):
        reason = f"{path} is missing: build it with `scripts/backends` (pinned Go modules, cached)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason} (CI=true: required)")
        pytest.skip(f"NOT CHECKED: {reason}")
    return path


@pytest.fixture
def binaries():
    """(gpulse, nvml-sim library) of the debug build, or $GPULSE_LOAD_GPULSE and
    $GPULSE_LOAD_SIM_LIB (the long runs of docs/reliability.md use the release build); the
    Collector and telemetrygen must be there too."""
    gpulse = Path(os.environ.get("GPULSE_LOAD_GPULSE", otlp_load.TARGET / "debug" / "gpulse"))
    lib = Path(os.environ.get("GPULSE_LOAD_SIM_LIB", otlp_load.TARGET / "debug" / "libnvidia_ml.so"))
    for p in (gpulse, lib):
        if not p.exists():
            pytest.fail(f"{p} is missing: run `cargo build --workspace` first (scripts/test does)")
    require_backend("otelcol-gpulse")
    require_backend("telemetrygen")
    return gpulse, lib
