#!/usr/bin/env python3
"""Runs gpulse, the floor and their peers against the same simulated node and prints what each
costs: CPU seconds per 1000 samples, % of a core and peak RSS, each configuration several
times (ranges, not best-of), then the targets computed from those ranges.

Standard library only (run it with any python3 >= 3.9); benches/peers/run.sh prepares the
venvs, the release builds and the simulator directory, then calls this.

The node's GPU processes are real: with --real-processes (run.sh's default) the script starts
one sleeping child per GPU process and writes a scenario that lists their PIDs, so every tool
pays for what it reads about each process under /proc. Without it the scenario's PIDs do not
exist on the host (the old benchmark).

A peer is NAME or NAME@SECONDS (its sampling interval; --interval when left out): gpulse,
gpulse-default-export (gpulse exporting every 10 s), floor (examples/bench_floor: only gpulse's
NVML calls and /proc reads), nvitop-exporter, all-smi, openlit, gpustat-json-loop.

CPU is whole-process: the process's own CPU-time clock (all its threads, in nanoseconds), plus
cutime + cstime of the process from /proc/<pid>/stat and utime + stime of its live descendants
(in 10 ms ticks), taken at the start and at the end of the measured
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


def cpu_ticks(pid, own=True, children=False):
    """utime + stime (``own``) and cutime + cstime (``children``) from /proc/<pid>/stat, in ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the ')' field 3 is index 0: utime=14, stime=15, cutime=16, cstime=17.
    return (int(fields[11]) + int(fields[12])) * own + (int(fields[13]) + int(fields[14])) * children


def process_cpu_seconds(pid):
    """The process's own CPU time (all its threads) in nanoseconds, from its CPU-time clock
    (clock_getcpuclockid: Linux's (~pid << 3) | CPUCLOCK_SCHED), not from /proc's 10 ms ticks:
    30 s of gpulse at 1 s is well under a tenth of a second, a handful of ticks."""
    return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9


def tree_cpu_seconds(pid):
    """The process from its CPU-time clock; its waited-for children (cutime, cstime) and its
    live descendants in /proc's ticks."""
    ticks = cpu_ticks(pid, own=False, children=True)
    for d in descendants(pid):
        try:
            ticks += cpu_ticks(d)
        except OSError:
            pass
    return process_cpu_seconds(pid) + ticks / CLK_TCK


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

    def __init__(self, name, argv, env, samples, scrape=None, interval=0.25, check=None):
        self.name, self.argv, self.env = name, argv, env
        self.samples_fn, self.scrape, self.interval = samples, scrape, interval
        # Called after the measured window: raises when the tool did not do the work measured
        # (e.g. a peer that found no GPU or no process).
        self.check = check
        # Tools whose samples are counted by the clock (gpulse, the floor): a fresh clock per run.
        self.nominal_interval = None
        self.peak_kib = 0
        self.scrapes = 0
        self.last_scrape = b""

    def reset(self):
        """Fresh counters before each run of the same configuration."""
        self.peak_kib = 0
        self.scrapes = 0
        self.last_scrape = b""
        if self.nominal_interval:
            self.samples_fn = nominal(self.nominal_interval)

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
            cpu0 = tree_cpu_seconds(proc.pid)
            n0, t0 = self.samples_fn(self), time.monotonic()
            time.sleep(duration)
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited while measured: {self._tail(log)}")
            cpu1 = tree_cpu_seconds(proc.pid)
            n1, t1 = self.samples_fn(self), time.monotonic()
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
        if self.scrape:
            self.check_scrape_rate(samples, t1 - t0)
        if self.check:
            self.check(self)
        cpu = cpu1 - cpu0
        return {
            "name": self.name,
            "interval": self.interval,
            "seconds": t1 - t0,
            "samples": samples,
            "cpu_s": cpu,
            "cpu_s_per_1000": cpu / samples * 1000,
            "core_percent": cpu / (t1 - t0) * 100,
            "peak_rss_mib": self.peak_kib / 1024,
        }

    def check_scrape_rate(self, scrapes, seconds):
        """A pulled exporter is compared only when it was scraped at its interval: no more than
        one scrape short of one per interval (one can straddle each end of the window)."""
        expected = seconds / self.interval
        if scrapes < expected - 1.5:
            raise RuntimeError(
                f"{self.name} answered {scrapes} scrapes in {seconds:.1f} s, where one every "
                f"{self.interval:g} s makes {expected:.0f}: its answers took longer than its "
                f"interval, so it did not deliver every interval and its figure would flatter "
                f"it. Measure on a less loaded machine or at a longer interval.")

    def _watch_rss(self, pid, stop):
        while not stop.is_set():
            for p in [pid] + descendants(pid):
                self.peak_kib = max(self.peak_kib, hwm_kib(p))
            stop.wait(0.05)

    def _scrape(self, stop):
        # A Prometheus server scraping at the exporter's interval, on a fixed schedule: each
        # scrape is due one interval after the previous one was due, not after it answered, so
        # a pulled exporter delivers once per interval as gpulse pushes once per export
        # interval. (Waiting an interval after each answer scraped all-smi at 1 s about every
        # 1.1–1.2 s, which let it deliver less often than gpulse.) A scrape that overruns its
        # slot is not made up with a burst: the next one is due an interval after it ended.
        due = time.monotonic()
        while not stop.is_set():
            try:
                with urllib.request.urlopen(self.scrape, timeout=5) as r:
                    self.last_scrape = r.read()
                self.scrapes += 1
            except OSError:
                pass
            now = time.monotonic()
            due = max(due + self.interval, now)
            stop.wait(due - now)

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


def spread(values):
    lo, hi = min(values), max(values)
    return (lo, hi)


def fmt_range(lo, hi, digits):
    if f"{lo:.{digits}f}" == f"{hi:.{digits}f}":
        return f"{lo:.{digits}f}"
    return f"{lo:.{digits}f}–{hi:.{digits}f}"


def summarize(rows):
    """Rows grouped by configuration (name), in first-seen order, with min/max per figure."""
    groups = {}
    for r in rows:
        groups.setdefault(r["name"], []).append(r)
    out = []
    for name, rs in groups.items():
        out.append({
            "name": name,
            "interval": rs[0]["interval"],
            "runs": len(rs),
            "samples": spread([r["samples"] for r in rs]),
            "cpu_s": spread([r["cpu_s"] for r in rs]),
            "cpu_ms_per_sample": spread([r["cpu_s_per_1000"] for r in rs]),
            "core_percent": spread([r["core_percent"] for r in rs]),
            "peak_rss_mib": spread([r["peak_rss_mib"] for r in rs]),
        })
    return out


def table(summary, seconds):
    print(f"| configuration | runs | samples | CPU s in {seconds:.0f} s | CPU ms / sample "
          "| % of a core | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for g in summary:
        print(f"| {g['name']} | {g['runs']} | {fmt_range(*g['samples'], 0)} "
              f"| {fmt_range(*g['cpu_s'], 2)} | {fmt_range(*g['cpu_ms_per_sample'], 3)} "
              f"| {fmt_range(*g['core_percent'], 2)} | {fmt_range(*g['peak_rss_mib'], 1)} |")


def ratio(a, b):
    """The range of a ÷ b over two (lo, hi) ranges: worst case first."""
    lo = a[0] / b[1] if b[1] > 0 else float("inf")
    hi = a[1] / b[0] if b[0] > 0 else float("inf")
    return lo, hi


def targets(summary):
    """The issue's targets, from the ranges: each line says the figures it compares."""
    by = {g["name"]: g for g in summary}
    lines = []

    def find(prefix, interval):
        return by.get(f"{prefix}@{interval:g}")

    g100 = find("gpulse", 0.1)
    if g100:
        hi = g100["core_percent"][1]
        lines.append(("gpulse 8×N every 100 ms, 1 s export: < 1 % of a core",
                      f"{fmt_range(*g100['core_percent'], 3)} %", hi < 1.0))
    for g in summary:
        if g["name"].startswith("gpulse@"):
            hi = g["peak_rss_mib"][1]
            lines.append((f"{g['name']} peak RSS < 15 MiB",
                          f"{fmt_range(*g['peak_rss_mib'], 1)} MiB", hi < 15.0))
    nv, g250 = find("nvitop-exporter", 0.25), find("gpulse", 0.25)
    if nv and g250:
        lo, hi = ratio(nv["cpu_ms_per_sample"], g250["cpu_ms_per_sample"])
        lines.append(("≥ 20× less CPU per sample than nvitop-exporter at 250 ms",
                      f"{fmt_range(lo, hi, 1)}×", lo >= 20))
    al, g1 = find("all-smi", 1), find("gpulse", 1)
    if al and g1:
        lo, hi = ratio(al["cpu_s"], g1["cpu_s"])
        lines.append(("≥ 5× less CPU than all-smi at 1 s (gpulse exporting every 1 s)",
                      f"{fmt_range(lo, hi, 1)}×", lo >= 5))
        ok = g1["peak_rss_mib"][1] <= al["peak_rss_mib"][0]
        lines.append(("… at no higher peak RSS than all-smi",
                      f"gpulse {fmt_range(*g1['peak_rss_mib'], 1)} MiB, all-smi "
                      f"{fmt_range(*al['peak_rss_mib'], 1)} MiB", ok))
    for g in summary:
        if not g["name"].startswith("gpulse@"):
            continue
        floor = find("floor", g["interval"])
        if floor:
            lo, hi = ratio(g["cpu_s"], floor["cpu_s"])
            lines.append((f"{g['name']} whole-process CPU as a multiple of the floor (goal ≤ 3×)",
                          f"{fmt_range(lo, hi, 1)}×", hi <= 3))
    if lines:
        print("\n| target | measured (range over the runs) | met? |")
        print("|---|---|---|")
        for what, got, ok in lines:
            print(f"| {what} | {got} | {'yes' if ok else '**no**'} |")


DEVICE = """
[[device]]
name = "NVIDIA H100 80GB HBM3"
memory_total_mib = 81559
memory_reserved_mib = 542
power_limit_w = 700

[device.signals]
gpu_util = { mean = 75, amplitude = 20, period = 30, stddev = 3, seed = 1, min = 0, max = 100 }
mem_util = { mean = 40, stddev = 5, seed = 2, min = 0, max = 100 }
encoder_util = 0
decoder_util = 0
temperature_c = { mean = 62, amplitude = 5, period = 120 }
power_w = { mean = 450, amplitude = 150, period = 30 }
clock_sm_mhz = { mean = 1700, stddev = 40, seed = 3 }
clock_graphics_mhz = { mean = 1700, stddev = 40, seed = 3 }
clock_mem_mhz = 2619
pcie_tx_kbps = { mean = 800000, stddev = 100000, seed = 4, min = 0 }
pcie_rx_kbps = { mean = 2000000, stddev = 200000, seed = 5, min = 0 }
throttle_reasons = { steps = [[0, 0], [20, 4], [40, 0]] }
pstate = 0
"""

PROCESS = """
[[device.process]]
{pid}
name = "python3"
kind = "compute"
memory_used_mib = {{ mean = 8750, stddev = 64, seed = 6, min = 0 }}
sm_util = {{ mean = 12, stddev = 1, seed = 7, min = 0, max = 100 }}
mem_util = {{ mean = 6, stddev = 1, seed = 8, min = 0, max = 100 }}
"""


def scenario_text(gpus, procs, pids=None):
    """bench-8x64's devices and processes for `gpus` GPUs and `procs` processes spread evenly
    over them (a GPU without one when procs < gpus). With `pids` (one per process) each
    process is listed by its PID; without, PIDs from 200000 that do not exist on the host."""
    if procs >= gpus and procs % gpus:
        raise ValueError(f"{procs} processes do not spread evenly over {gpus} GPUs")
    if pids is not None and len(pids) != procs:
        raise ValueError(f"{len(pids)} PIDs for {procs} processes")
    text = ('[driver]\nversion = "570.124.06"\nnvml_version = "12.570.124.06"\n'
            'cuda_version = "12.8"\n')
    per_gpu = procs // gpus if procs >= gpus else 1
    next_pid = 0
    for gpu in range(gpus):
        text += DEVICE
        if gpu >= procs and procs < gpus:
            continue
        if pids is None:
            text += PROCESS.format(pid=f"pid = {200000 + gpu * per_gpu}\ncount = {per_gpu}")
        else:
            for pid in pids[next_pid:next_pid + per_gpu]:
                text += PROCESS.format(pid=f"pid = {pid}")
        next_pid += per_gpu
    return text


class Sleepers:
    """`count` real, sleeping child processes: the node's GPU processes."""

    def __init__(self, count):
        self.procs = [subprocess.Popen(["sleep", "1000000"]) for _ in range(count)]

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def stop(self):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


STAND_IN_NVIDIA_SMI = """#!/bin/sh
# A stand-in for nvidia-smi: all-smi 0.22 looks for NVIDIA GPUs with lspci or `nvidia-smi -L`
# before it opens NVML. Only -L is answered; anything else fails, so a peer that fell back to
# nvidia-smi for its figures would show up as a failure, not as numbers.
if [ "$1" = "-L" ]; then
  i=0
  while [ $i -lt {gpus} ]; do
    echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-stand-in-$i)"
    i=$((i + 1))
  done
  exit 0
fi
echo "stand-in nvidia-smi: only -L is answered" >&2
exit 9
"""


def parse_peer(spec, default_interval):
    name, _, interval = spec.partition("@")
    return name, float(interval) if interval else default_interval


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpulse", required=True, help="gpulse release binary")
    ap.add_argument("--floor", help="examples/bench_floor release binary (for the floor peer)")
    ap.add_argument("--all-smi", help="all-smi binary (for the all-smi peer)")
    ap.add_argument("--sim-dir", required=True,
                    help="dir holding the NVML library as libnvidia-ml.so.1 (and .so)")
    ap.add_argument("--scenario", help="a scenario file; default: generated from --gpus/--procs")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--real-processes", action="store_true",
                    help="the GPU processes are real sleeping children (generated scenario)")
    ap.add_argument("--venvs", required=True, help="dir with the nvitop, gpustat, openlit venvs")
    ap.add_argument("--interval", type=float, default=0.25, help="default sampling interval, s")
    ap.add_argument("--export-interval", default="1s", help="gpulse's export interval")
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--runs", type=int, default=3, help="runs of each configuration")
    ap.add_argument("--peers", default="gpulse@0.1,floor@0.1,gpulse@0.25,floor@0.25,"
                    "nvitop-exporter@0.25,gpulse@1,floor@1,all-smi@1")
    ap.add_argument("--sweep", action="store_true", help="also sweep gpulse over GPUs × processes")
    ap.add_argument("--sweep-interval", type=float, default=0.1)
    ap.add_argument("--sweep-duration", type=float, default=20)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    sink = start_sink()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    lib = os.path.join(args.sim_dir, "libnvidia-ml.so.1")
    workdir = tempfile.mkdtemp(prefix="gpulse-peers-")
    sleepers = Sleepers(args.procs) if args.real_processes else None
    try:
        if args.scenario:
            scenario = os.path.abspath(args.scenario)
            what = args.scenario
        else:
            scenario = os.path.join(workdir, "node.toml")
            with open(scenario, "w") as f:
                f.write(scenario_text(args.gpus, args.procs, sleepers and sleepers.pids))
            what = (f"{args.gpus} GPUs × {args.procs} processes "
                    + ("(real sleeping processes)" if sleepers else "(PIDs that do not exist)"))
        stand_in = os.path.join(workdir, "bin")
        os.makedirs(stand_in)
        with open(os.path.join(stand_in, "nvidia-smi"), "w") as f:
            f.write(STAND_IN_NVIDIA_SMI.replace("{gpus}", str(args.gpus)))
        os.chmod(os.path.join(stand_in, "nvidia-smi"), 0o755)
        base_env = dict(os.environ)
        base_env.update(
            LD_LIBRARY_PATH=args.sim_dir,
            NVML_SIM_SCENARIO=scenario,
            PYTHONDONTWRITEBYTECODE="1",
        )
        if sleepers:
            # For an NVML implementation other than nvml-sim (run.sh's NVML_LIB): the real PIDs
            # as a plain list, and as tests/fixtures/other-nvml reads them (its GPU 0, at most 8).
            base_env["GPULSE_BENCH_PIDS"] = ",".join(map(str, sleepers.pids))
            base_env["OTHER_NVML_PIDS"] = ",".join(f"{p}:536870912" for p in sleepers.pids[:8])
        runs = [make_run(spec, args, base_env, endpoint, lib, workdir, stand_in, sleepers)
                for spec in args.peers.split(",")]
        print(f"# node: {what}; {args.duration:.0f} s measured after {args.warmup:.0f} s "
              f"warm-up, {args.runs} runs of each configuration, interleaved; gpulse exports "
              f"every {args.export_interval} unless named otherwise", flush=True)
        rows = []
        for n in range(args.runs):
            for run in runs:
                print(f"# run {n + 1}/{args.runs}: {run.name} ...", file=sys.stderr, flush=True)
                run.reset()
                load_before = os.getloadavg()[0]
                r = run.measure(args.warmup, args.duration)
                r["load_1m"] = (load_before, os.getloadavg()[0])
                print(f"#   {r['name']}: {r['cpu_s']:.3f} s CPU, {r['samples']} samples, "
                      f"peak RSS {r['peak_rss_mib']:.1f} MiB, load average (1 min) "
                      f"{r['load_1m'][0]:.2f} before, {r['load_1m'][1]:.2f} after",
                      file=sys.stderr, flush=True)
                rows.append(r)
        summary = summarize(rows)
        table(summary, args.duration)
        targets(summary)

        sweep = []
        if args.sweep:
            sweep = run_sweep(args, base_env, endpoint, lib, workdir)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"runs": rows, "summary": summary, "sweep": sweep}, f, indent=1)
    finally:
        if sleepers:
            sleepers.stop()


def make_run(spec, args, base_env, endpoint, lib, workdir, stand_in, sleepers):
    peer, interval = parse_peer(spec, args.interval)
    name = f"{peer}@{interval:g}"
    env = dict(base_env)
    venv = lambda v, exe: os.path.join(args.venvs, v, "bin", exe)  # noqa: E731
    if peer in ("gpulse", "gpulse-default-export"):
        export = "10s" if peer == "gpulse-default-export" else args.export_interval
        return gpulse_run(args.gpulse, name, env, interval, export, endpoint, lib)
    if peer == "floor":
        if not args.floor:
            sys.exit("the floor peer needs --floor (target/release/examples/bench_floor)")
        export_ms = parse_duration_ms(args.export_interval)
        argv = [args.floor, "--nvml-lib", lib, "--sample-interval-ms",
                str(int(interval * 1000)), "--export-interval-ms", str(export_ms)]
        run = Run(name, argv, env, nominal(interval), interval=interval)
        run.nominal_interval = interval
        return run
    if peer == "nvitop-exporter":
        port = free_port()
        argv = [venv("nvitop", "nvitop-exporter"), "--port", str(port),
                "--interval", str(interval)]
        check = expect_processes(sleepers, "pid=")
        return Run(name, argv, env, lambda r: r.scrapes,
                   scrape=f"http://127.0.0.1:{port}/metrics", interval=interval, check=check)
    if peer == "all-smi":
        if not args.all_smi:
            sys.exit("the all-smi peer needs --all-smi (cargo install all-smi --version 0.22.0)")
        port = free_port()
        env["PATH"] = stand_in + os.pathsep + env.get("PATH", "")
        argv = [args.all_smi, "api", "--port", str(port), "--interval", str(max(1, int(interval))),
                "--processes=true"]
        check = expect_processes(sleepers, "pid=")
        return Run(name, argv, env, lambda r: r.scrapes,
                   scrape=f"http://127.0.0.1:{port}/metrics", interval=interval, check=check)
    if peer == "openlit":
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRIC_EXPORT_INTERVAL=str(int(interval * 1000)),
        )
        code = (
            "import time, openlit\n"
            "openlit.init(collect_gpu_stats=True, application_name='bench',"
            " disable_batch=True)\n"
            "while True: time.sleep(3600)\n"
        )
        return Run(name, [venv("openlit", "python"), "-c", code], env,
                   lambda r: Sink.count("/v1/metrics"), interval=interval)
    if peer == "gpustat-json-loop":
        counter = os.path.join(workdir, "gpustat.count")
        loop = (f'while :; do "{venv("gpustat", "gpustat")}" --json >/dev/null && '
                f'echo >> "{counter}"; sleep {interval}; done')
        return Run(name, ["/bin/sh", "-c", loop], env, count_lines(counter), interval=interval)
    sys.exit(f"unknown peer {peer!r}: choose from gpulse, gpulse-default-export, floor, "
             "nvitop-exporter, all-smi, openlit, gpustat-json-loop (NAME or NAME@SECONDS)")


def expect_processes(sleepers, marker):
    """A check that the exporter's last scrape names every real GPU process's PID."""
    if not sleepers:
        return None

    def check(run):
        text = run.last_scrape.decode(errors="replace")
        missing = [pid for pid in sleepers.pids if f'{marker}"{pid}"' not in text]
        if missing:
            raise RuntimeError(
                f"{run.name}'s last scrape ({len(text)} bytes) does not name {len(missing)} of "
                f"the {len(sleepers.pids)} GPU processes (e.g. {missing[:3]}): it did not do the "
                f"per-process work being measured. First lines:\n{text[:1500]}")
    return check


def parse_duration_ms(text):
    for suffix, scale in (("ms", 1), ("s", 1000), ("m", 60000)):
        if text.endswith(suffix) and text[:-len(suffix)].isdigit():
            return int(text[:-len(suffix)]) * scale
    sys.exit(f"--export-interval {text!r}: use e.g. 1s, 500ms, 10s")


def gpulse_run(binary, label, env, interval, export_interval, endpoint, lib):
    argv = [
        binary, "run", "--nvml-lib", lib,
        "--sample-interval", f"{int(interval * 1000)}ms",
        "--export-interval", export_interval,
        "--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf",
        "--kubelet-socket", "none", "--log-level", "warn",
    ]
    run = Run(label, argv, env, nominal(interval), interval=interval)
    run.nominal_interval = interval
    return run


def run_sweep(args, base_env, endpoint, lib, workdir):
    print(f"\n# gpulse alone, sampling every {int(args.sweep_interval * 1000)}ms, exporting "
          f"every {args.export_interval}, {args.sweep_duration:.0f} s each, one run each"
          + (", real sleeping processes" if args.real_processes else ""))
    sweep = []
    for gpus in (1, 8, 64):
        for procs in (1, 64, 1024):
            sleepers = Sleepers(procs) if args.real_processes else None
            try:
                path = os.path.join(workdir, f"sweep-{gpus}x{procs}.toml")
                with open(path, "w") as f:
                    f.write(scenario_text(gpus, procs, sleepers and sleepers.pids))
                env = dict(base_env, NVML_SIM_SCENARIO=path)
                run = gpulse_run(args.gpulse, f"{gpus} GPUs × {procs} procs", env,
                                 args.sweep_interval, args.export_interval, endpoint, lib)
                print(f"# measuring {run.name} ...", file=sys.stderr, flush=True)
                run.reset()
                r = run.measure(args.warmup, args.sweep_duration)
                r.update(gpus=gpus, procs=procs)
                sweep.append(r)
            finally:
                if sleepers:
                    sleepers.stop()
    print("| GPUs | processes | CPU ms / sample | % of a core | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|")
    for r in sweep:
        print(f"| {r['gpus']} | {r['procs']} | {r['cpu_s_per_1000']:.3f} "
              f"| {r['core_percent']:.2f} | {r['peak_rss_mib']:.1f} |")
    return sweep


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
