"""callgrind of gpulse at 1 s / 1 s on 8 x 64 real processes that hold memory and run nothing
(process sm_util 0, so idle_holder's trailing run holds every window; issue 46):
max_windows = 150; counters zeroed at 15 s and dumped at 45 s (runs of 15-45 windows), zeroed
at 180 s and dumped at 240 s (runs of 150, the full history). Same profiling build as
steady_state-callgrind-fit.py."""
import os, sys, subprocess, time
sys.path.insert(0, "/work/main/benches/peers")
import measure
sink = measure.start_sink()
sl = measure.Sleepers(64)
text = measure.scenario_text(8, 64, sl.pids)
idle = "sm_util = { mean = 12, stddev = 1, seed = 7, min = 0, max = 100 }"
assert idle in text
open("s.toml","w").write(text.replace(idle, "sm_util = 0"))
open("g.toml","w").write('[diagnosis.history]\nmax_windows = 150\n')
env = dict(os.environ, NVML_SIM_SCENARIO="/tmp/cg3/s.toml")
p = subprocess.Popen(["valgrind","--tool=callgrind","--collect-atstart=yes","--callgrind-out-file=/tmp/cg3/cg.%p",
  "/tmp/tgt-prof/release/gpulse","run","--nvml-lib","/tmp/nvml-46b.so","--sample-interval","1s","--export-interval","1s","--config","/tmp/cg3/g.toml",
  "--otlp-endpoint",f"http://127.0.0.1:{sink.server_address[1]}","--otlp-protocol","http/protobuf","--kubelet-socket","none","--log-level","warn"],
  env=env, stdout=open("log","w"), stderr=subprocess.STDOUT)
t0=time.monotonic()
def at(s, args):
    time.sleep(max(0, t0+s-time.monotonic())); subprocess.run(["callgrind_control"]+args+[str(p.pid)])
at(15,["-z"]); at(45,["-d","early"]); at(180,["-z"]); at(240,["-d","full"])
p.terminate(); p.wait(); sl.stop()
print("requests", measure.Sink.count("/v1/metrics"))
