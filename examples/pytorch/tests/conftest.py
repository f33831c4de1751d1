"""Shared test plumbing: import paths, the torch requirement, and a loud note on skipped tests."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

EXAMPLE_DIR = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The tests run against the source tree, installed or not.
for path in (EXAMPLE_DIR / "src", EXAMPLE_DIR):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

_TORCH_SKIPS = []


def require_torch():
    """Import torch, or skip the test saying why; under CI=true a missing torch is a failure."""
    try:
        return importlib.import_module("torch")
    except ImportError as error:
        reason = (
            f"torch is not importable ({error}): the tests that run real PyTorch code did NOT run. "
            "Install the pinned set: pip install -r examples/pytorch/requirements-test.txt"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        _TORCH_SKIPS.append(reason)
        pytest.skip(reason)


def require_module(name: str, what: str):
    """Import an optional module the test needs, or skip saying what was not checked; under
    CI=true (where requirements-test.txt is installed) a missing module is a failure."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        reason = (
            f"{name} is not importable ({error}): {what} was NOT checked. "
            "Install the pinned set: pip install -r examples/pytorch/requirements-test.txt"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def torch():
    return require_torch()


@pytest.fixture
def cuda_torch():
    """torch with a CUDA device, for tests marked `cuda`. Those are deselected unless asked for
    (-m cuda); asked for on a machine where torch sees no device, they fail: a GPU test that
    passed by skipping would say the GPU path works when nothing checked it."""
    torch = require_torch()
    if not torch.cuda.is_available():
        pytest.fail(
            "this test was selected (-m cuda) but torch sees no CUDA device: run it on a GPU "
            "machine (scripts/device-check does), or leave -m cuda out to deselect it",
            pytrace=False,
        )
    return torch


_CPU_ONLY_DESELECTED = []


def pytest_collection_modifyitems(config, items):
    """Deselect the `cpu_only` tests where torch sees a CUDA device: they check what the
    companion does when CUDA is unavailable, which such a machine cannot show. Said at the end of
    the run, with the count."""
    cpu_only = [item for item in items if item.get_closest_marker("cpu_only")]
    if not cpu_only:
        return
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return  # the tests themselves fail (CI=true) or skip, loudly, through require_torch
    if not torch.cuda.is_available():
        return
    _CPU_ONLY_DESELECTED.extend(item.nodeid for item in cpu_only)
    config.hook.pytest_deselected(items=cpu_only)
    items[:] = [item for item in items if not item.get_closest_marker("cpu_only")]


def pytest_terminal_summary(terminalreporter):
    if _CPU_ONLY_DESELECTED:
        terminalreporter.write_sep("-", "cpu_only tests deselected")
        terminalreporter.write_line(
            f"{len(_CPU_ONLY_DESELECTED)} test(s) of the no-CUDA path did not run: torch sees a "
            "CUDA device here. They run on machines without one (CI)."
        )
    if _TORCH_SKIPS:
        terminalreporter.write_sep("!", "torch missing", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(_TORCH_SKIPS)} test(s) needing torch were SKIPPED: {_TORCH_SKIPS[0]}",
            red=True,
        )
