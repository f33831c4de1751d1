#!/usr/bin/env python3
"""What one export window weighs on the wire: bytes and data points of each OTLP metrics request
gpulse sends, on the benchmark node (nvml-sim's GPUs × real sleeping processes, as ratio.py and
measure.py use), for each `SAMPLE/EXPORT` configuration given.

    benches/peers/request_size.py --gpulse target/release/gpulse --sim-dir DIR 1s/1s 500ms/1s \
        1s/10s:examples/gpulse-lean.toml

A configuration may name a config file after a colon (`SAMPLE/EXPORT:FILE`), given to gpulse with
`--config`: the metric set of its `[metrics]` switches (the default set without one).

Each configuration runs `gpulse run` for --windows export windows against an OTLP/HTTP endpoint
of this script's, which decodes every request (opentelemetry-proto, as the test environment and
the companion install it) and counts its bytes and its points: all of them, and the `.max`/`.min`
companions of the window's gauges among them. Requests that carry gpulse's own health alone (a window without a
sample) are left out. Prints one row per configuration: the median and range over the windows.
"""

import argparse
import http.server
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (the benchmark node: scenario and sleepers)


def decoder():
    try:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    except ImportError as error:
        raise SystemExit(
            f"request_size.py needs opentelemetry-proto ({error}): run it with "
            "~/.cache/gpulse/venvs/test/bin/python (scripts/setup-test-env)"
        )
    return metrics_service_pb2.ExportMetricsServiceRequest


class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    windows = []
    lock = threading.Lock()
    request_type = None

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/metrics":
            request = Receiver.request_type.FromString(body)
            names = [
                (m.name, len(getattr(m, m.WhichOneof("data")).data_points))
                for rm in request.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            ]
            if any(not name.startswith("gpulse.") for name, _ in names):
                points = sum(n for _, n in names)
                # gpulse's own health has a `gpulse.sample.duration.max` of its own, no companion.
                companions = sum(
                    n
                    for name, n in names
                    if name.endswith((".max", ".min")) and not name.startswith("gpulse.")
                )
                with Receiver.lock:
                    Receiver.windows.append((len(body), points, companions))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def seconds(text):
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    raise SystemExit(f"{text!r}: a duration is a number followed by ms or s, e.g. 500ms or 1s")


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpulse", required=True, help="gpulse binary")
    ap.add_argument("--sim-dir", required=True, help="dir holding libnvidia-ml.so.1 (nvml-sim)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("configs", nargs="+", metavar="SAMPLE/EXPORT[:FILE]",
                    help="e.g. 1s/1s 500ms/1s 1s/10s:examples/gpulse-lean.toml")
    args = ap.parse_args()
    Receiver.request_type = decoder()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sleepers = measure.Sleepers(args.procs)
    workdir = tempfile.mkdtemp(prefix="gpulse-request-size-")
    try:
        scenario = os.path.join(workdir, "node.toml")
        with open(scenario, "w") as f:
            f.write(measure.scenario_text(args.gpus, args.procs, sleepers.pids))
        env = dict(os.environ, NVML_SIM_SCENARIO=scenario)
        print(f"# node: {args.gpus} GPUs × {args.procs} real sleeping processes; "
              f"{args.windows} windows per configuration")
        print("| sample / export | metric set | bytes per request | points per request "
              "| of which .max/.min |")
        print("| --- | --- | ---: | ---: | ---: |")
        for config in args.configs:
            intervals, _, config_file = config.partition(":")
            sample, _, export = intervals.partition("/")
            with Receiver.lock:
                Receiver.windows.clear()
            gpulse = subprocess.Popen(
                [
                    args.gpulse, "run",
                    "--nvml-lib", os.path.join(args.sim_dir, "libnvidia-ml.so.1"),
                    "--sample-interval", sample, "--export-interval", export,
                    "--otlp-endpoint", f"http://127.0.0.1:{server.server_address[1]}",
                    "--otlp-protocol", "http/protobuf",
                    "--kubelet-socket", "none", "--log-level", "warn",
                ] + (["--config", config_file] if config_file else []),
                env=env,
                stdin=subprocess.DEVNULL,
            )
            # The first window can be partial (gpulse started mid-interval): skipped.
            deadline = time.monotonic() + 30 + (args.windows + 2) * seconds(export) * 3
            while True:
                with Receiver.lock:
                    seen = len(Receiver.windows)
                if seen >= args.windows + 1:
                    break
                if gpulse.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{config}: gpulse sent {seen} windows, then "
                                     f"{'exited' if gpulse.poll() is not None else 'timed out'}")
                time.sleep(0.05)
            gpulse.terminate()
            gpulse.wait(20)
            with Receiver.lock:
                windows = Receiver.windows[1:args.windows + 1]
            sizes, points, companions = zip(*windows)
            metric_set = os.path.basename(config_file) if config_file else "default"
            print(f"| {sample} / {export} | {metric_set} | {spread(sizes, lambda v: f'{v / 1000:.0f} KB')} "
                  f"| {spread(points, lambda v: f'{v:.0f}')} "
                  f"| {spread(companions, lambda v: f'{v:.0f}')} |", flush=True)
    finally:
        sleepers.stop()
        server.shutdown()


if __name__ == "__main__":
    main()
