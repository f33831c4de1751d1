"""`gpulse top` inside the running node-agent container (`podman exec -it ... gpulse top`), in a
real terminal (tmux): it draws the simulated GPU and the process of another container, and on
SIGTERM and SIGHUP it leaves the alternate screen and exits 0, so the operator's terminal is
usable again."""

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from engine import host_and_ns_pid, podman, podman_env, wait_until
from test_node_agent import logs, run_agent

TMUX = shutil.which("tmux")


class Tmux:
    def __init__(self):
        if TMUX is None:
            pytest.fail("tmux is missing: apt-get install tmux")
        self.socket = f"gpulse-container-top-{uuid.uuid4().hex[:8]}"

    def run(self, *args) -> str:
        r = subprocess.run([TMUX, "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True,
                           env=podman_env())
        assert r.returncode == 0, f"tmux {args} failed: {r.stderr}"
        return r.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def alternate_on(self) -> bool:
        return self.run("display-message", "-p", "-t", "top", "#{alternate_on}").strip() == "1"

    def kill(self):
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True)


@pytest.mark.parametrize("signal", ["TERM", "HUP"])
def test_top_in_the_container_draws_and_restores_the_terminal(gpulse_image, collector, workload, tmp_path, signal):
    port, _ = collector
    host_pid, _ = host_and_ns_pid(workload, "/bin/busybox sleep")
    agent = run_agent(tmp_path, port, host_pid)
    tmux = Tmux()
    try:
        wait_until("gpulse to start", lambda: " starting " in logs(agent), timeout=60, logs=lambda: logs(agent))
        command = (f"podman exec -it -e GPULSE_LOG=warn -e GPULSE_KUBELET_SOCKET=none {agent} /usr/local/bin/gpulse top; "
                   "echo top-exit=$?; exec sleep 600")
        tmux.run("new-session", "-d", "-s", "top", "-x", "140", "-y", "40", "sh", "-c", command)
        screen = wait_until("the view with the simulated GPU and the other container's process",
                            lambda: (lambda s: s if "H100" in s and str(host_pid) in s else None)(tmux.screen()),
                            timeout=60, logs=lambda: tmux.screen())
        assert tmux.alternate_on(), "the view is not on the alternate screen"
        top_pid, _ = wait_until("gpulse top's host PID", lambda: _top_pid(agent), timeout=10)
        subprocess.run(["kill", f"-{signal}", str(top_pid)], check=True)
        after = wait_until("gpulse top to exit", lambda: (lambda s: s if "top-exit=" in s else None)(tmux.screen()),
                           timeout=10, logs=lambda: tmux.screen())
        assert "top-exit=0" in after, after
        assert not tmux.alternate_on(), "SIG" + signal + " left the terminal on the alternate screen"
        assert "H100" not in after, f"the view is still on screen after SIG{signal}: {after}"
        assert "H100" in screen
    finally:
        tmux.kill()
        podman("rm", "-f", "-t", "0", agent, check=False)


def _top_pid(agent):
    """The PID of `gpulse top` in the agent's cgroup. (`podman top` lists every host process for a
    container in the host's PID namespace, the tmux shell's `podman exec ... gpulse top` included.)"""
    ctr_id = podman("inspect", "--format", "{{.Id}}", agent).stdout.strip()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if argv[:2] == [b"/usr/local/bin/gpulse", b"top"] and ctr_id in cgroup:
            return int(proc.name), argv
    return None
