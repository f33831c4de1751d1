#!/usr/bin/env python3
"""callgrind of `gpulse run` at 1 s / 1 s on 8 x 64 real processes with a 150-window history
(issue 46), counters zeroed and dumped twice: once early, once with the history full. The
figures in docs/resources.md ("Why CPU rises") come from the two scenarios:

  noisy  the benchmark node as benches/steady_state.py runs it, with memory_growth.min_duration
         "2m" so that memory_growth can judge every series within 4 minutes under valgrind;
         counters over 50-110 s (neither full nor judged) and 180-240 s (both)
  idle   every process holds memory and runs nothing (process SM 0 %), so idle_holder's
         trailing run holds every window; counters over 15-45 s (runs of 15-45 windows) and
         180-240 s (runs of 150, the full history)

The gpulse binary is a profiling build (functions kept apart, line tables kept):

  CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \\
  CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_PROFILE_RELEASE_STRIP=none \\
  cargo build --release --target-dir /tmp/tgt-prof -p gpulse --bin gpulse
  benches/results/steady_state-callgrind.py noisy /tmp/tgt-prof/release/gpulse \\
      target/release/libnvidia_ml.so /tmp/cg-noisy

Read the dumps with `callgrind_annotate --inclusive=yes --threshold=100 OUTDIR/cg.PID.2`."""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import measure  # noqa: E402  (the benchmark's sink, sleepers and scenario)

BUSY_SM = "sm_util = { mean = 12, stddev = 1, seed = 7, min = 0, max = 100 }"
SCENARIOS = {
    # name: (extra config, (zero, dump early, zero, dump full) in seconds)
    "noisy": ('[diagnosis.memory_growth]\nmin_duration = "2m"\n', (50, 110, 180, 240)),
    "idle": ("", (15, 45, 180, 240)),
}


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in SCENARIOS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(SCENARIOS)}}} GPULSE NVML_LIB OUTDIR")
    name, gpulse, nvml_lib, out = sys.argv[1:]
    extra_config, (zero_early, dump_early, zero_full, dump_full) = SCENARIOS[name]
    os.makedirs(out, exist_ok=True)
    sink = measure.start_sink()
    sleepers = measure.Sleepers(64)
    text = measure.scenario_text(8, 64, sleepers.pids)
    if name == "idle":
        assert BUSY_SM in text, "benches/peers/measure.py's process SM line changed"
        text = text.replace(BUSY_SM, "sm_util = 0")
    scenario, config = os.path.join(out, "s.toml"), os.path.join(out, "g.toml")
    with open(scenario, "w") as f:
        f.write(text)
    with open(config, "w") as f:
        f.write("[diagnosis.history]\nmax_windows = 150\n" + extra_config)
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--collect-atstart=yes",
         f"--callgrind-out-file={out}/cg.%p",
         gpulse, "run", "--nvml-lib", nvml_lib, "--sample-interval", "1s",
         "--export-interval", "1s", "--config", config,
         "--otlp-endpoint", f"http://127.0.0.1:{sink.server_address[1]}",
         "--otlp-protocol", "http/protobuf", "--kubelet-socket", "none", "--log-level", "warn"],
        env=dict(os.environ, NVML_SIM_SCENARIO=scenario),
        stdout=open(os.path.join(out, "log"), "w"), stderr=subprocess.STDOUT)
    start = time.monotonic()

    def at(seconds, args):
        time.sleep(max(0, start + seconds - time.monotonic()))
        subprocess.run(["callgrind_control", *args, str(proc.pid)], check=True)

    at(zero_early, ["-z"])
    at(dump_early, ["-d", "early"])
    at(zero_full, ["-z"])
    at(dump_full, ["-d", "full"])
    proc.terminate()
    proc.wait()
    sleepers.stop()
    print("metric requests", measure.Sink.count("/v1/metrics"))


if __name__ == "__main__":
    main()
