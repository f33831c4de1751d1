#!/usr/bin/env python3
"""gpulse's OTLP receiver under the OpenTelemetry Collector project's load generator
(telemetrygen), against the same pipeline run by the real Collector, in the same run.

For each rate and protocol, three runs, interleaved so that whatever else loads the machine hits
them alike, each with a fresh middle and a fresh telemetrygen (--seconds of spans):

  direct     telemetrygen ─────────────────▶ sink
  gpulse     telemetrygen ─▶ gpulse run ───▶ sink    (receiver → enrichment → queue → OTLP/gRPC)
  collector  telemetrygen ─▶ otelcol ──────▶ sink    (otlp receiver → otlp exporter, no processor)

The sink (latency_sink.py) notes every span's id and its arrival minus its end time. What a
middle adds is its run's latency percentile minus the direct run's (a difference of
percentiles, not a percentile of differences). telemetrygen is one of gpulse's GPU processes
(nvml-sim lists its PID), so gpulse enriches every span, found by the connection: the costly
path. CPU is the middle's whole-process CPU time from the first span to the last one at the
sink (gpulse's own sampling, once a second, included), per 1000 spans generated; peak RSS is its
VmHWM. A run counts its spans: generated (telemetrygen's own count), accepted (by gpulse's
receiver, from its own gpulse.receiver.spans), arrived and distinct (at the sink).

    scripts/backends otelcol telemetrygen && cargo build --release -p gpulse -p nvml-sim
    $GPULSE_TEST_PYTHON benches/load/receiver_load.py --rates 1000,10000,50000 --repeat 2
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import otlp_load  # noqa: E402

HERE = Path(__file__).resolve().parent
SCENARIO = """# benches/load: one GPU, telemetrygen as its process ($GPULSE_LOAD_SENDER)
[[device]]
name = "NVIDIA H100 80GB HBM3"
[device.signals]
gpu_util = 80
power_w = 400
[[device.process]]
pid_env = "GPULSE_LOAD_SENDER"
name = "telemetrygen"
memory_used_mib = 4096
sm_util = 75
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="1000,10000,50000", help="spans/s, comma-separated")
    p.add_argument("--protocols", default="grpc,http")
    p.add_argument("--middles", default="direct,gpulse,collector")
    p.add_argument("--seconds", type=float, default=10, help="seconds of spans per run (10)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of every run (1)")
    p.add_argument("--worker-rate", type=float, default=5000, help="spans/s per telemetrygen worker (5000)")
    p.add_argument("--batch-size", type=int, default=100, help="telemetrygen's SDK batch (100, its default)")
    p.add_argument("--sample-interval", default="1s",
                   help="gpulse's --sample-interval (1s, its default): a span ending after the newest sample "
                        "waits for the next one before it is forwarded")
    p.add_argument("--gpulse", type=Path, default=otlp_load.TARGET / "release" / "gpulse")
    p.add_argument("--sim-lib", type=Path, default=otlp_load.TARGET / "release" / "libnvidia_ml.so")
    p.add_argument("--json", type=Path, help="also write every run as a JSON line here")
    return p.parse_args()


class Sink:
    def __init__(self, work):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "latency_sink.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(work / "sink.log", "w"), text=True)
        self.port = json.loads(self.proc.stdout.readline())["grpc"]

    def command(self, what):
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def telemetrygen_holder(work, name, endpoint, protocol, rate, args):
    """A shell that waits for a line on stdin, then becomes telemetrygen (same PID, so gpulse can
    be told it before it sends anything)."""
    workers = max(1, round(rate / args.worker_rate))
    argv = [str(otlp_load.backend("telemetrygen")), "traces", "--otlp-endpoint", endpoint, "--otlp-insecure",
            "--rate", f"{rate / workers:g}", "--workers", str(workers), "--duration", f"{args.seconds:g}s",
            "--batch-size", str(args.batch_size), "--child-spans", "1", "--service", "load"]
    if protocol == "http":
        argv.append("--otlp-http")
    log = open(work / f"{name}.telemetrygen.log", "w")
    proc = subprocess.Popen(["sh", "-c", 'read go; exec "$@"', "holder", *argv], stdin=subprocess.PIPE,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, work / f"{name}.telemetrygen.log"


def generated_spans(log_path):
    """Spans telemetrygen generated: its workers' `traces generated` counts, two spans each."""
    traces = [int(m) for m in re.findall(r'"traces":\s*(\d+)', Path(log_path).read_text())]
    return 2 * sum(traces)


def start_middle(kind, work, name, sink_port, sender_pid, grpc_port, http_port, args, extra=()):
    """The middle of a run on the given ports (None for the direct run), forwarding over
    OTLP/gRPC to `sink_port`; `extra`: more arguments of `gpulse run`."""
    if kind == "direct":
        return None
    log = open(work / f"{name}.log", "w")
    if kind == "gpulse":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GPULSE_"))}
        env.update({"NVML_SIM_SCENARIO": str(work / "scenario.toml"), "GPULSE_LOAD_SENDER": str(sender_pid),
                    "GPULSE_LOG": "warn", "NO_COLOR": "1"})
        argv = [str(args.gpulse), "run", "--nvml-lib", str(args.sim_lib), "--kubelet-socket", "none",
                "--otlp-endpoint", f"http://127.0.0.1:{sink_port}", "--otlp-protocol", "grpc",
                "--otlp-receiver-grpc", f"127.0.0.1:{grpc_port}", "--otlp-receiver-http", f"127.0.0.1:{http_port}",
                "--sample-interval", getattr(args, "sample_interval", "1s"), *extra]
    else:
        config = work / f"{name}.yaml"
        config.write_text(json.dumps({
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                                 "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
            "exporters": {"otlp": {"endpoint": f"127.0.0.1:{sink_port}", "tls": {"insecure": True}}},
            "service": {"telemetry": {"logs": {"level": "warn"}, "metrics": {"level": "none"}},
                        "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["otlp"]}}}}))
        env = None
        argv = [str(otlp_load.backend("otelcol-gpulse")), "--config", str(config)]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (otlp_load.port_open(grpc_port) and otlp_load.port_open(http_port)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"receiver_load: {kind} did not start listening; see {work / (name + '.log')}")
        time.sleep(0.1)
    time.sleep(1.5)  # gpulse: the first samples are in, its history knows telemetrygen
    return proc


def one_run(kind, protocol, rate, round_, sink, work, args):
    """One run: telemetrygen's holder first (its PID goes into gpulse's scenario), the middle,
    then the spans; returns the run's figures."""
    name = f"{kind}-{protocol}-{rate}-{round_}"
    sink.command("reset")
    grpc_port, http_port = otlp_load.free_port(), otlp_load.free_port()
    if kind == "direct":
        endpoint = f"127.0.0.1:{sink.port}"
        if protocol == "http":
            protocol = "grpc"  # the sink speaks gRPC only; the direct run is the baseline of both
    else:
        endpoint = f"127.0.0.1:{grpc_port if protocol == 'grpc' else http_port}"
    holder, log_path = telemetrygen_holder(work, name, endpoint, protocol, rate, args)
    middle = None
    try:
        middle = start_middle(kind, work, name, sink.port, holder.pid, grpc_port, http_port, args)
        cpu0 = otlp_load.cpu_seconds(middle.pid) if middle else 0.0
        started = time.monotonic()
        holder.stdin.write("go\n")
        holder.stdin.flush()
        holder.stdin.close()
        holder.wait(args.seconds + 60)
        # Until the last spans are at the sink (the middle's queue, the SDK's last batch).
        last, still = -1, 0
        while still < 3 and time.monotonic() - started < args.seconds + 60:
            time.sleep(0.5)
            spans = sink.command("report")["spans"]
            still = still + 1 if spans == last else 0
            last = spans
        elapsed = time.monotonic() - started
        cpu = (otlp_load.cpu_seconds(middle.pid) - cpu0) if middle else 0.0
        hwm = otlp_load.hwm_kib(middle.pid) if middle else None
        if kind == "gpulse":
            # Its last health (with gpulse.receiver.spans) goes out at SIGTERM.
            middle.send_signal(signal.SIGTERM)
            middle.wait(30)
        report = sink.command("report")
        generated = generated_spans(log_path)
        return {"middle": kind, "protocol": protocol, "rate": rate, "round": round_, "generated": generated,
                "arrived": report["spans"], "distinct": report["distinct"], "enriched": report["enriched"],
                "gpulse_accepted": report["gpulse_accepted"],
                "p50_ms": report["p50_ms"], "p99_ms": report["p99_ms"], "cpu_s": round(cpu, 3),
                "cpu_ms_per_1k_spans": round(1e6 * cpu / generated, 3) if generated else None,
                "peak_rss_mib": round(hwm / 1024, 1) if hwm else None, "seconds": round(elapsed, 1)}
    finally:
        for proc in (holder, middle):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()


def main():
    args = parse_args()
    for path, build in ((args.gpulse, "cargo build --release -p gpulse"),
                        (args.sim_lib, "cargo build --release -p nvml-sim")):
        if not path.exists():
            print(f"receiver_load: {path} is missing; build it first: {build}", file=sys.stderr)
            return 2
    otlp_load.backend("telemetrygen")
    otlp_load.backend("otelcol-gpulse")
    work = Path(tempfile.mkdtemp(prefix="gpulse-load-"))
    (work / "scenario.toml").write_text(SCENARIO)
    sink = Sink(work)
    rates = [int(r) for r in args.rates.split(",")]
    protocols = args.protocols.split(",")
    middles = args.middles.split(",")
    print(f"receiver_load: {args.seconds:g} s per run, {args.repeat} round(s); logs in {work}", flush=True)
    print(f"{'middle':>9} {'proto':>5} {'rate':>6} {'generated':>9} {'accepted':>8} {'arrived':>8} {'distinct':>8} "
          f"{'enriched':>8} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'CPU s':>6} {'ms/1k':>6} {'RSS MiB':>7}", flush=True)
    runs = []
    out = open(args.json, "a") if args.json else None
    try:
        for round_ in range(args.repeat):
            for rate in rates:
                for protocol in protocols:
                    for kind in middles:
                        if kind == "direct" and protocol != protocols[0]:
                            continue  # one baseline per rate
                        r = one_run(kind, protocol, rate, round_, sink, work, args)
                        runs.append(r)
                        if out:
                            out.write(json.dumps(r) + "\n")
                            out.flush()
                        accepted = r["gpulse_accepted"] if r["gpulse_accepted"] is not None else "-"
                        print(f"{r['middle']:>9} {r['protocol']:>5} {rate:>6} {r['generated']:>9} {accepted:>8} "
                              f"{r['arrived']:>8} "
                              f"{r['distinct']:>8} {r['enriched']:>8} {r['p50_ms'] or 0:>7.1f} {r['p99_ms'] or 0:>7.1f} "
                              f"{r['cpu_s']:>6.2f} {r['cpu_ms_per_1k_spans'] or 0:>6.1f} {r['peak_rss_mib'] or 0:>7.1f}",
                              flush=True)
    finally:
        sink.stop()
    summarize(runs, rates, protocols)
    return 0


def summarize(runs, rates, protocols):
    """Per rate and protocol: gpulse ÷ Collector CPU per span and the added latency, one figure
    per round (ranges, not best-of)."""
    print("\nreceiver_load: gpulse against the Collector (per round; added = run minus direct, same round)")
    for rate in rates:
        for protocol in protocols:
            ratios, added = [], []
            for g in (r for r in runs if r["middle"] == "gpulse" and r["rate"] == rate and r["protocol"] == protocol):
                c = next((r for r in runs if r["middle"] == "collector" and r["rate"] == rate
                          and r["protocol"] == protocol and r["round"] == g["round"]), None)
                d = next((r for r in runs if r["middle"] == "direct" and r["rate"] == rate
                          and r["round"] == g["round"]), None)
                if c and c["cpu_ms_per_1k_spans"] and g["cpu_ms_per_1k_spans"] is not None:
                    ratios.append(g["cpu_ms_per_1k_spans"] / c["cpu_ms_per_1k_spans"])
                if c and d and None not in (g["p50_ms"], c["p50_ms"], d["p50_ms"]):
                    added.append((g["p50_ms"] - d["p50_ms"], g["p99_ms"] - d["p99_ms"],
                                  c["p50_ms"] - d["p50_ms"], c["p99_ms"] - d["p99_ms"]))
            if not ratios:
                continue
            lost = [(r["middle"], r["round"], r["generated"] - r["distinct"]) for r in runs
                    if r["rate"] == rate and r["protocol"] == protocol and r["generated"] != r["distinct"]]
            print(f"  {rate:>6}/s {protocol:>4}: gpulse CPU / Collector CPU {min(ratios):.2f}-{max(ratios):.2f}; "
                  f"added p50/p99 ms gpulse {', '.join(f'{a[0]:.1f}/{a[1]:.1f}' for a in added)}, "
                  f"Collector {', '.join(f'{a[2]:.1f}/{a[3]:.1f}' for a in added)}; "
                  f"spans not arrived exactly once: {lost or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
