"""Shared fixtures for the deployment checks (tests/deploy): the repository root, and `absent()`,
which skips when something produced elsewhere is not there yet but FAILS under CI=true, where it
must be."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[2]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def absent(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI=true: this is required, not optional)")
    pytest.skip(f"NOT CHECKED: {reason}")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
