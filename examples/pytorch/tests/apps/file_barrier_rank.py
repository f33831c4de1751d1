#!/usr/bin/env python3
"""One rank of a job whose collective is a barrier on files, with the companion in the loop.

Each step does 50 ms of "work" in a ``forward`` phase, then waits inside
``tel.collective("barrier")`` until every rank of the job has written its file for the step. A
rank whose peer died waits there forever, as a rank waiting in an NCCL collective does (gloo, by
contrast, notices a dead peer's closed socket and raises, so a gloo job cannot show this). The
rank and job come from the launcher's variables (``RANK``, ``WORLD_SIZE``,
``TORCHELASTIC_RUN_ID``), as the companion reads them without torch.distributed. Writes its PID to
``--pid-file`` and waits for ``--start-after`` before training.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from otel_torch_train import TrainingTelemetry  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--barrier-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("--start-after", type=Path, required=True)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    args.pid_file.write_text(str(os.getpid()))
    while not args.start_after.exists():
        time.sleep(0.05)

    tel = TrainingTelemetry(model_name="file-barrier", live=True, memory_gauges=False)
    with tel.run():
        for step in tel.steps(range(args.steps)):
            with tel.phase("forward"):
                time.sleep(0.05)
            with tel.collective("barrier"):
                (args.barrier_dir / f"{step}-{rank}").touch()
                while not all(
                    (args.barrier_dir / f"{step}-{peer}").exists() for peer in range(world)
                ):
                    time.sleep(0.01)
    tel.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
