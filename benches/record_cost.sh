#!/usr/bin/env bash
# What `gpulse record` costs the job it wraps: gpulse records a command (`sleep`) sampling every
# 100 ms with 1 s analysis windows, against nvml-sim's 8 GPUs x 64 processes that are real
# sleeping processes (so attribution and the command-tree check read real /proc entries), and
# prints gpulse's own CPU (utime + stime from /proc/<pid>/stat) as % of one core over the steady
# span, then its whole CPU from start to exit (NVML open, summary, the HTML report written at
# the end), from getrusage of its waited-for children. Target: under 1 % of a core at 100 ms.
#
#   cargo build --release -p gpulse -p nvml-sim
#   benches/record_cost.sh [SECONDS]          # default 60, after a 5 s warm-up
#
# Prints the figures; nothing is written outside a temporary directory.
set -euo pipefail

SECONDS_MEASURED=${1:-60}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPULSE=${GPULSE_BIN:-$ROOT/target/release/gpulse}
LIB=${GPULSE_NVML_SIM:-$ROOT/target/release/libnvidia_ml.so}
for f in "$GPULSE" "$LIB"; do
    [ -e "$f" ] || { echo "missing $f: build with 'cargo build --release -p gpulse -p nvml-sim'" >&2; exit 1; }
done

WORK=$(mktemp -d)
SLEEPERS=()
cleanup() {
    [ ${#SLEEPERS[@]} -gt 0 ] && kill "${SLEEPERS[@]}" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# 64 real processes, 8 per GPU, each GPU's list in its own variable.
. "$ROOT/benches/lib-8x64.sh"
write_8x64_scenario "$WORK/record-8x64-real.toml"


TOTAL=$((SECONDS_MEASURED + 7))
# A Python parent runs gpulse so that its whole CPU (and its children's: one sleep) comes back
# from getrusage once it has exited.
env "${ENV_ARGS[@]}" NVML_SIM_SCENARIO="$SCENARIO" GPULSE_KUBELET_SOCKET=none python3 - \
    "$GPULSE" "$LIB" "$WORK" "$TOTAL" > "$WORK/total.txt" 2> "$WORK/summary.txt" <<'PY' &
import os, resource, subprocess, sys, time
gpulse, lib, work, total = sys.argv[1:5]
with open(os.path.join(work, "pid"), "w") as pid_file:
    start = time.monotonic()
    child = subprocess.Popen([gpulse, "record", "--nvml-lib", lib, "--sample-interval", "100ms",
                              "--export-interval", "1s", "--report", os.path.join(work, "r.html"),
                              "--", "sleep", total])
    pid_file.write(str(child.pid))
child.wait()
wall = time.monotonic() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = usage.ru_utime + usage.ru_stime
print(f"whole run  {100 * cpu / wall:6.2f} % of a core  ({cpu:.2f} s CPU over {wall:.1f} s wall, "
      f"exit {child.returncode}, report {os.path.getsize(os.path.join(work, 'r.html')) / 1e3:.0f} kB, "
      f"peak RSS {usage.ru_maxrss / 1024:.1f} MiB)")
PY
RUNNER=$!
while [ ! -s "$WORK/pid" ]; do sleep 0.1; done
PID=$(cat "$WORK/pid")
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { # utime + stime of $PID (fields 14 and 15, after the parenthesised comm)
    sed 's/^.*) //' "/proc/$PID/stat" | awk '{ print $12 + $13 }'
}
echo "gpulse record -- sleep $TOTAL, 8 GPUs x 64 real processes, every 100 ms, 1 s windows, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
sleep 5 # warm-up: NVML open, the first windows
t0=$(date +%s.%N); c0=$(cpu_ticks)
sleep "$SECONDS_MEASURED"
t1=$(date +%s.%N); c1=$(cpu_ticks)
awk -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v hz="$CLK_TCK" \
    'BEGIN { s = (c1 - c0) / hz; w = t1 - t0;
             printf "steady     %6.2f %% of a core  (%.2f s CPU over %.1f s wall)\n", 100 * s / w, s, w }'
wait "$RUNNER"
cat "$WORK/total.txt"
grep -E "^  (GPU|report)" "$WORK/summary.txt" | head -3 || true
