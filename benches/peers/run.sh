#!/usr/bin/env bash
# Peer comparison on one simulated node: gpulse (release), the floor (examples/bench_floor: only
# gpulse's NVML calls and /proc reads), nvitop-exporter and all-smi, each in its own
# configuration (NAME@SECONDS: sampling interval), three runs of each, interleaved, on nvml-sim
# (as libnvidia-ml.so.1) with 8 GPUs × 64 GPU processes that are real sleeping processes. Prints
# markdown tables and the targets (see BENCHMARKS.md); optionally gpulse alone over
# 1/8/64 GPUs × 1/64/1024 processes.
#
#   benches/peers/run.sh                                  # ~25 min: 8 configurations × 3 × 35 s
#   DURATION=10 RUNS=1 PEERS=gpulse@0.1,floor@0.1 benches/peers/run.sh
#   NVML_LIB=/path/to/other/libnvidia-ml.so.1 benches/peers/run.sh   # another NVML
#
# Environment: DURATION, WARMUP, RUNS, INTERVAL (s, for a peer without @), EXPORT_INTERVAL
# (gpulse, e.g. 1s), GPUS, PROCS, REAL (1: real processes, default; 0: PIDs that do not exist),
# SCENARIO (a file instead of the generated node), PEERS (comma list of NAME[@SECONDS]: gpulse,
# gpulse-default-export, floor, nvitop-exporter, all-smi, openlit, gpustat-json-loop), NVML_LIB
# (another libnvidia-ml.so.1 than nvml-sim; it must list the PIDs itself, see BENCHMARKS.md),
# ALL_SMI (the binary; default: installed with cargo into $GPULSE_BENCH_TOOLS), SWEEP (1/0),
# SWEEP_INTERVAL, SWEEP_DURATION, GPULSE_BENCH_VENVS (the Python peers' venvs; created when
# missing), PYTHON (>= 3.9), JSON_OUT.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
venvs="${GPULSE_BENCH_VENVS:-$HOME/.cache/gpulse/bench-venvs}"
target="${CARGO_TARGET_DIR:-$root/target}"

# Pinned peers. uv resolves OpenLIT's large dependency set in seconds where pip backtracks for
# many minutes; it only installs, the peers run on the venv's own python.
UV_VERSION=0.13.9
ALL_SMI_VERSION=0.22.0
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
peers="${PEERS:-gpulse@0.1,floor@0.1,gpulse@0.25,floor@0.25,nvitop-exporter@0.25,gpulse@1,floor@1,all-smi@1}"
case ",$peers" in *,nvitop-exporter*) install nvitop "$NVITOP" ;; esac
case ",$peers" in *,gpustat*) install gpustat "$GPUSTAT" ;; esac
case ",$peers" in *,openlit*) install openlit "$OPENLIT" ;; esac

# all-smi (Rust): built once into a cache dir. It needs protoc and libdrm's headers to build
# (Debian: protobuf-compiler, libdrm-dev).
all_smi="${ALL_SMI:-}"
case ",$peers" in *,all-smi*)
  if [ -z "$all_smi" ]; then
    tools="${GPULSE_BENCH_TOOLS:-$HOME/.cache/gpulse/bench-tools}"
    all_smi="$tools/bin/all-smi"
    if [ ! -x "$all_smi" ]; then
      command -v protoc >/dev/null || { echo "all-smi needs protoc: apt-get install protobuf-compiler libdrm-dev" >&2; exit 1; }
      cargo install all-smi --version "$ALL_SMI_VERSION" --locked --root "$tools"
    fi
  fi ;;
esac

cargo build --release -q --bin gpulse --example bench_floor
sim_dir="$(mktemp -d)"
trap 'rm -rf "$sim_dir"' EXIT
if [ -n "${NVML_LIB:-}" ]; then
  cp "$NVML_LIB" "$sim_dir/libnvidia-ml.so.1"
else
  cargo build --release -q -p nvml-sim
  cp "$target/release/libnvidia_ml.so" "$sim_dir/libnvidia-ml.so.1"
fi
# nvml-wrapper's Nvml::init() (all-smi) opens libnvidia-ml.so, gpulse and nvidia-ml-py .so.1.
ln -s libnvidia-ml.so.1 "$sim_dir/libnvidia-ml.so"

echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
args=()
[ "${SWEEP:-0}" = 1 ] && args+=(--sweep)
[ "${REAL:-1}" = 1 ] && args+=(--real-processes)
[ -n "${SCENARIO:-}" ] && args+=(--scenario "$SCENARIO")
[ -n "$all_smi" ] && args+=(--all-smi "$all_smi")
[ -n "${JSON_OUT:-}" ] && args+=(--json "$JSON_OUT")
"$python" benches/peers/measure.py \
  --gpulse "$target/release/gpulse" \
  --floor "$target/release/examples/bench_floor" \
  --sim-dir "$sim_dir" \
  --gpus "${GPUS:-8}" --procs "${PROCS:-64}" \
  --venvs "$venvs" \
  --interval "${INTERVAL:-0.25}" \
  --export-interval "${EXPORT_INTERVAL:-1s}" \
  --duration "${DURATION:-30}" \
  --warmup "${WARMUP:-5}" \
  --runs "${RUNS:-3}" \
  --peers "$peers" \
  --sweep-interval "${SWEEP_INTERVAL:-0.1}" \
  --sweep-duration "${SWEEP_DURATION:-20}" \
  "${args[@]}"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
