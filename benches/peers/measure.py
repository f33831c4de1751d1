#!/usr/bin/env python3
"""Runs gpulse and its Python peers against the same nvml-sim scenario and prints what each
costs: CPU seconds per 1000 samples and peak RSS, and each peer's ratio to gpulse.

Standard library only (run it with any python3 >= 3.9); benches/peers/run.sh prepares the
venvs, the release builds and the simulator directory, then calls this.

CPU is whole-process: utime + stime + cutime + cstime of the process from /proc/<pid>/stat,
plus utime + stime of its live descendants, taken at the start and at the end of the measured
window (after a warm-up, so start-up is not counted). Peak RSS is the largest VmHWM
(/proc/<pid>/status) of the process or of any descendant seen while it ran: for the gpustat
loop that is one `gpustat --json` process, as each sample is a new one.
"""

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts everything and counts requests per path.

    HTTP/1.1 with keep-alive, as a collector is: under http.server's default (HTTP/1.0, one
    connection per request) every export would also pay a TCP connect."""

    protocol_version = "HTTP/1.1"
    counts = {}
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        with Sink.lock:
            Sink.counts[self.path] = Sink.counts.get(self.path, 0) + 1
        # An empty protobuf message is a valid Export*ServiceResponse (full success).
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

    @classmethod
    def count(cls, path):
        with cls.lock:
            return cls.counts.get(path, 0)


def start_sink():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def children_map():
    kids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(rest[1]), []).append(int(name))
    return kids


def descendants(pid):
    kids = children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def cpu_ticks(pid, with_children):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the ')' field 3 is index 0: utime=14, stime=15, cutime=16, cstime=17.
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def tree_cpu_seconds(pid):
    total = cpu_ticks(pid, True)
    for d in descendants(pid):
        try:
            total += cpu_ticks(d, False)
        except OSError:
            pass
    return total / CLK_TCK


def hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Run:
    """One measured process: started, warmed up, measured for `duration` seconds, stopped."""

    def __init__(self, name, argv, env, samples, scrape=None, interval=0.25):
        self.name, self.argv, self.env = name, argv, env
        self.samples_fn, self.scrape, self.interval = samples, scrape, interval
        self.peak_kib = 0
        self.scrapes = 0

    def measure(self, warmup, duration):
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=log, start_new_session=True
        )
        stop = threading.Event()
        threading.Thread(target=self._watch_rss, args=(proc.pid, stop), daemon=True).start()
        if self.scrape:
            threading.Thread(target=self._scrape, args=(stop,), daemon=True).start()
        try:
            time.sleep(warmup)
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during warm-up: {self._tail(log)}")
            cpu0, n0, t0 = tree_cpu_seconds(proc.pid), self.samples_fn(self), time.monotonic()
            time.sleep(duration)
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited while measured: {self._tail(log)}")
            cpu1, n1, t1 = tree_cpu_seconds(proc.pid), self.samples_fn(self), time.monotonic()
        finally:
            stop.set()
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        samples = n1 - n0
        if samples <= 0:
            raise RuntimeError(f"{self.name} took no samples: {self._tail(log)}")
        cpu = cpu1 - cpu0
        return {
            "name": self.name,
            "seconds": t1 - t0,
            "samples": samples,
            "cpu_s": cpu,
            "cpu_s_per_1000": cpu / samples * 1000,
            "core_percent": cpu / (t1 - t0) * 100,
            "peak_rss_mib": self.peak_kib / 1024,
        }

    def _watch_rss(self, pid, stop):
        while not stop.is_set():
            for p in [pid] + descendants(pid):
                self.peak_kib = max(self.peak_kib, hwm_kib(p))
            stop.wait(0.05)

    def _scrape(self, stop):
        # A Prometheus server scraping at the exporter's interval.
        while not stop.is_set():
            try:
                with urllib.request.urlopen(self.scrape, timeout=5) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                pass
            stop.wait(self.interval)

    @staticmethod
    def _tail(log):
        log.seek(0)
        return log.read()[-2000:].decode(errors="replace")


def nominal(interval):
    start = time.monotonic()
    return lambda run: int((time.monotonic() - start) / interval)


def count_lines(path):
    def samples(run):
        try:
            with open(path) as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    return samples


def table(rows, reference="gpulse"):
    ref = next((r for r in rows if r["name"] == reference), None)
    head = (
        f"| {'tool':<22} | samples | CPU s / 1000 samples | % of a core | peak RSS MiB "
        f"| CPU × {reference} | RSS × {reference} |"
    )
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for r in rows:
        cpu_x = r["cpu_s_per_1000"] / ref["cpu_s_per_1000"] if ref and ref["cpu_s"] > 0 else 0
        rss_x = r["peak_rss_mib"] / ref["peak_rss_mib"] if ref else 0
        print(
            f"| {r['name']:<22} | {r['samples']:>7} | {r['cpu_s_per_1000']:>20.3f} "
            f"| {r['core_percent']:>11.2f} | {r['peak_rss_mib']:>12.1f} "
            f"| {cpu_x:>12.1f} | {rss_x:>12.2f} |"
        )


def scenario_text(gpus, procs):
    """A count-template scenario: `procs` processes spread evenly over `gpus` GPUs."""
    signals = """
[device.signals]
gpu_util = { mean = 75, amplitude = 20, period = 30, stddev = 3, seed = 1, min = 0, max = 100 }
mem_util = { mean = 40, stddev = 5, seed = 2, min = 0, max = 100 }
temperature_c = { mean = 62, amplitude = 5, period = 120 }
power_w = { mean = 450, amplitude = 150, period = 30 }
clock_sm_mhz = { mean = 1700, stddev = 40, seed = 3 }
pcie_tx_kbps = { mean = 800000, stddev = 100000, seed = 4, min = 0 }
pcie_rx_kbps = { mean = 2000000, stddev = 200000, seed = 5, min = 0 }
"""
    process = """
[[device.process]]
pid = {pid}
count = {count}
name = "python3"
memory_used_mib = {{ mean = 4000, stddev = 64, seed = 6, min = 0 }}
sm_util = {{ mean = 10, stddev = 1, seed = 7, min = 0, max = 100 }}
mem_util = {{ mean = 5, stddev = 1, seed = 8, min = 0, max = 100 }}
"""
    text = "[driver]\nversion = \"570.124.06\"\n"
    if procs >= gpus:
        if procs % gpus:
            raise ValueError(f"{procs} processes do not spread evenly over {gpus} GPUs")
        text += f"\n[[device]]\ncount = {gpus}\n" + signals
        text += process.format(pid=200000, count=procs // gpus)
    else:
        text += f"\n[[device]]\ncount = {procs}\n" + signals + process.format(pid=200000, count=1)
        text += f"\n[[device]]\ncount = {gpus - procs}\n" + signals
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpulse", required=True, help="gpulse release binary")
    ap.add_argument("--sim-dir", required=True, help="dir holding the sim as libnvidia-ml.so.1")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--venvs", required=True, help="dir with the nvitop, gpustat, openlit venvs")
    ap.add_argument("--interval", type=float, default=0.25, help="sampling interval, seconds")
    ap.add_argument("--export-interval", default="1s", help="gpulse's export interval")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--peers", default="gpulse,nvitop-exporter,openlit,gpustat-json-loop")
    ap.add_argument("--sweep", action="store_true", help="also sweep gpulse over GPUs × processes")
    ap.add_argument("--sweep-interval", type=float, default=0.1)
    ap.add_argument("--sweep-duration", type=float, default=20)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    sink = start_sink()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    lib = os.path.join(args.sim_dir, "libnvidia-ml.so.1")
    base_env = dict(os.environ)
    base_env.update(
        LD_LIBRARY_PATH=args.sim_dir,
        NVML_SIM_SCENARIO=os.path.abspath(args.scenario),
        PYTHONDONTWRITEBYTECODE="1",
    )
    ms = f"{int(args.interval * 1000)}ms"

    def gpulse_run(env, interval, label="gpulse", export_interval=None):
        argv = [
            args.gpulse, "run", "--nvml-lib", lib,
            "--sample-interval", f"{int(interval * 1000)}ms",
            "--export-interval", export_interval or args.export_interval,
            "--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf",
            "--kubelet-socket", "none", "--log-level", "warn",
        ]
        return Run(label, argv, env, nominal(interval))

    venv = lambda name, exe: os.path.join(args.venvs, name, "bin", exe)  # noqa: E731
    workdir = tempfile.mkdtemp(prefix="gpulse-peers-")
    runs = []
    for peer in args.peers.split(","):
        env = dict(base_env)
        if peer == "gpulse":
            runs.append(gpulse_run(env, args.interval))
        elif peer == "gpulse-default-export":
            # As deployed: the default 10 s export interval, the same sampling.
            runs.append(gpulse_run(env, args.interval, peer, "10s"))
        elif peer == "nvitop-exporter":
            port = free_port()
            argv = [venv("nvitop", "nvitop-exporter"), "--port", str(port),
                    "--interval", str(args.interval)]
            runs.append(Run(peer, argv, env, lambda r: r.scrapes,
                            scrape=f"http://127.0.0.1:{port}/metrics", interval=args.interval))
        elif peer == "openlit":
            env.update(
                OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                OTEL_METRIC_EXPORT_INTERVAL=str(int(args.interval * 1000)),
            )
            code = (
                "import time, openlit\n"
                "openlit.init(collect_gpu_stats=True, application_name='bench',"
                " disable_batch=True)\n"
                "while True: time.sleep(3600)\n"
            )
            runs.append(Run(peer, [venv("openlit", "python"), "-c", code], env,
                            lambda r: Sink.count("/v1/metrics")))
        elif peer == "gpustat-json-loop":
            counter = os.path.join(workdir, "gpustat.count")
            loop = (f'while :; do "{venv("gpustat", "gpustat")}" --json >/dev/null && '
                    f'echo >> "{counter}"; sleep {args.interval}; done')
            runs.append(Run(peer, ["/bin/sh", "-c", loop], env, count_lines(counter)))
        else:
            sys.exit(f"unknown peer {peer!r}: choose from gpulse, gpulse-default-export, "
                     "nvitop-exporter, openlit, gpustat-json-loop")

    rows = []
    print(f"# scenario {args.scenario}, sampling every {ms}, {args.duration:.0f} s each "
          f"after {args.warmup:.0f} s warm-up; gpulse exports every {args.export_interval}",
          flush=True)
    for run in runs:
        # A fresh nominal clock per run: the sample count starts when its process does.
        if run.name.startswith("gpulse"):
            run.samples_fn = nominal(args.interval)
        print(f"# measuring {run.name} ...", file=sys.stderr, flush=True)
        rows.append(run.measure(args.warmup, args.duration))
    table(rows)
    if any(r["name"] == "gpulse-default-export" for r in rows):
        print("\n# the same runs, against gpulse at its default 10 s export interval")
        table(rows, reference="gpulse-default-export")

    sweep = []
    if args.sweep:
        print(f"\n# gpulse alone, sampling every {int(args.sweep_interval * 1000)}ms, "
              f"exporting every {args.export_interval}, {args.sweep_duration:.0f} s each")
        for gpus in (1, 8, 64):
            for procs in (1, 64, 1024):
                path = os.path.join(workdir, f"sweep-{gpus}x{procs}.toml")
                with open(path, "w") as f:
                    f.write(scenario_text(gpus, procs))
                env = dict(base_env, NVML_SIM_SCENARIO=path)
                run = gpulse_run(env, args.sweep_interval, f"{gpus} GPUs × {procs} procs")
                print(f"# measuring {run.name} ...", file=sys.stderr, flush=True)
                run.samples_fn = nominal(args.sweep_interval)
                r = run.measure(args.warmup, args.sweep_duration)
                r.update(gpus=gpus, procs=procs)
                sweep.append(r)
        print("| GPUs | processes | CPU ms / sample | % of a core | peak RSS MiB |")
        print("|---:|---:|---:|---:|---:|")
        for r in sweep:
            print(f"| {r['gpus']} | {r['procs']} | {r['cpu_s_per_1000']:.3f} "
                  f"| {r['core_percent']:.2f} | {r['peak_rss_mib']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peers": rows, "sweep": sweep}, f, indent=1)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
