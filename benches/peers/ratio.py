#!/usr/bin/env python3
"""gpulse's whole-process CPU as a multiple of the floor's (examples/bench_floor: only the NVML
calls and /proc reads gpulse makes), measured in one run: the two run side by side against the
same simulated node (8 GPUs × 64 real sleeping processes by default), over the same seconds, so
whatever else loads the machine hits both alike. Several runs at each sampling interval
(interleaved), one ratio per run; prints a row per run and the range per interval.

    benches/floor_ratio.sh        # builds, then calls this with the simulator directory

CPU is read from each process's CPU-time clock (clock_gettime on the clock that
clock_getcpuclockid(pid) names: the sum over all of its threads, exited ones included, in
nanoseconds), not from /proc's 10 ms clock ticks, so a 30 s run of the floor at 1 s (about
30 ms of CPU) is not two or three ticks. Start-up is left out: the window starts after the
warm-up.

Standard library only; measure.py provides the sink, the sleepers and the scenario."""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (the sink, the sleepers and the scenario of the real benchmark)

# Linux's CPUCLOCK_SCHED: the process's total runtime, as the scheduler counts it.
CPUCLOCK_SCHED = 2


def process_cpu_clock(pid):
    """clock_getcpuclockid(pid): the clock id of a process's CPU time (all threads, ns).

    Linux encodes it as MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) = (~pid << 3) | 2; glibc's
    clock_getcpuclockid returns the same number. Any process may read another's."""
    return ((~pid) << 3) | CPUCLOCK_SCHED


def cpu_seconds(pid):
    return time.clock_gettime_ns(process_cpu_clock(pid)) / 1e9


def gpulse_argv(binary, lib, interval, export_ms, endpoint):
    return [
        binary, "run", "--nvml-lib", lib,
        "--sample-interval", f"{round(interval * 1000)}ms",
        "--export-interval", f"{export_ms}ms",
        "--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf",
        "--kubelet-socket", "none", "--log-level", "warn",
    ]


def floor_argv(binary, lib, interval, export_ms):
    return [binary, "--nvml-lib", lib, "--sample-interval-ms", str(round(interval * 1000)),
            "--export-interval-ms", str(export_ms)]


def measure_pair(argvs, env, warmup, duration):
    """Starts every command at once, reads each one's CPU clock after `warmup` and again
    `duration` seconds later, stops them. Returns {name: CPU seconds in the window} and the
    window's wall seconds."""
    logs, procs = {}, {}
    try:
        for name, argv in argvs.items():
            logs[name] = tempfile.TemporaryFile()
            procs[name] = subprocess.Popen(argv, env=env, stdout=logs[name], stderr=logs[name],
                                           start_new_session=True)
        time.sleep(warmup)
        check_alive(procs, logs, "during warm-up")
        t0 = time.monotonic()
        start = {name: cpu_seconds(p.pid) for name, p in procs.items()}
        time.sleep(duration)
        end = {name: cpu_seconds(p.pid) for name, p in procs.items()}
        t1 = time.monotonic()
        check_alive(procs, logs, "while measured")
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return {name: end[name] - start[name] for name in procs}, t1 - t0


def check_alive(procs, logs, when):
    for name, p in procs.items():
        if p.poll() is not None:
            logs[name].seek(0)
            tail = logs[name].read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{name} exited {when} (status {p.returncode}): {tail}")


def run_row(interval, cpu, wall):
    """One run's figures: each process's share of a core, and gpulse ÷ floor (and the
    baseline build's, when one ran alongside)."""
    def over_floor(name):
        return cpu[name] / cpu["floor"] if cpu["floor"] > 0 else float("inf")

    row = {
        "interval": interval,
        "wall_s": wall,
        "gpulse_cpu_s": cpu["gpulse"],
        "floor_cpu_s": cpu["floor"],
        "gpulse_core_percent": cpu["gpulse"] / wall * 100,
        "floor_core_percent": cpu["floor"] / wall * 100,
        "ratio": over_floor("gpulse"),
    }
    if "baseline" in cpu:
        row["baseline_cpu_s"] = cpu["baseline"]
        row["baseline_ratio"] = over_floor("baseline")
    return row


def summary(rows, goal):
    """Per interval (in first-seen order): the runs, the ratio's range and median, met or not
    (every run's ratio at or under the goal)."""
    by = {}
    for r in rows:
        by.setdefault(r["interval"], []).append(r)
    out = []
    for interval, rs in by.items():
        ratios = sorted(r["ratio"] for r in rs)
        mid = len(ratios) // 2
        median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
        out.append({
            "interval": interval,
            "runs": len(rs),
            "ratio": (ratios[0], ratios[-1]),
            "median": median,
            "gpulse_core_percent": measure.spread([r["gpulse_core_percent"] for r in rs]),
            "floor_core_percent": measure.spread([r["floor_core_percent"] for r in rs]),
            "met": ratios[-1] <= goal,
        })
        if all("baseline_ratio" in r for r in rs):
            out[-1]["baseline_ratio"] = measure.spread([r["baseline_ratio"] for r in rs])
    return out


def print_tables(rows, summ, goal):
    print("| sampling | run | gpulse CPU s | floor CPU s | gpulse % of a core "
          "| floor % of a core | gpulse ÷ floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    seen = {}
    for r in rows:
        seen[r["interval"]] = seen.get(r["interval"], 0) + 1
        print(f"| {label(r['interval'])} | {seen[r['interval']]} | {r['gpulse_cpu_s']:.3f} "
              f"| {r['floor_cpu_s']:.3f} | {r['gpulse_core_percent']:.3f} "
              f"| {r['floor_core_percent']:.3f} | {r['ratio']:.2f}× |")
    print(f"\n| sampling | runs | gpulse % of a core | floor % of a core | gpulse ÷ floor "
          f"(range) | median | ≤ {goal:g}× in every run? |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for s in summ:
        print(f"| {label(s['interval'])} | {s['runs']} "
              f"| {measure.fmt_range(*s['gpulse_core_percent'], 3)} "
              f"| {measure.fmt_range(*s['floor_core_percent'], 3)} "
              f"| {measure.fmt_range(*s['ratio'], 2)}× | {s['median']:.2f}× "
              f"| {'yes' if s['met'] else '**no**'} |")
    if any("baseline_ratio" in s for s in summ):
        print("\n| sampling | baseline build ÷ floor (same runs) | this build ÷ floor |")
        print("|---|---:|---:|")
        for s in summ:
            if "baseline_ratio" in s:
                print(f"| {label(s['interval'])} | {measure.fmt_range(*s['baseline_ratio'], 2)}× "
                      f"| {measure.fmt_range(*s['ratio'], 2)}× |")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def label(interval):
    return f"{round(interval * 1000)} ms" if interval < 1 else f"{interval:g} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpulse", required=True, help="gpulse release binary")
    ap.add_argument("--floor", required=True, help="examples/bench_floor release binary")
    ap.add_argument("--sim-dir", required=True, help="dir holding libnvidia-ml.so.1 (nvml-sim)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--intervals", default="1,0.1", help="sampling intervals, s, comma list")
    ap.add_argument("--export-interval-ms", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--goal", type=float, default=2.0)
    ap.add_argument("--baseline", help="another gpulse build, run alongside (before/after)")
    args = ap.parse_args()
    intervals = [float(s) for s in args.intervals.split(",")]

    sink = measure.start_sink()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    lib = os.path.join(args.sim_dir, "libnvidia-ml.so.1")
    sleepers = measure.Sleepers(args.procs)
    workdir = tempfile.mkdtemp(prefix="gpulse-ratio-")
    try:
        scenario = os.path.join(workdir, "node.toml")
        with open(scenario, "w") as f:
            f.write(measure.scenario_text(args.gpus, args.procs, sleepers.pids))
        env = dict(os.environ, LD_LIBRARY_PATH=args.sim_dir, NVML_SIM_SCENARIO=scenario)
        print(f"# node: {args.gpus} GPUs × {args.procs} real sleeping processes; gpulse and the "
              f"floor side by side, {args.duration:g} s measured after {args.warmup:g} s "
              f"warm-up, {args.runs} runs per interval, interleaved; export every "
              f"{args.export_interval_ms} ms; load average before: {loadavg()}", flush=True)
        rows = []
        for n in range(args.runs):
            for interval in intervals:
                before = measure.Sink.count("/v1/metrics")
                argvs = {
                    "gpulse": gpulse_argv(args.gpulse, lib, interval, args.export_interval_ms,
                                          endpoint),
                    "floor": floor_argv(args.floor, lib, interval, args.export_interval_ms),
                }
                if args.baseline:
                    argvs["baseline"] = gpulse_argv(args.baseline, lib, interval,
                                                    args.export_interval_ms, endpoint)
                cpu, wall = measure_pair(argvs, env, args.warmup, args.duration)
                exported = measure.Sink.count("/v1/metrics") - before
                if exported == 0:
                    raise RuntimeError("gpulse exported no metrics request: it did not do the "
                                       "work being measured")
                row = run_row(interval, cpu, wall)
                rows.append(row)
                baseline = (f", baseline {row['baseline_cpu_s']:.3f} s "
                            f"({row['baseline_ratio']:.2f}×)" if args.baseline else "")
                print(f"# run {n + 1}/{args.runs} at {label(interval)}: gpulse "
                      f"{row['gpulse_cpu_s']:.3f} s, floor {row['floor_cpu_s']:.3f} s, "
                      f"{row['ratio']:.2f}×{baseline} ({exported} requests received)",
                      file=sys.stderr, flush=True)
        print_tables(rows, summary(rows, args.goal), args.goal)
        print(f"# load average after: {loadavg()}")
    finally:
        sleepers.stop()


if __name__ == "__main__":
    main()
