"""benches/peers/ratio.py, where the gpulse ÷ floor figures of BENCHMARKS.md come from: the CPU
clock it reads of another process, the per-run ratio, the range and median per interval, and
whether the goal is met in every run.

Standard library and pytest only; run by scripts/test."""

import io
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches" / "peers"))

import ratio  # noqa: E402  (after the path it lives on)


def test_the_cpu_clock_of_another_process_counts_its_busy_time_not_its_sleep():
    # The child spins until it has used 0.3 s of CPU by its own clock, says so, then sleeps:
    # whatever the machine's load, its clock read from here is at least that.
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nwhile time.process_time() < 0.3: pass\n"
                             "print('spun', flush=True)\ntime.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        started = time.monotonic()
        assert busy.stdout.readline().strip() == "spun"
        busy_s = ratio.cpu_seconds(busy.pid)
        waited = time.monotonic() - started
        sleep_s = ratio.cpu_seconds(sleeper.pid)
    finally:
        busy.kill()
        sleeper.kill()
        busy.wait()
        sleeper.wait()
    assert 0.3 <= busy_s <= waited + 0.05, (busy_s, waited)
    assert sleep_s < 0.05, sleep_s


def test_the_clock_id_is_linuxs_process_cpu_clock_encoding():
    # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) = (~pid << 3) | 2, a negative clock id.
    assert ratio.process_cpu_clock(1) == -14
    assert ratio.process_cpu_clock(1234) == ((~1234) << 3) | 2


def test_one_run_row():
    row = ratio.run_row(1.0, {"gpulse": 0.09, "floor": 0.06}, 30.0)
    assert row["ratio"] == 0.09 / 0.06
    assert abs(row["gpulse_core_percent"] - 0.3) < 1e-9
    assert abs(row["floor_core_percent"] - 0.2) < 1e-9
    assert "baseline_ratio" not in row
    with_baseline = ratio.run_row(0.1, {"gpulse": 0.3, "floor": 0.2, "baseline": 0.5}, 30.0)
    assert with_baseline["baseline_ratio"] == 2.5
    assert ratio.run_row(1.0, {"gpulse": 0.1, "floor": 0.0}, 1.0)["ratio"] == float("inf")


def rows(interval, pairs):
    return [ratio.run_row(interval, {"gpulse": g, "floor": f}, 30.0) for g, f in pairs]


def test_summary_per_interval_range_median_and_goal_in_every_run():
    data = rows(1.0, [(0.18, 0.10), (0.21, 0.10), (0.19, 0.10)]) + \
        rows(0.1, [(0.30, 0.20), (0.36, 0.20)])
    s1, s01 = ratio.summary(data, goal=2.0)
    assert (s1["interval"], s1["runs"]) == (1.0, 3)
    assert s1["ratio"] == (0.18 / 0.10, 0.21 / 0.10)
    assert abs(s1["median"] - 1.9) < 1e-9
    assert not s1["met"], "one run over 2x is not met"
    assert s01["runs"] == 2
    assert abs(s01["median"] - (1.5 + 1.8) / 2) < 1e-9
    assert s01["met"]


def test_the_tables_print_each_run_and_the_verdict():
    data = rows(1.0, [(0.18, 0.10), (0.25, 0.10)])
    out = io.StringIO()
    with redirect_stdout(out):
        ratio.print_tables(data, ratio.summary(data, 2.0), 2.0)
    text = out.getvalue()
    assert "| 1 s | 1 | 0.180 | 0.100 | 0.600 | 0.333 | 1.80× |" in text
    assert "| 1 s | 2 | 0.250 | 0.100 | 0.833 | 0.333 | 2.50× |" in text
    assert "| 1 s | 2 | 0.600–0.833 | 0.333 | 1.80–2.50× | 2.15× | **no** |" in text
    assert ratio.label(0.1) == "100 ms" and ratio.label(1.0) == "1 s"
