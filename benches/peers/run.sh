#!/usr/bin/env bash
# Peer comparison: gpulse (release) vs nvitop-exporter, OpenLIT's GPU collector and a
# `gpustat --json` loop, all on nvml-sim (as libnvidia-ml.so.1, through nvidia-ml-py) with the
# same scenario, the same sampling interval and the same duration; then gpulse alone over
# 1/8/64 GPUs × 1/64/1024 processes. Prints markdown tables (see BENCHMARKS.md).
#
#   benches/peers/run.sh                      # 60 s per tool at 250 ms, sweep at 100 ms
#   DURATION=20 SWEEP_DURATION=10 benches/peers/run.sh
#
# Environment: DURATION, WARMUP, INTERVAL (s), EXPORT_INTERVAL (gpulse, e.g. 1s),
# SCENARIO, PEERS (comma list), SWEEP (1/0), SWEEP_INTERVAL, SWEEP_DURATION,
# GPULSE_BENCH_VENVS (where the peers' venvs live; created when missing), PYTHON (>= 3.9).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
venvs="${GPULSE_BENCH_VENVS:-$HOME/.cache/gpulse/bench-venvs}"
target="${CARGO_TARGET_DIR:-$root/target}"

# Pinned peers. uv resolves OpenLIT's large dependency set in seconds where pip backtracks for
# many minutes; it only installs, the peers run on the venv's own python.
UV_VERSION=0.13.9
NVITOP="nvitop[exporter]==1.7.2"
GPUSTAT="gpustat==1.1.1"
OPENLIT="openlit==1.45.0"
NVML_PY="nvidia-ml-py==13.615.71"

mkdir -p "$venvs"
if [ ! -x "$venvs/tools/bin/uv" ]; then
  "$python" -m venv "$venvs/tools"
  "$venvs/tools/bin/pip" install -q "uv==$UV_VERSION"
fi
uv="$venvs/tools/bin/uv"
install() { # venv-name packages...
  local name="$1"; shift
  if [ ! -x "$venvs/$name/bin/python" ]; then
    "$uv" venv -q -p "$python" "$venvs/$name"
  fi
  "$uv" pip install -q -p "$venvs/$name/bin/python" "$@" "$NVML_PY"
}
install nvitop "$NVITOP"
install gpustat "$GPUSTAT"
install openlit "$OPENLIT"

cargo build --release -q --bin gpulse
cargo build --release -q -p nvml-sim
sim_dir="$(mktemp -d)"
trap 'rm -rf "$sim_dir"' EXIT
cp "$target/release/libnvidia_ml.so" "$sim_dir/libnvidia-ml.so.1"

echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
sweep=()
[ "${SWEEP:-1}" = 1 ] && sweep=(--sweep)
exec "$python" benches/peers/measure.py \
  --gpulse "$target/release/gpulse" \
  --sim-dir "$sim_dir" \
  --scenario "${SCENARIO:-nvml-sim/scenarios/bench-8x64.toml}" \
  --venvs "$venvs" \
  --interval "${INTERVAL:-0.25}" \
  --export-interval "${EXPORT_INTERVAL:-1s}" \
  --duration "${DURATION:-60}" \
  --warmup "${WARMUP:-5}" \
  --peers "${PEERS:-gpulse,gpulse-default-export,nvitop-exporter,openlit,gpustat-json-loop}" \
  --sweep-interval "${SWEEP_INTERVAL:-0.1}" \
  --sweep-duration "${SWEEP_DURATION:-20}" \
  ${sweep[@]+"${sweep[@]}"} ${JSON_OUT:+--json "$JSON_OUT"}
