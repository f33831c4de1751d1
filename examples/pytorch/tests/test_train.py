"""train.py run for real on the CPU, its spans read back from the console exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import EXAMPLE_DIR, require_torch

TRAIN = str(EXAMPLE_DIR / "train.py")


@pytest.fixture(autouse=True)
def needs_torch():
    require_torch()


def environment(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        OTEL_SERVICE_NAME="train-test",
        CUDA_VISIBLE_DEVICES="",  # the CPU path, even on a GPU machine
    )
    env.update(extra)
    return env


def console_spans(stdout):
    """The JSON objects ConsoleSpanExporter printed, between train.py's own lines."""
    decoder = json.JSONDecoder()
    spans, index = [], 0
    while True:
        start = stdout.find("{", index)
        if start < 0:
            return spans
        span, index = decoder.raw_decode(stdout, start)
        spans.append(span)


def run_train(tmp_path, *args, check=True, **env):
    pid_file = tmp_path / "train.pid"
    result = subprocess.run(
        [sys.executable, TRAIN, "--pid-file", str(pid_file), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=environment(**env),
    )
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result, pid_file


def named(spans, name):
    return [s for s in spans if s["name"] == name]


def test_train_runs_and_emits_the_span_tree(tmp_path):
    result, pid_file = run_train(
        tmp_path, "--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "8"
    )
    first_line = result.stdout.splitlines()[0]
    assert first_line.startswith("PID ")
    pid = int(first_line.split()[1])
    assert pid_file.read_text().strip() == str(pid)
    assert "done: 6 steps" in result.stdout

    spans = console_spans(result.stdout)
    counts = {
        name: len(named(spans, name))
        for name in (
            "training run",
            "epoch",
            "step",
            "data_wait",
            "forward",
            "backward",
            "optimizer",
        )
    }
    assert counts == {
        "training run": 1,
        "epoch": 2,
        "step": 6,
        "data_wait": 6,
        "forward": 6,
        "backward": 6,
        "optimizer": 6,
    }
    (run,) = named(spans, "training run")
    resource = run["resource"]["attributes"]
    assert resource["process.pid"] == pid
    assert resource["process.vpid"] == pid
    assert resource["service.name"] == "train-test"
    assert run["attributes"]["training.model.name"] == "cnn"
    assert run["attributes"]["training.device"] == "cpu"
    for step in named(spans, "step"):
        assert step["attributes"]["training.batch.size"] == 8
        assert step["attributes"]["training.loss"] > 0
        assert step["attributes"]["training.samples_per_second"] > 0
    steps_in_order = sorted(s["attributes"]["training.step"] for s in named(spans, "step"))
    assert steps_in_order == list(range(6))
    assert len({s["context"]["trace_id"] for s in spans}) == 1


def test_loader_and_precision_facts_on_run_and_epoch_spans(tmp_path):
    result, _ = run_train(
        tmp_path,
        *("--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "4", "--autocast", "bf16"),
    )
    spans = console_spans(result.stdout)
    expected = {
        "pytorch.dataloader.num_workers": 0,
        "pytorch.dataloader.pin_memory": False,  # pinned only when training on CUDA
        "pytorch.dataloader.persistent_workers": False,
        "pytorch.dataloader.batch_size": 4,
        "pytorch.autocast.enabled": True,
        "pytorch.autocast.dtype": "bfloat16",
        "pytorch.compile.used": False,
    }
    for span in named(spans, "training run") + named(spans, "epoch"):
        facts = {k: v for k, v in span["attributes"].items() if k.startswith("pytorch.")}
        assert facts == expected, span["name"]


def test_data_delay_shows_as_data_wait(tmp_path):
    result, _ = run_train(
        tmp_path,
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "4",
        "--data-delay",
        "0.15",
    )
    waits = named(console_spans(result.stdout), "data_wait")
    assert len(waits) == 2
    for wait in waits:
        # ConsoleSpanExporter prints ISO times; their difference is the wait.
        from datetime import datetime

        start = datetime.fromisoformat(wait["start_time"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(wait["end_time"].replace("Z", "+00:00"))
        assert (end - start).total_seconds() >= 0.15


def test_failure_marks_step_epoch_and_run_as_errors(tmp_path):
    result, _ = run_train(
        tmp_path,
        "--epochs",
        "2",
        "--steps-per-epoch",
        "3",
        "--batch-size",
        "4",
        "--fail-at-step",
        "4",
        check=False,
    )
    assert result.returncode != 0
    assert "failing on purpose" in result.stderr
    spans = console_spans(result.stdout)
    assert len(named(spans, "step")) == 5
    statuses = {
        (s["name"], s["status"]["status_code"])
        for s in spans
        if s["name"] in ("training run", "epoch", "step")
    }
    assert ("training run", "ERROR") in statuses
    assert ("epoch", "ERROR") in statuses and ("epoch", "UNSET") in statuses
    failed_steps = [s for s in named(spans, "step") if s["status"]["status_code"] == "ERROR"]
    assert [s["attributes"]["training.step"] for s in failed_steps] == [4]


def test_start_after_waits_for_the_file(tmp_path):
    pid_file = tmp_path / "train.pid"
    go = tmp_path / "go"
    process = subprocess.Popen(
        [
            sys.executable,
            TRAIN,
            "--pid-file",
            str(pid_file),
            "--start-after",
            str(go),
            "--epochs",
            "1",
            "--steps-per-epoch",
            "1",
            "--batch-size",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(OTEL_TRACES_EXPORTER="none"),
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "train.py never wrote its PID file"
            time.sleep(0.05)
        assert int(pid_file.read_text()) == process.pid
        time.sleep(1.0)
        assert process.poll() is None, "train.py did not wait for --start-after"
        go.touch()
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr[-2000:]
    assert "done: 1 steps" in stdout
