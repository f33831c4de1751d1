"""Fixtures of tests/backends (the helpers are in backend_stack.py): `stack`, the programs of one
test module; `workloads`, the GPU processes of node.toml; `local`, programs of one test only."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backend_stack import Stack, Workloads  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("backends"))
    yield s
    s.stop_all()


@pytest.fixture(scope="module")
def workloads(stack):
    w = Workloads(stack)
    yield w
    w.trainer.stop()
    w.idle.stop()
    w.remove_cgroups()


@pytest.fixture
def local(tmp_path):
    """Programs of one test only, stopped when it ends (the workloads stay for the module)."""
    s = Stack(tmp_path)
    yield s
    s.stop_all()
