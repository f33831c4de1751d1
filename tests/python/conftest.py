"""Fixtures for the nvml-sim ABI cross-check: NVIDIA's own Python binding (nvidia-ml-py,
module ``pynvml``) reads the simulated libnvidia-ml.so.1.

pynvml opens the library by soname (``CDLL("libnvidia-ml.so.1")``) at ``nvmlInit``, and the
dynamic loader reads ``LD_LIBRARY_PATH`` only when a process starts, so every check runs pynvml
in a child Python process whose environment points at a temporary directory holding a copy of
the cdylib under that name, and whose ``NVML_SIM_SCENARIO`` names a scenario the test wrote.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB_NAME = "libnvidia_ml.so"


def _find_cdylib() -> Path:
    """$GPULSE_TARGET_DIR (a cargo target dir, or the profile dir in it), else target/debug."""
    candidates = []
    target = os.environ.get("GPULSE_TARGET_DIR")
    if target:
        candidates += [Path(target) / "debug" / LIB_NAME, Path(target) / LIB_NAME]
    candidates.append(REPO / "target" / "debug" / LIB_NAME)
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(
        f"{LIB_NAME} not found (looked in: {', '.join(map(str, candidates))}). "
        "Build it first with `cargo build -p nvml-sim`, or set GPULSE_TARGET_DIR to the "
        "cargo target directory it was built in.",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def cdylib() -> Path:
    return _find_cdylib()


PRELUDE = """
import json, sys
import pynvml
from pynvml import *

def err(fn, *args):
    try:
        fn(*args)
    except NVMLError as e:
        return [type(e).__name__, e.value, str(e)]
    return None

result = {}
"""


OTHER_NVML_SOURCE = REPO / "tests" / "fixtures" / "other-nvml" / "other_nvml.c"


@pytest.fixture(scope="session")
def other_nvml(tmp_path_factory) -> Path:
    """The independent C implementation (tests/fixtures/other-nvml), built with ``$CC`` (else
    ``cc``) as the Rust tests build it."""
    out = tmp_path_factory.mktemp("other-nvml") / "libnvidia-ml.so.1"
    cc = os.environ.get("CC", "cc")
    try:
        proc = subprocess.run(
            [cc, "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(out), str(OTHER_NVML_SOURCE)],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        pytest.fail(f"C compiler `{cc}` not found; install one or set CC", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"`{cc}` failed to build {OTHER_NVML_SOURCE}:\n{proc.stderr}", pytrace=False)
    return out


@pytest.fixture
def pynvml_run(cdylib, tmp_path):
    """Runs a snippet of pynvml code against a scenario; the snippet fills ``result`` (a dict
    of JSON values), which is returned. Optional ``env`` adds environment variables; ``lib``
    replaces nvml-sim with another library (the scenario is then ignored)."""

    def run(
        scenario: str,
        code: str,
        env: dict | None = None,
        timeout: float = 60,
        lib: Path | None = None,
    ):
        libdir = tmp_path / "lib"
        libdir.mkdir(exist_ok=True)
        shutil.copyfile(lib or cdylib, libdir / "libnvidia-ml.so.1")
        scenario_file = tmp_path / "scenario.toml"
        scenario_file.write_text(textwrap.dedent(scenario))
        script = PRELUDE + textwrap.dedent(code) + "\nprint('RESULT ' + json.dumps(result))\n"
        child_env = {
            k: v for k, v in os.environ.items() if not k.startswith("NVML_SIM_")
        }
        child_env["LD_LIBRARY_PATH"] = str(libdir)
        child_env["NVML_SIM_SCENARIO"] = str(scenario_file)
        child_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-c", script],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            pytest.fail(
                f"pynvml child failed (exit {proc.returncode}):\n{proc.stderr}\n{proc.stdout}",
                pytrace=False,
            )
        lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        assert lines, f"no result from child:\n{proc.stdout}\n{proc.stderr}"
        out = json.loads(lines[-1][len("RESULT "):])
        out["__stderr__"] = proc.stderr
        return out

    return run
