#!/usr/bin/env python3
"""What otel-torch-train costs per training step.

Times N steps of a small MLP on the CPU, plain and instrumented (run/epoch/step spans, data_wait,
forward/backward/optimizer phases, record_step), interleaving the two R times and keeping the
median, and prints the per-step overhead in microseconds and as a share of the plain step. Spans go
through a BatchSpanProcessor to an exporter that drops them: the full SDK path a real run pays on
the training thread, without a network (the export itself runs on the processor's thread).

A CPU step of a small model is the worst case: a GPU step of a real model takes milliseconds,
so the same microseconds are a smaller share. ``--empty`` also times a loop with no model work,
which isolates the companion's own cost.

``--distributed`` wraps the model in DistributedDataParallel over a one-rank gloo group (a real
all-reduce per step, no other rank to wait for) in both loops, and adds the setting
``nocollect`` (the full tree without collective timing): ``full`` minus ``nocollect`` is what
timing the collectives costs per step (the DDP comm hook, the wrapped torch.distributed calls,
the step attribute and the histogram point).

With ``--distributed`` the script also times, in one loop of ``--repeat`` rounds, three models side
by side: plain DDP (no companion), the companion without collective timing (``nocollect``) and
with it (``full``), the three in a rotating order each round, and reports the per-round paired
differences (median, and the 25th-75th percentile spread): ``full − nocollect`` is the collective
timing's cost per step, ``full − plain`` the whole companion's under DDP. Pairing within a round
lets a shared machine's load (other builds) hit the three alike; the load average before and after
is printed with the figures.

``--live`` times, the same way, the companion with and without its live state (``live.py``: the
step, phase and collective written on the training thread for gpulse's hang detection, and its
reporter thread): ``full − nolive`` is its cost per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

try:
    import otel_torch_train  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from otel_torch_train import NoCuda, TrainingTelemetry  # noqa: E402


class DropExporter(SpanExporter):
    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans):
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def make_work(torch, batch_size: int, empty: bool, ddp=None):
    """``ddp``: None (a plain model), or a function given the DDP model (registers a hook)."""
    if empty:
        return (lambda batch: 0.0), [(None, None)] * 4
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    if ddp is not None:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch_size, 256, generator=generator), torch.randint(0, 10, (batch_size,)))
        for _ in range(16)
    ]

    def forward(batch):
        x, y = batch
        return loss_fn(model(x), y)

    return (forward, optimizer), batches


class Clock:
    """Wall time and the training thread's own CPU time, per step.

    The CPU time is what the companion takes from the training thread; unlike wall time it does
    not grow when other processes share the cores (other builds, other jobs).
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.wall = time.perf_counter()
        self.cpu = time.thread_time()

    def stop(self) -> tuple:
        return (
            (time.perf_counter() - self.wall) / self.steps,
            (time.thread_time() - self.cpu) / self.steps,
        )


def plain_loop(work, batches, steps: int, empty: bool) -> tuple:
    data = (batches[i % len(batches)] for i in range(steps))
    clock = Clock(steps)
    if empty:
        for _batch in data:
            pass
    else:
        forward, optimizer = work
        for batch in data:
            loss = forward(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss.item()
    return clock.stop()


def instrumented_loop(tel, work, batches, steps: int, empty: bool) -> tuple:
    data = (batches[i % len(batches)] for i in range(steps))
    clock = Clock(steps)
    with tel.run():
        for _ in tel.epochs(range(1)):
            if empty:
                for _batch in tel.steps(data):
                    with tel.phase("forward"):
                        pass
                    with tel.phase("backward"):
                        pass
                    with tel.phase("optimizer"):
                        pass
                    tel.record_step(loss=0.0, batch_size=1)
            else:
                forward, optimizer = work
                for batch in tel.steps(data):
                    with tel.phase("forward"):
                        loss = forward(batch)
                    with tel.phase("backward"):
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                    with tel.phase("optimizer"):
                        optimizer.step()
                    tel.record_step(loss=loss.item())
    return clock.stop()


CONFIGS = {
    "full": ("full tree (phases as spans)", {}),
    "attrs": ("phases as step attributes", {"phase_spans": False}),
    "every10": ("1 step in 10 traced", {"step_spans_every": 10}),
    "nocollect": ("full tree, collectives untimed", {"collectives": False}),
    "nolive": ("full tree, no live state", {"live": False}),
}


def measure(torch, args, empty: bool, config: str) -> dict:
    label, options = CONFIGS[config]
    distributed = args.distributed and not empty
    work, batches = make_work(torch, args.batch_size, empty, (lambda m: None) if distributed else None)
    exporter = DropExporter()
    tracer_provider = TracerProvider()
    # Sized so no span is dropped: a dropped span would make the instrumented loop look cheaper.
    tracer_provider.add_span_processor(
        BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=2048)
    )
    tel = TrainingTelemetry(
        "bench",
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(),
        cuda=NoCuda(),
        **options,
    )
    tel_work = work
    if distributed:
        # A model of its own: a comm hook cannot be taken off the plain loop's model again.
        watch = tel.watch_ddp if options.get("collectives", True) else (lambda m: None)
        tel_work, _ = make_work(torch, args.batch_size, empty, watch)
    plain_loop(work, batches, args.warmup, empty)
    instrumented_loop(tel, tel_work, batches, args.warmup, empty)
    plain, instrumented = [], []
    for _ in range(args.repeat):
        plain.append(plain_loop(work, batches, args.steps, empty))
        instrumented.append(instrumented_loop(tel, tel_work, batches, args.steps, empty))
    tel.shutdown()
    tracer_provider.shutdown()
    base = statistics.median(p[0] for p in plain)
    with_tel = statistics.median(p[0] for p in instrumented)
    base_cpu = statistics.median(p[1] for p in plain)
    with_tel_cpu = statistics.median(p[1] for p in instrumented)
    return {
        "workload": "empty loop"
        if empty
        else f"{'DDP ' if distributed else ''}MLP 256-256-10, batch {args.batch_size}, CPU",
        "telemetry": label,
        "steps": args.steps,
        "repeat": args.repeat,
        "plain_us": base * 1e6,
        "instrumented_us": with_tel * 1e6,
        "overhead_us": (with_tel - base) * 1e6,
        "overhead_percent": (with_tel - base) / base * 100 if base > 0 else float("nan"),
        "plain_cpu_us": base_cpu * 1e6,
        "instrumented_cpu_us": with_tel_cpu * 1e6,
        "overhead_cpu_us": (with_tel_cpu - base_cpu) * 1e6,
        "overhead_cpu_percent": (
            (with_tel_cpu - base_cpu) / base_cpu * 100 if base_cpu > 0 else float("nan")
        ),
        "spans_exported": exporter.exported,
    }


def _spread(values: list) -> dict:
    """Median and the 25th/75th percentiles of paired differences, in µs."""
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median_us": statistics.median(values) * 1e6, "p25_us": q[0] * 1e6, "p75_us": q[2] * 1e6}


def bench_telemetry(**options):
    """A TrainingTelemetry whose spans go to a dropping exporter, and its provider."""
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(DropExporter(), max_queue_size=65536, max_export_batch_size=2048)
    )
    tel = TrainingTelemetry(
        "bench", tracer_provider=provider, meter_provider=MeterProvider(), cuda=NoCuda(), **options
    )
    return provider, tel


def interleaved_rounds(loops: dict, providers: list, args) -> tuple:
    """Each loop (name -> run(steps) -> (wall, cpu)) warmed up, then run ``args.repeat`` rounds
    in a rotating order, so drift of the machine falls on every variant alike; the providers
    shut down after. Returns (rounds by name, load average before, after)."""
    for run in loops.values():
        run(args.warmup)
    names = list(loops)
    rounds = {name: [] for name in names}
    load_before = os.getloadavg()
    for i in range(args.repeat):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            rounds[name].append(loops[name](args.steps))
    load_after = os.getloadavg()
    for provider, tel in providers:
        tel.shutdown()
        provider.shutdown()
    return rounds, load_before, load_after


def paired(rounds: dict, a: str, b: str, which: int) -> dict:
    """The spread of ``a`` minus ``b``, round by round (``which``: 0 wall, 1 CPU)."""
    return _spread([x[which] - y[which] for x, y in zip(rounds[a], rounds[b])])


def measure_collective_cost(torch, args) -> dict:
    """Plain DDP, the companion without and with collective timing, interleaved per round."""
    plain_work, batches = make_work(torch, args.batch_size, False, lambda m: None)
    loops = {
        "plain": lambda steps: plain_loop(plain_work, batches, steps, False),
    }
    providers = []
    for name, collectives in (("nocollect", False), ("full", True)):
        provider, tel = bench_telemetry(collectives=collectives)
        work, _ = make_work(
            torch, args.batch_size, False, tel.watch_ddp if collectives else (lambda m: None)
        )
        providers.append((provider, tel))
        loops[name] = (lambda tel, work: lambda steps: instrumented_loop(tel, work, batches, steps, False))(tel, work)
    rounds, load_before, load_after = interleaved_rounds(loops, providers, args)
    return {
        "workload": f"DDP (gloo, 1 rank) MLP 256-256-10, batch {args.batch_size}, CPU",
        "steps": args.steps,
        "rounds": args.repeat,
        "step_us": {n: statistics.median(r[0] for r in rounds[n]) * 1e6 for n in loops},
        "collective_timing_wall": paired(rounds, "full", "nocollect", 0),
        "collective_timing_cpu": paired(rounds, "full", "nocollect", 1),
        "companion_wall": paired(rounds, "full", "plain", 0),
        "companion_cpu": paired(rounds, "full", "plain", 1),
        "load_before": load_before,
        "load_after": load_after,
        "cpus": os.cpu_count(),
    }


def measure_live_cost(torch, args) -> dict:
    """The companion with and without its live state (live.py), interleaved per round: the
    state's writes on the training thread (a few per step, phase and collective) and its
    reporter thread's wakeups, which send nothing while no step lingers."""
    loops, providers = {}, []
    work, batches = make_work(torch, args.batch_size, False, None)
    for name, live in (("nolive", False), ("full", True)):
        provider, tel = bench_telemetry(live=live)
        providers.append((provider, tel))
        loops[name] = (lambda tel: lambda steps: instrumented_loop(tel, work, batches, steps, False))(tel)
    rounds, load_before, load_after = interleaved_rounds(loops, providers, args)
    return {
        "workload": f"MLP 256-256-10, batch {args.batch_size}, CPU",
        "steps": args.steps,
        "rounds": args.repeat,
        "step_us": {n: statistics.median(r[0] for r in rounds[n]) * 1e6 for n in loops},
        "live_wall": paired(rounds, "full", "nolive", 0),
        "live_cpu": paired(rounds, "full", "nolive", 1),
        "live_writes_us": live_writes_us(),
        "load_before": load_before,
        "load_after": load_after,
        "cpus": os.cpu_count(),
    }


def live_writes_us(iterations: int = 200_000, repeat: int = 7) -> float:
    """The live state's writes of one step of train.py's shape (step begins, batch arrives, three
    phases, one collective issued and completed, step ends), timed alone: the best of ``repeat``
    runs of ``iterations`` steps, in µs per step. The paired loops above carry the machine's
    noise; this is the floor under it."""
    import timeit

    from otel_torch_train.live import LiveState

    live = LiveState()

    def step(n=[0]):  # noqa: B006 - a counter
        live.begin_step(n[0])
        live.got_batch()
        for phase in ("forward", "backward", "optimizer"):
            live.enter_phase(phase)
            if phase == "backward":
                live.collective_done(live.collective_issued("all_reduce"))
            live.exit_phase()
        live.end_step()
        n[0] += 1

    best = min(timeit.repeat(step, number=iterations, repeat=repeat))
    return best / iterations * 1e6


def print_live_cost(r: dict) -> None:
    def fmt(d: dict) -> str:
        return f"{d['median_us']:7.2f} µs  (p25 {d['p25_us']:6.2f}, p75 {d['p75_us']:6.2f})"

    steps = ", ".join(f"{n} {v:.1f} µs" for n, v in r["step_us"].items())
    print()
    print(f"{r['workload']}: {r['rounds']} rounds x {r['steps']} steps, with and without the live state")
    print(f"  step (median): {steps}")
    print(f"  live state (full - nolive), wall: {fmt(r['live_wall'])}")
    print(f"  live state (full - nolive), CPU:  {fmt(r['live_cpu'])}")
    print(f"  the live state's writes of one step, alone (best of 7 x 200000): {r['live_writes_us']:.2f} µs")
    before = " ".join(f"{x:.2f}" for x in r["load_before"])
    after = " ".join(f"{x:.2f}" for x in r["load_after"])
    print(f"  load average before: {before}; after: {after}; {r['cpus']} CPUs")


def print_collective_cost(r: dict) -> None:
    def fmt(d: dict) -> str:
        return f"{d['median_us']:7.1f} µs  (p25 {d['p25_us']:6.1f}, p75 {d['p75_us']:6.1f})"

    steps = ", ".join(f"{n} {v:.1f} µs" for n, v in r["step_us"].items())
    print()
    print(f"{r['workload']}: {r['rounds']} rounds x {r['steps']} steps, the three interleaved")
    print(f"  step (median): {steps}")
    print(f"  collective timing (full - nocollect), wall: {fmt(r['collective_timing_wall'])}")
    print(f"  collective timing (full - nocollect), CPU:  {fmt(r['collective_timing_cpu'])}")
    print(f"  whole companion (full - plain), wall:       {fmt(r['companion_wall'])}")
    print(f"  whole companion (full - plain), CPU:        {fmt(r['companion_cpu'])}")
    before = " ".join(f"{x:.2f}" for x in r["load_before"])
    after = " ".join(f"{x:.2f}" for x in r["load_after"])
    print(f"  load average before: {before}; after: {after}; {r['cpus']} CPUs")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--config",
        action="append",
        choices=sorted(CONFIGS),
        help="telemetry setting(s) to time (default: all)",
    )
    parser.add_argument("--empty", action="store_true", help="also time a loop with no model work")
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="the model under DDP in a one-rank gloo group (adds the nocollect setting)",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="also time the live state's cost per step: with and without it, paired per round",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    configs = args.config or [c for c in CONFIGS if c not in ("nocollect", "nolive") or (c == "nocollect" and args.distributed)]
    if args.distributed:
        import tempfile

        import torch.distributed as dist

        store = tempfile.mkdtemp(prefix="bench-overhead-")
        dist.init_process_group(
            "gloo", init_method=f"file://{store}/store", rank=0, world_size=1
        )
    results = [measure(torch, args, False, config) for config in configs]
    if args.empty:
        results += [measure(torch, args, True, config) for config in configs]
    paired = measure_collective_cost(torch, args) if args.distributed else None
    live = measure_live_cost(torch, args) if args.live else None
    if args.distributed:
        torch.distributed.destroy_process_group()
    if args.json:
        document = {"results": results}
        if paired:
            document["paired"] = paired
        if live:
            document["live"] = live
        print(json.dumps(document if (paired or live) else results, indent=2))
        return 0
    print(
        f"{'workload':30} {'telemetry':28} {'plain µs':>9} {'with µs':>9} {'overhead':>16}"
        f" {'CPU overhead':>18}"
    )
    for r in results:
        wall = f"{r['overhead_us']:7.1f} µs"
        cpu = f"{r['overhead_cpu_us']:7.1f} µs"
        if r["plain_us"] >= 1:
            wall += f" {r['overhead_percent']:5.1f}%"
            cpu += f" {r['overhead_cpu_percent']:5.1f}%"
        print(
            f"{r['workload']:30} {r['telemetry']:28} {r['plain_us']:9.1f} "
            f"{r['instrumented_us']:9.1f} {wall:>16} {cpu:>18}"
        )
    print(
        f"({args.steps} steps x {args.repeat} interleaved repeats, medians; wall time, and the"
        f" training thread's CPU time (time.thread_time); torch threads {args.threads})"
    )
    if paired:
        print_collective_cost(paired)
    if live:
        print_live_cost(live)
    return 0


if __name__ == "__main__":
    sys.exit(main())
