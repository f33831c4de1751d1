#!/usr/bin/env python3
"""What gpulse costs once its histories are full: runs one `gpulse run` on a simulated node of
real (sleeping) GPU processes for as long as its diagnosis histories take to fill and then some,
and prints, minute by minute, the CPU it used in that minute and its RSS, then the two ratios a
sidecar is signed off on:

  CPU   the last minutes' CPU per minute / minutes 2-4's (target <= 1.1)
  RSS   RSS at the end / RSS at 2 minutes              (target <= 1.25)

Usage (release builds; benches/steady_state.sh builds them and runs the four configurations):

  benches/steady_state.py --gpulse target/release/gpulse --nvml-lib target/release/libnvidia_ml.so \\
      --gpus 8 --procs 64 --sample-interval 1s --export-interval 1s --minutes 15

The history of the trend rules keeps `[diagnosis.history] max_windows` windows (720 by
default). At a 1 s export that is 12 minutes; at the default 10 s export, two hours. For the
default export, `--max-windows N` runs with a smaller history (written to a config file), which
fills in N × the export interval: per window, a full history of N windows costs what a full one
of 720 does, except the walks over it that grow with its length, which `--max-windows` would
hide; run once with the full 720 for those (two hours) or read docs/resources.md's reasoning.

Standard library only; reuses benches/peers/measure.py's sink, sleepers and clocks. The CPU is
the process's own CPU-time clock (all threads), the RSS VmRSS from /proc/<pid>/status, both read
each minute. Run it on a quiet machine: figures are the process's own CPU, so other load moves
them less than wall time, but a busy machine still adds cache misses and context switches.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import measure  # noqa: E402 (the path above)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


def parse_seconds(text):
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        number = text[: -len(suffix)]
        if text.endswith(suffix) and number.replace(".", "", 1).isdigit():
            return float(number) * scale
    sys.exit(f"steady_state.py: {text!r} is not a duration: use e.g. 1s, 500ms, 10s")


def ratios(rows):
    """The end's CPU per minute over minutes 2-4's, and the end's RSS over minute 2's. The end
    is the last three minutes (one minute alone is noisy at ~100 ms of CPU)."""
    by_minute = {r["minute"]: r for r in rows}
    early = [by_minute[m]["cpu_ms"] for m in (2, 3, 4) if m in by_minute]
    late = [r["cpu_ms"] for r in rows[-3:]]
    if len(early) < 3 or len(rows) < 7:
        raise SystemExit("steady_state.py: run at least 7 minutes to compare the end with minutes 2-4")
    cpu = (sum(late) / len(late)) / (sum(early) / len(early))
    rss = rows[-1]["rss_mib"] / by_minute[2]["rss_mib"]
    return cpu, rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpulse", required=True, help="the gpulse binary (a release build)")
    ap.add_argument("--nvml-lib", required=True, help="nvml-sim's libnvidia_ml.so")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=64, help="real sleeping GPU processes, spread over the GPUs")
    ap.add_argument("--sample-interval", default="1s")
    ap.add_argument("--export-interval", default="1s")
    ap.add_argument("--minutes", type=int, default=15)
    ap.add_argument("--max-windows", type=int,
                    help="[diagnosis.history] max_windows for this run (default: gpulse's, 720)")
    ap.add_argument("--config-toml", default="",
                    help="more gpulse config-file TOML for this run, e.g. to move a rule's "
                         "min_duration and see what its walks cost")
    ap.add_argument("--json", help="also write the rows and ratios here")
    args = ap.parse_args()

    export_s = parse_seconds(args.export_interval)
    windows = args.max_windows or 720
    fill_minutes = windows * export_s / 60
    if fill_minutes + 3 > args.minutes:
        print(f"# note: the history fills after {fill_minutes:.0f} min; the run ends at "
              f"{args.minutes} min, so its end is not the full state", file=sys.stderr)

    sink = measure.start_sink()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    workdir = tempfile.mkdtemp(prefix="gpulse-steady-")
    sleepers = measure.Sleepers(args.procs)
    proc = None
    try:
        scenario = os.path.join(workdir, "node.toml")
        with open(scenario, "w") as f:
            f.write(measure.scenario_text(args.gpus, args.procs, sleepers.pids))
        argv = [
            args.gpulse, "run", "--nvml-lib", args.nvml_lib,
            "--sample-interval", args.sample_interval,
            "--export-interval", args.export_interval,
            "--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf",
            "--kubelet-socket", "none", "--log-level", "warn",
        ]
        if args.max_windows or args.config_toml:
            config = os.path.join(workdir, "gpulse.toml")
            with open(config, "w") as f:
                if args.max_windows:
                    f.write(f"[diagnosis.history]\nmax_windows = {args.max_windows}\n")
                f.write(args.config_toml.replace("\\n", "\n") + "\n")
            argv += ["--config", config]
        env = dict(os.environ, NVML_SIM_SCENARIO=scenario)
        log = open(os.path.join(workdir, "gpulse.log"), "wb")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
        print(f"# gpulse run: {args.gpus} GPUs × {args.procs} real sleeping processes, sampling "
              f"every {args.sample_interval}, exporting every {args.export_interval} over "
              f"OTLP/HTTP to a local sink; history {windows} windows, full after "
              f"{fill_minutes:.1f} min; {args.minutes} min; load average at start "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        print("| minute | CPU ms in that minute | RSS MiB | load (1 min) |")
        print("|---:|---:|---:|---:|", flush=True)
        rows = []
        start = time.monotonic()
        before = measure.process_cpu_seconds(proc.pid)
        for minute in range(1, args.minutes + 1):
            time.sleep(max(0.0, start + minute * 60 - time.monotonic()))
            if proc.poll() is not None:
                log.flush()
                tail = open(log.name, "rb").read()[-2000:].decode(errors="replace")
                raise SystemExit(f"steady_state.py: gpulse exited in minute {minute}: {tail}")
            now = measure.process_cpu_seconds(proc.pid)
            row = {
                "minute": minute,
                "cpu_ms": round((now - before) * 1000, 1),
                "rss_mib": round(rss_kib(proc.pid) / 1024, 2),
                "load_1m": round(os.getloadavg()[0], 2),
            }
            before = now
            rows.append(row)
            print(f"| {minute} | {row['cpu_ms']:.0f} | {row['rss_mib']:.1f} | {row['load_1m']:.2f} |",
                  flush=True)
        cpu, rss = ratios(rows)
        exports = measure.Sink.count("/v1/metrics")
        print(f"\nCPU per minute, last 3 minutes / minutes 2-4: {cpu:.2f} (target <= 1.1)")
        print(f"RSS at the end / at 2 minutes: {rss:.2f} (target <= 1.25)")
        print(f"peak RSS {measure.hwm_kib(proc.pid) / 1024:.1f} MiB; {exports} metric exports received")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "rows": rows, "cpu_ratio": cpu, "rss_ratio": rss,
                           "metric_exports": exports}, f, indent=1)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        sleepers.stop()
        sink.shutdown()


if __name__ == "__main__":
    main()
