#!/bin/bash
# callgrind of gpulse at 1 s/1 s on 8x64 real processes: counters zeroed at 60 s and dumped at 120 s (early), zeroed at 720 s and dumped at 780 s (full).
cd /tmp/cg && python3 - <<'PY'
import os, sys, subprocess, time
sys.path.insert(0, "/work/wt-steady/benches/peers")
import measure
sink = measure.start_sink()
sl = measure.Sleepers(64)
open("s.toml","w").write(measure.scenario_text(8, 64, sl.pids))
env = dict(os.environ, NVML_SIM_SCENARIO="/tmp/cg/s.toml")
p = subprocess.Popen(["valgrind","--tool=callgrind","--collect-atstart=yes","--callgrind-out-file=/tmp/cg/cg.%p",
  "/tmp/gpulse-steady-release","run","--nvml-lib","/work/wt-steady/target/release/libnvidia_ml.so","--sample-interval","1s","--export-interval","1s",
  "--otlp-endpoint",f"http://127.0.0.1:{sink.server_address[1]}","--otlp-protocol","http/protobuf","--kubelet-socket","none","--log-level","warn"],
  env=env, stdout=open("log","w"), stderr=subprocess.STDOUT)
t0=time.monotonic()
def at(s, args):
    time.sleep(max(0, t0+s-time.monotonic())); subprocess.run(["callgrind_control"]+args+[str(p.pid)])
at(60,["-z"]); at(120,["-d","early"]); at(720,["-z"]); at(780,["-d","full"])
p.terminate(); p.wait(); sl.stop()
print("requests", measure.Sink.count("/v1/metrics"))
PY
