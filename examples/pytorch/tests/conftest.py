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


@pytest.fixture
def torch():
    return require_torch()


def pytest_terminal_summary(terminalreporter):
    if _TORCH_SKIPS:
        terminalreporter.write_sep("!", "torch missing", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(_TORCH_SKIPS)} test(s) needing torch were SKIPPED: {_TORCH_SKIPS[0]}",
            red=True,
        )
