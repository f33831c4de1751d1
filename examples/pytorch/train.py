#!/usr/bin/env python3
"""A small, seeded training job instrumented with otel-torch-train.

A CNN (or MLP) learns a fixed random "teacher" on synthetic 16x16 images: the loss falls, the run
takes seconds on a CPU and uses the GPU when one is present. Built to be watched by gpulse:

* it prints ``PID <pid>`` as its first line (and writes it to ``--pid-file``), so a test can put
  the PID in the simulator's scenario;
* ``--start-after FILE`` waits for FILE to exist before training, so gpulse can be started on a
  PID that is already known;
* ``--data-delay`` makes the DataLoader slow (time lands in ``data_wait``), ``--sleep-per-step``
  stretches each step, so a step outlasts several gpulse samples.

Under ``torchrun`` (``WORLD_SIZE`` > 1) it trains data-parallel: ``init_process_group`` (NCCL on
CUDA, gloo on the CPU), the model wrapped in ``DistributedDataParallel`` with its all-reduces timed
(``tel.watch_ddp``), each rank on its own seeded data. ``--slow-rank R`` applies ``--data-delay``
to rank R only: a straggler. ``{rank}`` in ``--pid-file`` is replaced by the rank.

Telemetry goes where the ``OTEL_*`` variables say (``OTEL_TRACES_EXPORTER=console`` prints spans).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# The companion package lives next to this script; an installed copy takes precedence.
try:
    import otel_torch_train  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from otel_torch_train import TrainingTelemetry  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument(
        "--autocast",
        choices=("off", "bf16", "fp16"),
        default="off",
        help="run the forward pass under torch.autocast in this dtype (pytorch.autocast.*)",
    )
    parser.add_argument(
        "--memory-summary-after",
        type=int,
        default=None,
        metavar="EPOCHS",
        help="send torch.cuda.memory_summary() as a log record when the per-epoch peak of "
        "allocated memory has risen this many epochs in a row",
    )
    parser.add_argument(
        "--data-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sleep this long producing each batch (shows as data_wait)",
    )
    parser.add_argument(
        "--sleep-per-step",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sleep this long at the end of each step, outside the phases",
    )
    parser.add_argument(
        "--slow-rank",
        type=int,
        default=None,
        metavar="RANK",
        help="under torchrun, apply --data-delay to this rank only (a straggler)",
    )
    parser.add_argument(
        "--block-rank",
        type=int,
        default=None,
        metavar="RANK",
        help="under torchrun, this rank blocks (sleeps) inside one step, in a phase of its own: "
        "the others wait for it in their all-reduce (a hung rank, or a long checkpoint)",
    )
    parser.add_argument("--block-at-step", type=int, default=0, metavar="STEP")
    parser.add_argument(
        "--no-watch-ddp",
        action="store_true",
        help="leave the DDP model without the companion's hook (its collectives unseen)",
    )
    parser.add_argument("--block-seconds", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--block-phase", default="stuck", metavar="NAME", help="the phase it blocks in"
    )
    parser.add_argument(
        "--pid-file", type=Path, help="write this process's PID here ({rank}: the rank)"
    )
    parser.add_argument(
        "--start-after", type=Path, metavar="FILE", help="wait until FILE exists before training"
    )
    parser.add_argument("--start-timeout", type=float, default=120.0, metavar="SECONDS")
    parser.add_argument(
        "--service-name",
        default=None,
        help="service.name set in code (OTEL_SERVICE_NAME, when set, still wins)",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        help="raise at this global step (to see error spans)",
    )
    args = parser.parse_args(argv)
    for name in ("epochs", "steps_per_epoch", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.memory_summary_after is not None and args.memory_summary_after < 1:
        parser.error("--memory-summary-after must be at least 1 epoch (leave it out for never)")
    return args


def announce_pid(pid_file) -> None:
    print(f"PID {os.getpid()}", flush=True)
    if pid_file is not None:
        pid_file = Path(str(pid_file).replace("{rank}", os.environ.get("RANK", "0")))
        # Written whole then renamed, so a reader polling for the file never sees it half-written.
        partial = pid_file.with_name(pid_file.name + ".partial")
        partial.write_text(f"{os.getpid()}\n")
        partial.replace(pid_file)


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(
                f"train.py: {path} did not appear within {timeout:.0f}s (--start-after)"
            )
        time.sleep(0.05)


def build_model(torch, kind: str):
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


class SlowCollate:
    """Stacks a batch, after sleeping: a stand-in for decoding or reading from slow storage."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self, samples):
        import torch

        if self.delay > 0:
            time.sleep(self.delay)
        images = torch.stack([s[0] for s in samples])
        labels = torch.stack([s[1] for s in samples])
        return images, labels


def main(argv=None) -> int:
    args = parse_args(argv)
    announce_pid(args.pid_file)

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if args.start_after is not None:
        wait_for(args.start_after, args.start_timeout)

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train.py: --device cuda but torch.cuda.is_available() is False")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(args.seed)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world_size > 1:
        import torch.distributed as dist

        if use_cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if use_cuda else "gloo")
    data_delay = args.data_delay
    if args.slow_rank is not None and args.slow_rank != rank:
        data_delay = 0.0

    samples = args.steps_per_epoch * args.batch_size
    # Each rank its own shard of the synthetic data; the teacher is the same everywhere.
    generator = torch.Generator().manual_seed(args.seed)
    teacher_generator = generator
    if world_size > 1:
        teacher_generator = torch.Generator().manual_seed(args.seed)
        generator = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    images = torch.randn(samples, 1, 16, 16, generator=generator)
    teacher = torch.randn(256, 10, generator=teacher_generator)
    labels = (images.flatten(1) @ teacher).argmax(dim=1)
    loader = DataLoader(
        TensorDataset(images, labels),
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed + 1),
        num_workers=args.num_workers,
        collate_fn=SlowCollate(data_delay),
        pin_memory=use_cuda,
        drop_last=True,
    )
    model = build_model(torch, args.model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    tel = TrainingTelemetry(
        model_name=args.model,
        service_name=args.service_name,
        memory_summary_after=args.memory_summary_after,
    )
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None)
        if not args.no_watch_ddp:
            model = tel.watch_ddp(model)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast)
    last_loss = float("nan")
    with tel.run(epochs=args.epochs, device=device.type, seed=args.seed):
        step = 0
        for epoch in tel.epochs(range(args.epochs)):
            for x, y in tel.steps(loader):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                if args.block_rank == rank and step == args.block_at_step:
                    with tel.phase(args.block_phase):
                        time.sleep(args.block_seconds)
                with torch.autocast(device.type, autocast_dtype, enabled=bool(autocast_dtype)):
                    # Inside the autocast block, so the telemetry sees it (pytorch.autocast.*).
                    with tel.phase("forward"):
                        loss = loss_fn(model(x), y)
                with tel.phase("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with tel.phase("optimizer"):
                    optimizer.step()
                last_loss = loss.item()
                tel.record_step(loss=last_loss, batch_size=x.shape[0])
                if args.fail_at_step is not None and step == args.fail_at_step:
                    raise RuntimeError(f"--fail-at-step {step}: failing on purpose")
                if args.sleep_per_step > 0:
                    time.sleep(args.sleep_per_step)
                step += 1
            print(f"epoch {epoch} loss {last_loss:.4f}", flush=True)
    tel.shutdown()
    if world_size > 1:
        torch.distributed.destroy_process_group()
    print(f"done: {step} steps, final loss {last_loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
