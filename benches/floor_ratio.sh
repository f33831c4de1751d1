#!/usr/bin/env bash
# gpulse ÷ the floor, measured in one run: gpulse and examples/bench_floor (the same NVML calls
# and /proc reads, nothing else) side by side on nvml-sim's 8 GPUs × 64 real sleeping processes,
# sampling every 1 s and every 100 ms (exporting every 1 s, or EXPORT_MS), several runs of each,
# interleaved.
# Prints a row per run and the ratio's range per interval (goal: ≤ 2×). See BENCHMARKS.md.
#
#   benches/floor_ratio.sh                         # 3 runs × 30 s at each interval, ~4 min
#   RUNS=5 DURATION=60 benches/floor_ratio.sh
#   EXPORT_MS=10000 DURATION=60 benches/floor_ratio.sh   # gpulse's default export interval
#
# Environment: RUNS, DURATION, WARMUP (s), INTERVALS (s, comma list; default 1,0.1), EXPORT_MS
# (gpulse's export interval; default 1000, the fast one; gpulse's own default is 10000), GPUS,
# PROCS, PYTHON (>= 3.9), CARGO_TARGET_DIR.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"

cargo build --release -q --bin gpulse --example bench_floor
cargo build --release -q -p nvml-sim
sim_dir="$(mktemp -d)"
trap 'rm -rf "$sim_dir"' EXIT
cp "$target/release/libnvidia_ml.so" "$sim_dir/libnvidia-ml.so.1"

echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), gpulse $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"${PYTHON:-python3}" benches/peers/ratio.py \
  --gpulse "$target/release/gpulse" \
  --floor "$target/release/examples/bench_floor" \
  --sim-dir "$sim_dir" \
  --gpus "${GPUS:-8}" --procs "${PROCS:-64}" \
  --intervals "${INTERVALS:-1,0.1}" \
  --export-interval-ms "${EXPORT_MS:-1000}" \
  --runs "${RUNS:-3}" --duration "${DURATION:-30}" --warmup "${WARMUP:-5}"
