#!/usr/bin/env python3
"""gpulse's cost once its histories are full (issue 46): runs one `gpulse run` against nvml-sim
with real sleeping GPU processes and an OTLP/HTTP sink, and prints, every minute, the CPU
milliseconds spent in that minute, RSS, and the private (anonymous) memory from
/proc/PID/smaps_rollup; at the end the two ratios the issue sets:

  CPU per minute over the last 3 minutes / CPU per minute of minutes 2-4   (target <= 1.1)
  RSS at the end / RSS at 2 minutes                                        (target <= 1.25)

The diagnosis history holds `max_windows` summaries per (process, device) (default 720: 12 min at
a 1 s export, 2 h at 10 s). `--max-windows N` writes a config file with
[diagnosis.history] max_windows = N, so the history of a 10 s export fills in N x 10 s
(the cost of one window at a given fill does not depend on how long the full history is kept:
compare its per-minute CPU after filling with the full-length 1 s run's). Run long enough for
every history to be full (the script prints when the diagnosis history is full by the clock).

Standard library only. Reuses benches/peers/measure.py's sink, sleepers and scenario.

  benches/steady_state.py --gpulse target/release/gpulse --nvml-lib target/release/libnvidia_ml.so \
      --gpus 8 --procs 64 --minutes 15 --export-interval 1s
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import measure  # noqa: E402  (the sibling benchmark's helpers)


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


def anonymous_kib(pid):
    """Private anonymous memory (the heap and thread stacks, not the mapped binary), from
    smaps_rollup: what grows when a structure grows."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpulse", required=True, help="gpulse binary (the release build)")
    ap.add_argument("--nvml-lib", required=True, help="nvml-sim's libnvidia_ml.so")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=64, help="real sleeping GPU processes in all")
    ap.add_argument("--minutes", type=int, default=15)
    ap.add_argument("--sample-interval", default="1s")
    ap.add_argument("--export-interval", default="1s")
    ap.add_argument("--max-windows", type=int, help="[diagnosis.history] max_windows")
    ap.add_argument("--config-toml", default="",
                    help="more config-file TOML for the run (\\n for new lines), e.g. a rule's "
                         "min_duration, to see what its work costs once it can judge a series")
    args = ap.parse_args()
    if args.minutes < 6:
        sys.exit("--minutes must be at least 6: the ratios compare minutes 2-4 with the last 3")

    workdir = tempfile.mkdtemp(prefix="gpulse-steady-")
    sink = measure.start_sink()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    sleepers = measure.Sleepers(args.procs)
    scenario = os.path.join(workdir, "scenario.toml")
    with open(scenario, "w") as f:
        f.write(measure.scenario_text(args.gpus, args.procs, sleepers.pids))
    argv = [args.gpulse, "run", "--nvml-lib", args.nvml_lib,
            "--sample-interval", args.sample_interval, "--export-interval", args.export_interval,
            "--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf",
            "--kubelet-socket", "none", "--log-level", "warn"]
    if args.max_windows or args.config_toml:
        config = os.path.join(workdir, "gpulse.toml")
        with open(config, "w") as f:
            if args.max_windows:
                f.write(f"[diagnosis.history]\nmax_windows = {args.max_windows}\n")
            f.write(args.config_toml.replace("\\n", "\n") + "\n")
        argv += ["--config", config]
    env = dict(os.environ, NVML_SIM_SCENARIO=scenario)
    log = open(os.path.join(workdir, "gpulse.log"), "w+b")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    windows = args.max_windows or 720
    print(f"# gpulse {' '.join(argv[1:])}")
    print(f"# {args.gpus} GPUs x {args.procs} real processes, nvml-sim, {args.minutes} min; "
          f"diagnosis history {windows} windows, full by the clock after "
          f"{windows} export intervals; {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f} at start")
    print("| minute | CPU ms in that minute | RSS MiB | anonymous MiB | metric requests |")
    print("|---:|---:|---:|---:|---:|", flush=True)
    rows = []
    start = time.monotonic()
    last_cpu = measure.process_cpu_seconds(proc.pid)
    try:
        for minute in range(1, args.minutes + 1):
            time.sleep(max(0.0, start + 60 * minute - time.monotonic()))
            if proc.poll() is not None:
                log.seek(0)
                sys.exit(f"gpulse exited in minute {minute}: {log.read()[-2000:].decode()}")
            cpu = measure.process_cpu_seconds(proc.pid)
            rss = status_kib(proc.pid, "VmRSS") / 1024
            anon = anonymous_kib(proc.pid) / 1024
            rows.append(((cpu - last_cpu) * 1000, rss, anon))
            last_cpu = cpu
            print(f"| {minute} | {rows[-1][0]:.0f} | {rss:.1f} | {anon:.1f} "
                  f"| {measure.Sink.count('/v1/metrics')} |", flush=True)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)
        sleepers.stop()
        sink.shutdown()
    early = sum(r[0] for r in rows[1:4]) / 3
    late = sum(r[0] for r in rows[-3:]) / 3
    cpu_ratio, rss_ratio = late / early, rows[-1][1] / rows[1][1]
    print(f"\nCPU/minute, last 3 minutes / minutes 2-4: {late:.0f} / {early:.0f} ms = "
          f"{cpu_ratio:.2f} (target <= 1.1: {'met' if cpu_ratio <= 1.1 else 'NOT met'})")
    print(f"RSS at the end / at 2 minutes: {rows[-1][1]:.1f} / {rows[1][1]:.1f} MiB = "
          f"{rss_ratio:.2f} (target <= 1.25: {'met' if rss_ratio <= 1.25 else 'NOT met'})")
    print(f"peak RSS (VmHWM) not read after exit; load average at end "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
