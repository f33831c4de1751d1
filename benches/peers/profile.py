#!/usr/bin/env python3
"""Runs one command against measure.py's simulated node (8 GPUs × 64 real sleeping processes by
default) and prints its CPU and peak RSS, for profiling what benches/peers/run.sh measures.

The command is run as given with `{lib}` and `{endpoint}` replaced (the simulator, as
libnvidia-ml.so.1, and an OTLP/HTTP keep-alive sink of this script), under the same
environment measure.py gives the tools. Wrap it in a profiler to see where the time goes:

    benches/peers/profile.py --sim-dir DIR --seconds 20 -- \\
      valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \\
      target/release/gpulse run --nvml-lib {lib} --sample-interval 1s --export-interval 1s \\
      --otlp-endpoint {endpoint} --otlp-protocol http/protobuf --kubelet-socket none

The command's process group gets SIGINT after --seconds (gpulse flushes and exits 0; callgrind writes its file).
CPU is whole-process (utime + stime of the process and of its waited-for children) over the
whole run, start-up included; use benches/peers/run.sh for the figures BENCHMARKS.md reports.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (the sink, the sleepers and the scenario of the real benchmark)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim-dir", required=True, help="dir holding libnvidia-ml.so.1 (nvml-sim)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        sys.exit("give the command to run after --")

    sink = measure.start_sink()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    lib = os.path.join(args.sim_dir, "libnvidia-ml.so.1")
    sleepers = measure.Sleepers(args.procs)
    workdir = tempfile.mkdtemp(prefix="gpulse-profile-")
    try:
        scenario = os.path.join(workdir, "node.toml")
        with open(scenario, "w") as f:
            f.write(measure.scenario_text(args.gpus, args.procs, sleepers.pids))
        env = dict(os.environ, LD_LIBRARY_PATH=args.sim_dir, NVML_SIM_SCENARIO=scenario)
        argv = [a.replace("{lib}", lib).replace("{endpoint}", endpoint) for a in command]
        # Its own process group: SIGINT reaches a wrapper (perf stat) and the tool under it.
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], measure.hwm_kib(proc.pid))
                stop.wait(0.2)

        threading.Thread(target=watch, daemon=True).start()
        t0 = time.monotonic()
        time.sleep(args.seconds)
        peak[0] = max(peak[0], measure.hwm_kib(proc.pid))
        stop.set()
        os.killpg(proc.pid, signal.SIGINT)
        usage_before = os.times()
        rc = proc.wait()
        usage = os.times()
        cpu = (usage.children_user - usage_before.children_user
               + usage.children_system - usage_before.children_system)
        print(f"# {argv[0]}: exit {rc}, {time.monotonic() - t0:.1f} s, CPU {cpu:.2f} s "
              f"(user+system, whole run), peak RSS {peak[0] / 1024:.1f} MiB, "
              f"{sink.RequestHandlerClass.count('/v1/metrics')} metrics requests",
              file=sys.stderr)
    finally:
        sleepers.stop()


if __name__ == "__main__":
    main()
