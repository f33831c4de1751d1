"""callgrind of gpulse at 1 s / 1 s on 8 x 64 real processes (issue 46): with max_windows = 150
and memory_growth.min_duration = "2m", so that the history is full and memory_growth can judge
every series within 4 minutes under valgrind. Counters zeroed at 50 s and dumped at 110 s
(early: neither), zeroed at 180 s and dumped at 240 s (full). The binary is a profiling build:
  CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_PROFILE_RELEASE_STRIP=none \
  cargo build --release --target-dir /tmp/tgt-prof -p gpulse --bin gpulse
Read with `callgrind_annotate --inclusive=yes --threshold=100 cg.PID.2`."""
import os, sys, subprocess, time
sys.path.insert(0, "/work/main/benches/peers")
import measure
sink = measure.start_sink()
sl = measure.Sleepers(64)
open("s.toml","w").write(measure.scenario_text(8, 64, sl.pids))
open("g.toml","w").write('[diagnosis.history]\nmax_windows = 150\n[diagnosis.memory_growth]\nmin_duration = "2m"\n')
env = dict(os.environ, NVML_SIM_SCENARIO="/tmp/cg2/s.toml")
p = subprocess.Popen(["valgrind","--tool=callgrind","--collect-atstart=yes","--callgrind-out-file=/tmp/cg2/cg.%p",
  "/tmp/tgt-prof/release/gpulse","run","--nvml-lib","/tmp/nvml-46b.so","--sample-interval","1s","--export-interval","1s","--config","/tmp/cg2/g.toml",
  "--otlp-endpoint",f"http://127.0.0.1:{sink.server_address[1]}","--otlp-protocol","http/protobuf","--kubelet-socket","none","--log-level","warn"],
  env=env, stdout=open("log","w"), stderr=subprocess.STDOUT)
t0=time.monotonic()
def at(s, args):
    time.sleep(max(0, t0+s-time.monotonic())); subprocess.run(["callgrind_control"]+args+[str(p.pid)])
at(50,["-z"]); at(110,["-d","early"]); at(180,["-z"]); at(240,["-d","full"])
p.terminate(); p.wait(); sl.stop()
print("requests", measure.Sink.count("/v1/metrics"))
