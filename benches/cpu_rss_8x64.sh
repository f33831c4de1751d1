#!/usr/bin/env bash
# CPU time and peak RSS of one gpulse binary (argument): bench-8x64 (8 GPUs x 64 PIDs that do not
# exist) on the debug nvml-sim, 100 ms sampling, 1 s export over gRPC to the Python OTLP test
# receiver, for $SECS seconds (default 30). Used to compare two builds (e.g. before/after a change).
set -euo pipefail
bin=$1; secs=${SECS:-30}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${GPULSE_TEST_PYTHON:-$HOME/.cache/gpulse/venvs/test/bin/python}
out=$(mktemp -d)
$py $root/tests/receiver/otlp_receiver.py --output $out/req.jsonl --grpc-port 0 --http-port 0 > $out/ports &
rpid=$!
for i in $(seq 100); do [ -s $out/ports ] && break; sleep 0.1; done
port=$($py -c "import json,sys;print(json.load(open('$out/ports'))['grpc'])")
NVML_SIM_SCENARIO=$root/nvml-sim/scenarios/bench-8x64.toml GPULSE_KUBELET_SOCKET=none GPULSE_LOG=warn \
OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$port \
  $bin run --nvml-lib $root/target/debug/libnvidia_ml.so --sample-interval 100ms --export-interval 1s 2>$out/err &
gpid=$!
sleep $secs
read -r -a st < /proc/$gpid/stat
tck=$(getconf CLK_TCK)
cpu=$(( ${st[13]} + ${st[14]} ))
hwm=$(grep VmHWM /proc/$gpid/status | awk '{print $2}')
kill -TERM $gpid; wait $gpid || true
kill $rpid; wait $rpid 2>/dev/null || true
reqs=$(grep -c '"signal": "metrics"' $out/req.jsonl || grep -c metrics $out/req.jsonl || true)
echo "$bin cpu_s=$(echo "scale=2; $cpu/$tck" | bc) over ${secs}s peak_rss_kib=$hwm metrics_requests=$reqs"
rm -rf $out
