"""The real-time mode of scripts/soak (`scripts/soak --real-time`): `gpulse run` in real time
against nvml-sim, with its OTLP receiver under span load, forwarding to the real OpenTelemetry
Collector (otelcol-gpulse, scripts/backends), while the faults come and go:

- process churn: a wave of --churn-size short-lived GPU processes every --churn-every seconds,
  each listed for two periods (PIDs that do not exist on the host, as in a sidecar);
- GPU 1 falls off the bus for --gpu-lost-for seconds of every --gpu-lost-every;
- the Collector is stopped (SIGTERM) every --restart-every seconds and started again after
  --down-for seconds;
- spans: this script sends --span-rate spans/s over OTLP/HTTP to gpulse's receiver, and is
  itself one of the GPU processes of the scenario, so gpulse can enrich its spans (found by
  the connection).

Every --every seconds a row: gpulse's RSS, its export queue and its counters (scraped from its
own /metrics), spans accepted and refused. At the end: the sender stops, the queue is given
time to drain, gpulse gets SIGTERM, and every span the receiver accepted is looked up in the
Collector's files. The run fails when gpulse died, when its RSS grew (the same flatness verdict
as the fast-forward soak), or when a span it accepted is missing beyond what gpulse counted as
dropped.
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches" / "load"))
import otlp_load  # noqa: E402


def add_arguments(p):
    g = p.add_argument_group("real-time mode (--real-time)")
    g.add_argument("--real-time", action="store_true", help="the real-time soak (see above)")
    g.add_argument("--span-rate", type=float, default=200, help="spans/s sent to the receiver (200)")
    g.add_argument("--span-batch", type=int, default=20, help="spans per request (20)")
    g.add_argument("--churn-every", type=float, default=60, help="seconds between process waves (60)")
    g.add_argument("--churn-size", type=int, default=20, help="processes per wave and GPU (20)")
    g.add_argument("--gpu-lost-every", type=float, default=600, help="GPU 1 lost once per this many s (600)")
    g.add_argument("--gpu-lost-for", type=float, default=60, help="for this many seconds (60)")
    g.add_argument("--restart-every", type=float, default=300, help="Collector restart period, s (300)")
    g.add_argument("--down-for", type=float, default=15, help="seconds the Collector stays down (15)")
    g.add_argument("--drain", type=float, default=90, help="seconds the queue gets to drain at the end (90)")
    g.add_argument("--enrich-history", default="10m",
                   help="gpulse's --enrich-history (10m, its default; a short run wants it full early)")


def scenario(args, duration):
    """The nvml-sim scenario of a run of `duration` seconds: churn waves and lost-GPU windows
    laid out over it, and this script as a long-lived GPU process ($GPULSE_SOAK_SENDER)."""
    lines = [
        "# Written by scripts/soak --real-time for one run.",
        "[[device]]", "count = 2", 'name = "NVIDIA H100 80GB HBM3"', "",
        "[device.signals]",
        "gpu_util = { mean = 60, amplitude = 30, period = 900, stddev = 5, seed = 1, min = 0, max = 100 }",
        "mem_util = { mean = 30, stddev = 5, seed = 2, min = 0, max = 100 }",
        "temperature_c = { mean = 60, amplitude = 8, period = 1800 }",
        "power_w = { mean = 400, amplitude = 150, period = 600 }", "",
        "[[device.process]]", 'pid_env = "GPULSE_SOAK_SENDER"', 'name = "python3"',
        "memory_used_mib = 2048", "sm_util = 50", "",
    ]
    waves = int(duration // args.churn_every) + 2
    for wave in range(waves):
        start = wave * args.churn_every
        lines += ["[[device.process]]", f"pid = {3000000 + wave * args.churn_size}", f"count = {args.churn_size}",
                  f"memory_used_mib = {{ mean = 900, stddev = 100, seed = {wave}, min = 0 }}",
                  f"sm_util = {{ mean = 40, stddev = 10, seed = {100 + wave}, min = 0, max = 100 }}",
                  f"active_from_s = {start:g}", f"active_until_s = {start + 2 * args.churn_every:g}", ""]
    lost = args.gpu_lost_every / 2  # the first loss in the middle of the first period
    while lost < duration:
        lines += ["[[fault]]", 'kind = "gpu_lost"', "device = 1", f"from_s = {lost:g}",
                  f"until_s = {lost + args.gpu_lost_for:g}", ""]
        lost += args.gpu_lost_every
    return "\n".join(lines)


def main(args):
    for path, build in ((args.gpulse, "cargo build --release -p gpulse"),
                        (args.sim_lib, "cargo build --release -p nvml-sim")):
        if not path.exists():
            print(f"soak: {path} is missing; build it first: {build}", file=sys.stderr)
            return 2
    try:
        import opentelemetry.proto  # noqa: F401
    except ImportError:
        if Path(args.python).resolve() != Path(sys.executable).resolve():
            # The sender runs in this process: go on in the interpreter that has the packages.
            os.execv(args.python, [args.python, *sys.argv])
    try:
        otlp_load.backend("otelcol-gpulse")
        import opentelemetry.proto  # noqa: F401,F811
    except (SystemExit, ImportError) as e:
        print(f"soak: {e}; the real-time mode needs the Collector and opentelemetry-proto "
              f"(run with $GPULSE_TEST_PYTHON)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpulse-soak-rt-"))
    (work / "scenario.toml").write_text(scenario(args, args.duration + args.drain + 60))
    collector = otlp_load.Collector(work, keep_metrics=True).start()
    health = otlp_load.HealthReader(collector.metrics_path)
    receiver_port = otlp_load.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GPULSE_"))}
    env.update({
        "NVML_SIM_SCENARIO": str(work / "scenario.toml"),
        "GPULSE_SOAK_SENDER": str(os.getpid()),
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.http_port}",
        "GPULSE_KUBELET_SOCKET": "none",
        "GPULSE_LOG": "warn",
        "NO_COLOR": "1",
    })
    gpulse_err = work / "gpulse.err"
    gpulse = subprocess.Popen(
        [str(args.gpulse), "run", "--nvml-lib", str(args.sim_lib),
         "--sample-interval", args.sample_interval, "--export-interval", args.export_interval,
         "--queue-max-bytes", args.queue_max_bytes,
         "--otlp-receiver-http", f"127.0.0.1:{receiver_port}", "--enrich-history", args.enrich_history],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(gpulse_err, "w"))
    deadline = time.monotonic() + 60
    while not otlp_load.port_open(receiver_port):
        if gpulse.poll() is not None or time.monotonic() > deadline:
            print(f"soak: gpulse did not start listening (exit {gpulse.poll()}); see {gpulse_err}", file=sys.stderr)
            gpulse.kill()
            collector.stop()
            return 2
        time.sleep(0.2)
    sender = otlp_load.SpanSender(f"http://127.0.0.1:{receiver_port}/v1/traces", args.span_rate,
                                  batch=args.span_batch, service="soak-sender")
    sender.start()
    print(f"soak: real time, {args.duration:.0f} s; {args.span_rate:g} spans/s to the receiver; Collector "
          f"down {args.down_for:g} s of every {args.restart_every:g} s; GPU 1 lost {args.gpu_lost_for:g} s of "
          f"every {args.gpu_lost_every:g} s; {args.churn_size} new processes per GPU every "
          f"{args.churn_every:g} s; logs in {work}", flush=True)
    print(f"{'time':>6} {'RSS MiB':>8} {'queue':>6} {'queue KiB':>9} {'dropped':>7} {'failures':>8} "
          f"{'accepted':>9} {'refused':>7} {'collector':>9}", flush=True)
    rows, died, restarts = [], None, 0
    started = time.monotonic()
    next_row = started + args.every
    down_since = None
    try:
        while True:
            now = time.monotonic()
            elapsed = now - started
            if elapsed >= args.duration:
                break
            if gpulse.poll() is not None:
                died = gpulse.returncode
                break
            period_at = elapsed % args.restart_every
            if down_since is None and elapsed >= args.restart_every and period_at < args.down_for:
                collector.stop()
                down_since = now
                restarts += 1
            elif down_since is not None and now - down_since >= args.down_for:
                collector.start()
                down_since = None
            if now >= next_row:
                next_row += args.every
                rss = otlp_load.rss_kib(gpulse.pid)
                h = health.poll()
                rows.append((elapsed, rss))
                print(f"{elapsed:6.0f} {(rss or 0) / 1024:8.1f} {h.get('gpulse.export.queue.size', 0):6.0f} "
                      f"{h.get('gpulse.export.queue.bytes', 0) / 1024:9.1f} "
                      f"{h.get('gpulse.export.dropped', 0):7.0f} "
                      f"{h.get('gpulse.export.failures', 0):8.0f} {sender.accepted:9d} "
                      f"{sender.refused + sender.failed:7d} {'down' if down_since else 'up':>9}", flush=True)
            time.sleep(0.2)
    finally:
        sender.stop()
        if down_since is not None or not collector.running():
            collector.start()
        drained = False
        if died is None:
            # Drained when a health report built after the sender stopped shows an empty queue
            # (gpulse's own metrics of that moment may still be in it).
            drain_until = time.monotonic() + args.drain
            health.poll()
            seen = health.updates
            while time.monotonic() < drain_until and gpulse.poll() is None:
                time.sleep(1)
                h = health.poll()
                if health.updates > seen and h.get("gpulse.export.queue.bytes", 1) < 64 * 1024:
                    drained = True
                    break
        if gpulse.poll() is None:
            gpulse.send_signal(signal.SIGTERM)
            try:
                gpulse.wait(timeout=30)
            except subprocess.TimeoutExpired:
                gpulse.kill()
        collector.stop()
    if died is not None:
        print(f"soak: FAIL: gpulse exited with {died} after {time.monotonic() - started:.0f} s; see {gpulse_err}")
        return 1
    return verdict(args, rows, sender, collector, health.latest, drained, restarts, gpulse.returncode, gpulse_err)


def verdict(args, rows, sender, collector, metrics, drained, restarts, exit_status, gpulse_err):
    """Prints the figures; 1 when memory grew, a span was lost uncounted or gpulse misbehaved."""
    failed = False
    samples = [(t, r) for t, r in rows if r is not None]
    warm = [r for t, r in samples if t >= 0.2 * args.duration]
    if len(warm) < 3:
        print("soak: FAIL: too few RSS samples for a verdict; run longer (--duration) or sample more often (--every)")
        return 1
    third = max(1, len(warm) // 3)
    first, last = statistics.median(warm[:third]) / 1024, statistics.median(warm[-third:]) / 1024
    growth = last - first
    pct = 100 * growth / first if first else 0.0
    print(f"soak: RSS median first third {first:.1f} MiB, last third {last:.1f} MiB ({growth:+.1f} MiB, "
          f"{pct:+.1f}%); max RSS {max(r for _, r in samples) / 1024:.1f} MiB")
    if growth > args.max_growth_mib and pct > args.max_growth_pct:
        print(f"soak: FAIL: memory grew by {growth:.1f} MiB ({pct:.1f}%), more than {args.max_growth_mib:g} MiB "
              f"and {args.max_growth_pct:g}%")
        failed = True
    count = otlp_load.count_spans(collector.trace_files)
    accepted = sender.accepted_hex_ids()
    arrived = set(count.ids)
    missing = len(accepted - arrived)
    dropped_points = metrics.get("gpulse.export.data_points.dropped", 0)
    enriched = len(accepted & count.enriched_ids())
    print(f"soak: spans: {sender.accepted} accepted by gpulse's receiver, {sender.refused} refused, "
          f"{sender.failed} failed to send (answers {sender.answers}, slowest {sender.max_answer_s:.2f} s); at the "
          f"Collector ({collector.starts} starts, {restarts} restarts): {count.total} spans, {count.distinct} "
          f"distinct, {count.duplicates} duplicates (at-least-once delivery), {missing} accepted spans "
          f"missing, {enriched} of the accepted enriched; gpulse counted {metrics.get('gpulse.export.dropped', 0):.0f} "
          f"requests ({dropped_points:.0f} points or spans) dropped; queue drained at the end: {drained}")
    if missing > dropped_points:
        print(f"soak: FAIL: {missing} accepted spans never reached the Collector, more than the "
              f"{dropped_points:.0f} points or spans gpulse counted as dropped")
        failed = True
    if sender.accepted == 0 or enriched == 0:
        print("soak: FAIL: no span was accepted, or none of the sender's spans was enriched "
              f"(gpulse knows the sender as a GPU process); see {gpulse_err}")
        failed = True
    if exit_status != 0:
        print(f"soak: FAIL: gpulse exited {exit_status} at SIGTERM; see {gpulse_err}")
        failed = True
    if sender.failed:
        print(f"soak: FAIL: {sender.failed} spans got no answer from gpulse's receiver within the sender's "
              f"{sender.timeout:g} s timeout (or the connection failed): it must answer, even while the "
              f"Collector is down")
        failed = True
    if failed:
        return 1
    print("soak: PASS: memory flat, every accepted span arrived or was counted as dropped")
    return 0
