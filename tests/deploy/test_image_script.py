"""scripts/image's answers to a machine that cannot build: each names what is missing and the
Debian package that brings it, and exits 2 before doing anything. (Building and running the
images is tests/container's job.)"""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_with_only(tmp_path, commands, *args, fake=()):
    """scripts/image with a PATH holding only `commands` (symlinks to the real ones) and `fake`
    ones (symlinks to `true`, never reached: the checks stop before any build)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for c in commands:
        (bin_dir / c).symlink_to(shutil.which(c))
    for c in fake:
        (bin_dir / c).symlink_to(shutil.which("true"))
    env = {k: v for k, v in os.environ.items() if k != "PATH"}
    env["PATH"] = str(bin_dir)
    return subprocess.run([shutil.which("bash"), str(REPO / "scripts" / "image"), *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_missing_engine_names_the_package(tmp_path):
    r = run_with_only(tmp_path, ["dirname", "id", "sed"])
    assert r.returncode == 2, r
    assert "'podman' not found" in r.stderr and "apt-get install podman runc" in r.stderr, r.stderr


def test_a_missing_dpkg_deb_names_the_package(tmp_path):
    r = run_with_only(tmp_path, ["dirname", "id", "sed"], fake=["podman"])
    assert r.returncode == 2, r
    assert "'dpkg-deb' not found" in r.stderr and "apt-get install dpkg" in r.stderr, r.stderr


def test_an_unknown_argument_is_named(tmp_path):
    r = subprocess.run([str(REPO / "scripts" / "image"), "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "unknown argument '--bogus'" in r.stderr
