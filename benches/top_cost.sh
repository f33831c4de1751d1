#!/usr/bin/env bash
# What `gpulse top` costs: it runs in tmux (160x50) at --interval 1s against nvml-sim's 8 GPUs
# x 64 processes, the 64 processes being real sleeping processes (so attribution reads real
# /proc entries), and prints its CPU (utime + stime from /proc/<pid>/stat) as % of one core over
# the measured span, in the flat view and then in the tree view (which also reads every
# /proc/<pid>/stat once per refresh). Target: under 2 % of a core in the flat view.
#
#   cargo build --release -p gpulse -p nvml-sim
#   benches/top_cost.sh [SECONDS]          # default 60 per view, after a 5 s warm-up
#
# Needs /usr/bin/tmux. Prints the figures; nothing is written outside a temporary directory.
set -euo pipefail

SECONDS_PER_VIEW=${1:-60}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPULSE=${GPULSE_BIN:-$ROOT/target/release/gpulse}
LIB=${GPULSE_NVML_SIM:-$ROOT/target/release/libnvidia_ml.so}
TMUX="/usr/bin/tmux -L gpulse-top-cost-$$ -f /dev/null"
for f in "$GPULSE" "$LIB" /usr/bin/tmux; do
    [ -e "$f" ] || { echo "missing $f: build with 'cargo build --release -p gpulse -p nvml-sim' (and install tmux)" >&2; exit 1; }
done

WORK=$(mktemp -d)
SLEEPERS=()
cleanup() {
    $TMUX kill-server 2>/dev/null || true
    [ ${#SLEEPERS[@]} -gt 0 ] && kill "${SLEEPERS[@]}" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# 64 real processes, 8 per GPU, each GPU's list in its own variable.
. "$ROOT/benches/lib-8x64.sh"
write_8x64_scenario "$WORK/top-8x64-real.toml"

$TMUX new-session -d -s top -x 160 -y 50 \
    "exec env ${ENV_ARGS[*]} NVML_SIM_SCENARIO=$SCENARIO GPULSE_KUBELET_SOCKET=none $GPULSE top --interval 1s --nvml-lib $LIB"
PID=$($TMUX display-message -p -t top '#{pane_pid}')
CLK_TCK=$(getconf CLK_TCK)

cpu_ticks() { # utime + stime of $PID (fields 14 and 15, after the parenthesised comm)
    sed 's/^.*) //' "/proc/$PID/stat" | awk '{ print $12 + $13 }'
}

measure() { # $1: label
    sleep 5 # warm-up: NVML open, first windows, the view's first frames
    local t0 c0 t1 c1
    t0=$(date +%s.%N); c0=$(cpu_ticks)
    sleep "$SECONDS_PER_VIEW"
    t1=$(date +%s.%N); c1=$(cpu_ticks)
    local listed
    listed=$($TMUX capture-pane -p -t top | grep -o 'Processes ([0-9]*)' || echo 'Processes (?)')
    awk -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v hz="$CLK_TCK" -v label="$1" -v listed="$listed" \
        'BEGIN { s = (c1 - c0) / hz; w = t1 - t0;
                 printf "%-10s %6.2f %% of a core  (%.2f s CPU over %.1f s wall; the view lists %s)\n",
                        label, 100 * s / w, s, w, listed }'
}

echo "gpulse top, 8 GPUs x 64 real processes, --interval 1s, tmux 160x50, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
measure "flat view"
$TMUX send-keys -t top t
measure "tree view"
RSS=$(awk '/^VmRSS/ { print $2 " " $3 }' "/proc/$PID/status")
echo "RSS at the end: $RSS"
$TMUX send-keys -t top q
